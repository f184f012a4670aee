"""Sums deferred past linear consumers (``defer_sums_past_linear_consumers``): a psum moved down a chain of ops linear
in its value to the smallest value on it. Oracle: the unsharded function on the same inputs; the bytes against
jax.jit's compiled program, which sums where the contraction is."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import shardprop as sp
from tests.ir import held_partial
from tests.conftest import assert_same_as_unsharded, random_args

X, W = random_args([((64, 32), np.float32), ((32, 48), np.float32)])
CONTRACTED = (P(None, "j"), P("j", None))


@pytest.mark.parametrize("strategy", ["collective", "auto"])
@pytest.mark.parametrize("name,f,specs,args,summed", [
    ("sum of a product", lambda x, w: jnp.sum(x @ w) * 0.5, CONTRACTED, (X, W), ((), "f32")),
    ("column means", lambda x, w: 2 * jnp.mean(x @ w, axis=0), (P("i", "j"), P("j", None)), (X, W),
     ((48,), "f32")),
], ids=lambda v: v if isinstance(v, str) else None)
def test_a_psum_waits_for_the_smallest_value_of_its_linear_chain(name, f, specs, args, summed, strategy, mesh):
    prog = assert_same_as_unsharded(f, args, mesh=mesh, in_specs=specs, strategy=strategy, rtol=1e-4, atol=1e-4)
    assert [(t.kind, t.shape, t.dtype) for t in prog.communication()] == [("all-reduce", *summed)]
    assert held_partial(prog), "the contraction is left partial"
    assert "]{+j} = dot_general" in str(prog.graph)  # the listing types the partial value
    comparison = sp.compare_with_jit(f, mesh, specs, *args, program=prog)
    assert comparison.shardprop_bytes < comparison.jit_bytes / 5  # jax.jit all-reduces the product


@pytest.mark.parametrize("name,f", [
    ("not linear", lambda x, w: jnp.sum(jnp.tanh(x @ w))),
    ("a replicated bias added", lambda x, w: jnp.sum(x @ w + 1.0)),
    ("used twice", lambda x, w: jnp.sum((x @ w) * (x @ w).sum(axis=0))),
    ("an output", lambda x, w: (jnp.sum(x @ w), x @ w)),
    ("integer division", lambda x, w: jnp.sum((x.astype(jnp.int32) @ w.astype(jnp.int32)) // 3)),
    ("a conversion", lambda x, w: jnp.sum((x.astype(jnp.int8) @ w.astype(jnp.int8)).astype(jnp.float32))),
    ("reduce_precision", lambda x, w: jnp.sum(jax.lax.reduce_precision(x @ w, 5, 2), axis=0)),
    ("times an argument", lambda x, w: jnp.sum((x @ w) * w[0], axis=0)),  # which may hold an infinity
    ("a product with an argument", lambda x, w: jnp.sum((x @ w) @ w.T)),
])
def test_a_psum_stays_where_its_value_is_not_summed_linearly(name, f, mesh):
    """Deferring through these would add a bias once per device, or round each device's share."""
    args = (X * 4, W * 4)
    assert_same_as_unsharded(f, args, mesh=mesh, in_specs=CONTRACTED, strategy="collective", rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("name,f", [
    ("times infinity", lambda t, ids: (t[ids] * jnp.inf).sum(0)),
    ("over zero", lambda t, ids: (t[ids] / 0.0).sum(0)),
])
def test_a_partial_sum_is_not_multiplied_by_an_infinity_or_divided_by_zero(name, f, mesh):
    """Found by review: the devices that do not own a looked-up row hold zeros, and 0 * inf is NaN where the sum's
    product is inf. A factor must be a constant of finite numbers (non-zero, for a divisor) for a sum to wait."""
    table = np.arange(64 * 4, dtype=np.float32).reshape(64, 4) + 1
    ids = np.array([3, 40, 63, 0, 17, 33, 8, 50], np.int32)
    prog = assert_same_as_unsharded(f, (table, ids), mesh=mesh, in_specs=(P("i"), None), strategy="collective")
    assert not held_partial(prog)
    assert_same_as_unsharded(lambda t, ids: (t[ids] * 0.5).sum(0), (table, ids), mesh=mesh, in_specs=(P("i"), None),
                             strategy="collective")


def test_a_partial_value_runs_in_the_stage_of_the_sum_that_finishes_it(mesh):
    """A partial value never crosses a stage boundary, where it would be taken as whole: the nodes of a chain run
    in its finisher's stage, after a gather that starts the program's second stage."""
    def f(x, w):
        h = jnp.sort(jnp.tanh(x), axis=0)  # the rows gathered: stage 1
        return 2 * jnp.mean(h @ w, axis=0)

    prog = assert_same_as_unsharded(f, (X, W), mesh=mesh, in_specs=(P("i", "j"), P("j")), strategy="collective",
                                    rtol=1e-4, atol=1e-4)
    assert len(prog.stages) == 2 and held_partial(prog)
    graph = prog.plan.graph
    for v in held_partial(prog):
        (consumer,) = graph.consumers[v]
        assert prog.plan.stage_of(graph.producer[v]) == prog.plan.stage_of(consumer) == 1


def test_a_psum_is_not_deferred_into_a_ranged_value(meshes):
    """A product's psum stays at the product when the next value on its chain is ranged (a transpose of an axis of 1
    laid out over 4 devices: one device holds its row): the devices' rows would not line up with a partial sum over
    them. Found by the fuzzer, as a crash ('a mesh axis cannot both shard and sum a value') compiling a gradient."""
    def loss(x0, x1):
        v0 = jax.lax.dot_general(x1, x0, (((0,), (0,)), ((), ())))
        return jnp.sum(v0 * jnp.cos(jnp.arange(64.0).reshape(v0.shape))) + jnp.sum(x0 * x1)

    x0, x1 = random_args([((1, 2, 4), np.float32), ((1, 2, 4), np.float32)])
    assert_same_as_unsharded(jax.grad(loss, (0, 1)), (x0, x1), mesh=meshes["4x2"],
                             in_specs=(P(None, None, "i"), P("i", "j", None)))
