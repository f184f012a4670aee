"""Sharding constraints (``ops/placement.py``) on axes their mesh axes do not divide: laid out in blocks of
``ceil(n / count)`` rows, the last ones short — ranged, as an argument laid out so is, and as ``jax.jit`` pads them
(issue #48: they were refused with an ``IndivisibleAxisError`` where ``jax.jit`` runs them). Oracle: ``jax.jit`` of
the same function (JAX refuses such a constraint eagerly) and the unsharded gradient."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardprop as sp
from tests.conftest import covering, random_args

X6, X12, X10 = random_args([((6, 4), np.float32), ((12, 5), np.float32), ((10, 6), np.float32)])

CASES = [  # (name, x, spec, then): the constraint on x * 2, then `then` of it
    ("6 rows over 4 devices (issue #48)", X6, P("i"), lambda v: v + 1.0),
    ("12 rows over i and j together", X12, P(("i", "j")), lambda v: jnp.sum(v, axis=0)),
    ("12 rows over j and i together", X12, P(("j", "i")), lambda v: jnp.max(v, axis=0)),
    ("both axes uneven", X10, P("i", "j"), lambda v: jnp.tanh(v) @ jnp.ones((6, 3))),
    ("uneven, then gathered by a reduction along it", X10, P("i", None), lambda v: jnp.cumsum(v, axis=0)),
    ("uneven, then reshaped", X12, P("i", None), lambda v: v.reshape(6, 10).sum(1)),
    ("uneven, an unconstrained axis beside it", X10, P("i", P.UNCONSTRAINED), lambda v: v * v),
]


@pytest.mark.parametrize("name,x,spec,then,strategy,mesh_name",
                         covering(CASES, ["auto", "collective", "gather"], ["4x2", "2x4", "8", "2x2x2"]))
def test_a_constraint_on_an_axis_its_mesh_axes_do_not_divide_runs_on_uneven_blocks(name, x, spec, then, strategy,
                                                                                   mesh_name, meshes):
    mesh = meshes[mesh_name]
    entries = [tuple(n for n in (e if isinstance(e, tuple) else (e,)) if n in mesh.shape) if e is not None and
               e is not P.UNCONSTRAINED else e for e in spec]
    spec = P(*(e if not isinstance(e, tuple) else (e[0] if len(e) == 1 else e) if e else None for e in entries))

    def f(x):
        return then(jax.lax.with_sharding_constraint(x * 2.0, NamedSharding(mesh, spec)))

    fs = sp.autoshard(f, mesh=mesh, in_specs=(P(),), strategy=strategy)
    want = jax.jit(f)(x)
    np.testing.assert_allclose(np.asarray(fs(x)), np.asarray(want), rtol=1e-5, atol=1e-5)
    unconstrained = lambda x: then(x * 2.0)  # noqa: E731  (the same function, as JAX differentiates it eagerly)
    loss = lambda g: lambda x: jnp.sum(jnp.cos(g(x)))  # noqa: E731
    want = jax.grad(loss(unconstrained))(x)
    for got in (jax.grad(loss(fs))(x), sp.autoshard(jax.grad(loss(f)), mesh=mesh, in_specs=(P(),),
                                                    strategy=strategy)(x)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
