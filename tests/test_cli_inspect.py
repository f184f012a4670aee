"""`shardprop inspect` in every format, with flat (`--arg`) and pytree (`--args`) arguments: in this process
(tests/cli.py), the first test as a user runs it (a subprocess)."""

import json
import shutil
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from shardprop.inspect import SCHEMA
from tests.cli import shardprop, shardprop_subprocess

EXAMPLE = Path(__file__).parent / "inspection" / "nx_example.py"
BASE = ["inspect", f"{EXAMPLE}:f", "--mesh", "i=4,j=2",
        "--arg", "f32[16,8]@P(i,j)", "--arg", "f32[16,8]", "--strategy", "gather"]


def run(*extra, check=True, base=True, subprocess=False):
    """``shardprop inspect`` on the Nx example; ``base=False`` leaves the two ``--arg`` out of BASE; ``subprocess``
    runs it as a user does."""
    cmd = BASE if base else [x for k, x in enumerate(BASE) if x != "--arg" and BASE[k - 1] != "--arg"]
    result = (shardprop_subprocess if subprocess else shardprop)(*cmd, *extra)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def test_text_has_listing_stage_table_explanation_lineage_and_blocks():
    out = run("--explain", "e", "--lineage", "0:0,1", "--blocks", "c", subprocess=True).stdout
    assert "c:f32[16@i,8@j] = add a b" in out and "c:f32[16@i,8] = all_gather[j axis=1] c" in out   # listing
    assert "2 stage(s), strategy gather" in out and "total ≈ 256 B moved per device" in out  # stage table
    assert "origin: argument a has spec P('i', 'j'); this is its axis 0" in out    # explain
    assert "lineage 0:0,1: i[0:4, 4:8] depends on" in out                             # lineage
    assert "argument a[0:4, 0:8]" in out and "argument a[0:16, 4:8]" in out
    assert "│             0:4 │ dev 0 │ dev 1 │" in out                                 # blocks


def test_json_is_valid_against_the_documented_schema(tmp_path):
    out = tmp_path / "prog.json"
    run("--format", "json", "--explain", "e", "--lineage", "0:0,1", "--lineage", "e:1", "-o", str(out))
    doc = json.loads(out.read_text())
    jsonschema.validate(doc, SCHEMA)
    assert doc["lineage"]["0:0,1"]["inputs"]["0"] == [[[0, 4], [0, 8]], [[0, 16], [4, 8]]]
    assert doc["lineage"]["e:1"]["inputs"]["1"] == [[[4, 8], [0, 8]]]
    assert doc["explain"]["e"]["axes"][0]["mesh_axes"] == ["i"]
    # the schema describes those sections too: a malformed box or a missing field does not pass
    broken = json.loads(out.read_text())
    broken["lineage"]["e:1"]["inputs"]["1"] = [[[4, 8, 1], [0, 8]]]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, SCHEMA)
    del doc["explain"]["e"]["axes"][0]["origin"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, SCHEMA)


def test_schema_flag_prints_the_schema():
    result = shardprop("inspect", "--schema")
    assert result.returncode == 0 and json.loads(result.stdout) == json.loads(json.dumps(SCHEMA))


def test_dot_format():
    out = run("--format", "dot").stdout
    assert out.startswith("digraph shardprop {") and "subgraph cluster_stage_1" in out and "gather j" in out


def test_svg_format(tmp_path):
    target = tmp_path / "graph.svg"
    result = run("--format", "svg", "-o", str(target), check=False)
    if shutil.which("dot"):
        assert result.returncode == 0, result.stderr
        assert "<svg" in target.read_text()
    else:
        assert result.returncode == 2 and "RenderError" in result.stderr and "graphviz" in result.stderr


@pytest.mark.parametrize("args,message", [
    (["--arg", "f32[16,8]@P(i,q)", "--arg", "f32[16,8]"],
     "UnknownMeshAxisError: argument a: spec P('i', 'q') names mesh axis 'q'"),
    (["--arg", "x32[16,8]", "--arg", "f32[16,8]"], "unknown dtype 'x32'"),
    (["--arg", "f32[16,8]@P(i,j)"],
     "TraceError: tracing 'f' failed: TypeError: f() missing 1 required positional"),
    (["--explain", "zz"], "no value 'zz'"),
    (["--lineage", "0:9,9"], "out of range on axis 0"),
    (["--format", "dot", "--explain", "e"], "--explain is shown only with --format text or json, not --format dot"),
    (["--format", "json", "--blocks", "c"], "--blocks is shown only with --format text, not --format json"),
])
def test_bad_input_is_a_one_line_error(args, message):
    cmd = ["inspect", f"{EXAMPLE}:f", "--mesh", "i=4,j=2"]
    if "--arg" not in args:
        cmd += ["--arg", "f32[16,8]@P(i,j)", "--arg", "f32[16,8]"]
    result = shardprop(*cmd, *args)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr


