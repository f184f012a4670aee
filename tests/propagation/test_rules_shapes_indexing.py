"""Table-driven tests for the shape, slicing, indexing, scan, sort and convolution rules: each row checks
the propagated output sharding and the numerical result against the unsharded function."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import shardprop as sp
from tests.conftest import assert_same_as_unsharded, check_rule_case, random_args

F32, I32 = np.float32, np.int32
M = (16, 8)


def indices(n, high, seed=3):
    return np.random.default_rng(seed).integers(0, high, size=n).astype(np.int32)


IDX16 = indices((16,), 16)
IDX16x1 = indices((16, 1), 8)

# (id, function, [(shape, dtype)], mesh, in_specs, expected output spec(s), primitive that must have a rule)
CASES = [
    ("reshape_merge_keeps_major", lambda a: a.reshape(128), [(M, F32)], "4x2", (P("i"),), P("i"), "reshape"),
    ("reshape_split_keeps_major", lambda a: a.reshape(16, 8), [((128,), F32)], "4x2", (P("i"),), P("i"), "reshape"),
    ("reshape_minor_sharded_is_gathered", lambda a: a.reshape(128), [(M, F32)], "4x2", (P(None, "j"),), P(),
     "reshape"),
    ("reshape_attention_heads", lambda a: a.reshape(8, 16, 4, 8), [((8, 16, 32), F32)], "4x2",
     (P("i", None, "j"),), P("i", None, "j"), "reshape"),
    ("reshape_indivisible_is_gathered", lambda a: a.reshape(2, 64), [(M, F32)], "4x2", (P("i"),), P(), "reshape"),
    # rows over ('i', 'j') split into (4, 4): i deals out the major axis, j halves the minor one; nothing moves (as
    # jax.jit lays it out)
    ("reshape_compound", lambda a: a.reshape(4, 4, 8), [(M, F32)], "4x2", (P(("i", "j")),), P("i", "j"), "reshape"),
    ("reshape_split_over_two_mesh_axes", lambda a: a.reshape(4, 4), [((16,), F32)], "4x2", (P(("i", "j")),),
     P("i", "j"), "reshape"),
    # two axes, each one index per device but the last, merge into one over both mesh axes: nothing moves
    ("reshape_merge_over_two_mesh_axes", lambda a: a.reshape(8, 8), [((4, 2, 8), F32)], "4x2", (P("i", "j"),),
     P(("i", "j")), "reshape"),
    # j before i: the first output axis (4) is not a run of j's blocks then i's: gathered
    ("reshape_compound_that_does_not_line_up", lambda a: a.reshape(4, 4), [((16,), F32)], "4x2", (P(("j", "i")),),
     P(), "reshape"),
    ("reshape_size1_axes", lambda a: a.reshape(1, 16, 1, 8), [(M, F32)], "4x2", (P("i", "j"),),
     P(None, "i", None, "j"), "reshape"),
    ("iota_one_hot", lambda labels: jax.nn.one_hot(labels, 16), [((16,), I32)], "4x2", (P("i"),), P("i"), "iota"),
    ("iota_adopts_sharded_axis", lambda a: a * jnp.arange(8.0), [(M, F32)], "4x2", (P("i", "j"),), P("i", "j"),
     "iota"),
    ("iota_compound_offsets", lambda a: a + jnp.arange(16.0)[:, None], [(M, F32)], "2x2x2",
     (P(("i", "j", "k")),), P(("i", "j", "k")), "iota"),
    ("slice_partial_axis", lambda a: a[:, 2:5], [(M, F32)], "4x2", (P("i", "j"),), P("i"), "slice"),
    # rows 4-12 of blocks of 4 realigned to blocks of 2: each device receives the rows its block lacks
    ("slice_cut_axis_stays_sharded", lambda a: a[4:12, :], [(M, F32)], "4x2", (P("i", "j"),), P("i", "j"), "slice"),
    # every 2nd row from blocks of 4: each device takes its own block's rows
    ("slice_strided", lambda a: a[::2], [(M, F32)], "4x2", (P("i", "j"),), P("i", "j"), "slice"),
    ("slice_strided_across_blocks", lambda a: a[::3], [(M, F32)], "4x2", (P("i", "j"),), P(None, "j"), "slice"),
    ("pad", lambda a: jnp.pad(a, ((0, 0), (1, 2))), [(M, F32)], "4x2", (P("i", "j"),), P("i"), "pad"),
    ("concatenate", lambda a, b: jnp.concatenate([a, b], axis=1), [(M, F32), (M, F32)], "4x2",
     (P("i", "j"), None), P("i", "j"), "concatenate"),
    ("concatenate_other_axis_merges", lambda a, b: jnp.concatenate([a, b], axis=0), [(M, F32), (M, F32)], "4x2",
     (P(None, "j"), P(None, "j")), P(None, "j"), "concatenate"),
    # each device reverses its block, a permute sends it to its mirror device
    ("rev", lambda a: a[::-1], [(M, F32)], "4x2", (P("i", "j"),), P("i", "j"), "rev"),
    ("dynamic_slice", lambda a, s: lax.dynamic_slice(a, (0, s), (16, 4)), [(M, F32), ((), I32)], "4x2",
     (P("i", "j"), P()), P("i"), "dynamic_slice"),
    ("dynamic_slice_whole_axis_ignores_index", lambda a, s: lax.dynamic_slice(a, (s, 2), (16, 4)),
     [(M, F32), ((), I32)], "8", (P("i"), P()), P("i"), "dynamic_slice"),
    # constant starts name a static slice: traced as one, it keeps the sliced axis sharded (realigned)
    ("dynamic_slice_at_constant_starts_is_a_slice", lambda a: lax.dynamic_slice(a, (0, 3), (16, 4)), [(M, F32)],
     "4x2", (P("i", "j"),), P("i", "j"), "slice"),
    # the update writes part of axis 1: each device writes the columns that land in its block
    ("dynamic_update_slice", lambda a, u: lax.dynamic_update_slice(a, u, (0, 2)), [(M, F32), ((16, 4), F32)],
     "4x2", (P("i", "j"), None), P("i", "j"), "dynamic_update_slice"),
    ("gather_rows", lambda a: a[IDX16], [(M, F32)], "4x2", (P("i", "j"),), P(None, "j"), "gather"),
    ("gather_sharded_indices", lambda a, i: a[i], [(M, F32), ((16,), I32)], "4x2", (P(None, "j"), P("i")),
     P("i", "j"), "gather"),
    ("take_along_axis", lambda a: jnp.take_along_axis(a, IDX16x1, axis=1), [(M, F32)], "4x2", (P("i", "j"),),
     P("i"), "gather"),
    ("scatter_add", lambda a, u: a.at[IDX16[:4]].add(u), [(M, F32), ((4, 8), F32)], "4x2", (P(None, "j"), None),
     P(None, "j"), "scatter-add"),
    ("scatter_set", lambda a: a.at[:, 3].set(0.0), [(M, F32)], "4x2", (P("i", "j"),), P("i", "j"), "scatter"),
    # a window covering an indexed axis whole starts at 0 (clamped there): each device writes its block of it
    ("vmapped_row_update_keeps_the_row_axis",
     jax.vmap(lambda a, r, s: lax.dynamic_update_slice_in_dim(a, r[None], s, 0)),
     [((4, 10, 8), F32), ((4, 8), F32), ((4,), I32)], "4x2", (P("i", None, "j"), P("i", "j"), P("i")),
     P("i", None, "j"), "scatter"),
    # ... or, under fill, is dropped where it starts elsewhere (every other window starts at 0, the rest not)
    ("whole_window_scatter_dropped_off_zero", lambda a, u, ix: lax.scatter(
        a, ix.at[::2, 1].set(0), u, lax.ScatterDimensionNumbers((1,), (0,), (0, 1)),
        mode=lax.GatherScatterMode.FILL_OR_DROP),
     [(M, F32), ((6, 8), F32), ((6, 2), I32)], "4x2", (P("i", "j"), None, None), P("i", "j"), "scatter"),
    # cumulative ops scan their blocks: the scanned axis stays sharded
    ("cumsum", lambda a: jnp.cumsum(a, axis=1), [(M, F32)], "4x2", (P("i", "j"),), P("i", "j"), "cumsum"),
    ("cumprod", lambda a: jnp.cumprod(a, axis=0), [(M, F32)], "4x2", (P("i", "j"),), P("i", "j"), "cumprod"),
    ("cummax", lambda a: lax.cummax(a, axis=0), [(M, F32)], "4x2", (P("i", "j"),), P("i", "j"), "cummax"),
    ("cumlogsumexp", lambda a: lax.cumlogsumexp(a, axis=1), [(M, F32)], "4x2", (P("i", "j"),), P("i", "j"),
     "cumlogsumexp"),
    ("sort", lambda a: jnp.sort(a, axis=1), [(M, F32)], "4x2", (P("i", "j"),), P("i"), "sort"),
    ("argsort", lambda a: jnp.argsort(a, axis=0), [(M, F32)], "4x2", (P("i", "j"),), P(None, "j"), "sort"),
    ("top_k", lambda a: lax.top_k(a, 3), [(M, F32)], "4x2", (P("i", "j"),), (P("i"), P("i")), "top_k"),
    ("conv_batch_and_features", lambda x, w: lax.conv_general_dilated(
        x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")),
     [((8, 6, 6, 4), F32), ((3, 3, 4, 8), F32)], "4x2", (P("i"), P(None, None, None, "j")),
     P("i", None, None, "j"), "conv_general_dilated"),
    ("conv_input_features_gathered", lambda x, w: lax.conv_general_dilated(
        x, w, (1, 1), "VALID", dimension_numbers=("NCHW", "OIHW", "NCHW")),
     [((8, 4, 6, 6), F32), ((8, 4, 3, 3), F32)], "4x2", (P("i", "j"), None), P("i"), "conv_general_dilated"),
    ("max_pool", lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID"),
     [((8, 6, 6, 4), F32)], "4x2", (P("i", None, None, "j"),), P("i", None, None, "j"), "reduce_window_max"),
    # a window along a sharded axis keeps it sharded: each device reads one row of its neighbour's block (a halo)
    ("avg_pool_sum", lambda x: lax.reduce_window(x, 0.0, lax.add, (1, 2, 2, 1), (1, 1, 1, 1), "SAME"),
     [((8, 6, 6, 4), F32)], "4x2", (P("i", "j"),), P("i", "j"), "reduce_window_sum"),
    ("copy", lambda a: jnp.array(a, copy=True) + lax.optimization_barrier(a), [(M, F32)], "4x2",
     (P("i", "j"),), P("i", "j"), "add"),
    ("bitcast_same_width", lambda a: lax.bitcast_convert_type(a, jnp.int32), [(M, F32)], "4x2", (P("i", "j"),),
     P("i", "j"), "bitcast_convert_type"),
    # jax 0.10.2's own primitives for jnp.split / jnp.stack / jnp.tile (they fell back before)
    # each piece ranged in place, returned in equal blocks of its own (a piece's rows realigned over j)
    ("split_along_a_sharded_axis", lambda a: jnp.split(a, 2, axis=1), [(M, F32)], "4x2", (P("i", "j"),),
     (P("i", "j"), P("i", "j")), "split"),
    ("split_piece_adopts_its_consumer", lambda a, w: jnp.split(a, 2, axis=1)[1] * w, [(M, F32), ((16, 4), F32)],
     "4x2", (P("i", "j"), P(None, "j")), P("i", "j"), "split"),
    ("array_split_uneven", lambda a: jnp.array_split(a, 3, axis=0), [(M, F32)], "4x2", (P("i", "j"),),
     (P(None, "j"),) * 3, "split"),
    ("stack_keeps_operand_axes", lambda a, b: jnp.stack([a, b], axis=1), [(M, F32), (M, F32)], "4x2",
     (P("i", "j"), None), P("i", None, "j"), "stack"),
    ("stack_new_axis_adopts", lambda a, b, c: jnp.stack([a, b]) + c, [(M, F32), (M, F32), ((2, 16, 8), F32)],
     "4x2", (P("i"), P("i"), P("j", "i")), P("j", "i"), "stack"),
    ("unstack", lambda a: jnp.unstack(a, axis=1)[5], [(M, F32)], "4x2", (P("i", "j"),), P("i"), "unstack"),
    ("tile_repeated_axis_gathered", lambda a: jnp.tile(a, (1, 3)), [(M, F32)], "4x2", (P("i", "j"),), P("i"),
     "tile"),
    ("tile_repeated_axis_adopts", lambda a, w: jnp.tile(a, (2, 1)) + w, [(M, F32), ((32, 8), F32)], "4x2",
     (P("i", "j"), P("i")), P("i", "j"), "tile"),
    ("generic_reduce_two_operands", lambda a, b: lax.reduce((a, b), (0.0, -jnp.inf),
                                                            lambda x, y: (x[0] + y[0], jnp.maximum(x[1], y[1])), (0,)),
     [(M, F32), (M, F32)], "4x2", (P("i", "j"), P(None, "j")), (P("j"), P("j")), "reduce"),
    ("approx_max_k", lambda a: lax.approx_max_k(a, 2), [(M, F32)], "4x2", (P("i", "j"),), (P("i"), P("i")),
     "approx_top_k"),
    ("max_pool_gradient", jax.grad(lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1),
                                                                "VALID").sum()),
     [((8, 6, 6, 4), F32)], "4x2", (P("i", None, None, "j"),), P("i", None, None, "j"), "select_and_scatter_add"),
    ("batched_cholesky", lambda a: jnp.linalg.cholesky(a @ jnp.swapaxes(a, 1, 2) + 6 * jnp.eye(6)),
     [((4, 6, 6), F32)], "4x2", (P("i"),), P("i"), "cholesky"),
    ("batched_solve", lambda a, b: jnp.linalg.solve(a + 6 * jnp.eye(6), b), [((8, 6, 6), F32), ((8, 6, 2), F32)],
     "4x2", (P("i"), P(("i", "j"))), P(("i", "j")), "lu"),
    ("batched_svd_values", lambda a: jnp.linalg.svd(a, compute_uv=False), [((8, 6, 4), F32)], "4x2",
     (P(("i", "j")),), P(("i", "j")), "svd"),
    ("fft_over_the_last_axis", lambda a: jnp.fft.rfft(a), [(M, F32)], "4x2", (P("i", "j"),), P("i"), "fft"),
    # (the result, shaped like a, is laid out like it: `real` takes the transform sliced over j, for free)
    ("fft2_keeps_the_batch", lambda a: jnp.fft.fft2(a).real, [((4, 8, 8), F32)], "4x2", (P("i", "j"),), P("i", "j"),
     "fft"),
    ("batched_det_platform_branch_folded", jnp.linalg.det, [((8, 4, 4), F32)], "4x2", (P(("i", "j")),),
     P(("i", "j")), "lu"),
    # the rows and the indices share i: the indices (64 B) are gathered rather than the table (512 B), as jax.jit does
    ("gather_indices_and_rows_share_a_mesh_axis", lambda a, i: jnp.take(a, i, axis=1), [(M, F32), ((16,), I32)],
     "4x2", (P("i"), P("i")), P("i"), "gather"),
    # ... unless the indices are the larger: then the table is gathered and the lookup keeps the indices' layout
    ("gather_rows_cheaper_to_gather_than_the_indices", lambda a, i: jnp.take(a, i, axis=1),
     [((16, 2), F32), ((256,), I32)], "4x2", (P("i"), P("i")), P(None, "i"), "gather"),
    ("conv_batch_and_kernel_share_a_mesh_axis", lambda x, w: lax.conv_general_dilated(
        x, w, (1, 1), "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW")), [((8, 3, 6, 6), F32), ((8, 3, 3, 3), F32)],
     "4x2", (P("i"), P("i")), P("i"), "conv_general_dilated"),
    ("device_put_passes_through", lambda a: jax.device_put(a) * 2, [(M, F32)], "4x2", (P("i", "j"),), P("i", "j"),
     "device_put"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_rule(case, meshes):
    _, f, arg_types, mesh_name, in_specs, expected, primitive = case
    args = random_args(arg_types)
    if arg_types[0][1] == I32:  # labels in range
        args = [np.abs(args[0]) % 16] + args[1:]
    if len(arg_types) > 1 and arg_types[1][1] == I32:
        args = [args[0], np.abs(args[1]) % 16]
    check_rule_case(f, args, mesh=meshes[mesh_name], in_specs=in_specs, expected=expected, primitive=primitive)


def test_random_numbers_are_drawn_per_block_and_equal_the_unsharded_ones(mesh):
    key = jax.random.key(3)

    def f(a):
        return a * jax.random.uniform(key, a.shape) + jax.random.normal(jax.random.fold_in(key, 1), a.shape)

    prog = assert_same_as_unsharded(f, random_args([(M, F32)]), mesh=mesh, in_specs=(P("i", "j"),), rtol=1e-6)
    assert not prog.sharded.fallbacks  # random ops have explicit rules, so no warning
    assert prog.out_specs == (P("i", "j"),)
    bits = [n for n in prog.sharded.graph.nodes if n.op == "random_bits"]
    assert bits and all(prog.plan.layout(n.output) == (("i",), ("j",)) for n in bits)  # each device its block
    assert not prog.communication()


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32])
@pytest.mark.parametrize("mesh_name,spec", [("4x2", P("i", "j")), ("4x2", P(None, ("j", "i"))),
                                            ("2x2x2", P(("k", "i"), "j")), ("8", P(None, "i"))])
def test_random_bits_of_a_block_are_the_unsharded_bits_at_its_positions(mesh_name, spec, dtype, meshes):
    """The oracle is JAX's own bits, bit for bit: each device hashes its elements' positions in the whole array."""
    key = jax.random.key(7)

    def f(a):  # the bits meet ``a`` (adding zero): they adopt its sharding
        return jax.random.bits(key, a.shape, dtype) + (a > 100).astype(dtype)

    (a,) = random_args([((16, 24), F32)])
    fs = sp.autoshard(f, mesh=meshes[mesh_name], in_specs=(spec,))
    np.testing.assert_array_equal(np.asarray(fs(a)), np.asarray(jax.random.bits(key, a.shape, dtype)))
    prog = fs.trace(a)
    (bits,) = [n for n in prog.sharded.graph.nodes if n.op == "random_bits"]
    assert prog.sharded.layout(bits.output) == prog.sharded.layout(prog.sharded.graph.inputs[0])
    assert not prog.communication()


def _batched_keys(a):
    keys = jax.random.split(jax.random.key(1), a.shape[0])
    return a * jax.vmap(lambda k: jax.random.uniform(k, a.shape[1:]))(keys)


def _rbg_key(a):
    return a * jax.random.uniform(jax.random.key(1, impl="rbg"), a.shape)


@pytest.mark.parametrize("f", [_batched_keys, _rbg_key], ids=["a batch of keys", "rbg"])
def test_other_random_generators_stay_replicated_and_exact(f, mesh):
    """Bits that do not depend on position alone are drawn whole on every device (conservative, on purpose)."""
    prog = assert_same_as_unsharded(f, random_args([(M, F32)]), mesh=mesh, in_specs=(P("i", "j"),), rtol=1e-6)
    bits = [n for n in prog.sharded.graph.nodes if n.op in ("random_bits", "rng_bit_generator")]
    assert bits and all(all(not m for m in prog.sharded.layout(v)) for n in bits for v in n.outputs)


def test_random_bits_without_partitionable_threefry_stay_replicated(mesh):
    key = jax.random.key(3)

    def f(a):
        return a * jax.random.uniform(key, a.shape)

    with jax.threefry_partitionable(False):
        prog = assert_same_as_unsharded(f, random_args([(M, F32)]), mesh=mesh, in_specs=(P("i", "j"),), rtol=1e-6)
        (bits,) = [n for n in prog.sharded.graph.nodes if n.op == "random_bits"]
        assert prog.sharded.layout(bits.output) == ((), ())


def _host_doubled(x):
    return jax.pure_callback(lambda v: v * 2.0, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


@pytest.mark.parametrize("name,f", [
    # only a body holding a primitive without a rule (a host callback) makes a loop or a branch fall back
    ("cond", lambda a: lax.cond(jnp.sum(a) > 0, _host_doubled, lambda x: x - jnp.mean(x, axis=0), a) + 1.0),
    ("while", lambda a: lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, _host_doubled(c[1])), (0, a))[1]),
    ("scan", lambda a: lax.scan(lambda c, r: (c + _host_doubled(r), c * r), jnp.zeros(a.shape[1]), a)[1]),
])
def test_a_body_without_a_rule_falls_back_naming_the_body_primitive(name, f, mesh):
    import warnings

    import shardprop as sp

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", sp.FallbackWarning)
        prog = assert_same_as_unsharded(f, random_args([(M, F32)]), mesh=mesh, in_specs=(P("i", "j"),))
    (message,) = [str(w.message) for w in caught if f"primitive `{name}`" in str(w.message)]
    assert "`pure_callback` at test_rules_shapes_indexing.py:" in message and "inside its body" in message
    (node,) = [n for n in prog.sharded.graph.nodes if n.op == name]
    assert node.id in prog.sharded.fallbacks
    assert all(m == () for v in node.outputs for m in prog.sharded.layout(v))
    with pytest.raises(sp.NoRuleError, match=rf"`{name}` .*`pure_callback` at .* inside its body has no rule"):
        sp.autoshard(f, mesh=mesh, in_specs=(P("i", "j"),), strict=True).trace(jax.ShapeDtypeStruct(M, F32))


@pytest.mark.parametrize("name,f", [
    ("cond on a reduced predicate", lambda a: lax.cond(jnp.sum(a) > 0, lambda x: x * 2.0, lambda x: -x, a) + 1.0),
    ("switch", lambda a: lax.switch(jnp.argmax(a[0]) % 3, [jnp.sin, jnp.cos, lambda x: x * 2.0], a)),
])
def test_branches_that_need_no_gather_stay_sharded(name, f, mesh):
    import warnings

    import shardprop as sp

    for strategy in ("gather", "collective", "auto"):
        with warnings.catch_warnings():
            warnings.simplefilter("error", sp.FallbackWarning)
            prog = assert_same_as_unsharded(f, random_args([(M, F32)]), mesh=mesh, in_specs=(P("i", "j"),),
                                            strategy=strategy)
        assert prog.out_specs == (P("i", "j"),)
        (node,) = [n for n in prog.sharded.graph.nodes if n.op == "cond"]
        assert prog.sharded.layout(node.outputs[0]) == (("i",), ("j",))  # each device took the branch on its block


def rnn(h0, xs, w):
    def step(h, x):
        h = jnp.tanh(h @ w + x)
        return h, h.sum(-1)

    return lax.scan(step, h0, xs)


@pytest.mark.parametrize("mesh_name,specs,expected", [
    # batch sharded: the body never touches it, so carry and outputs stay sharded, one stage, no gather
    ("4x2", (P("i"), P(None, "i"), None), (P("i"), P(None, "i"))),
    ("2x2x2", (P(("i", "j")), P(None, ("i", "j")), P()), (P(("i", "j")), P(None, ("i", "j")))),
    # hidden units sharded: `h @ w` contracts them every step, so the carry is replicated (gathered once); the
    # final carry, shaped like h0, is returned sliced like it (free)
    ("4x2", (P(None, "j"), None, None), (P(None, "j"), P())),
])
def test_scan_is_sharded_through_when_the_body_needs_no_gather(mesh_name, specs, expected, meshes):
    rng = np.random.default_rng(0)
    args = [rng.normal(size=(8, 16)).astype(F32), rng.normal(size=(5, 8, 16)).astype(F32),
            (rng.normal(size=(16, 16)) / 4).astype(F32)]
    prog = assert_same_as_unsharded(rnn, args, mesh=meshes[mesh_name], in_specs=specs)
    assert prog.out_specs == expected
    assert not prog.sharded.fallbacks and len(prog.stages) == 1
    (node,) = [n for n in prog.sharded.graph.nodes if n.op == "scan"]
    assert node.id in prog.sharded.bodies


def _cross_entropy(logits, labels):
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=1))


@pytest.mark.parametrize("mesh_name", ["8", "4x2"])
@pytest.mark.parametrize("strategy", ["gather", "auto"])
def test_a_batched_scatter_pairs_its_batch_axes_as_gather_does(mesh_name, strategy, meshes):
    """The gradient of an integer-label cross-entropy scatters each row's cotangent into that row: with the batch
    sharded, each device scatters its rows into its own (issue #17: the batch was gathered and the result
    replicated); jax.jit moves nothing here either."""
    logits = random_args([((16, 10), np.float32)])[0]
    labels = (np.arange(16) * 7 % 10).astype(np.int32)
    grad = jax.grad(_cross_entropy)
    prog = assert_same_as_unsharded(grad, (logits, labels), mesh=meshes[mesh_name], in_specs=(P("i"), P("i")),
                                    strategy=strategy)
    assert prog.communication() == [] and prog.out_specs == (P("i"),)


def test_a_vmapped_scatter_with_several_index_axes_stays_sharded_over_the_batch(meshes):
    def add_rows(x, idx, u):  # per example: x[idx[k]] += u[k] for every k (repeats accumulate)
        return x.at[idx].add(u)

    f = jax.vmap(add_rows)
    x, u = random_args([((8, 6, 4), np.float32), ((8, 5, 4), np.float32)])
    idx = (np.arange(40).reshape(8, 5) * 3 % 6).astype(np.int32)
    prog = assert_same_as_unsharded(f, (x, idx, u), mesh=meshes["4x2"], in_specs=(P("i", None, "j"), P("i"),
                                                                                  P("i", None, "j")))
    assert prog.communication() == [] and prog.out_specs == (P("i", None, "j"),)
