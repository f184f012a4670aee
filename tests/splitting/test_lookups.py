"""Lookups along a sharded axis (``finish_gather``): each device looks up the indices that fall in its block and a
``psum`` combines them, instead of gathering the operand — vocabulary-parallel cross-entropy and embedding tables
sharded by vocabulary. Oracle: the unsharded function on the same inputs, exactly (one device contributes each
element, the others add zero; a -0.0 comes back +0.0, as from jax.jit's lookup)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import shardprop as sp
from tests.conftest import assert_same_as_unsharded, random_args


def _cross_entropy(logits, labels):
    lse = jax.nn.logsumexp(logits, axis=-1)
    return jnp.mean(lse - jnp.take_along_axis(logits, labels[:, None], axis=1)[:, 0])


def _optax_cross_entropy(logits, labels):
    optax = pytest.importorskip("optax")
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def _labels(n, classes, seed=0):
    return np.random.default_rng(seed).integers(0, classes, size=n).astype(np.int32)


@pytest.mark.covering
@pytest.mark.parametrize("strategy", ["collective", "auto"])
@pytest.mark.parametrize("loss", [_cross_entropy, _optax_cross_entropy, jax.grad(_cross_entropy)],
                         ids=["take_along_axis", "optax", "gradient"])
def test_vocabulary_parallel_cross_entropy_never_gathers_the_logits(loss, strategy, meshes):
    """Logits sharded over the batch (i) and the classes (j): the max and the sum of the logsumexp and the label
    lookup are each finished by an all-reduce of a per-row value, as jax.jit does (issue #17: 4-5x jit's bytes)."""
    (logits,) = random_args([((32, 256), np.float32)])
    args = (logits, _labels(32, 256))
    prog = assert_same_as_unsharded(loss, args, mesh=meshes["4x2"], in_specs=(P("i", "j"), P("i")),
                                    strategy=strategy)
    assert {t.kind for t in prog.communication()} == {"all-reduce"}
    assert max(t.bytes for t in prog.communication()) <= 32 * 4  # one f32 per row of the device's batch block
    comparison = sp.compare_with_jit(loss, meshes["4x2"], (P("i", "j"), P("i")), *args, strategy=strategy)
    assert comparison.shardprop_bytes <= comparison.jit_bytes


def _embedding_table(vocab, width, dtype=np.float32):
    table = np.arange(vocab * width, dtype=np.float64).reshape(vocab, width) / 7 - 3
    return table.astype(dtype)


@pytest.mark.covering
@pytest.mark.parametrize("mode", ["fill", "clip", "wrap", "promise_in_bounds"])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
@pytest.mark.parametrize("mesh_name,table_spec", [("4x2", P("j")), ("8", P("i")), ("2x2x2", P(("k", "i")))])
def test_an_embedding_table_sharded_by_vocabulary_is_looked_up_per_block(mesh_name, table_spec, dtype, mode, meshes):
    """Every index mode as the unsharded gather gives it, out-of-bounds indices included: ``fill`` gives the fill
    value (NaN, the int minimum) once, ``clip`` the edge row."""
    table = _embedding_table(64, 8, dtype)
    ids = np.array([0, 1, 63, 17, 40, 1, 62, 33], np.int32)
    if mode != "promise_in_bounds":
        ids = np.array([0, 1, -1, 64, 70, -65, 63, 17], np.int32)  # past both ends

    def lookup(table, ids):
        if mode == "promise_in_bounds":  # jnp.take does not take it
            return table.at[ids].get(mode=mode)
        return jnp.take(table, ids, axis=0, mode=mode)

    fs = sp.autoshard(lookup, mesh=meshes[mesh_name], in_specs=(table_spec, None), strategy="collective")
    got, want = np.asarray(fs(table, ids)), np.asarray(lookup(jnp.asarray(table), jnp.asarray(ids)))
    np.testing.assert_array_equal(got, want)
    prog = fs.trace(table, ids)
    assert [t.kind for t in prog.communication()] == ["all-reduce"]
    assert "all-gather" not in prog.hlo()


def test_auto_sums_the_looked_up_rows_instead_of_gathering_the_table(meshes):
    """The cost model's choice: an all-reduce of the batch's rows (16x64 floats per device) against the
    all-gather of a 512x64 table — and the compiled program moves no more than jax.jit's."""
    (table,) = random_args([((512, 64), np.float32)])
    ids = _labels(64, 512)

    def loss(table, ids):
        return jnp.tanh(jnp.take(table, ids, axis=0)).sum()

    prog = assert_same_as_unsharded(loss, (table, ids), mesh=meshes["4x2"], in_specs=(P("j"), P("i")))
    assert [(t.kind, t.shape) for t in prog.communication()][0] == ("all-reduce", (16, 64))
    assert "all-gather" not in prog.hlo()
    comparison = sp.compare_with_jit(loss, meshes["4x2"], (P("j"), P("i")), table, ids)
    assert comparison.shardprop_bytes <= comparison.jit_bytes


def test_two_sharded_indexed_axes_are_looked_up_in_the_block_holding_both(meshes):
    (x,) = random_args([((16, 8), np.float32)])
    rows, cols = np.array([0, 15, 7, 3, 9], np.int32), np.array([7, 0, 3, 3, 5], np.int32)
    prog = assert_same_as_unsharded(lambda x: x[rows, cols], (x,), mesh=meshes["4x2"], in_specs=(P("i", "j"),),
                                    strategy="collective", rtol=0, atol=0)
    assert [(c.kind, set(c.mesh_axes)) for c in prog.plan.collectives.values()] == [("psum", {"i", "j"})]


def test_a_lookup_in_booleans_keeps_its_gather(meshes):
    """No sum combines booleans exactly as a lookup would: the table is gathered (correct, and still checked)."""
    mask = np.arange(64) % 3 == 0
    ids = np.array([0, 3, 5, 63], np.int32)
    prog = assert_same_as_unsharded(lambda m: m[ids], (mask,), mesh=meshes["8"], in_specs=(P("i"),),
                                    strategy="collective")
    assert not prog.plan.collectives


@pytest.mark.covering
@pytest.mark.parametrize("mode", [None, "clip", "drop", "promise_in_bounds"])
@pytest.mark.parametrize("method", ["set", "add", "mul", "min", "max"])
@pytest.mark.parametrize("mesh_name,spec", [("8", P("i")), ("4x2", P("j", "i")), ("2x2x2", P(("k", "i")))])
def test_a_scatter_into_a_sharded_axis_updates_each_block_in_place(mesh_name, spec, method, mode, meshes):
    """``x.at[idx].op(v)`` on an axis sharded over the mesh: each device applies the updates landing in its block
    (indices shifted, the others dropped; clamped first under ``clip``) — no gather of x, and exactly the unsharded
    result, out-of-bounds and negative indices included."""
    (x,) = random_args([((16, 8), np.float32)])
    idx = np.array([0, 3, 15, 3, 9] if mode == "promise_in_bounds" else [0, 3, 15, 3, -2, 16, 40, -40], np.int32)
    v = np.arange(len(idx) * 8, dtype=np.float32).reshape(len(idx), 8) - 7

    def f(x):
        return getattr(x.at[idx], method)(v, mode=mode)

    fs = sp.autoshard(f, mesh=meshes[mesh_name], in_specs=(spec,), strategy="collective")
    want = np.asarray(f(jnp.asarray(x)))
    if method == "set" and mode == "promise_in_bounds":
        want = np.asarray(jax.jit(f)(x))  # repeated indices: XLA's order, the same on every device
    np.testing.assert_array_equal(np.asarray(fs(x)), want)
    prog = fs.trace(x)
    assert not prog.communication()
    assert prog.out_specs == (spec,)


@pytest.mark.parametrize("strategy", ["collective", "auto"])
def test_the_cross_entropy_gradient_scatters_into_each_class_block(strategy, meshes):
    """The integer-label gradient scatter-adds -1/B at each row's label into zeros of the logits' shape: with the
    classes sharded each device builds only its block of it (it built the whole [B, V] array before, 8x the work)."""
    (logits,) = random_args([((64, 256), np.float32)])
    prog = assert_same_as_unsharded(jax.grad(_cross_entropy), (logits, _labels(64, 256)), mesh=meshes["8"],
                                    in_specs=(P(None, "i"), P()), strategy=strategy)
    graph = prog.plan.graph
    scatters = [n for n in graph.nodes if n.op == "scatter-add" and len(graph.avals[n.output].shape) == 2]
    assert scatters and all(prog.plan.layout(n.output) == ((), ("i",)) for n in scatters)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16])
