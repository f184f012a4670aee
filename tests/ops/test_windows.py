"""Windows along a sharded axis (convolutions, pooling, a max-pool's derivatives): the axis stays sharded, each device
receiving only the rows of its neighbours' blocks its window reads (a halo exchange).

Oracles: the unsharded function on the same inputs (values), ``jax.jit`` on the same input shardings (bytes moved
and output shardings, from its compiled HLO), and the compiled HLO of our own program (the estimate). The geometry
is checked against a brute-force count of the rows each device's outputs read.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import shardprop as sp
from shardprop.core.transfers import total_moved
from shardprop.inspect.listing import format_listing
from shardprop.ops.pooling import select_reaches
from shardprop.core.layouts import Span
from shardprop.ops.windows import dilated_window_reach, summed_window_reach, window_out, window_reach, window_rows
from tests.conftest import assert_same_as_unsharded, random_args

DN = ("NHWC", "HWIO", "NHWC")
X = ((2, 32, 16, 4), jnp.float32)
W = ((3, 3, 4, 8), jnp.float32)


def conv(x, w, stride=1, padding="SAME", **kw):
    return lax.conv_general_dilated(x, w, (stride, stride), padding, dimension_numbers=DN, **kw)


def max_pool(x, window=3, stride=1, padding="SAME"):
    return lax.reduce_window(x, -jnp.inf, lax.max, (1, window, window, 1), (1, stride, stride, 1), padding)


def loss_grad(f, argnums=(0, 1)):
    return jax.grad(lambda x, w: jnp.sum(f(x, w) ** 2), argnums=argnums)


# (id, f(x, w), mesh, in_specs, the output specs jax.jit gives and so must we, fewer bytes than jit expected)
CASES = [
    ("conv_same_rows", lambda x, w: conv(x, w), "8", (P(None, "i"), P()), (P(None, "i"),), False),
    ("conv_strided", lambda x, w: conv(x, w, 2), "8", (P(None, "i"), P()), (P(None, "i"),), False),
    ("conv_dilated_kernel", lambda x, w: conv(x, w, rhs_dilation=(2, 2)), "8", (P(None, "i"), P()),
     (P(None, "i"),), False),
    ("conv_5x5_reaches_past_the_neighbour", lambda x, w: conv(x, jnp.tile(w, (2, 2, 1, 1))[:5, :5]), "8",
     (P(None, "i"), P()), (P(None, "i"),), False),
    ("conv_depthwise", lambda x, w: lax.conv_general_dilated(
        x, w[:, :, :1, :4], (1, 1), "SAME", dimension_numbers=DN, feature_group_count=4), "8",
     (P(None, "i"), P()), (P(None, "i"),), False),
    ("conv_rows_and_columns", lambda x, w: conv(x, w), "4x2", (P(None, "i", "j"), P()), (P(None, "i", "j"),), False),
    ("conv_batch_and_rows", lambda x, w: conv(x, w), "4x2", (P("j", "i"), P()), (P("j", "i"),), False),
    ("two_convs", lambda x, w: conv(jax.nn.relu(conv(x, w))[..., :4], w), "8", (P(None, "i"), P()),
     (P(None, "i"),), False),
    ("conv_input_gradient", loss_grad(lambda x, w: conv(x, w), 0), "8", (P(None, "i"), P()), (P(None, "i"),),
     False),
    ("conv_both_gradients", loss_grad(lambda x, w: conv(x, w)), "8", (P(None, "i"), P()), (P(None, "i"), P()),
     True),
    ("strided_conv_both_gradients", loss_grad(lambda x, w: conv(x, w, 2)), "8", (P(None, "i"), P()),
     (P(None, "i"), P()), True),
    ("conv_gradients_rows_and_columns", loss_grad(lambda x, w: conv(x, w)), "4x2", (P(None, "i", "j"), P()),
     (P(None, "i", "j"), P()), True),
    ("max_pool_same", lambda x, w: max_pool(x), "8", (P(None, "i"), P()), (P(None, "i"),), False),
    ("max_pool_strided", lambda x, w: max_pool(x, 3, 2), "8", (P(None, "i"), P()), (P(None, "i"),), False),
    ("avg_pool_2x2_moves_nothing", lambda x, w: lax.reduce_window(x, 0.0, lax.add, (1, 2, 2, 1), (1, 2, 2, 1),
                                                                   "VALID") / 4, "8", (P(None, "i"), P()),
     (P(None, "i"),), False),
    ("min_pool", lambda x, w: lax.reduce_window(x, jnp.inf, lax.min, (1, 3, 1, 1), (1, 1, 1, 1), "SAME"), "8",
     (P(None, "i"), P()), (P(None, "i"),), False),
    ("int_max_pool", lambda x, w: lax.reduce_window((x * 10).astype(jnp.int32), jnp.iinfo(jnp.int32).min, lax.max,
                                                    (1, 3, 1, 1), (1, 1, 1, 1), "SAME"), "8", (P(None, "i"), P()),
     (P(None, "i"),), False),
    ("generic_product_window_unpadded", lambda x, w: lax.reduce_window(x, 1.0, lax.mul, (1, 2, 1, 1), (1, 2, 1, 1),
                                                                        "VALID"), "8", (P(None, "i"), P()),
     (P(None, "i"),), False),
    ("window_of_9_sums", lambda x, w: lax.reduce_window(x, 0.0, lax.add, (1, 9, 1, 1), (1, 1, 1, 1), "SAME"), "8",
     (P(None, "i"), P()), (P(None, "i"),), False),
    ("max_pool_gradient", loss_grad(lambda x, w: max_pool(x), 0), "8", (P(None, "i"), P()), (P(None, "i"),), True),
    ("strided_max_pool_gradient", loss_grad(lambda x, w: max_pool(x, 3, 2), 0), "8", (P(None, "i"), P()),
     (P(None, "i"),), True),
    ("max_pool_gradient_rows_and_columns", loss_grad(lambda x, w: max_pool(x), 0), "4x2", (P(None, "i", "j"), P()),
     (P(None, "i", "j"),), True),
    ("max_pool_tangent", lambda x, w: jax.jvp(max_pool, (x,), (x * 2,))[1], "8", (P(None, "i"), P()),
     (P(None, "i"),), False),
    ("conv_in_a_loop", lambda x, w: lax.fori_loop(0, 3, lambda _, h: jnp.tanh(conv(h, w[..., :4])), x), "8",
     (P(None, "i"), P()), (P(None, "i"),), False),
]


@pytest.mark.parametrize("name,f,mesh_name,specs,out_specs,fewer", CASES, ids=[c[0] for c in CASES])
def test_window_along_a_sharded_axis(name, f, mesh_name, specs, out_specs, fewer, meshes):
    """Equal to the unsharded function; the output as sharded as jax.jit's; no more bytes than jit (fewer where a
    halo replaces jit's gathers); the estimate equals the compiled program."""
    mesh = meshes[mesh_name]
    args = random_args([X, W])
    prog = assert_same_as_unsharded(f, args, mesh=mesh, in_specs=specs, rtol=1e-4, atol=1e-4)
    comparison = sp.compare_with_jit(f, mesh, specs, *args, program=prog)
    assert prog.out_specs == out_specs == comparison.jit_out_specs, str(comparison)
    assert comparison.shardprop_bytes <= comparison.jit_bytes, str(comparison)
    if fewer:
        assert comparison.shardprop_bytes < comparison.jit_bytes, str(comparison)
    assert total_moved(prog.estimated_communication()) == pytest.approx(comparison.shardprop_bytes)
    assert not prog.sharded.fallbacks


