"""Sums deferred past linear consumers (``defer_sums_past_linear_consumers``): a psum moved down a chain of ops linear
in its value to the smallest value on it. Oracle: the unsharded function on the same inputs; the bytes against
jax.jit's compiled program, which sums where the contraction is."""

import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import shardprop as sp
from tests.conftest import assert_same_as_unsharded, random_args

ARGS = random_args([((64, 32), np.float32), ((32, 48), np.float32), ((48, 8), np.float32)])
X, W, V = ARGS
CONTRACTED = (P(None, "j"), P("j", None))


@pytest.mark.parametrize("strategy", ["collective", "auto"])
@pytest.mark.parametrize("name,f,specs,args,summed", [
    ("sum of a product", lambda x, w: jnp.sum(x @ w) * 0.5, CONTRACTED, (X, W), ((), "f32")),
    ("product times a matrix", lambda x, w, v: (x @ w) @ v, CONTRACTED + (None,), (X, W, V), ((64, 8), "f32")),
    ("column means", lambda x, w: 2 * jnp.mean(x @ w, axis=0), (P("i", "j"), P("j", None)), (X, W),
     ((48,), "f32")),
], ids=lambda v: v if isinstance(v, str) else None)
def test_a_psum_waits_for_the_smallest_value_of_its_linear_chain(name, f, specs, args, summed, strategy, mesh):
    prog = assert_same_as_unsharded(f, args, mesh=mesh, in_specs=specs, strategy=strategy, rtol=1e-4, atol=1e-4)
    assert [(t.kind, t.shape, t.dtype) for t in prog.communication()] == [("all-reduce", *summed)]
    assert prog.plan.pending, "the contraction is left partial"
    assert "left a partial sum over j: summed later, by the psum over" in str(prog.graph)
    comparison = sp.compare_with_jit(f, mesh, specs, *args, strategy=strategy)
    assert comparison.shardprop_bytes < comparison.jit_bytes / 5  # jax.jit all-reduces the product


@pytest.mark.parametrize("name,f", [
    ("not linear", lambda x, w: jnp.sum(jnp.tanh(x @ w))),
    ("a replicated bias added", lambda x, w: jnp.sum(x @ w + 1.0)),
    ("used twice", lambda x, w: jnp.sum((x @ w) * (x @ w).sum(axis=0))),
    ("an output", lambda x, w: (jnp.sum(x @ w), x @ w)),
    ("integer division", lambda x, w: jnp.sum((x.astype(jnp.int32) @ w.astype(jnp.int32)) // 3)),
])
def test_a_psum_stays_where_its_value_is_not_summed_linearly(name, f, mesh):
    """Deferring through these would add a bias once per device, or round each device's share."""
    args = (X * 4, W * 4)
    assert_same_as_unsharded(f, args, mesh=mesh, in_specs=CONTRACTED, strategy="collective", rtol=1e-4, atol=1e-3)


def test_a_partial_value_runs_in_the_stage_of_the_sum_that_finishes_it(mesh):
    """The product is made in stage 1 (after a gather), its finisher reads a value made in stage 2: the partial
    product is computed in stage 2 (a partial value never crosses a boundary, where it would be taken as whole)."""
    y = random_args([((64, 48), np.float32)], seed=5)[0]

    def f(x, w, y):
        late = jnp.cumsum(jnp.tanh(jnp.cumsum(jnp.tanh(y), axis=0)), axis=1)  # gathered over i, then j: stage 2
        return jnp.sum((jnp.cumsum(jnp.tanh(x), axis=0) @ w) * late)

    prog = assert_same_as_unsharded(f, (X, W, y), mesh=mesh, in_specs=(P("i", "j"), P("j"), P("i", "j")),
                                    strategy="collective", rtol=1e-4, atol=1e-3)
    assert len(prog.stages) == 3
    (dot,) = [n for n in prog.plan.graph.nodes if n.op == "dot_general"]
    assert prog.plan.stage_of(dot.id) == prog.plan.stage_of(prog.plan.pending[dot.id].finisher) == 2
