"""Planted faults are found: a wrong lowering step by ``first_divergence``, a false replication claim by
``check``, a NaN by ``first_nonfinite`` — each naming the node and its source line. The bugs are planted with
monkeypatch in these tests only."""

import dataclasses
import warnings
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import shardprop as sp
from shardprop.backends import evaluate
from shardprop.debug import FindingKind
from tests.functions import nx_example
from tests.inspection import nx_example as nx_module

RNG = np.random.default_rng(5)
A = RNG.normal(size=(16, 8)).astype(np.float32)
B = RNG.normal(size=(16, 8)).astype(np.float32)


def _line_of(text: str) -> int:
    lines, start = inspect.getsourcelines(nx_module.f)
    return start + next(k for k, line in enumerate(lines) if text in line)


def _plant_wrong_per_block(monkeypatch, op: str, wrong):
    """The per-block piece of ``op`` replaced by ``wrong`` (a lowering bug), for the stages compiled now."""
    real_lookup = evaluate.lookup

    def lookup(name):
        record = real_lookup(name)
        return dataclasses.replace(record, per_block=wrong) if name == op else record

    monkeypatch.setattr(evaluate, "lookup", lookup)


@pytest.mark.parametrize("strategy", ["gather", "collective"])
def test_first_divergence_names_the_node_a_planted_lowering_bug_produced(monkeypatch, meshes, strategy):
    prog = sp.autoshard(nx_example, mesh=meshes["4x2"], in_specs=(P("i", "j"), None), strategy=strategy).trace(A, B)
    _plant_wrong_per_block(monkeypatch, "sub", lambda node, invals, blocks: [invals[0] + invals[1]])
    dbg = sp.Debugger(prog, A, B)
    found = dbg.first_divergence()
    assert found is not None
    assert found.where.name == "d" and found.where.op == "sub"
    assert found.where.source.endswith(f"nx_example.py:{_line_of('y = a - b')}")
    assert found.error.max_abs > 0.1
    assert len(found.blocks) == 8  # every device computed a + b on its block
    text = str(found)
    assert "first divergence: d:f32" in text and "`sub`" in text and "nx_example.py" in text
    assert "a:f32[16@i,8@j]" in text and "rule elementwise" in text
    # later nodes differ too, but only because d does: the table shows them all
    table = dbg.compare()
    assert [r.where.name for r in table.disagreeing][0] == "d"
    assert not table.agree and "FAULT" in str(table) and "differs" in str(table)
    assert table.fault.where.name == "d"


def test_a_missing_psum_is_found_by_first_divergence_and_by_check(monkeypatch, meshes):
    prog = sp.autoshard(nx_example, mesh=meshes["4x2"], in_specs=(P("i", "j"), None),
                        strategy="collective").trace(A, B)
    summed = [n for n in prog.sharded.graph.nodes if prog.plan.collective(n.id) is not None]
    assert [n.op for n in summed] == ["reduce_sum", "reduce_sum"]
    # The lowering step that finishes partial sums forgets to: each device keeps its partial sum while the
    # plan says the result is replicated over the reduced mesh axis (a false replication claim).
    real_step = evaluate.apply_step
    monkeypatch.setattr(evaluate, "apply_step", lambda x, step, mesh_shape: x if step.kind == "psum" else
                        real_step(x, step, mesh_shape))
    dbg = sp.Debugger(prog, A, B)
    dbg.run()
    found = dbg.first_divergence()
    assert found.where.name == "e" and found.where.op == "reduce_sum"
    assert found.where.source.endswith(f"nx_example.py:{_line_of('z = jnp.sum(x, axis=1)')}")
    assert any("finished by psum[j] e" in line for line in found.decision)
    # both sums are at fault; what is computed from them only inherits the difference
    table = dbg.compare()
    assert [r.where.name for r in table.rows if r.fault] == ["e", "f"]
    assert [r.status for r in table.rows] == ["ok", "ok", "FAULT", "FAULT", "differs", "differs", "differs"]
    findings = dbg.check()
    assert findings, "the false replication claim went unnoticed"
    first = findings[0]
    assert first.kind is FindingKind.REPLICAS_DIFFER
    assert first.where.name == "e" and first.where.rule == "reductions.reduction"
    assert "replicated over j" in first.detail and len(first.devices) == 2
    assert {f.where.name for f in findings} >= {"e", "f"}
    assert "nx_example.py" in str(first)


def test_check_finds_nothing_on_a_correct_program(meshes):
    prog = sp.autoshard(nx_example, mesh=meshes["4x2"], in_specs=(P("i", "j"), None),
                        strategy="collective").trace(A, B)
    dbg = sp.Debugger(prog, A, B)
    assert dbg.check() == []  # nothing computed but the arguments, which hold
    dbg.run()
    assert dbg.check() == []


def _logs(x):
    y = x * 2.0
    z = jnp.log(y)
    return jnp.sum(z, axis=0), y


def test_first_nonfinite_names_the_log_of_a_negative_number(meshes):
    x = np.abs(RNG.normal(size=(16, 8))).astype(np.float32) + 0.5
    x[9, 5] = -1.0
    prog = sp.autoshard(_logs, mesh=meshes["4x2"], in_specs=(P("i", "j"),)).trace(x)
    found = sp.Debugger(prog, x).first_nonfinite()
    assert found is not None
    assert found.where.op == "log" and found.index == (9, 5)
    assert np.isnan(found.element)
    line = inspect.getsourcelines(_logs)[1] + 2
    assert found.where.source.endswith(f"test_faults.py:{line}")
    mesh = meshes["4x2"]
    assert found.device == int(mesh.devices[2, 1].id) and found.coords == {"i": 2, "j": 1}
    text = str(found)
    assert "`log`" in text and f"test_faults.py:{line}" in text and "[9, 5]" in text and "device" in text