def test_a_halo_is_a_move_in_the_listing(meshes):
    """The halo exchange is a move node of its own: the listing names it and the haloed type (``<1,1>``)."""
    args = random_args([X, W])
    prog = sp.autoshard(lambda x, w: conv(x, w), mesh=meshes["8"], in_specs=(P(None, "i"), P())).trace(*args)
    text = format_listing(prog.plan)
    ir = prog.plan.node_ir(next(n.id for n in prog.sharded.graph.nodes if n.op == "conv_general_dilated"))
    kinds = [m.step.kind for m in ir.moves_in]
    assert kinds == ["halo", "halo"]
    (lhs, _) = ir.compute.inputs
    assert lhs.type.halo == ((0, 0), (1, 1), (0, 0), (0, 0))
    assert "a:f32[2,32@i<1,1>,16,4] = halo[i axis=1 <1,1>] a" in text, text


def test_a_valid_convolution_keeps_its_uneven_rows_in_place(meshes):
    """A VALID convolution's output blocks are uneven (30 rows on 8 devices, the last block short): each device
    computes its block from its rows and two of its neighbour's (a ranged result); returned, it comes back whole,
    as under jax.jit (a JAX array cannot be uneven)."""
    args = random_args([X, W])
    prog = assert_same_as_unsharded(lambda x, w: conv(x, w, padding="VALID"), args, mesh=meshes["8"],
                                    in_specs=(P(None, "i"), P()), rtol=1e-4, atol=1e-4)
    assert prog.out_specs == (P(),)
    assert "30@i[4k:4k+4]" in str(prog.graph), str(prog.graph)


