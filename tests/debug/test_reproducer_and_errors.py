"""A saved stage runs in a fresh process with only JAX and gives the same output; bad input to the debugger is a
ShardingError naming the problem."""

import json
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import shardprop as sp
from tests.functions import nx_example

RNG = np.random.default_rng(11)
A = RNG.normal(size=(16, 8)).astype(np.float32)
B = RNG.normal(size=(16, 8)).astype(np.float32)


@pytest.fixture(scope="module")
def prog(meshes):
    return sp.autoshard(nx_example, mesh=meshes["4x2"], in_specs=(P("i", "j"), None), strategy="gather").trace(A, B)


def test_saved_stage_reruns_in_a_fresh_process(prog, tmp_path):
    dbg = sp.Debugger(prog, A, B)
    script = dbg.save_stage(1, tmp_path / "repro")
    assert dbg.stage is None  # it ran the stages it needed
    names = sorted(p.name for p in script.parent.iterdir())
    assert names == ["run_stage_1.py", "stage_1.jax_export", "stage_1.json", "stage_1_data.npz"]
    manifest = json.loads((script.parent / "stage_1.json").read_text())
    assert manifest["mesh_shape"] == [4, 2] and manifest["mesh_axes"] == ["i", "j"]
    assert [e["spec"] for e in manifest["inputs"]] == [["i", "j"], ["i", "j"]]  # as the stage's inputs are held
    saved = np.load(script.parent / "stage_1_data.npz")
    np.testing.assert_allclose(saved["out_0"], np.asarray(nx_example(A, B)), rtol=1e-5, atol=1e-5)
    # a fresh interpreter, no shardprop on its path: the script needs only jax
    run = subprocess.run([sys.executable, "-I", str(script)], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "i: float32[16, 8] matches the saved output" in run.stdout


def test_saved_stage_reports_a_changed_output(prog, tmp_path):
    script = sp.Debugger(prog, A, B).save_stage(0, tmp_path)
    data = dict(np.load(tmp_path / "stage_0_data.npz"))
    data["out_1"] = data["out_1"] + 1  # pretend the stage once gave something else
    np.savez(tmp_path / "stage_0_data.npz", **data)
    run = subprocess.run([sys.executable, "-I", str(script)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 1 and "d: float32[16, 8] DIFFERS" in run.stdout


def test_save_stage_into_an_unwritable_directory(prog, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(sp.ArtifactError, match="cannot write stage 0"):
        sp.Debugger(prog, A, B).save_stage(0, blocker / "repro")


def test_unknown_names_suggest_close_ones(prog):
    dbg = sp.Debugger(prog, A, B)
    with pytest.raises(sp.UnknownValueError, match="did you mean 'e'"):
        dbg.value("ee")
    with pytest.raises(sp.UnknownValueError, match="no value 'zz'"):
        dbg.blocks("zz")
    with pytest.raises(sp.UnknownValueError):
        dbg.break_at(99)
    assert isinstance(sp.UnknownValueError("x"), sp.ShardingError)


def test_nodes_are_addressed_by_name_id_or_node(prog):
    dbg = sp.Debugger(prog, A, B)
    dbg.run()
    graph = prog.sharded.graph
    node = graph.nodes[graph.producer[4]]
    np.testing.assert_array_equal(np.asarray(dbg.value(node)), np.asarray(dbg.value("e")))
    np.testing.assert_array_equal(np.asarray(dbg.value(4)), np.asarray(dbg.value("e")))


@pytest.mark.parametrize("k", [2, -1, "1", 1.0, True])
def test_stage_index_out_of_range(prog, k):
    dbg = sp.Debugger(prog, A, B)
    with pytest.raises(sp.StageIndexError, match="2 stages"):
        dbg.save_stage(k, "/tmp/never")
    with pytest.raises(sp.StageIndexError):
        dbg.run_to(k if k != 2 else 3)


def test_arguments_that_do_not_match_the_program(prog):
    with pytest.raises(sp.InputMismatchError, match="traced with"):
        sp.Debugger(prog, A[:8], B)
    with pytest.raises(sp.InputMismatchError):
        sp.Debugger(prog, A)
    with pytest.raises(sp.OptionError, match="keep="):
        sp.Debugger(prog, A, B, keep="everything")
    with pytest.raises(sp.OptionError, match="runs a Program"):
        sp.Debugger(prog.plan, A, B)


def test_stepping_past_the_end_and_breaking_at_an_argument(prog):
    dbg = sp.Debugger(prog, A, B)
    with pytest.raises(sp.OptionError, match="argument 0"):
        dbg.break_at("a")
    dbg.run()
    with pytest.raises(sp.NotComputedError, match="reset"):
        dbg.step()


@pytest.mark.parametrize("options", [{"rtol": "x"}, {"rtol": -1}, {"atol": float("nan")}, {"rtol": True}])
def test_tolerances_are_checked(prog, options):
    with pytest.raises(sp.OptionError, match="expected a finite number >= 0"):
        sp.Debugger(prog, A, B).compare(**options)


@pytest.mark.parametrize("repeats", [0, -1, 2.5, True])
def test_profile_repeats_are_checked(prog, repeats):
    with pytest.raises(sp.OptionError, match="at least 1"):
        sp.Debugger(prog, A, B).profile(repeats)


def test_a_program_without_stages(meshes):
    prog = sp.autoshard(lambda x: x, mesh=meshes["4x2"], in_specs=(P("i"),)).trace(A)
    dbg = sp.Debugger(prog, A)
    assert dbg.done and dbg.run() == []
    with pytest.raises(sp.NotComputedError, match="no stages: its outputs are its arguments"):
        dbg.step()
    with pytest.raises(sp.StageIndexError, match="has no stages"):
        dbg.save_stage(0, "/tmp/never")
    np.testing.assert_array_equal(np.asarray(dbg.outputs), A)
    assert dbg.compare().rows == () and dbg.first_divergence() is None


def test_first_nonfinite_can_skip_the_arguments(meshes):
    x = A.copy()
    x[0, 0] = np.nan
    prog = sp.autoshard(lambda x: jnp.sqrt(x - 1), mesh=meshes["4x2"], in_specs=(P("i"),)).trace(x)
    dbg = sp.Debugger(prog, x)
    assert dbg.first_nonfinite().where.op == "parameter"
    found = dbg.first_nonfinite(arguments=False)
    assert found.where.op == "sub" and found.index == (0, 0)


def test_relative_error_is_infinite_where_the_reference_is_zero():
    from shardprop.debug.reference import Tolerance, errors

    got, ref = np.array([1e-9, 2.0], np.float32), np.array([0.0, 2.0], np.float32)
    max_abs, max_rel, agrees = errors(got, ref, Tolerance())
    assert max_rel == float("inf") and max_abs == pytest.approx(1e-9)
    assert errors(np.array([np.nan]), np.array([1.0]), Tolerance())[2] is False
    assert errors(np.array([np.nan, np.inf]), np.array([np.nan, np.inf]), Tolerance()) == (0.0, 0.0, True)


def test_the_readme_walk(prog):
    dbg = sp.Debugger(prog, A, B)
    assert dbg.break_at("i") == 1
    dbg.run()
    assert dbg.stage == 1 and not dbg.done
    assert dbg.step().stage == 1 and dbg.done
    np.testing.assert_array_equal(np.asarray(dbg.outputs), np.asarray(prog(A, B)))
