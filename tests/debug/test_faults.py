"""Planted faults are found: a wrong lowering step by ``first_divergence``, a false replication claim by
``check``, a NaN by ``first_nonfinite`` — each naming the node and its source line. The bugs are planted with
monkeypatch in these tests only."""

import dataclasses
import inspect

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
    monkeypatch.setattr(evaluate, "finish", lambda node, invals, outs, collective, mesh_shape: outs)
    dbg = sp.Debugger(prog, A, B)
    dbg.run()
    found = dbg.first_divergence()
    assert found.where.name == "e" and found.where.op == "reduce_sum"
    assert found.where.source.endswith(f"nx_example.py:{_line_of('z = jnp.sum(x, axis=1)')}")
    assert any("psum over j" in line for line in found.decision)
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