def test_narrow_indices_into_a_sharded_axis_are_widened_before_they_are_shifted(dtype, meshes):
    """Found by review: a block's offset (256) and the axis's end (511) do not fit uint8 / int8 indices."""
    ids = np.array([5, 100, 120, 127], dtype)
    scatter = (lambda t, i: t.at[i].add(1.0),) if dtype != np.int8 else ()  # jnp refuses int8 into 512 rows
    for f in (lambda t, i: jnp.take(t, i, axis=0), *scatter):
        assert_same_as_unsharded(f, (np.arange(512, dtype=np.float32), ids), mesh=meshes["8"], in_specs=(P("i"), None),
                                 strategy="collective", rtol=0, atol=0)


def test_a_lookup_in_sharded_prng_keys_keeps_its_gather(meshes):
    """Found by review: keys cannot be summed (a LoweringError before: the empty kind of a key dtype is "in" every
    string)."""
    keys = jax.random.split(jax.random.key(3), 16)
    ids = np.array([0, 7, 9, 15], np.int32)
    for strategy in ("collective", "auto"):
        got = sp.autoshard(lambda ks, i: jax.random.key_data(ks[i]), mesh=meshes["8"], in_specs=(P("i"), None),
                           strategy=strategy)(keys, ids)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(jax.random.key_data(keys[ids])))
