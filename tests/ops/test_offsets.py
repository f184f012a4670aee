"""Reads and writes at an offset along a sharded axis (``dynamic_slice``, ``dynamic_update_slice``): the operand stays
sharded. A write lands in the blocks it covers and moves nothing (a KV-cache write); a read moves the slice, not the
operand (each device cuts its part, a psum adds them).

Oracles: the unsharded function on the same inputs (exact: a write copies, a read adds zeros), ``jax.jit`` on the
same input shardings (bytes, from its compiled HLO), our compiled HLO (the estimate).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import shardprop as sp
from shardprop.core.transfers import total_moved
from tests.conftest import assert_like_unsharded

CACHE = np.random.default_rng(0).normal(size=(2, 64, 4, 8)).astype(np.float32)

# (mesh, the cache's spec): the sequence axis over 8 devices; over i with the batch over j
LAYOUTS = [("8", P(None, "i")), ("4x2", P("j", "i"))]
# positions before, inside, on a block's edge, across blocks, past the end (clamped) and negative (clamped)
POSITIONS = [0, 6, 7, 60, 70, -3]


def _check(f, args, mesh, specs):
    fs = sp.autoshard(f, mesh=mesh, in_specs=specs)
    assert_like_unsharded(fs(*args), f, args, rtol=0, atol=0)
    prog = fs.trace(*args)
    comparison = sp.compare_with_jit(f, mesh, specs, *args, program=prog)
    assert total_moved(prog.estimated_communication()) == pytest.approx(comparison.shardprop_bytes)
    return prog, comparison


@pytest.mark.covering
@pytest.mark.parametrize("rows", [1, 13])
@pytest.mark.parametrize("pos", POSITIONS)
@pytest.mark.parametrize("mesh_name,spec", LAYOUTS, ids=[m for m, _ in LAYOUTS])
def test_a_write_at_an_offset_moves_nothing_and_stays_sharded(rows, pos, mesh_name, spec, meshes):
    new = np.random.default_rng(1).normal(size=(2, rows, 4, 8)).astype(np.float32)
    f = lambda cache, new, p: lax.dynamic_update_slice(cache, new, (0, p, 0, 0))  # noqa: E731
    prog, comparison = _check(f, (CACHE, new, np.int32(pos)), meshes[mesh_name], (spec, P(), P()))
    assert prog.out_specs == (spec,)
    assert comparison.shardprop_bytes == 0 <= comparison.jit_bytes, str(comparison)
    if rows > 1:  # jax.jit gathers the cache for a write of several rows (one row it writes in place too)
        assert comparison.jit_bytes > 0, str(comparison)


@pytest.mark.covering
@pytest.mark.parametrize("rows", [1, 5, 13])
@pytest.mark.parametrize("pos", POSITIONS)
@pytest.mark.parametrize("mesh_name,spec", LAYOUTS, ids=[m for m, _ in LAYOUTS])
def test_a_read_at_an_offset_moves_the_slice_not_the_operand(rows, pos, mesh_name, spec, meshes):
    f = lambda cache, p: lax.dynamic_slice_in_dim(cache, p, rows, axis=1) * 2.0  # noqa: E731
    _, comparison = _check(f, (CACHE, np.int32(pos)), meshes[mesh_name], (spec, P()))
    assert comparison.shardprop_bytes < comparison.jit_bytes, str(comparison)


@pytest.mark.covering
@pytest.mark.parametrize("pos", POSITIONS)
@pytest.mark.parametrize("mesh_name,spec", LAYOUTS, ids=[m for m, _ in LAYOUTS])
def test_a_read_at_a_constant_offset_is_a_slice_and_keeps_its_rows_in_place(pos, mesh_name, spec, meshes):
    # the starts are constants: the tracer takes the static slice they name (clamped as lax clamps them), which keeps
    # the sequence axis sharded (realigned to 2 rows a device), as x[:, 6:22] would
    f = lambda cache: lax.dynamic_slice_in_dim(cache, pos, 16, axis=1) * 2.0  # noqa: E731
    prog, comparison = _check(f, (CACHE,), meshes[mesh_name], (spec,))
    assert "dynamic_slice" not in str(prog.graph) and "slice[" in str(prog.graph), str(prog.graph)
    assert prog.out_specs == (spec,)
    assert comparison.shardprop_bytes <= comparison.jit_bytes, str(comparison)


def test_a_kv_cache_step_in_a_loop(meshes):
    """A decoding loop writes one row per step into a sequence-sharded cache and reads it back summed: the cache
    never moves."""
    def decode(cache, x):
        def step(i, carry):
            cache, total = carry
            row = jnp.tanh(x + i.astype(jnp.float32))[:, None]
            cache = lax.dynamic_update_slice(cache, row, (0, i, 0, 0))
            return cache, total + jnp.sum(cache, axis=1)
        return lax.fori_loop(0, 9, step, (cache, jnp.zeros_like(x)))

    x = np.ones((2, 4, 8), np.float32)
    fs = sp.autoshard(decode, mesh=meshes["8"], in_specs=(P(None, "i"), P()))
    got = fs(CACHE, x)
    want = decode(jnp.asarray(CACHE), jnp.asarray(x))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)
    assert got[0].sharding.spec == P(None, "i")
    comparison = sp.compare_with_jit(decode, meshes["8"], (P(None, "i"), P()), CACHE, x)
    assert comparison.shardprop_bytes <= comparison.jit_bytes, str(comparison)


SLICE_WRITES = [
    ("set", lambda c, n: jnp.asarray(c).at[:, 2:10].set(n)),
    ("add_across_blocks", lambda c, n: jnp.asarray(c).at[:, 5:13].add(n)),
    ("multiply_the_tail", lambda c, n: jnp.asarray(c).at[:, 60:].multiply(2.0)),
    ("rows_and_columns", lambda c, n: jnp.asarray(c).at[:, 20:28, 1:3].set(n[:, :, :2])),
    ("max", lambda c, n: jnp.asarray(c).at[:, 3:11].max(n)),
]


@pytest.mark.covering
@pytest.mark.parametrize("mesh_name,spec", LAYOUTS, ids=[m for m, _ in LAYOUTS])
@pytest.mark.parametrize("name,f", SLICE_WRITES, ids=[w[0] for w in SLICE_WRITES])
def test_a_slice_write_is_done_in_place(name, f, mesh_name, spec, meshes):
    """``x.at[2:10].set(v)`` is a scatter of one window: each device writes the rows landing in its block."""
    new = np.random.default_rng(2).normal(size=(2, 8, 4, 8)).astype(np.float32)
    prog, comparison = _check(f, (CACHE, new), meshes[mesh_name], (spec, P()))
    assert prog.out_specs == (spec,)
    assert comparison.shardprop_bytes == 0 < comparison.jit_bytes, str(comparison)


@pytest.mark.covering
@pytest.mark.parametrize("mode", [lax.GatherScatterMode.FILL_OR_DROP, lax.GatherScatterMode.CLIP])
@pytest.mark.parametrize("start", [-1, 0, 7, 56, 57, 70])
def test_a_window_scatter_out_of_range_is_dropped_or_clamped_as_unsharded(mode, start, meshes):
    numbers = lax.ScatterDimensionNumbers(update_window_dims=(0, 1, 2, 3), inserted_window_dims=(),
                                          scatter_dims_to_operand_dims=(1,))
    new = np.random.default_rng(3).normal(size=(2, 8, 4, 8)).astype(np.float32)

    def f(cache, new, s):
        return lax.scatter(cache, jnp.array([s]), new, numbers, mode=mode)

    _check(f, (CACHE, new, np.int32(start)), meshes["8"], (P(None, "i"), P(), P()))


def test_a_clipped_scatter_clamps_the_index_of_an_axis_that_is_not_sharded(meshes):
    """Two index columns, the first axis sharded: the second column's out-of-range index is clamped (mode="clip"),
    as unsharded — it was dropped (the per-block scatter runs in fill mode)."""
    x = np.zeros((16, 4), np.float32)
    f = lambda x: jnp.asarray(x).at[jnp.array([3, 12]), jnp.array([9, -7])].set(5.0, mode="clip")  # noqa: E731
    _check(f, (x,), meshes["8"], (P("i"),))


def test_an_unsigned_start_past_int32_clamps_to_the_end(meshes):
    """A uint32 start of 3e9 clamps to the end of the axis (it wrapped negative, to the start)."""
    x = np.arange(32 * 4, dtype=np.float32).reshape(32, 4)
    start = np.uint32(3_000_000_000)
    _check(lambda x, s: lax.dynamic_slice_in_dim(x, s, 5, axis=0), (x, start), meshes["8"], (P("i"), P()))
    _check(lambda x, s: lax.dynamic_update_slice_in_dim(x, -np.ones((2, 4), np.float32), s, axis=0), (x, start),
           meshes["8"], (P("i"), P()))


@pytest.mark.parametrize("index_dtype", [np.int8, np.int16, np.uint8])
@pytest.mark.parametrize("spec", [P("i"), P()], ids=["sharded", "replicated"])
def test_a_narrow_index_type(index_dtype, spec, meshes):
    """``lax.dynamic_slice`` normalizes each start (``i + 32`` where negative) in the index's own type; the constant
    index arithmetic the tracer folds keeps that type (an int16 start folded to int32 was a LoweringError)."""
    x = np.arange(32 * 8, dtype=np.float32).reshape(32, 8)
    f = lambda x, i: lax.dynamic_slice(x, (i, jnp.zeros_like(i)), (5, 8))  # noqa: E731
    _check(f, (x, index_dtype(3)), meshes["8"], (spec, P()))


@pytest.mark.parametrize("mode", [lax.GatherScatterMode.CLIP, lax.GatherScatterMode.FILL_OR_DROP])
def test_a_uint32_scatter_index_past_int32(mode, meshes):
    """A uint32 index of 3e9 is out of bounds: clamped to the end (clip) or dropped (fill), not wrapped to 0."""
    x = np.arange(4 * 32, dtype=np.float32).reshape(4, 32)
    window = lax.ScatterDimensionNumbers(update_window_dims=(0, 1), inserted_window_dims=(),
                                         scatter_dims_to_operand_dims=(1,))
    f = lambda x, i: lax.scatter(x, i, jnp.ones((4, 5), jnp.float32) * -1, window, mode=mode)  # noqa: E731
    _check(f, (x, np.array([3_000_000_000], np.uint32)), meshes["8"], (P(None, "i"), P()))


@pytest.mark.parametrize("method", ["set", "add", "max"])
def test_the_gradient_of_a_slice_write_moves_the_slice(method, meshes):
    """The update's gradient is a gather of a window of the cotangent: each device cuts its part, a psum adds
    them (the cotangent stays sharded; jax.jit gathers it)."""
    new = np.random.default_rng(4).normal(size=(2, 8, 4, 8)).astype(np.float32)

    def loss(cache, new):
        return jnp.sum(getattr(jnp.asarray(cache).at[:, 2:10], method)(new) ** 2)

    f = jax.grad(loss, argnums=(0, 1))
    fs = sp.autoshard(f, mesh=meshes["8"], in_specs=(P(None, "i"), P()))
    for got, want in zip(fs(CACHE, new), f(jnp.asarray(CACHE), jnp.asarray(new)), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    comparison = sp.compare_with_jit(f, meshes["8"], (P(None, "i"), P()), CACHE, new)
    assert comparison.shardprop_bytes < comparison.jit_bytes, str(comparison)
    assert total_moved(fs.trace(CACHE, new).estimated_communication()) == pytest.approx(comparison.shardprop_bytes)


@pytest.mark.parametrize("mode", ["clip", "fill"])
def test_a_gather_of_windows_along_a_sharded_axis(mode, meshes):
    numbers = lax.GatherDimensionNumbers(offset_dims=(0, 1, 2, 3), collapsed_slice_dims=(), start_index_map=(1,))
    starts = jnp.array([[5], [60], [-3], [56]])
    f = lambda x: lax.gather(x, starts, numbers, (2, 8, 4, 8), mode=mode, fill_value=7.0)  # noqa: E731
    _check(f, (CACHE,), meshes["8"], (P(None, "i"),))
