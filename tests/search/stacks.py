"""A small stack of transformer blocks searched on the 4x2 mesh with one of ``ilp``'s routes through a bound
recorded, and its result checked against the unsharded step (``test_alike.py``, ``test_dual.py``)."""

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

import shardprop as sp
from shardprop.bench import models
from shardprop.bench.search import stack_step
from shardprop.search import ilp


def searched_stack(monkeypatch, route: str, blocks: int):
    """The program ``sp.AUTO`` chose for ``blocks`` blocks (d 8, ff 16, batch 8x4 over ``data``), whether each call
    of ``ilp.<route>`` proved the core it was given, and the step's arguments."""
    proved = []
    solve = getattr(ilp, route)

    def recorded(p, **kw):
        found = solve(p, **kw)
        proved.append(found is not None)
        return found

    monkeypatch.setattr(ilp, route, recorded)
    params = [models.init_block(8, 16, seed=k) for k in range(blocks)]
    x = np.random.default_rng(0).normal(size=(8, 4, 8)).astype(np.float32)
    mesh = sp.make_mesh((4, 2), ("data", "model"))
    program = sp.autoshard(stack_step, mesh=mesh, in_specs=(sp.AUTO, P("data"))).trace(params, x)
    return program, proved, (params, x)


def assert_equals_unsharded(program, args) -> tuple:
    """The program's result on ``args`` equals ``jax.jit(stack_step)``'s (rtol 1e-4, atol 1e-5); the result."""
    got, want = program(*args), jax.jit(stack_step)(*args)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-5)
    return got
