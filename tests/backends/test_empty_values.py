"""Values with a zero-length axis — an empty argument, a slice of nothing, a split's or an edge pad's empty pieces in
a gradient — in programs, their gradients (``jax.grad`` of the program under the caller's ``jax.jit``, and the
gradient program) and their stages. Oracle: the unsharded function and gradient on the same inputs.

What the long fuzz run (CI seed 4772616) found, and its siblings: an empty value passed between two stages was an
operand of a ``shard_map`` that Shardy refused under the caller's jit (it takes an empty operand for a constant);
a collective moving an empty block along its axis of no rows failed XLA's verifier; a reshape of an empty array
broke propagation (its axes have no groups of equal sizes); a window over an empty value's sharded axis was refused
its halo (found by review: "a halo ... on an axis that is not sharded"); and an empty output declared sharded came
back from the jit with every device holding the whole empty array under the sharded claim (``jax.jit``'s
``out_shardings`` do so too), which ``np.asarray`` refused.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardprop as sp
from tests.conftest import assert_like_unsharded
from tests.fuzz_oracle import weighted

RNG = np.random.default_rng(4772616)
X3 = RNG.normal(size=(8, 8, 8)).astype(np.float32)
X2 = RNG.normal(size=(8, 8)).astype(np.float32)
ROWS0 = np.zeros((0, 8), np.float32)  # no rows
COLS0 = np.zeros((8, 0), np.float32)  # no columns

EMPTY = [  # (name, f, args, in_specs, in the default run)
    ("an edge pad's gradient passes empty pieces between stages (CI seed 4772616)",
     lambda x: jnp.pad(x, ((0, 0), (0, 1), (0, 0)), mode="edge"), (X3,), (P(None, ("i", "j"), None),), True),
    ("an empty argument joined to a full one", lambda x, e: (jnp.concatenate([x, e], axis=1) * 2, e + 1),
     (X2, COLS0), (P("i", "j"), P("i")), True),
    ("a sum over an axis of no rows", lambda a: a.sum(0) + 1, (ROWS0,), (P("i", "j"),), True),
    ("a reshape of an empty array", lambda a: a.reshape(2, 0, 4) * 2, (ROWS0,), (P("i", "j"),), True),
    ("a slice of nothing, and a sum over one", lambda a: (a[3:3] + 1, a[:, 5:5].sum(1)), (X2,), (P("i", "j"),),
     False),
    ("a split's empty pieces", lambda x: jnp.split(x, [0, 8], axis=1)[1].sum(0), (X3,), (P(None, "j"),), False),
    ("a product over an empty contraction", lambda a, b: a @ b.T + 1, (COLS0, COLS0), (P("i"), P("i")), False),
    ("a product of no rows", lambda a, b: (a @ b, b.sum()), (ROWS0, X2), (P("i"), P("i", "j")), False),
    ("a maximum over no columns", lambda a: jnp.max(a, axis=1, initial=-3.0), (COLS0,), (P("i"),), False),
    ("a mean over no rows", lambda a, b: jnp.mean(a, 0) + b[0], (ROWS0, X2), (P("i", "j"), P("i", "j")), False),
    ("a cumulative sum, a sort", lambda a: (jnp.cumsum(a, 0), jnp.sort(a, 0)), (ROWS0,), (P("i", "j"),), False),
    ("a broadcast of no rows", lambda a, b: a[:, None, :] + b[None, :, :1], (ROWS0, X2), (P("i", "j"), P("i", "j")),
     False),
    ("a select, a transpose", lambda a: (jnp.where(a > 0, a, 0.0), a.T * 2), (COLS0,), (P("i"),), False),
    ("taking no rows", lambda a: a[jnp.zeros((0,), jnp.int32)], (X2,), (P("i", "j"),), False),
    ("a scan over no steps", lambda a: jax.lax.scan(lambda c, r: (c + r, c * 2), jnp.zeros(8), a), (ROWS0,), (P(),),
     False),
    ("a window along a sharded axis of a batch of none (a halo of no rows)",
     lambda a: jax.lax.reduce_window(a, 0.0, jax.lax.add, (1, 3, 1), (1, 1, 1), "SAME"),
     (np.zeros((0, 16, 4), np.float32),), (P(None, "j"),), False),
    ("a convolution over a batch of none, its rows sharded",
     lambda x, w: jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")),
     (np.zeros((0, 16, 8, 4), np.float32), RNG.normal(size=(3, 3, 4, 4)).astype(np.float32)), (P(None, "j"), P()),
     False),
]


@pytest.mark.parametrize("name, f, args, in_specs", [
    pytest.param(*row[:4], id=row[0], marks=() if row[4] else pytest.mark.slow) for row in EMPTY])
def test_empty_values_run_and_differentiate_as_unsharded(name, f, args, in_specs, meshes):
    mesh = meshes["2x4"]
    fs = sp.autoshard(f, mesh=mesh, in_specs=in_specs)
    assert_like_unsharded(fs(*args), f, args)  # (np.asarray of every leaf: an empty one is readable)
    argnums = tuple(range(len(args)))
    reference = jax.grad(weighted(f), argnums=argnums)
    assert_like_unsharded(jax.jit(jax.grad(weighted(fs), argnums=argnums))(*args), reference, args)
    gradient = sp.autoshard(jax.grad(weighted(f), argnums=argnums), mesh=mesh, in_specs=in_specs)
    assert_like_unsharded(gradient(*args), reference, args)


def test_empty_values_pass_between_stages_one_at_a_time(meshes):
    """The edge pad's gradient stage by stage (the debugger's way): its empty values pass between the stages."""
    f = jax.grad(weighted(EMPTY[0][1]))
    prog = sp.autoshard(f, mesh=meshes["2x4"], in_specs=EMPTY[0][3]).trace(X3)
    passed = [i for stage in prog.plan.stages[1:] for i in stage.inputs
              if 0 in prog.plan.graph.avals[i.ref.value].shape]
    assert passed, "the gradient no longer passes an empty value between stages: the test tests nothing"
    results: list = []
    for k, stage in enumerate(prog.plan.stages):
        inputs = [X3 if i.source.is_argument else results[i.source.stage][i.source.index] for i in stage.inputs]
        results.append(prog.stage(k)(*inputs))
    np.testing.assert_allclose(np.asarray(results[-1][0]), np.asarray(f(X3)), rtol=1e-5, atol=1e-5)
    assert sp.Debugger(prog, X3).first_divergence() is None


def test_empty_prng_keys_move_as_declared(meshes):
    """An empty array of PRNG keys (no zeros to make of them) is moved as planned: its plan gathers along no empty
    axis."""
    keys = jax.random.split(jax.random.key(0), 0).reshape(0, 8)
    out = sp.autoshard(lambda k: k, mesh=meshes["2x4"], in_specs=(P("i", "j"),), out_specs=P(None, "i"))(keys)
    assert out.shape == (0, 8) and jax.dtypes.issubdtype(out.dtype, jax.dtypes.prng_key)


def test_an_empty_output_is_laid_out_as_declared(meshes):
    mesh = meshes["2x4"]
    out = sp.autoshard(lambda a: a * 2, mesh=mesh, in_specs=(P("i"),), out_specs=P("i", "j"))(COLS0)
    assert out.sharding.is_equivalent_to(NamedSharding(mesh, P("i", "j")), 2)
    assert {s.data.shape for s in out.addressable_shards} == {(4, 0)}
    assert np.asarray(out).shape == (8, 0)
