"""A maximum's or a minimum's value and derivative, finished across devices (``backends/finish.py``) and taken of
values XLA would compute in several kernels (``backends/evaluate.computed_once``). Oracle: the unsharded function and
gradient on the same inputs.

Two classes the outside fuzzer of issue #48 found:

* **The rows no device holds** (a pad's value along a ranged axis) tie with the devices' results: the finish takes
  them in and counts them among the elements its derivative averages over — they had no count, and a gradient
  where the pad's value won was 0/0, NaN.
* **A value compared with its own extreme** (a maximum's derivative is ``x == max(x)``): XLA:CPU computes a cheap
  value again in every kernel that reads it, contracting ``a * b + c`` into one fused multiply-add in some kernels
  and not in others, so the copies may differ in their last bit and the test miss the maximum (``jnp.min(x +
  x.mean(0, keepdims=True), axis=0)``'s gradient was off by its whole tangent in two columns). Such a value is held
  once — with its derivative (the first fix cut it, and ``jax.grad`` of the program lost the value's tangent) and
  for ``jax.grad`` of the program too, whose maximum's derivative JAX adds to the program's own kernels. The same
  expression written twice (``m + x <= jnp.min(m + x)``) is one node, as ``jax.jit`` computes it once
  (``shardprop/expr/trace.py`` merges it): two copies were held in two kernels with two roundings.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import shardprop as sp
from tests.conftest import (assert_differentiates_as_unsharded, assert_like_unsharded, assert_same_as_unsharded,
                            covering)

RNG = np.random.RandomState(836123)
X14 = RNG.randn(14, 8).astype(np.float32)
X12 = np.random.RandomState(0).randn(12, 10).astype(np.float32)
X16 = RNG.randn(16, 12).astype(np.float32)
X3 = np.random.default_rng(0).normal(size=(3, 12, 6)).astype(np.float32)

PADDED = [  # (name, f, x, in_specs): a maximum or minimum over a pad's rows, the pad's value winning, tying or losing
    ("the pad's value wins some rows (issue #48)",
     lambda x: jnp.max(jnp.pad(x, ((0, 0), (0, 3)), constant_values=1.0), axis=1), X14, (P(None, "i"),)),
    ("the pad's value wins every row", lambda x: jnp.max(jnp.pad(x, ((0, 0), (2, 1)), constant_values=9.0), axis=1),
     X14, (P(None, "i"),)),
    ("the pad's value ties", lambda x: jnp.max(jnp.pad(jnp.minimum(x, 0.5), ((0, 0), (0, 3)), constant_values=0.5),
                                               axis=1), X14, (P(None, "i"),)),
    ("a minimum, the pad's value losing", lambda x: jnp.min(jnp.pad(x, ((1, 2), (0, 0)), constant_values=5.0),
                                                            axis=0), X16, (P("i", None),)),
    ("over two axes, one padded", lambda x: jnp.max(jnp.pad(x, ((0, 0), (1, 2)), constant_values=0.0), axis=(0, 1)),
     X16, (P("i", "j"),)),
    ("over two axes, both padded", lambda x: jnp.max(jnp.pad(x, ((1, 0), (1, 2)), constant_values=2.0), axis=(0, 1)),
     X16, (P("i", "j"),)),
    ("kept as a size-1 axis", lambda x: jnp.min(jnp.pad(x, ((0, 3), (0, 0)), constant_values=-1.0), axis=0,
                                                keepdims=True) * x, X16, (P("i", None),)),
]

COMPARED = [  # (name, f, x, in_specs): a value computed from several, compared with its own extreme
    ("the minimum of x plus its mean (issue #48)", lambda x: jnp.min(jnp.mean(x, 0, keepdims=True) + x, axis=0).sum(),
     X12, (P("i", None),)),
    ("an affine value's maximum", lambda x: jnp.max(x * 0.75 + jnp.sin(x), axis=1), X16, (P("i", "j"),)),
    ("an elementwise maximum", lambda x: jnp.maximum(x * 0.75 + jnp.sin(x), 0.1 * x + 0.2), X16, (P("i", "j"),)),
    ("x == max(x) in the user's code", lambda x: jnp.where(x * 3.0 + 1.0 == jnp.max(x * 3.0 + 1.0, axis=0), 1.0, 0.0),
     X16, (P("i", "j"),)),
    ("a softmax", lambda x: jax.nn.softmax(x * 0.5 + 1.0, axis=1), X12, (P("i", None),)),
    # (found by the fuzzer of programs as users write them: jax.grad through the program compared in its kernels)
    ("written twice, compared with its own minimum (one node, as jax.jit computes it once)",
     lambda x: jnp.where(jnp.mean(x, 0, keepdims=True) + x <= jnp.min(jnp.mean(x, 0, keepdims=True) + x, axis=0), x,
                         0.0), X12, (P("i", None),)),
    ("the maximum of x plus its mean, replicated", lambda x: jnp.max(x + jnp.mean(x, 0, keepdims=True), axis=1,
                                                                    keepdims=True), X3, (P(),)),
]


@pytest.mark.parametrize("name,f,x,in_specs,strategy,mesh_name",
                         covering(PADDED + COMPARED, ["auto", "collective", "gather"], ["8", "4x2", "2x4", "2x2x2"]))
def test_a_maximum_or_minimum_and_its_derivative_equal_the_unsharded_ones(name, f, x, in_specs, strategy, mesh_name,
                                                                         meshes):
    mesh = meshes[mesh_name]
    in_specs = tuple(P(*(e if e is None or e in mesh.shape else None for e in spec)) for spec in in_specs)
    assert_same_as_unsharded(f, (x,), mesh=mesh, in_specs=in_specs, strategy=strategy)
    assert_differentiates_as_unsharded(f, (x,), mesh=mesh, in_specs=in_specs, strategy=strategy)


@pytest.mark.slow  # the default run's kernels are compiled at -O0, where LLVM contracts nothing: CI's slow set is not
def test_an_edge_pads_copies_keep_their_tie_in_a_sharded_gradient(meshes):
    """CI's long fuzz run (``SHARDPROP_FUZZ_SEED=10786768``): an edge pad's border is an exact copy of the row's first
    entry, and the two tie for the row's maximum. XLA:CPU computed the pad's two pieces by two code paths of the one
    kernel holding the shifted value, contracting the multiply-add on one only: the copies differed in their last bit,
    the tie was lost and the gradient was off by 0.29. The pad is held once too (``compared_with_itself``)."""
    def f(x0, x1):
        padded = jnp.pad(x1, ((0, 0), (0, 0), (1, 0)), mode="edge")
        shifted = padded + jnp.mean(padded, axis=2, keepdims=True)
        return (jnp.where(shifted >= jnp.max(shifted, axis=2, keepdims=True), padded, 0.0),)

    def loss(*xs):
        return sum(jnp.sum(o * jnp.cos(jnp.arange(o.size, dtype=o.dtype).reshape(o.shape))) for o in f(*xs))

    rng = np.random.default_rng(0)
    args = (rng.normal(size=(8, 4, 8)).astype(np.float32), rng.normal(size=(8, 1, 8)).astype(np.float32))
    grad = sp.autoshard(jax.grad(loss, argnums=(0, 1)), mesh=meshes["2x2x2"], in_specs=(P(("i", "j"), "k", None), None))
    assert_like_unsharded(grad(*args), jax.grad(loss, argnums=(0, 1)), args)