# --- the geometry, against a brute-force count ----------------------------------------------------------------

def _read_rows(size, blocks, out_size, window, stride, lo, dilation=1):
    """The input rows each device's output block reads (outside [0, size): padding), by brute force."""
    out_block = out_size // blocks
    reads = []
    for d in range(blocks):
        rows = {o * stride - lo + t * dilation for o in range(d * out_block, (d + 1) * out_block)
                for t in range(window)}
        reads.append((min(rows), max(rows)))
    return reads


@pytest.mark.parametrize("size,blocks,window,stride,padding,dilation", [
    (64, 8, 3, 1, (1, 1), 1), (64, 8, 3, 2, (0, 1), 1), (64, 8, 2, 2, (0, 0), 1), (64, 8, 5, 1, (2, 2), 1),
    (64, 8, 3, 1, (2, 2), 2), (64, 4, 9, 1, (4, 4), 1), (48, 8, 4, 2, (1, 1), 1), (64, 8, 7, 1, (9, 9), 3),
])
def test_window_reach_is_the_rows_read(size, blocks, window, stride, padding, dilation):
    out_size = window_out(size, window=window, stride=stride, padding=padding, dilation=dilation, base_dilation=1)
    before, after = window_reach(size, blocks, out_size, window=window, stride=stride, padding=padding,
                                 dilation=dilation)
    block = size // blocks
    for d, (first, last) in enumerate(_read_rows(size, blocks, out_size, window, stride, padding[0], dilation)):
        assert first == d * block - before
        assert last == (d + 1) * block - 1 + after


@pytest.mark.parametrize("size,blocks,out_size,window,stride,padding", [
    (62, 8, 62, 3, 1, (0, 0)),   # 62 rows do not divide
    (64, 8, 62, 3, 1, (0, 0)),   # VALID: uneven output blocks
    (64, 8, 64, 65, 1, (32, 32)),  # reads past every other block: a gather moves less
    (64, 8, 22, 3, 3, (1, 1)),   # the stride does not divide the block
])
def test_no_halo_where_the_blocks_do_not_line_up(size, blocks, out_size, window, stride, padding):
    assert window_reach(size, blocks, out_size, window=window, stride=stride, padding=padding) is None


def test_summed_and_dilated_reaches():
    """The kernel gradient of a 3x3 SAME convolution reads one row either side; the input gradient of a strided
    one reads one gradient row after its block and pads the dilated rows (1, 0)."""
    assert summed_window_reach(64, 64, 8, 3, stride=1, padding=(1, 1)) == (1, 1)
    assert summed_window_reach(64, 32, 8, 3, stride=1, padding=(0, 1), dilation=2) == (0, 1)
    assert dilated_window_reach(32, 8, 64, window=3, stride=1, padding=(1, 2), base_dilation=2) == (0, 1, (1, 0))
    assert select_reaches("select_and_scatter_add", 64, 8, window=3, stride=2, padding=(0, 1)) == ((1, 0), (2, 1))
    assert select_reaches("select_and_scatter_add", 64, 8, window=2, stride=2, padding=(0, 0)) == ((0, 0), (0, 0))