def test_missing_function_is_reported():
    result = shardprop("inspect", f"{EXAMPLE}:nope", "--mesh", "i=8")
    assert result.returncode == 2 and "has no 'nope'" in result.stderr


def test_a_module_that_does_not_import_is_a_one_line_error(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("def f(a):\n    return a +\n")
    result = shardprop("inspect", f"{broken}:f", "--mesh", "i=8",
                       "--arg", "f32[8]@P(i)")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "importing broken.py failed (line 2): SyntaxError" in result.stderr


def test_specs_may_quote_mesh_axis_names_as_in_python():
    quoted = run("--arg", "f32[16,8]@P(\"i\", 'j')", "--arg", "f32[16,8]", "--format", "json", base=False).stdout
    plain = run("--arg", "f32[16,8]@P(i,j)", "--arg", "f32[16,8]", "--format", "json", base=False).stdout
    assert json.loads(quoted) == json.loads(plain)


def test_the_output_suffix_picks_the_format_or_a_mismatch_is_refused(tmp_path):
    run("-o", str(tmp_path / "prog.json"))
    assert json.loads((tmp_path / "prog.json").read_text())["strategy"] == "gather"
    run("-o", str(tmp_path / "prog.dot"))
    assert (tmp_path / "prog.dot").read_text().startswith("digraph")
    mismatch = run("--format", "svg", "-o", str(tmp_path / "graph.png"), check=False)
    assert mismatch.returncode == 2 and "--format svg but -o" in mismatch.stderr and "says png" in mismatch.stderr
    assert not (tmp_path / "graph.png").exists()
    if shutil.which("dot"):
        run("-o", str(tmp_path / "graph.png"))
        assert (tmp_path / "graph.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # a real PNG


def test_version():
    result = shardprop_subprocess("--version", timeout=60)
    assert result.returncode == 0 and result.stdout.startswith("shardprop 0.")


LOSS = Path(__file__).parent / "cli_loss_example.py"
LOSS_SPECS = ["--in-specs", "(None, P('i'), P('i'))"]  # parameters unannotated, the batch over i


def inspect_loss(*extra, check=True):
    """``shardprop inspect`` on ``loss_fn(params, tokens, targets)``, params a dict (tests/cli_loss_example.py)."""
    result = shardprop("inspect", f"{LOSS}:loss_fn", "--mesh", "i=8",
                             *extra)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def test_pytree_arguments_from_an_example_function_or_files_give_the_unsharded_types(tmp_path):
    import jax

    from tests.cli_loss_example import loss_fn, make_args

    from_module = json.loads(inspect_loss("--args", f"{LOSS}:make_args", *LOSS_SPECS, "--format", "json").stdout)
    jsonschema.validate(from_module, SCHEMA)
    args = make_args()
    values = {v["name"]: v for v in from_module["values"]}
    leaves = jax.tree_util.tree_leaves(args)  # the dict's keys sorted, then tokens and targets
    typed = [(values[i["value"]]["shape"], values[i["value"]]["dtype"]) for i in from_module["inputs"]]
    assert typed == [(list(x.shape), {"float32": "f32", "int32": "i32"}[str(x.dtype)]) for x in leaves]
    assert [i["layout"][0] for i in from_module["inputs"]] == [[]] * 4 + [["i"], ["i"]]
    (out,) = from_module["outputs"]
    assert values[out["value"]]["shape"] == list(jax.eval_shape(loss_fn, *args).shape) == []
    # The same arguments as files: the parameters an .npz (one dict argument), the batch one .npy per argument.
    np.savez(tmp_path / "params.npz", **args[0])
    np.save(tmp_path / "tokens.npy", args[1])
    np.save(tmp_path / "targets.npy", args[2])
    from_files = inspect_loss("--args", str(tmp_path / "params.npz"), "--args", str(tmp_path / "tokens.npy"),
                              "--args", str(tmp_path / "targets.npy"), *LOSS_SPECS, "--format", "json").stdout
    assert json.loads(from_files) == from_module


@pytest.mark.parametrize("extra, message", [
    (["--args", "/no/such/params.npz"], "OptionError: --args '/no/such/params.npz': cannot read it"),
    (["--args", f"{LOSS}:no_such_example"], "cli_loss_example.py has no 'no_such_example'"),
    (["--args", f"{LOSS}:make_dict"], "make_dict() returned a dict, not a tuple of arguments"),
    (["--args", f"{LOSS}:make_args", "--in-specs", "(P('i'), P('i'))"],
     "SpecTreeError: in_specs (P('i',), P('i',)) is not a pytree prefix of the arguments"),
    (["--args", f"{LOSS}:make_args", "--arg", "f32[8]"], "give --arg (one array per flag) or --args"),
])
def test_bad_pytree_arguments_are_a_one_line_error(extra, message):
    result = inspect_loss(*extra, check=False)
    assert result.returncode == 2, result.stdout
    assert message in result.stderr and "Traceback" not in result.stderr
