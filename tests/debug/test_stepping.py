"""Stepping a program stage by stage reproduces ``prog(*args)`` and the unsharded function; every value's
blocks reassemble to it; the debugger leaves the program as it found it."""

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import shardprop as sp
from shardprop.examples import attention, mlp
from tests.functions import nx_example

RNG = np.random.default_rng(3)
A = np.arange(128.0, dtype=np.float32).reshape(16, 8)
B = RNG.normal(size=(16, 8)).astype(np.float32)
X = RNG.normal(size=(16, 32)).astype(np.float32)
LABELS = RNG.integers(0, 10, size=16).astype(np.int32)
SEQ = RNG.normal(size=(8, 16, 32)).astype(np.float32)


def _mlp_specs():
    hidden = "k"
    params = [{"w": P(None, hidden), "b": P(hidden)}, {"w": P(hidden, None), "b": P()}]
    return params, P(("i", "j")), P(("i", "j"))


def _block_specs():
    col, row = P(None, "j"), P("j", None)
    return ({"wq": col, "wk": col, "wv": col, "wo": row, "w1": col, "b1": P("j"), "w2": row, "b2": None,
             "ln1_g": None, "ln1_b": None, "ln2_g": None, "ln2_b": None}, P("i"))


CASES = [
    ("nx_gather", nx_example, (A, B), "4x2", (P("i", "j"), None), "gather"),
    ("nx_collective", nx_example, (A, B), "4x2", (P("i", "j"), None), "collective"),
    ("mlp_train_step_2d", mlp.train_step, (mlp.init_params(), X, LABELS), "2x2x2", _mlp_specs(), "auto"),
    ("transformer_block", attention.transformer_block, (attention.init_block(), SEQ), "4x2", _block_specs(), "auto"),
]


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


