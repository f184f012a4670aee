"""`shardprop debug` (in this process, tests/cli.py; the first test as a user runs it, a subprocess): stage by
stage, JSON, arrays from files, a saved stage, the interactive prompt, pytree arguments (`--args`), the exit status,
and one-line errors."""

import json
from pathlib import Path

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from tests.cli import shardprop, shardprop_subprocess

EXAMPLE = Path(__file__).parent / "inspection" / "nx_example.py"
BASE = ["debug", f"{EXAMPLE}:f", "--mesh", "i=4,j=2", "--strategy", "gather", "--repeats", "2"]
ARGS = ["--arg", "f32[16,8]@P(i,j)", "--arg", "f32[16,8]"]


def run(*extra, check=True, stdin=None, subprocess=False):
    result = (shardprop_subprocess if subprocess else shardprop)(*BASE, *extra, stdin=stdin)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def test_text_steps_every_stage_compares_and_profiles():
    out = run(*ARGS, subprocess=True).stdout
    assert "2 stage(s), 9 nodes, strategy gather" in out
    assert "stage 0: 2 ops (add, sub)" in out and "stage 1: 5 ops (reduce_sum×2, broadcast_in_dim×2, add)" in out
    assert "c:f32[16@i,8@j]  P('i', 'j')  <- stage 0 output 0, all-gather over j on axis 1 (64 B)" in out
    assert out.count("vs unsharded: all") == 2
    assert "all 7 values agree with the unsharded function" in out
    assert "every device holds what the plan says it holds" in out
    assert "per-stage profile (median of 2 runs" in out and "measured 256 B, estimated 256 B" in out


def test_json_has_every_stage_and_the_verdict(tmp_path):
    out = tmp_path / "debug.json"
    run(*ARGS, "--format", "json", "-o", str(out))
    doc = json.loads(out.read_text())
    assert doc["program"]["stages"] == 2 and doc["agree"] is True and doc["divergence"] is None
    assert [s["stage"] for s in doc["stages"]] == [0, 1]
    assert [v["value"] for v in doc["stages"][1]["comparison"]["values"]] == ["e", "f", "g", "h", "i"]
    assert doc["findings"] == [] and doc["nonfinite"] is None
    assert [s["measured_bytes"] for s in doc["profile"]["stages"]] == [0, 256]


def test_arrays_from_files_and_a_non_finite_value(tmp_path):
    a = np.arange(128, dtype=np.float32).reshape(16, 8)
    a[3, 2] = np.inf
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", np.ones((16, 8), np.float32))
    result = run("--arg", f"@{tmp_path / 'a.npy'}@P(i,j)", "--arg", f"@{tmp_path / 'b.npy'}", check=False)
    assert "first non-finite: argument a holds inf: a[3, 2] on device 0 (i=0, j=0)" in result.stdout
    assert result.returncode == 1 and "found a non-finite value (exit status 1)" in result.stderr


def test_save_stage(tmp_path):
    out = run(*ARGS, "--save-stage", "1", str(tmp_path / "repro")).stdout
    assert f"stage 1 saved: python {tmp_path / 'repro' / 'run_stage_1.py'}" in out
    assert (tmp_path / "repro" / "stage_1.jax_export").is_file()


def test_interactive_prompt():
    commands = "\n".join(["break e", "break", "continue", "print c", "blocks e", "print zz", "print", "print 4",
                          "next", "where", "compare", "quit"]) + "\n"
    out = run(*ARGS, "--interactive", stdin=commands).stdout
    assert "breakpoint before stage 1" in out
    assert "stage 0: 2 ops (add, sub)" in out and "next: stage 1 of 2" in out
    assert "c =\n" in out
    assert "NotComputedError: e is computed by stage 1, which has not run yet" in out
    assert "UnknownValueError: no value 'zz'" in out
    assert "before stage 1: e" in out and "usage: print NAME" in out
    assert "stage 1: 5 ops" in out and "finished" in out
    assert "all 7 values agree" in out


