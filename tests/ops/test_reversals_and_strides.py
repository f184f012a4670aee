"""A reversal and an every-``s``-th slice along a sharded axis keep it sharded.

A reversal reverses each block and sends it to its mirror device (one collective-permute of the block, what
``jax.jit`` moves too). A slice taking every ``s``-th element from one of the first ``s``, where ``s`` divides the
block, takes each device's elements from its own block (nothing moves). Oracles: the unsharded function (exact: these
ops only move elements), ``jax.jit``'s HLO on the same input shardings, our compiled HLO.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import shardprop as sp
from shardprop.core.transfers import total_moved

X = np.arange(4 * 64 * 8, dtype=np.float32).reshape(4, 64, 8)
LAYOUTS = [("8", P(None, "i")), ("4x2", P("j", "i")), ("4x2", P(None, ("i", "j"))), ("2x2x2", P("k", ("i", "j")))]
FUNCTIONS = [
    ("flip", lambda x: jnp.flip(x, 1), 0),
    ("flip_two_axes", lambda x: jnp.flip(x, (0, 1)), 0),
    ("plus_its_flip", lambda x: x + jnp.flip(x, 1), 0),
    ("even_positions", lambda x: x[:, ::2], 0),
    ("odd_positions", lambda x: x[:, 1::2], 0),
    ("every_fourth_from_3", lambda x: x[:, 3::4], 0),
    ("even_minus_odd", lambda x: x[:, ::2] - x[:, 1::2], 0),
    # the gradient of a strided slice: a pad with interior padding, each device spreading its own block
    ("odd_positions_gradient", jax.grad(lambda x: jnp.sum(x[:, 1::2] ** 2)), 0),
    ("every_fourth_gradient", jax.grad(lambda x: jnp.sum(x[:, ::4] ** 3)), 0),
]


# a covering sample by default (every op, layout and strategy once), the whole table with -m slow
@pytest.mark.covering
@pytest.mark.parametrize("strategy", ["auto", "gather"])
@pytest.mark.parametrize("mesh_name,spec", LAYOUTS, ids=[f"{m}-{s}" for m, s in LAYOUTS])
@pytest.mark.parametrize("name,f,_", FUNCTIONS, ids=[f[0] for f in FUNCTIONS])
def test_stays_sharded_and_moves_what_jit_moves(name, f, _, mesh_name, spec, strategy, meshes):
    mesh = meshes[mesh_name]
    fs = sp.autoshard(f, mesh=mesh, in_specs=(spec,), strategy=strategy)
    got = fs(X)
    np.testing.assert_allclose(np.asarray(got), np.asarray(f(jnp.asarray(X))), rtol=1e-6)
    assert got.sharding.spec == spec
    comparison = sp.compare_with_jit(f, mesh, (spec,), X, program=fs.trace(X))
    assert comparison.shardprop_bytes <= comparison.jit_bytes, str(comparison)
    assert total_moved(fs.trace(X).estimated_communication()) == pytest.approx(comparison.shardprop_bytes)


def test_a_stride_that_does_not_fit_the_blocks_still_gathers(meshes):
    """``x[:, ::3]`` (64 rows, blocks of 8): the blocks of the output would not line up with the operand's."""
    f = lambda x: x[:, ::3]  # noqa: E731
    got = sp.autoshard(f, mesh=meshes["8"], in_specs=(P(None, "i"),))(X)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(f(jnp.asarray(X))))
    assert got.sharding.spec == P()


def test_a_bfloat16_flip_moves_its_bits(meshes):
    """XLA:CPU would permute bfloat16 as float32 (twice the bytes priced): the reversed block moves as 16 bits."""
    x = X.astype(jnp.bfloat16)
    f = lambda x: jnp.flip(x, 1)  # noqa: E731
    fs = sp.autoshard(f, mesh=meshes["8"], in_specs=(P(None, "i"),))
    np.testing.assert_array_equal(np.asarray(fs(x), np.float32), np.asarray(f(jnp.asarray(x)), np.float32))
    comparison = sp.compare_with_jit(f, meshes["8"], (P(None, "i"),), x)
    assert total_moved(fs.trace(x).estimated_communication()) == pytest.approx(comparison.shardprop_bytes)


def test_a_flip_along_a_mesh_axis_of_size_one_moves_nothing():
    """Every device holds the whole axis: its block reversed is the result (a mirror over it sent the block)."""
    mesh = sp.make_mesh((8, 1), ("i", "j"))
    f = lambda x: jnp.flip(x, 1) * 2  # noqa: E731
    fs = sp.autoshard(f, mesh=mesh, in_specs=(P(None, "j"),))
    np.testing.assert_array_equal(np.asarray(fs(X)), np.asarray(f(jnp.asarray(X))))
    assert sp.compare_with_jit(f, mesh, (P(None, "j"),), X).shardprop_bytes == 0