def test_halo_rows_past_the_ends_are_what_the_window_pads_with(meshes):
    """A max over windows at the first and last rows, where every value is negative: padding read as zeros would
    win the max (the identity, -inf, must)."""
    x = -np.abs(np.asarray(random_args([X])[0])) - 1.0
    f = lambda x: max_pool(x)  # noqa: E731
    got = sp.autoshard(f, mesh=meshes["8"], in_specs=(P(None, "i"),))(x)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(f(jnp.asarray(x))))


# --- found by review (issue #27) ------------------------------------------------------------------------------

def _same_as_unsharded_and_priced(f, args, mesh, specs):
    prog = assert_same_as_unsharded(f, args, mesh=mesh, in_specs=specs, rtol=1e-5, atol=1e-5)
    comparison = sp.compare_with_jit(f, mesh, specs, *args, program=prog)
    assert total_moved(prog.estimated_communication()) == pytest.approx(comparison.shardprop_bytes)
    return prog


def sum_pool_3(x):
    return lax.reduce_window(x, 0.0, lax.add, (3,), (1,), ((1, 1),))


@pytest.mark.parametrize("mesh_name,spec", [("4x2", P(("j", "i"))), ("2x2x2", P(("k", "i"))), ("4x2", P(("i", "j")))])
def test_a_halo_over_mesh_axes_named_out_of_mesh_order(mesh_name, spec, meshes):
    """``ppermute`` numbers the devices of several mesh axes in mesh order: the rows must come from the block before
    in the layout's order (``P(('j', 'i'))``), not the device before in mesh order."""
    _same_as_unsharded_and_priced(sum_pool_3, (np.arange(32.0, dtype=np.float32),), meshes[mesh_name], (spec,))


@pytest.mark.parametrize("window,stride,padding", [(2, 3, (0, 0)), (1, 2, (0, 0)), (3, 4, (0, 1)), (1, 4, (0, 0))])
def test_a_max_pool_gradient_whose_stride_is_longer_than_its_window(window, stride, padding, meshes):
    """Rows no window covers receive nothing (they were a LoweringError: the block came out a row short)."""
    x = np.asarray(random_args([((48,), jnp.float32)])[0])
    g = jax.grad(lambda x: jnp.sum(lax.reduce_window(x, -jnp.inf, lax.max, (window,), (stride,), (padding,))))
    _same_as_unsharded_and_priced(g, (x,), meshes["8"], (P("i"),))


def test_a_generic_window_whose_init_is_not_the_identity_is_gathered_where_padded(meshes):
    """XLA leaves padded rows out of a window; no fill past the ends reproduces an init of 1 for a sum."""
    f = lambda x: lax.reduce_window(x, 1.0, lax.add, (3,), (1,), ((1, 1),))  # noqa: E731
    _same_as_unsharded_and_priced(f, (np.zeros((64,), np.float32),), meshes["8"], (P("i"),))


def test_windows_that_exchange_the_same_rows_pay_once(meshes):
    """Three windows over one value: a halo step adding rows another already exchanged is merged by XLA, and the
    estimate (a move marked ``merged``) says so."""
    def rw(x, w, p):
        return lax.reduce_window(x, 0.0, lax.add, (w, 1), (1, 1), (p, (0, 0)))

    f = lambda x: rw(x, 3, (1, 1)) + rw(x, 5, (2, 2)) + rw(x, 3, (2, 0))  # noqa: E731
    x = np.asarray(random_args([((64, 16), jnp.float32)])[0])
    prog = _same_as_unsharded_and_priced(f, (x,), meshes["8"], (P("i"),))
    assert any(m.merged for stage in prog.plan.stages for m in stage.instructions if hasattr(m, "merged"))
    assert "rows exchanged already (XLA merges the two)" in format_listing(prog.plan)


# --- bad input: JAX's own error at trace time, as under jax.jit -----------------------------------------------

