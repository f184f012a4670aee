"""A reduction finished by a collective whose kept axes its use lays out over other mesh axes than its operand holds
them in — an ``out_specs``, a sharding constraint or an argument it meets naming several mesh axes in another order
(``P(('k', 'i'))`` for an axis held over ``'i'``): the operand is moved to the rule's layout first, so the result is
computed in the layout its type says. Found by an outside fuzzer (issue #48): the result came back twice as long, a
``LoweringError`` at a broadcast, a raw ``ValueError`` from the move planner. Oracle: the unsharded function and
gradient on the same inputs; ``out_specs`` exactly."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardprop as sp
from tests.conftest import assert_differentiates_as_unsharded, covering, random_args

REDUCTIONS = {
    "sum": lambda x, axis, keep=False: jnp.sum(x, axis=axis, keepdims=keep),
    "mean": lambda x, axis, keep=False: jnp.mean(x, axis=axis, keepdims=keep),
    "max": lambda x, axis, keep=False: jnp.max(x, axis=axis, keepdims=keep),
    "min": lambda x, axis, keep=False: jnp.min(x, axis=axis, keepdims=keep),
    "prod": lambda x, axis, keep=False: jnp.prod(1.0 + 0.1 * x, axis=axis, keepdims=keep),
    "argmax": lambda x, axis, keep=False: jnp.argmax(x, axis=axis, keepdims=keep).astype(jnp.float32),
}

CASES = [  # (name, mesh, shapes, in_specs, out_specs, f(reduce, *args))
    ("out_specs over k then i (issue #48)", "2x2x2", [(4, 2)], (P("i", "j"),), P(("k", "i")),
     lambda r, x: r(x, 1)),
    ("a constraint over k then i (issue #48)", "2x2x2", [(4, 2)], (P("i", "j"),), None,
     lambda r, x: jax.lax.with_sharding_constraint(r(x, 1), NamedSharding(MESH3, P(("k", "i"))))),
    ("meeting an argument over k then i (issue #48)", "2x2x2", [(16, 8), (16, 8)], (P("i", "j"), P(("k", "i"), None)),
     None, lambda r, x, y: r(x, 1, True) + y),
    ("meeting it over k then i, and j", "2x2x2", [(16, 8), (16, 8)], (P("i", "j"), P(("k", "i"), "j")), None,
     lambda r, x, y: r(x, 1, True) * y),
    ("out_specs over i then k (issue #48)", "2x2x2", [(2, 4, 2)], (P("i", None, "j"),), P(None, ("i", "k")),
     lambda r, x: r(x, 2)),
    ("out_specs over j then i", "2x4", [(8, 4)], (P("i", "j"),), P(("j", "i")), lambda r, x: r(x, 1)),
    ("a kept axis moved to another", "2x4", [(8, 8, 4)], (P("i", None, "j"),), P(None, "i"),
     lambda r, x: r(x, 2)),
    ("two reduced axes, out_specs compound", "2x2x2", [(8, 4, 2)], (P("i", "j", "k"),), P(("k", "i")),
     lambda r, x: r(x, (1, 2))),
]
MESH3 = sp.make_mesh((2, 2, 2), ("i", "j", "k"))


@pytest.mark.parametrize("name,mesh_name,shapes,in_specs,out_specs,f,kind,strategy",
                         covering(CASES, sorted(REDUCTIONS), ["auto", "collective", "gather"]))
def test_a_reduction_laid_out_by_its_use_over_other_mesh_axes(name, mesh_name, shapes, in_specs, out_specs, f, kind,
                                                              strategy, meshes):
    if kind == "argmax" and name.startswith("two reduced axes"):
        pytest.skip("an arg-extreme reduces one axis")
    mesh = meshes[mesh_name]
    g = lambda *xs: f(REDUCTIONS[kind], *xs)  # noqa: E731
    args = random_args([(s, np.float32) for s in shapes])
    fs = sp.autoshard(g, mesh=mesh, in_specs=in_specs, strategy=strategy, out_specs=out_specs)
    got, want = fs(*args), g(*map(jnp.asarray, args))
    assert got.shape == want.shape
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    if out_specs is not None:
        assert got.sharding.is_equivalent_to(NamedSharding(mesh, out_specs), got.ndim), got.sharding
    if kind != "argmax":
        assert_differentiates_as_unsharded(g, args, mesh=mesh, in_specs=in_specs, strategy=strategy,
                                           out_specs=out_specs)