def test_first_nonfinite_is_none_when_everything_is_finite(meshes):
    x = np.abs(RNG.normal(size=(16, 8))).astype(np.float32) + 0.5
    prog = sp.autoshard(_logs, mesh=meshes["4x2"], in_specs=(P("i", "j"),)).trace(x)
    assert sp.Debugger(prog, x).first_nonfinite() is None


def test_bfloat16_values_are_compared_as_floats_with_their_own_precision(meshes):
    x = np.abs(RNG.normal(size=(16, 8))).astype(jnp.bfloat16) + 1
    x[3, 5] = -1
    prog = sp.autoshard(lambda x: jnp.sqrt(x) * 2, mesh=meshes["4x2"], in_specs=(P("i", "j"),)).trace(x)
    dbg = sp.Debugger(prog, x)
    assert dbg.first_divergence() is None and dbg.compare().agree  # NaN in both: agrees
    found = dbg.first_nonfinite()
    assert found.where.op == "sqrt" and found.index == (3, 5)
    assert dbg.check() == []  # NaN replicas are equal replicas
    from shardprop.debug.reference import Tolerance, errors

    got, want = np.array([100.0, 1.0], np.float32), np.array([100.5, 1.0], np.float32)
    assert errors(got, want, Tolerance(rtol=0.1))[2]
    assert errors(got, want, Tolerance(), dtype=jnp.bfloat16)[2]       # 0.5% is within 100 bfloat16 ulps
    assert not errors(got, want, Tolerance(), dtype=np.float32)[2]     # ... but not within 100 float32 ulps


def test_check_finds_a_block_that_is_not_where_its_shard_ranges_say(monkeypatch, meshes):
    prog = sp.autoshard(nx_example, mesh=meshes["4x2"], in_specs=(P("i", "j"), None)).trace(A, B)
    dbg = sp.Debugger(prog, A, B)
    dbg.run()
    real = dbg.block_ranges

    def swapped(v, block, layout=None):  # a shard model that puts c's row blocks 0 and 1 the wrong way round
        if v == 2 and block[0] in (0, 1):
            block = (1 - block[0], *block[1:])
        return real(v, block, layout)

    monkeypatch.setattr(dbg, "block_ranges", swapped)
    findings = dbg.check()
    assert {f.kind for f in findings} == {FindingKind.BLOCK_MISPLACED}
    assert {f.where.name for f in findings} == {"c"} and len(findings) == 4
    assert "is not the global value's slice [4:8, 0:4]" in findings[0].detail


def test_analyses_read_what_the_step_returned(meshes):
    calls = []

    def flaky(v):  # a host callback that gives NaN from its second call on
        calls.append(1)
        return np.asarray(v) * 2 + (np.nan if len(calls) > 1 else 0)

    def f(x):
        return jax.pure_callback(flaky, jax.ShapeDtypeStruct(x.shape, x.dtype), x).sum()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sp.FallbackWarning)
        prog = sp.autoshard(f, mesh=meshes["4x2"], in_specs=(P("i", "j"),)).trace(A)
    dbg = sp.Debugger(prog, A)
    dbg.run()
    assert not np.isnan(np.asarray(dbg.value("b"))).any()
    assert dbg.first_nonfinite() is None  # the read-out re-runs the stage, but keeps the step's outputs


@pytest.mark.parametrize("keep", ["outputs", "all"])
def test_comparisons_follow_reset_and_running_backwards(meshes, keep):
    prog = sp.autoshard(nx_example, mesh=meshes["4x2"], in_specs=(P("i", "j"), None), strategy="gather").trace(A, B)
    dbg = sp.Debugger(prog, A, B, keep=keep)
    dbg.step()
    assert [r.where.name for r in dbg.compare().rows] == ["c", "d"]
    assert len(dbg.compare(rtol=1e-3).rows) == 2
    dbg.run_to(2)
    assert len(dbg.compare().rows) == 7 and len(dbg.compare(rtol=1e-3).rows) == 7
    dbg.run_to(1)   # behind: starts again
    assert [r.where.name for r in dbg.compare().rows] == ["c", "d"]
    dbg.reset()
    assert len(dbg.compare().rows) == 7  # nothing run: the whole program first
    assert dbg.compare().agree and dbg.check() == []


@pytest.mark.parametrize("fill", [-1e9, -np.inf], ids=["-1e9", "-inf"])
def test_a_fault_in_a_causal_mask_is_found_beside_its_fill(monkeypatch, meshes, fill):
    """The masked branch's fill sets no tolerance for the scores beside it: a select that gets the scores wrong (0.5
    off where it keeps them) is the first fault, whether the mask fills -1e9 or -inf (#52's review: the operands'
    magnitudes had made every element's tolerance the fill's)."""
    def attention(q, k):
        scores = q @ k.T
        keep = jnp.tril(jnp.ones(scores.shape, bool))
        return jax.nn.softmax(jnp.where(keep, scores, fill), axis=-1)

    q, k = RNG.normal(size=(16, 8)).astype(np.float32), RNG.normal(size=(16, 8)).astype(np.float32)
    prog = sp.autoshard(attention, mesh=meshes["4x2"], in_specs=(P("i"), None)).trace(q, k)
    def wrong(node, invals, blocks):  # (the float select only: jnp.tril's own select of booleans stays right)
        off = 0.5 if jnp.issubdtype(invals[2].dtype, jnp.floating) else False
        return [jnp.where(invals[0], invals[2] + off, invals[1])]

    _plant_wrong_per_block(monkeypatch, "select_n", wrong)
    dbg = sp.Debugger(prog, q, k)
    found = dbg.first_divergence()
    assert found is not None, dbg.compare().summary()
    assert found.where.op == "select_n", str(found)