@pytest.mark.parametrize("f,message", [
    (lambda x: lax.conv_general_dilated(x, jnp.ones((3, 3, 5, 8)), (1, 1), "SAME", dimension_numbers=DN),
     "feature dimension"),
    (lambda x: lax.dynamic_update_slice(x, jnp.ones((2, 40, 16, 4)), (0, 1, 0, 0)), "update shape"),
    (lambda x: lax.reduce_window(x, 0.0, lax.add, (1, 3, 3), (1, 1, 1), "SAME"), "could not be broadcast"),
])
def test_a_window_or_update_that_makes_no_sense_is_jax_s_error(f, message, meshes):
    x = np.zeros((2, 32, 16, 4), np.float32)
    with pytest.raises(sp.TraceError, match=message):
        sp.autoshard(f, mesh=meshes["8"], in_specs=(P(None, "i"),))(x)


def test_a_window_longer_than_the_axis_gives_jit_s_empty_result(meshes):
    f = lambda x: lax.reduce_window(x, 0.0, lax.add, (1, 99, 1, 1), (1, 1, 1, 1), "VALID")  # noqa: E731
    assert_same_as_unsharded(f, (np.zeros((2, 32, 16, 4), np.float32),), mesh=meshes["8"],
                             in_specs=(P(None, "i"),))


@pytest.mark.slow  # 11 s; the bench's spatial CNN rows and the valid-CNN test below run the same paths by default
def test_a_flax_cnn_with_image_rows_sharded(meshes):
    """A flax CNN's adam step (convolutions, a max-pool, a strided convolution, an average pool) with the rows
    sharded: equal to the unsharded step, no fallback or reshard warning, fewer bytes than jax.jit."""
    flax_nn = pytest.importorskip("flax.linen")
    optax = pytest.importorskip("optax")

    class CNN(flax_nn.Module):
        @flax_nn.compact
        def __call__(self, x):
            x = flax_nn.relu(flax_nn.Conv(8, (3, 3))(x))
            x = flax_nn.max_pool(x, (2, 2), strides=(2, 2))
            x = flax_nn.relu(flax_nn.Conv(8, (3, 3), strides=(2, 2))(x))
            x = flax_nn.avg_pool(x, (2, 2), strides=(2, 2))
            return flax_nn.Dense(10)(x.mean(axis=(1, 2)))

    model, opt = CNN(), optax.adam(1e-3)
    x = np.asarray(random_args([((4, 64, 32, 3), jnp.float32)])[0])
    y = np.arange(4) % 10
    params = model.init(jax.random.key(0), x)

    def step(params, state, x, y):
        loss, grads = jax.value_and_grad(
            lambda p: optax.softmax_cross_entropy_with_integer_labels(model.apply(p, x), y).mean())(params)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    specs = (None, None, P(None, "i"), None)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error", sp.FallbackWarning)
        warnings.simplefilter("error", sp.ReshardWarning)
        assert_same_as_unsharded(step, (params, opt.init(params), x, y), mesh=meshes["8"], in_specs=specs,
                                 rtol=1e-4, atol=1e-5)
    comparison = sp.compare_with_jit(step, meshes["8"], specs, params, opt.init(params), x, y)
    assert comparison.shardprop_bytes < comparison.jit_bytes, str(comparison)


# --- windows over ranged rows (issue #27): uneven outputs, a pad's or a slice's rows ------------------------------

def avg_pool(x, window=2):
    return lax.reduce_window(x, 0.0, lax.add, (1, window, window, 1), (1, window, window, 1), "VALID") / window ** 2


