"""Derivatives through the blocks' bookkeeping (issue #48, found on review): a haloed ranged block's padding, and a
bfloat16 value moved as its bits. Oracle: the unsharded gradient on the same inputs.

* A max pooling's derivative over ranged rows whose windows fall in equal blocks (a type spells those None) was
  planned as if the windows were not laid out at all: a raw ``ValueError`` (the 2,000-program run).
* An operand broadcast along ranged rows (a column sum times the rows): JAX's derivative of the broadcast sums the
  cotangent over the padding rows too, where a non-finite padding row (``0 / 0``, a pooling's ``-inf``) made NaN.
* A ranged block that also holds its neighbour's rows (a halo, for a convolution or a pooling window over a slice)
  starts before its own rows: the mask that keeps derivatives out of the padding counted from the wrong row, and the
  gradient lost the rows next to each block's edge.
* XLA:CPU widens bfloat16 and float8 in collectives, so their moves carry bits (``backends/moves.as_bits``); the
  bitcast had no derivative, and ``jax.grad`` through a gathered bfloat16 value was zero.
* A window sum read by a strided slice that keeps one row a block (found by the fuzzer of user programs): JAX
  differentiates the block's windows by padding that row's cotangent, itself padded by the slice's derivative, and
  XLA:CPU folds the two pads and the window sum into a broadcast of the row — the gradient of ``jax.grad`` through
  the sharded program gained the rows at each block's first (``ops/pooling.summed_windows`` keeps the pads apart).
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


def max_pool_in_equal_blocks(x, w):  # 32 windows over 63 ranged rows: the windows' blocks are equal (a type's None)
    return lax.reduce_window(x[:, :, 0:63] * w[0, 0, 0], -jnp.inf, lax.max, (1, 1, 2), (1, 1, 2), "SAME")


HALOED = [("a SAME convolution", conv_over_a_slice), ("a sum pooling", pool_over_a_slice),
          ("a strided max pooling", max_pool_over_a_slice),
          ("a max pooling whose windows fall in equal blocks", max_pool_in_equal_blocks)]


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


def _max_pool_times_its_sums(x, y):  # the 2,000-program run's program (issue #48): padding rows of -inf
    pooled = lax.reduce_window(x[0:2], -jnp.inf, lax.max, (2,), (1,), "SAME")
    return pooled * jnp.sum(pooled - jnp.sum(pooled, axis=0, keepdims=True), axis=0, keepdims=True)


UNEVEN = RNG.normal(size=(11, 4)).astype(np.float32)
BROADCASTS = [  # (name, f, args, in_specs, mesh): a ranged operand whose padding is not finite, and an operand
    # broadcast along its ranged axis: JAX's derivative of the broadcast sums the cotangent over the padding rows too
    ("a max pooling over a slice times its sum (the run's program)", _max_pool_times_its_sums,
     (RNG.normal(size=(16,)).astype(np.float32), np.float32(0.5)), (P(("i", "j")), None), "2x2x2"),
    ("quotient rows times their column sums (a size-1 axis)", lambda x, y: _normalized(x, 1) * jnp.sum(
        _normalized(x, 1), axis=0, keepdims=True) * y, (UNEVEN, np.float32(2.0)), (P("i"), None), "8"),
    ("quotient rows times their column maxima (a missing axis)", lambda x, y: _normalized(x, 1) * jnp.max(
        _normalized(x, 1), axis=0) * y, (UNEVEN, np.float32(2.0)), (P("i"), None), "8"),
    ("quotient rows times their total (a scalar)", lambda x, y: _normalized(x, 1) * (jnp.sum(_normalized(x, 1)) * y),
     (UNEVEN, np.float32(2.0)), (P("i"), None), "8"),
    ("quotient rows over their column means", lambda x, y: _normalized(x, 1) / (
        1.0 + jnp.abs(jnp.mean(_normalized(x, 1), axis=0, keepdims=True) * y)), (UNEVEN, np.float32(2.0)),
     (P("i"), None), "8"),
    ("a choice between quotient rows and their column means", lambda x, y: jnp.where(
        x > 0, _normalized(x, 1), jnp.mean(_normalized(x, 1), axis=0) * y), (UNEVEN, np.float32(2.0)),
     (P("i"), None), "8"),
    ("quotient rows times their column sums broadcast by hand", lambda x, y: _normalized(x, 1) * jnp.broadcast_to(
        jnp.sum(_normalized(x, 1), axis=0) * y, x.shape), (UNEVEN, np.float32(2.0)), (P("i"), None), "8"),
    ("a slice's rows times a column sum on a 4x2 mesh", lambda x, y: _normalized(x[1:10], 1) * jnp.sum(
        _normalized(x[1:10], 1), axis=0, keepdims=True) * y, (UNEVEN, np.float32(2.0)), (P("i", "j"), None), "4x2"),
]


@pytest.mark.parametrize("name,f,args,in_specs,mesh_name,strategy",
                         covering(BROADCASTS, ["auto", "collective", "gather"]))
def test_an_operand_broadcast_along_padded_rows_differentiates_as_unsharded(name, f, args, in_specs, mesh_name,
                                                                          strategy, meshes):
    mesh = meshes[mesh_name]
    assert_same_as_unsharded(f, args, mesh=mesh, in_specs=in_specs, strategy=strategy, rtol=1e-4, atol=1e-4)
    assert_differentiates_as_unsharded(f, args, mesh=mesh, in_specs=in_specs, strategy=strategy, rtol=1e-4,
                                       atol=1e-4)


WINDOWS_THEN_ONE_ROW = [  # (name, f, mesh, in_specs): 6 rows in blocks of 3, the strided slice keeping one row a block
    ("the fuzzer's program", lambda x: lax.reduce_window(x[:, 3:4], 0.0, lax.add, (2, 1, 1), (1, 1, 1),
                                                         "SAME")[1:2:2], "2x2x2", (P("i", "j", "k"),)),
    ("a row of each block", lambda x: lax.reduce_window(x, 0.0, lax.add, (2, 1, 1), (1, 1, 1), "SAME")[1:4:3],
     "2x2x2", (P("i"),)),
]


@pytest.mark.parametrize("name,f,mesh_name,in_specs", WINDOWS_THEN_ONE_ROW)
def test_a_window_sum_read_by_a_slice_of_one_row_a_block_differentiates_as_unsharded(name, f, mesh_name, in_specs,
                                                                                    meshes):
    x = RNG.normal(size=(6, 8, 8)).astype(np.float32)
    assert_same_as_unsharded(f, (x,), mesh=meshes[mesh_name], in_specs=in_specs, rtol=1e-4, atol=1e-4)
    assert_differentiates_as_unsharded(f, (x,), mesh=meshes[mesh_name], in_specs=in_specs, rtol=1e-4, atol=1e-4)
