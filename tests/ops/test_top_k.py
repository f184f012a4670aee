"""``lax.top_k`` along a sharded axis: each device takes its block's ``k`` best and an all-gather of those candidates
finishes it, where that moves less than gathering the axis (``jax.jit`` gathers it).

Oracles: the unsharded function on the same inputs (exact: ties and NaN included), ``jax.jit`` on the same input
shardings (bytes, from its compiled HLO), our compiled HLO (the estimate).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import shardprop as sp
from shardprop.core.transfers import total_moved

X = np.random.default_rng(0).normal(size=(4, 8, 512)).astype(np.float32)
X[0, 0, :] = 1.0  # a row of ties: the lowest indices win, as unsharded
X[1, 1, 100] = np.nan  # NaN sorts first, as unsharded
X[2, 3, 7] = X[2, 3, 300] = 50.0

LAYOUTS = [("8", P(None, None, "i")), ("4x2", P("j", None, "i")), ("4x2", P(None, None, ("i", "j")))]
PROGRAMS = [
    ("values_and_indices", lambda x: jax.lax.top_k(x, 5)),
    ("indices_only", lambda x: jax.lax.top_k(x, 5)[1]),
    ("on_a_middle_axis", lambda x: jax.lax.top_k(jnp.swapaxes(x, 1, 2) * 2.0, 3)),
    ("gradient", jax.grad(lambda x: jnp.sum(jax.lax.top_k(x, 3)[0] ** 2))),
]


@pytest.mark.parametrize("mesh_name,spec", LAYOUTS, ids=[f"{m}-{s}" for m, s in LAYOUTS])
@pytest.mark.parametrize("name,f", PROGRAMS, ids=[p[0] for p in PROGRAMS])
def test_a_top_k_along_a_sharded_axis_gathers_candidates_not_the_axis(name, f, mesh_name, spec, meshes):
    mesh = meshes[mesh_name]
    fs = sp.autoshard(f, mesh=mesh, in_specs=(spec,))
    for got, want in zip(jax.tree_util.tree_leaves(fs(X)), jax.tree_util.tree_leaves(f(jnp.asarray(X))), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    prog = fs.trace(X)
    comparison = sp.compare_with_jit(f, mesh, (spec,), X, program=prog)
    assert total_moved(prog.estimated_communication()) == pytest.approx(comparison.shardprop_bytes)
    if name != "on_a_middle_axis":  # (the swap moves the sharded axis out of top_k's way: nothing to finish)
        assert re.search(r"= top_k\[[ij*]+\] ", str(prog.graph)), str(prog.graph)  # the finish
        assert comparison.shardprop_bytes < comparison.jit_bytes / 4, str(comparison)


def test_a_top_k_as_long_as_a_block_gathers_the_axis(meshes):
    # each device's candidates would be its whole block: gathering the axis moves no more, and is what happens
    f = lambda x: jax.lax.top_k(x, 64)  # noqa: E731
    prog = sp.autoshard(f, mesh=meshes["8"], in_specs=(P(None, None, "i"),)).trace(X)
    assert not re.search(r"= top_k\[[ij*]+\] ", str(prog.graph)), str(prog.graph)
    for got, want in zip(prog(X), f(jnp.asarray(X)), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