@pytest.mark.parametrize("name,f,args,mesh_name,specs,strategy", CASES, ids=[c[0] for c in CASES])
def test_stepping_every_stage_reproduces_the_program_and_the_unsharded_function(
        name, f, args, mesh_name, specs, strategy, meshes):
    prog = sp.autoshard(f, mesh=meshes[mesh_name], in_specs=specs, strategy=strategy).trace(*args)
    whole = prog(*args)
    dbg = sp.Debugger(prog, *args)
    reports = []
    while not dbg.done:
        assert dbg.stage == len(reports)
        reports.append(dbg.step())
    assert [r.stage for r in reports] == list(range(len(prog.stages)))
    got = dbg.outputs
    # Same pytree, same shardings, same numbers as the whole program ...
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(whole)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(whole), strict=True):
        assert g.sharding.is_equivalent_to(w.sharding, g.ndim), (g.sharding, w.sharding)
        assert g.dtype == w.dtype and g.weak_type == w.weak_type
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6, atol=1e-6)
    # ... and as the unsharded function (the oracle; float32 sums in another order).
    want = f(*jax.tree_util.tree_map(jax.numpy.asarray, args))
    for g, w in zip(_leaves(got), _leaves(want), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    # The node-by-node comparison agrees, and the plan keeps its promises.
    table = dbg.compare()
    assert table.agree, str(table)
    assert len(table.rows) == sum(1 for n in prog.sharded.graph.nodes if n.op not in ("parameter", "constant"))
    assert dbg.first_divergence() is None
    assert dbg.check() == []
    assert dbg.first_nonfinite() is None


def test_gather_strategy_nx_example_has_zero_error(meshes):
    prog = sp.autoshard(nx_example, mesh=meshes["4x2"], in_specs=(P("i", "j"), None), strategy="gather").trace(A, B)
    table = sp.Debugger(prog, A, B).compare()
    assert table.agree and max(r.max_abs for r in table.rows) == 0.0


@pytest.mark.parametrize("strategy", ["gather", "collective"])
@pytest.mark.parametrize("keep", ["outputs", "all"])
def test_blocks_reassemble_to_the_value_for_every_node(meshes, strategy, keep):
    prog = sp.autoshard(nx_example, mesh=meshes["4x2"], in_specs=(P("i", "j"), None),
                        strategy=strategy).trace(A, B)
    dbg = sp.Debugger(prog, A, B, keep=keep)
    dbg.run()
    graph = prog.sharded.graph
    unsharded = {"c": A + B, "d": A - B}
    for v in range(len(graph.avals)):
        name = graph.value_name(v)
        value = np.asarray(dbg.value(name))
        blocks = dbg.blocks(name)
        assert len(blocks) == 8
        rebuilt = np.full(value.shape, np.nan, value.dtype)
        for block in blocks:
            assert block.data.shape == rebuilt[block.slices].shape
            rebuilt[block.slices] = block.data
            np.testing.assert_array_equal(block.data, value[block.slices])  # each block is its slice
        np.testing.assert_array_equal(rebuilt, value)
        if name in unsharded:
            np.testing.assert_allclose(value, unsharded[name], rtol=1e-6)


def test_blocks_name_devices_coordinates_and_shard_ranges(meshes):
    prog = sp.autoshard(nx_example, mesh=meshes["4x2"], in_specs=(P("i", "j"), None)).trace(A, B)
    dbg = sp.Debugger(prog, A, B)
    blocks = {b.device: b for b in dbg.blocks("a")}
    mesh = meshes["4x2"]
    device = int(mesh.devices[2, 1].id)
    assert blocks[device].coords == {"i": 2, "j": 1}
    assert blocks[device].index == ((8, 12), (4, 8))
    np.testing.assert_array_equal(blocks[device].data, A[8:12, 4:8])
    assert "i=2, j=1" in blocks[device].where()


def test_breakpoints_run_to_reset_and_the_program_is_unchanged(meshes):
    prog = sp.autoshard(nx_example, mesh=meshes["4x2"], in_specs=(P("i", "j"), None), strategy="gather").trace(A, B)
    before = np.asarray(prog(A, B))
    dbg = sp.Debugger(prog, A, B)
    assert dbg.break_at("e") == 1            # e (the row sums) is computed in stage 1
    reports = dbg.run()
    assert [r.stage for r in reports] == [0] and dbg.stage == 1 and not dbg.done
    with pytest.raises(sp.NotComputedError, match="stage 1"):
        dbg.value("e")
    with pytest.raises(sp.NotComputedError):
        _ = dbg.outputs
    assert dbg.run()[-1].stage == 1 and dbg.done and dbg.stage is None
    assert dbg.run() == []
    dbg.run_to(1)                             # behind us: starts again
    assert dbg.stage == 1
    dbg.reset()
    assert dbg.stage == 0
    dbg.run_to(2)
    np.testing.assert_array_equal(np.asarray(dbg.outputs), before)
    np.testing.assert_array_equal(np.asarray(prog(A, B)), before)


def test_step_reports_ops_specs_time_and_bytes(meshes):
    prog = sp.autoshard(nx_example, mesh=meshes["4x2"], in_specs=(P("i", "j"), None), strategy="gather").trace(A, B)
    dbg = sp.Debugger(prog, A, B)
    first, second = dbg.step(), dbg.step()
    assert first.ops == ("add", "sub") and first.collective_bytes == 0
    assert second.ops.count("reduce_sum") == 2
    # the gathers of c over j and of d over i: as the cost model says (64 B + 192 B per device)
    assert second.collective_bytes == pytest.approx(256)
    assert second.wall_time > 0 and second.compile_time > 0
    text = str(second)
    assert "stage 1" in text and "all-gather over j on axis 1 (64 B)" in text and "P('i', 'j')" in text


def test_keep_all_holds_intermediates_and_outputs_recomputes_them(meshes):
    prog = sp.autoshard(nx_example, mesh=meshes["4x2"], in_specs=(P("i", "j"), None),
                        strategy="collective").trace(A, B)
    assert len(prog.stages) == 1
    lazy, eager = sp.Debugger(prog, A, B), sp.Debugger(prog, A, B, keep="all")
    lazy.run()
    eager.run()
    for name in "cdefgh":
        np.testing.assert_array_equal(np.asarray(lazy.value(name)), np.asarray(eager.value(name)))
        assert lazy.value(name).sharding.is_equivalent_to(eager.value(name).sharding, lazy.value(name).ndim)
