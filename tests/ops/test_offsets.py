"""Reads and writes at an offset along a sharded axis (``dynamic_slice``, ``dynamic_update_slice``): the operand stays
sharded. A write lands in the blocks it covers and moves nothing (a KV-cache write); a read moves the slice, not the
operand (each device cuts its part, a psum adds them).

Oracles: the unsharded function on the same inputs (exact: a write copies, a read adds zeros), ``jax.jit`` on the
same input shardings (bytes, from its compiled HLO), our compiled HLO (the estimate).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import shardprop as sp
from shardprop.core.transfers import total_moved

CACHE = np.random.default_rng(0).normal(size=(2, 64, 4, 8)).astype(np.float32)

# (mesh, the cache's spec): the sequence axis over 8 devices; over i with the batch over j
LAYOUTS = [("8", P(None, "i")), ("4x2", P("j", "i"))]
# positions before, inside, on a block's edge, across blocks, past the end (clamped) and negative (clamped)
POSITIONS = [0, 6, 7, 60, 70, -3]


def _check(f, args, mesh, specs):
    fs = sp.autoshard(f, mesh=mesh, in_specs=specs)
    got = fs(*args)
    want = f(*(jnp.asarray(a) for a in args))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    comparison = sp.compare_with_jit(f, mesh, specs, *args)
    prog = fs.trace(*args)
    assert total_moved(prog.estimated_communication()) == pytest.approx(comparison.shardprop_bytes)
    return prog, comparison


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


@pytest.mark.parametrize("rows", [1, 5, 13])
@pytest.mark.parametrize("pos", POSITIONS)
@pytest.mark.parametrize("mesh_name,spec", LAYOUTS, ids=[m for m, _ in LAYOUTS])
def test_a_read_at_an_offset_moves_the_slice_not_the_operand(rows, pos, mesh_name, spec, meshes):
    f = lambda cache, p: lax.dynamic_slice_in_dim(cache, p, rows, axis=1) * 2.0  # noqa: E731
    _, comparison = _check(f, (CACHE, np.int32(pos)), meshes[mesh_name], (spec, P()))
    assert comparison.shardprop_bytes < comparison.jit_bytes, str(comparison)


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
