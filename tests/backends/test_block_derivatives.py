"""Derivatives through the blocks' bookkeeping (issue #48, found on review): a haloed ranged block's padding, and a
bfloat16 value moved as its bits. Oracle: the unsharded gradient on the same inputs.

* A ranged block that also holds its neighbour's rows (a halo, for a convolution or a pooling window over a slice)
  starts before its own rows: the mask that keeps derivatives out of the padding counted from the wrong row, and the
  gradient lost the rows next to each block's edge.
* XLA:CPU widens bfloat16 and float8 in collectives, so their moves carry bits (``backends/moves.as_bits``); the
  bitcast had no derivative, and ``jax.grad`` through a gathered bfloat16 value was zero.
"""

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

from tests.conftest import assert_differentiates_as_unsharded, assert_same_as_unsharded, covering

RNG = np.random.default_rng(0)
X = RNG.normal(size=(2, 3, 64)).astype(np.float32)
W = RNG.normal(size=(4, 3, 3)).astype(np.float32)


def conv_over_a_slice(x, w):  # the lhs is ranged (61 rows in blocks of 8) and haloed
    return lax.conv_general_dilated(x[:, :, 0:61], w, (1,), "SAME", dimension_numbers=("NCH", "OIH", "NCH"))


def pool_over_a_slice(x, w):
    return lax.reduce_window(x[:, :, 0:61] * w[0, 0, 0], 0.0, lax.add, (1, 1, 3), (1, 1, 1), "SAME")


def max_pool_over_a_slice(x, w):
    return lax.reduce_window(x[:, :, 3:62] + w[0, 0, 0], -jnp.inf, lax.max, (1, 1, 3), (1, 1, 2), "SAME")


HALOED = [("a SAME convolution", conv_over_a_slice), ("a sum pooling", pool_over_a_slice),
          ("a strided max pooling", max_pool_over_a_slice)]


@pytest.mark.parametrize("name,f,strategy,mesh_name", covering(HALOED, ["auto", "collective", "gather"], ["8", "4x2"]))
def test_a_window_over_a_slice_of_a_sharded_axis_differentiates_as_unsharded(name, f, strategy, mesh_name, meshes):
    mesh = meshes[mesh_name]
    in_specs = (P(None, None, "i"), None)
    assert_same_as_unsharded(f, (X, W), mesh=mesh, in_specs=in_specs, strategy=strategy, rtol=1e-4, atol=1e-4)
    assert_differentiates_as_unsharded(f, (X, W), mesh=mesh, in_specs=in_specs, strategy=strategy, rtol=1e-4,
                                       atol=1e-4)


MOVED = [  # (name, f, in_specs): a bfloat16 value gathered, rotated, moved between axes
    ("gathered for a maximum", lambda x: jnp.max(x * 0.75 + jnp.sin(x), axis=1), (P(None, "i"),)),
    ("rotated by a roll", lambda x: jnp.roll(x * 2.0, 3, axis=1) * x, (P(None, "i"),)),
    ("moved to the other axis by a reshape", lambda x: jnp.sin(x * 3.0).reshape(16, 8) * 1.5, (P(None, "i"),)),
]


@pytest.mark.parametrize("name,f,in_specs,dtype", covering(MOVED, ["bfloat16", "float8_e4m3fn"]))
def test_a_narrow_float_moved_as_bits_keeps_its_derivative(name, f, in_specs, dtype, meshes):
    x = jnp.asarray(RNG.normal(size=(8, 16)), dtype)
    if dtype == "float8_e4m3fn":  # (float8 has no arithmetic of its own: moved, then widened)
        f = (lambda g: lambda x: g(x.astype(jnp.bfloat16)))(f)
    assert_differentiates_as_unsharded(f, (x,), mesh=meshes["8"], in_specs=in_specs, strategy="gather", rtol=2e-2,
                                       atol=2e-2)


def _normalized(x, axes):  # a quotient: its padding rows (0 / 0) are NaN
    return x / jnp.sum(x * x, axis=axes, keepdims=True)


PRODUCTS = [  # (name, f, args, in_specs): an operand ranged along an axis the product does not sum over, whose
    # padding is NaN; the other operand's derivative sums over it (issue #48, the 10,000-program run)
    ("rows of a quotient times a weight", lambda x, w: _normalized(x, 1) @ w,
     (RNG.normal(size=(11, 4)).astype(np.float32), RNG.normal(size=(4, 3)).astype(np.float32)), (P("i"), None)),
    ("a batch of quotients times a weight", lambda x, w: jnp.einsum("bij,jk->bik", _normalized(x, (1, 2)), w),
     (RNG.normal(size=(5, 3, 4)).astype(np.float32), RNG.normal(size=(4, 2)).astype(np.float32)), (P("i"), None)),
    ("the maximum of a quotient times itself (the run's program)",
     lambda x, w: jnp.max(x / (1.0 + jnp.abs(jnp.sum(x, axis=1, keepdims=True))), axis=0) @ jnp.max(
         x / (1.0 + jnp.abs(jnp.sum(x, axis=1, keepdims=True))), axis=0) * w,
     (RNG.normal(size=(8, 1, 1)).astype(np.float32), np.float32(1.5)), (P(None, "i", None), None)),
    ("a convolution of a batch of quotients", lambda x, w: lax.conv_general_dilated(
        _normalized(x, (1, 2)), w, (1,), "SAME", dimension_numbers=("NCH", "OIH", "NCH")),
     (RNG.normal(size=(5, 3, 16)).astype(np.float32), W), (P("i"), None)),
]


@pytest.mark.parametrize("name,f,args,in_specs,strategy", covering(PRODUCTS, ["auto", "collective", "gather"]))
def test_a_product_of_an_operand_with_nan_padding_differentiates_as_unsharded(name, f, args, in_specs, strategy,
                                                                            meshes):
    assert_same_as_unsharded(f, args, mesh=meshes["8"], in_specs=in_specs, strategy=strategy, rtol=1e-4, atol=1e-4)
    assert_differentiates_as_unsharded(f, args, mesh=meshes["8"], in_specs=in_specs, strategy=strategy, rtol=1e-4,
                                       atol=1e-4)