@pytest.mark.parametrize("extra,message", [
    (["--arg", "f32[16,8]@P(i,j)"], "TraceError: tracing 'f' failed"),
    (["--arg", "@/no/such/file.npy@P(i)", "--arg", "f32[16,8]"], "cannot read '/no/such/file.npy'"),
    ([*ARGS, "--save-stage", "7", "/tmp/x"], "StageIndexError: no stage 7: this program has 2 stages"),
    ([*ARGS, "--repeats", "0"], "--repeats 0"),
    ([*ARGS, "--interactive", "--format", "json"], "--interactive is a text prompt"),
])
def test_bad_input_is_a_one_line_error(extra, message):
    result = run(*extra, check=False)
    assert result.returncode == 2, result.stdout
    assert message in result.stderr and "Traceback" not in result.stderr


LOSS = Path(__file__).parent / "cli_loss_example.py"
LOSS_SPECS = ["--in-specs", "(None, P('i'), P('i'))"]  # parameters unannotated, the batch over i


def debug_loss(function, *extra, stdin=None):
    """``shardprop debug`` on a function of (params dict, tokens, targets) from tests/cli_loss_example.py."""
    return shardprop("debug", f"{LOSS}:{function}", "--mesh", "i=8", "--repeats", "1", *extra, stdin=stdin)


def test_a_loss_over_a_params_dict_agrees_with_the_unsharded_function_and_exits_0(tmp_path):
    out = tmp_path / "debug.json"
    result = debug_loss("loss_fn", "--args", f"{LOSS}:make_args", *LOSS_SPECS, "--format", "json", "-o", str(out))
    assert result.returncode == 0, result.stderr
    doc = json.loads(out.read_text())
    assert doc["agree"] is True and doc["divergence"] is None and doc["findings"] == [] and doc["nonfinite"] is None
    sources = {i["source"]: i["spec"] for stage in doc["stages"] for i in stage["inputs"]}
    assert sources["tokens"] == sources["targets"] == "P('i',)"   # named as the function names them


def test_the_loss_it_computes_from_an_npz_is_the_unsharded_loss(tmp_path):
    """The parameters from an .npz, the batch from the example module: the value `print` shows at the prompt
    is what loss_fn gives unsharded on one device."""
    import shardprop as sp
    from shardprop.expr.graph import value_name
    from tests.cli_loss_example import loss_fn, make_args

    args = make_args()
    np.savez(tmp_path / "params.npz", **args[0])
    prog = sp.autoshard(loss_fn, mesh=sp.make_mesh((8,), ("i",)), in_specs=(None, P("i"), P("i"))).trace(*args)
    name = value_name(prog.plan.graph.outputs[0])  # the loss, as the listing names it
    result = debug_loss("loss_fn", "--args", str(tmp_path / "params.npz"), "--args", f"{LOSS}:make_batch_only",
                        *LOSS_SPECS, "--interactive", stdin=f"continue\nprint {name}\nquit\n")
    assert result.returncode == 0, result.stderr
    printed = result.stdout.split(f"{name} =\n")[1].split("\n")[0]
    np.testing.assert_allclose(float(printed), float(loss_fn(*args)), rtol=1e-5)


def test_a_planted_nan_exits_1_and_a_clean_run_0():
    """The parameters as ShapeDtypeStructs (filled from --seed); the log of a negative number is found."""
    planted = debug_loss("nan_loss", "--args", f"{LOSS}:make_shapes", *LOSS_SPECS)
    assert planted.returncode == 1, planted.stderr
    assert "first non-finite: `log` at cli_loss_example.py:" in planted.stdout
    assert "found a non-finite value (exit status 1)" in planted.stderr and "Traceback" not in planted.stderr
    clean = debug_loss("loss_fn", "--args", f"{LOSS}:make_shapes", *LOSS_SPECS)
    assert clean.returncode == 0, clean.stderr
    assert "values agree with the unsharded function" in clean.stdout and "first non-finite" not in clean.stdout


def test_a_bad_pytree_argument_is_a_one_line_error():
    result = debug_loss("loss_fn", "--args", f"{LOSS}:make_dict")
    assert result.returncode == 2 and "make_dict() returned a dict, not a tuple" in result.stderr
    assert "Traceback" not in result.stderr