RANGED = [
    # the gradient of a strided pool: its cotangent spread in place (a pad with interior padding, each block twice as
    # long, ranged), then a window one row past each block
    ("avg_pool_gradient", loss_grad(lambda x, w: avg_pool(x), 0), (P(None, "i"), P())),
    ("avg_pool_gradient_rows_and_columns", loss_grad(lambda x, w: avg_pool(x), 0), (P(None, "i", "j"), P())),
    # a VALID max-pool's gradient: its ranged cotangent scattered into each device's rows (the padding scatters 0)
    ("valid_max_pool_gradient", loss_grad(lambda x, w: max_pool(x, 3, 1, "VALID"), 0), (P(None, "i"), P())),
    ("strided_valid_max_pool_gradient", loss_grad(lambda x, w: max_pool(x, 3, 2, "VALID"), 0), (P(None, "i"), P())),
    ("valid_max_pool_gradient_rows_and_columns", loss_grad(lambda x, w: max_pool(x, 3, 1, "VALID"), 0),
     (P(None, "i", "j"), P())),
    # a max-pool over a VALID convolution's ranged rows: its gradient scatters into them in place, the cotangent read
    # in their blocks
    ("max_pool_over_a_valid_conv_gradient", loss_grad(lambda x, w: max_pool(jax.nn.relu(conv(x, w, padding="VALID")),
                                                                             2, 2, "VALID")), (P(None, "i"), P())),
    # a VALID window's output blocks are uneven (30 rows, the last block short): kept ranged, read in place next
    ("valid_pool_then_sum", lambda x, w: jnp.sum(max_pool(x, 3, 1, "VALID"), axis=1), (P(None, "i"), P())),
    ("valid_pool_then_pool", lambda x, w: jnp.sum(max_pool(max_pool(x, 3, 1, "VALID"), 3, 1, "SAME"), axis=1),
     (P(None, "i"), P())),
    # a pad's rows no device holds (its value) and a slice's rows, read by the window as they are held
    ("pool_over_a_pad", lambda x, w: lax.reduce_window(jnp.pad(x, ((0, 0), (2, 0), (0, 0), (0, 0)),
                                                               constant_values=5.0), -jnp.inf, lax.max,
                                                       (1, 3, 1, 1), (1, 1, 1, 1), "VALID"), (P(None, "i"), P())),
    ("pool_over_a_slice", lambda x, w: jnp.sum(max_pool(x[:, 3:], 3, 1, "SAME"), axis=1), (P(None, "i"), P())),
    # a VALID convolution's gradients: the input's reads the ranged cotangent with a halo, the kernel's sums over its
    # blocks (the padding zeroed), a psum adds
    ("valid_conv_gradients", loss_grad(lambda x, w: conv(x, w, padding="VALID")), (P(None, "i"), P())),
    ("strided_valid_conv_gradients", loss_grad(lambda x, w: conv(x, w, 2, "VALID")), (P(None, "i"), P())),
    # the second convolution's input is ranged: its kernel gradient sums the ranged input and cotangent in blocks
    ("two_valid_convs_gradients", loss_grad(lambda x, w: conv(jax.nn.relu(conv(x, w, padding="VALID"))[..., :4], w,
                                                              padding="VALID")), (P(None, "i"), P())),
    ("conv_over_a_pad_then_sum", lambda x, w: jnp.sum(conv(jnp.pad(x, ((0, 0), (2, 0), (0, 0), (0, 0)),
                                                                   constant_values=0.5), w, padding="VALID"), axis=1),
     (P(None, "i"), P())),
    ("conv_over_a_slice_then_sum", lambda x, w: jnp.sum(conv(x[:, 1:31], w), axis=1), (P(None, "i"), P())),
]


@pytest.mark.parametrize("name,f,specs", RANGED, ids=[c[0] for c in RANGED])
def test_a_window_over_ranged_rows_reads_them_in_place(name, f, specs, meshes):
    """Equal to the unsharded function; nothing gathered whole; no more bytes than jax.jit; the estimate equals the
    compiled program."""
    mesh = meshes["4x2" if "columns" in name else "8"]
    args = random_args([X, W])
    prog = assert_same_as_unsharded(f, args, mesh=mesh, in_specs=specs, rtol=1e-4, atol=1e-4)
    comparison = sp.compare_with_jit(f, mesh, specs, *args, program=prog)
    assert comparison.shardprop_bytes <= comparison.jit_bytes, str(comparison)
    assert total_moved(prog.estimated_communication()) == pytest.approx(comparison.shardprop_bytes)
    if "gradient" in name:  # the input's gradient laid out like the input (jax.jit's too, or replicated)
        assert prog.out_specs[0] == specs[0], str(comparison)
        assert comparison.shardprop_bytes < comparison.jit_bytes, str(comparison)
    if "then" in name or "gradient" in name:
        assert not [t for t in prog.estimated_communication() if t.kind == "all-gather"], str(prog.graph)


