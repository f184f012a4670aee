"""Cumulative ops along a sharded axis (``cumsum``, ``cumprod``, ``cummax``, ``cummin``, ``cumlogsumexp``, reversed
too): each device scans its block, one all-gather of the block totals finishes it, the axis stays sharded — fewer
bytes than ``jax.jit``, which gathers the axis.

Oracles: the unsharded function on the same inputs, ``jax.jit``'s compiled HLO on the same input shardings, our own
compiled HLO (the estimate).
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

X = np.random.default_rng(0).normal(size=(4, 64, 8)).astype(np.float32)

OPS = [
    ("cumsum", lambda x: jnp.cumsum(x, axis=1)),
    ("cumsum_reversed", lambda x: lax.cumsum(x, axis=1, reverse=True)),
    ("cumprod", lambda x: jnp.cumprod(1 + 0.01 * x, axis=1)),
    ("cummax", lambda x: lax.cummax(x, axis=1)),
    ("cummin_reversed", lambda x: lax.cummin(x, axis=1, reverse=True)),
    ("cumlogsumexp", lambda x: lax.cumlogsumexp(x, axis=1)),
    ("int_cumsum", lambda x: jnp.cumsum((x * 10).astype(jnp.int32), axis=1)),
    ("int_cummax", lambda x: lax.cummax((x * 10).astype(jnp.int32), axis=1)),
    ("cumsum_gradient", jax.grad(lambda x: jnp.sum(jnp.cumsum(x, axis=1) ** 2))),
    ("cumsum_in_a_loop", lambda x: lax.fori_loop(0, 3, lambda _, c: jnp.tanh(jnp.cumsum(c, axis=1) * 0.1), x)),
]
LAYOUTS = [("8", P(None, "i")), ("4x2", P("j", "i")), ("2x2x2", P("k", ("i", "j")))]


# a covering sample by default (every op, layout and strategy once), the whole table with -m slow
@pytest.mark.covering
@pytest.mark.parametrize("strategy", ["auto", "gather"])
@pytest.mark.parametrize("mesh_name,spec", LAYOUTS, ids=[m for m, _ in LAYOUTS])
@pytest.mark.parametrize("name,f", OPS, ids=[o[0] for o in OPS])
def test_a_cumulative_op_stays_sharded_and_moves_one_row_per_device(name, f, mesh_name, spec, strategy, meshes):
    mesh = meshes[mesh_name]
    fs = sp.autoshard(f, mesh=mesh, in_specs=(spec,), strategy=strategy)
    got, want = fs(X), f(jnp.asarray(X))
    scale = float(np.max(np.abs(np.asarray(want, np.float64))))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5 * scale)
    assert got.sharding.spec == spec
    comparison = sp.compare_with_jit(f, mesh, (spec,), X, program=fs.trace(X))
    assert comparison.shardprop_bytes < comparison.jit_bytes, str(comparison)
    prog = fs.trace(X)
    assert total_moved(prog.estimated_communication()) == pytest.approx(comparison.shardprop_bytes)


def test_the_block_totals_are_what_moves(meshes):
    """One all-gather of one row per device (4 x 8 floats): 7/8 of 8 rows of 32 floats, 896 B per device."""
    prog = sp.autoshard(lambda x: jnp.cumsum(x, axis=1), mesh=meshes["8"], in_specs=(P(None, "i"),)).trace(X)
    (transfer,) = prog.communication()
    assert (str(transfer.kind), transfer.shape, transfer.moved_bytes) == ("all-gather", (4, 8, 8), 896.0)


def test_nan_and_infinities_propagate_as_unsharded(meshes):
    x = X.copy()
    x[0, 3, 0], x[1, 20, 1], x[2, 40, 2] = np.nan, np.inf, -np.inf
    for f in (lambda x: jnp.cumsum(x, axis=1), lambda x: lax.cummax(x, axis=1), lambda x: lax.cumlogsumexp(x, axis=1)):
        got = sp.autoshard(f, mesh=meshes["8"], in_specs=(P(None, "i"),))(x)
        np.testing.assert_allclose(np.asarray(got), np.asarray(f(jnp.asarray(x))), rtol=1e-5, atol=1e-5)


def test_bfloat16_block_totals_move_as_16_bits(meshes):
    """XLA:CPU gathers bfloat16 as float32 (twice the bytes priced); the totals move as their bits."""
    x = X.astype(jnp.bfloat16)
    f = lambda x: jnp.cumsum(x, axis=1)  # noqa: E731
    fs = sp.autoshard(f, mesh=meshes["8"], in_specs=(P(None, "i"),))
    got = fs(x)
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(f(jnp.asarray(x)), np.float32), rtol=2e-2,
                               atol=0.3)
    comparison = sp.compare_with_jit(f, meshes["8"], (P(None, "i"),), x)
    assert total_moved(fs.trace(x).estimated_communication()) == pytest.approx(comparison.shardprop_bytes)