def test_a_flax_valid_cnn_with_pools_keeps_its_ranged_rows(meshes):
    """flax's pools pass their pad value through a ``reshard``: the average pool's gradient (a pad with interior
    padding by it) still spreads each block in place; the max pool's gradient scatters into ranged rows. Fewer
    bytes than jax.jit, values as unsharded (found trying the change as a user would)."""
    flax_nn = pytest.importorskip("flax.linen")

    class Net(flax_nn.Module):
        @flax_nn.compact
        def __call__(self, x):
            x = flax_nn.avg_pool(flax_nn.relu(flax_nn.Conv(4, (3, 3), padding="VALID")(x)), (2, 2), (2, 2))
            x = flax_nn.max_pool(flax_nn.relu(flax_nn.Conv(4, (3, 3), padding="VALID")(x)), (2, 2), (2, 2))
            return x.mean((1, 2))

    net, (x,) = Net(), random_args([X])
    params = net.init(jax.random.key(0), x)
    grad = jax.grad(lambda p, x: jnp.sum(net.apply(p, x) ** 2))
    prog = assert_same_as_unsharded(grad, (params, x), mesh=meshes["8"], in_specs=(None, P(None, "i")), rtol=1e-4,
                                    atol=1e-5)
    comparison = sp.compare_with_jit(grad, meshes["8"], (None, P(None, "i")), params, x)
    assert comparison.shardprop_bytes < comparison.jit_bytes, str(comparison)
    assert not [t for t in prog.estimated_communication() if t.kind == "all-gather"], str(prog.graph)


@pytest.mark.parametrize("size,count,offset,block,window,stride,padding", [
    (64, 8, 0, 8, 3, 1, (0, 0)), (64, 8, 0, 8, 3, 1, (1, 1)), (33, 8, -1, 4, 2, 1, (0, 0)),
    (61, 8, 3, 8, 3, 1, (1, 1)), (66, 8, -2, 8, 3, 1, (0, 0)), (64, 8, 0, 8, 2, 2, (0, 0)), (60, 8, 2, 8, 5, 1, (2, 2)),
])
def test_window_rows_are_the_rows_read(size, count, offset, block, window, stride, padding):
    """Against a brute-force count: each device's output block (the rows the out span gives it) reads exactly the
    rows it holds, ``before`` more ahead and ``after`` more past them (negative: fewer)."""
    out_size = window_out(size, window=window, stride=stride, padding=padding, dilation=1, base_dilation=1)
    (before, after), out = window_rows(Span(offset, block), size, count, out_size, window=window, stride=stride,
                                       padding=padding)
    assert out.block * count >= out_size and out.offset == 0
    for d in range(count):
        rows = [o * stride - padding[0] + t for o in range(d * out.block, (d + 1) * out.block) for t in range(window)]
        assert min(rows) == d * block - offset - before
        assert max(rows) == (d + 1) * block - offset - 1 + after


def test_a_max_pool_gradient_whose_cotangent_is_ranged_over_a_mesh_axis_the_windows_use_on_another_axis(meshes):
    """Found by the user-program fuzzer (seed 6036399): the gradient of a max pool over a one-row slice of a maximum,
    on 2x2x2 with the input over ``(i, j)`` and ``k``. The cotangent came ranged over ``k`` along the pooled axis while
    the windows were laid over ``k`` along the next: the rule read both, needing ``k`` twice (a raw ValueError from
    the move planner). The ranges are now read whole there."""
    def f(x0):
        v2 = jnp.max(x0 + jnp.mean(x0, axis=0, keepdims=True), axis=0)
        v3 = lax.reduce_window(v2[0:1], -jnp.inf, lax.max, (2, 1), (1, 1), "SAME")
        return jnp.sum((v3 @ v2) * jnp.cos(jnp.arange(8.0, dtype=jnp.float32)))

    x = np.asarray(random_args([((8, 8, 8), jnp.float32)])[0])
    fs = sp.autoshard(jax.grad(f), mesh=meshes["2x2x2"], in_specs=(P(("i", "j"), "k", None),))
    np.testing.assert_allclose(np.asarray(fs(x)), np.asarray(jax.jit(jax.grad(f))(x)), rtol=2e-4, atol=1e-4)
