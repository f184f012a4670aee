"""Lineage against an independent oracle: the non-zero pattern of the Jacobian at a random point.

For an output block, input element ``x`` is a dependency when some output element of the block has a
non-zero derivative with respect to ``x``. Lineage must cover every such element (sound) and, where every
rule on the way is exact, cover nothing else (exact). The functions are smooth with random inputs, so a
structural dependency shows up as a non-zero derivative.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import shardprop as sp
from shardprop.inspect.lineage import block_box, dependencies, mask
from shardprop.core.boxes import MAX_BOXES


def nx_example(a, b):
    x = a + b
    y = a - b
    return jnp.sum(x, axis=1)[:, None] + jnp.sum(y, axis=0)[None, :]


def matmul_tanh(a, w):
    return jnp.tanh(a @ w)


def transpose_reshape(a, b):
    return (jnp.sin(a).T.reshape(4, 32) * 2.0).reshape(8, 16) + b


def slices_pads_concat(a, b):
    top = jnp.pad(a[2:10:2, 1:7], ((1, 3), (0, 2)))  # strided slice, then padding
    return jnp.concatenate([top, jnp.exp(b[:8])], axis=0)


def scans_and_windows(a, b):
    c = jnp.cumsum(a * b, axis=0)
    window = jax.lax.reduce_window(c, 0.0, jax.lax.add, (3, 1), (1, 1), "VALID")
    return window + jnp.flip(b[2:], axis=1)


def broadcasts_and_reductions(a, b):
    mean = jnp.mean(a, axis=0, keepdims=True)
    return jnp.cos(a - mean) @ jnp.sum(b, axis=1, keepdims=True) + jnp.max(b)


def attention_like(q, k):
    s = q @ k.T / 4.0
    p = jnp.exp(s - jnp.max(s, axis=-1, keepdims=True))
    return (p / jnp.sum(p, axis=-1, keepdims=True)) @ k


CASES = [
    ("nx_example", nx_example, [(16, 8), (16, 8)], (P("i", "j"), None)),
    ("matmul_tanh", matmul_tanh, [(16, 8), (8, 8)], (P("i"), P(None, "j"))),
    ("transpose_reshape", transpose_reshape, [(16, 8), (8, 16)], (P("i", "j"), None)),
    ("slices_pads_concat", slices_pads_concat, [(16, 8), (16, 8)], (P(None, "j"), P("i"))),
    ("scans_and_windows", scans_and_windows, [(16, 8), (16, 8)], (P("i", "j"), P("i", "j"))),
    ("broadcasts_and_reductions", broadcasts_and_reductions, [(16, 8), (8, 4)], (P("i", "j"), P())),
    ("attention_like", attention_like, [(16, 8), (16, 8)], (P("i"), None)),
]


def jacobian_dependencies(f, args, out_box, jac=None):
    """Per input, the boolean mask of elements some output element in ``out_box`` depends on (``jac``: the
    Jacobian of ``f`` at ``args`` if already computed)."""
    if jac is None:
        jac = jax.jit(jax.jacrev(f, argnums=tuple(range(len(args)))))(*args)
    index = tuple(slice(s, e) for s, e in out_box)
    deps = []
    for arg, j in zip(args, jac, strict=True):
        block = np.asarray(j)[index]  # output block axes, then input axes
        deps.append(np.any(block != 0, axis=tuple(range(len(out_box)))).reshape(arg.shape))
    return deps


def random_box(rng, shape):
    """A random non-empty box of ``shape``: one ``(start, stop)`` per axis."""
    box = []
    for n in shape:
        start = int(rng.integers(0, n))
        box.append((start, int(rng.integers(start + 1, n + 1))))
    return tuple(box)


@pytest.mark.parametrize("name,f,shapes,in_specs", CASES, ids=[c[0] for c in CASES])
def test_lineage_matches_jacobian_pattern(name, f, shapes, in_specs, mesh):
    rng = np.random.default_rng(0)
    args = [jnp.asarray(rng.normal(size=s), dtype=jnp.float32) for s in shapes]
    prog = sp.autoshard(f, mesh=mesh, in_specs=in_specs).trace(*args)
    graph = prog.sharded.graph
    out = graph.outputs[0]
    layout = prog.plan.layout(out)
    counts = [int(np.prod([mesh.shape[m] for m in axes])) for axes in layout]
    checked_exact = 0
    jac = jax.jit(jax.jacrev(f, argnums=tuple(range(len(args)))))(*args)  # once: every block reads its part
    for block in itertools.product(*(range(c) for c in counts)):
        result = sp.lineage(prog, output=0, block=block)
        want = jacobian_dependencies(f, args, block_box(prog, out, block), jac)
        for index, arg in enumerate(args):
            got = mask(arg.shape, result[index])
            missed = want[index] & ~got
            assert not missed.any(), f"{name} block {block}: lineage misses input {index} at {np.argwhere(missed)[:5]}"
            if result.exact:
                np.testing.assert_array_equal(got, want[index], err_msg=f"{name} block {block} input {index}")
        checked_exact += result.exact
    assert checked_exact, f"{name}: every block was inexact; the exactness claim was never tested"


@pytest.mark.parametrize("name,f,shapes,in_specs", CASES, ids=[c[0] for c in CASES])
def test_lineage_of_random_boxes_matches_jacobian_pattern(name, f, shapes, in_specs, mesh):
    """Blocks of a replicated output are the whole output; random boxes exercise every rule's index maps."""
    rng = np.random.default_rng(1)
    args = [jnp.asarray(rng.normal(size=s), dtype=jnp.float32) for s in shapes]
    graph = sp.trace(f, *args)
    out = graph.outputs[0]
    shape = graph.avals[out].shape
    exact_boxes = 0
    jac = jax.jit(jax.jacrev(f, argnums=tuple(range(len(args)))))(*args)  # once: every box reads its part
    for _ in range(12):
        box = random_box(rng, shape)
        found, exact = dependencies(graph, out, [box])
        want = jacobian_dependencies(f, args, box, jac)
        for index, arg in enumerate(args):
            got = mask(arg.shape, found[index])
            assert not (want[index] & ~got).any(), f"{name} box {box}: lineage misses part of input {index}"
            if exact:
                np.testing.assert_array_equal(got, want[index], err_msg=f"{name} box {box} input {index}")
        exact_boxes += exact
    assert exact_boxes == 12, f"{name}: these functions use exact rules only"


def test_nx_example_block_is_the_documented_boxes(mesh):
    a = jnp.ones((16, 8))
    prog = sp.autoshard(nx_example, mesh=mesh, in_specs=(P("i", "j"), None)).trace(a, a)
    result = sp.lineage(prog, output=0, block=(0, 1))
    # a[0:4, :] and a[:, 4:8], as in the issue (and the same of b)
    assert result == {0: [((0, 4), (0, 8)), ((0, 16), (4, 8))], 1: [((0, 4), (0, 8)), ((0, 16), (4, 8))]}
    assert result.exact


def test_lineage_of_an_intermediate_value(mesh):
    a = jnp.ones((16, 8))
    prog = sp.autoshard(nx_example, mesh=mesh, in_specs=(P("i", "j"), None)).trace(a, a)
    # e = sum(a + b, axis=1) is sharded over i: block 1 reads rows 4:8 of both inputs, every column
    assert sp.lineage(prog, value="e", block=(1,)) == {0: [((4, 8), (0, 8))], 1: [((4, 8), (0, 8))]}


def test_conservative_rules_say_they_are_not_exact(mesh):
    def f(x, i):
        return jax.lax.dynamic_slice(x, (i, 0), (4, 8)) * 2.0

    x = jnp.ones((16, 8))
    prog = sp.autoshard(f, mesh=mesh, in_specs=(P(None, "j"), P())).trace(x, jnp.int32(3))
    result = sp.lineage(prog, output=0, block=(0, 1))
    assert not result.exact
    assert result[0] == [((0, 16), (4, 8))]  # any row may be read; the column block is known


@pytest.mark.parametrize("block,message", [((0,), "rank 2"), ((4, 0), "out of range on axis 0"),
                                           ((0, 2), "out of range on axis 1")])
def test_bad_blocks_raise_typed_errors(block, message, mesh):
    a = jnp.ones((16, 8))
    prog = sp.autoshard(nx_example, mesh=mesh, in_specs=(P("i", "j"), None)).trace(a, a)
    with pytest.raises(sp.OptionError, match=message):
        sp.lineage(prog, output=0, block=block)
    with pytest.raises(sp.OptionError, match="no value"):
        sp.lineage(prog, value="zz", block=None)


# Edge cases of single rules. `smooth` marks functions whose derivative is non-zero wherever an input element
# can change the output: for them the Jacobian pattern is the exact dependency set. For max, select, sort,
# top_k and clip it is not (only the winning element has a non-zero derivative at a point, although every
# element of the window could win), so there the oracle checks soundness only.
EDGE_CASES = {
    "negative_pad": (lambda x: jnp.sin(jax.lax.pad(x, 0.0, ((-2, 3, 0), (1, -1, 2)))), [(10, 6)], True),
    "interior_pad_value": (lambda x, v: jax.lax.pad(x, v, ((1, 2, 1), (0, 0, 3))), [(5, 4), ()], True),
    "strided_slice": (lambda x: x[1:9:3, ::2] * 2.0, [(10, 8)], True),
    "reshape_split_merge": (lambda x: jnp.sin(x.reshape(2, 1, 3, 8, 1).transpose(3, 0, 2, 1, 4).reshape(4, 12)),
                            [(6, 8)], True),
    "reshape_size_one_axes": (lambda x: x.reshape(1, 4, 1, 6, 1) * 2.0, [(4, 6)], True),
    "flip_reshape_slice": (lambda x: jnp.flip(x.reshape(4, 6), 1).reshape(24)[3:20], [(2, 12)], True),
    "transpose_rank3": (lambda x: jnp.transpose(x, (2, 0, 1)) ** 2, [(3, 4, 5)], True),
    "window_same_padding": (lambda x: jax.lax.reduce_window(x, 0.0, jax.lax.add, (3, 2), (2, 3), "SAME"),
                            [(9, 10)], True),
    "window_max": (lambda x: jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (2, 2), (1, 1), ((1, 0), (0, 1))),
                   [(6, 5)], False),
    "dot_batch": (lambda a, b: jnp.einsum("bij,bjk->bik", a, b), [(3, 4, 5), (3, 5, 2)], True),
    "dot_batch_permuted": (lambda a, b: jnp.einsum("ibj,kjb->bik", a, b), [(4, 3, 5), (2, 5, 3)], True),
    "concatenate_three": (lambda a, b, c: jnp.concatenate([a, b, c], axis=1) ** 2, [(3, 2), (3, 4), (3, 1)], True),
    "split": (lambda x: jnp.split(x, [2, 5], axis=1)[1] * 2.0, [(3, 7)], True),
    "cumsum_reverse": (lambda x: jax.lax.cumsum(x, axis=1, reverse=True) ** 2, [(4, 6)], True),
    "cumprod": (lambda x: jnp.cumprod(x, axis=0), [(5, 3)], True),
    "broadcast_scalar": (lambda x, s: jnp.broadcast_to(x[:, None, :], (4, 3, 5)) * s, [(4, 5), ()], True),
    "squeeze": (lambda x: jnp.squeeze(x, axis=(0, 2)) ** 2, [(1, 4, 1, 3)], True),
    "convolution": (lambda x, w: jax.lax.conv(x, w, (1, 1), "SAME"), [(2, 3, 6, 6), (4, 3, 3, 3)], True),
    "sort_with_payload": (lambda x, y: jax.lax.sort((x, y), dimension=1, num_keys=1)[1] * 1.0, [(3, 5), (3, 5)],
                          False),
    "top_k": (lambda x: jax.lax.top_k(x, 2)[0], [(4, 6)], False),
    "max_over_two_axes": (lambda x: jnp.max(x, axis=(0, 2)), [(3, 4, 5)], False),
    "select": (lambda x, y: jnp.where(x > 0, x, y), [(4, 4), (4, 4)], False),
    "clip": (lambda x, a: jnp.clip(x, a, 2.0), [(4, 4), ()], False),
    "reshape_order_f": (lambda x: jnp.reshape(x, (8, 4), order="F") * 2.0, [(4, 8)], True),
    "ravel_order_f": (lambda x: jnp.ravel(x, order="F")[3:17] ** 2, [(3, 2, 4)], True),
    "reshape_with_dimensions": (lambda x: jax.lax.reshape(x, (4, 6), dimensions=(2, 0, 1)) * 3.0, [(2, 3, 4)],
                                True),
    "window_dilated": (lambda x: jax.lax.reduce_window(x, 0.0, jax.lax.add, (2, 3), (1, 1), "VALID",
                                                       window_dilation=(3, 2)), [(9, 8)], True),
    "large_strided_slice": (lambda x: x[::2, 1::3] * 2.0, [(96, 99)], True),
    "gather_rows": (lambda x: x[jnp.array([4, 0, 2])] * 2.0, [(5, 6)], True),
    "gather_rows_and_slice": (lambda x: x[jnp.array([[0, 2], [1, 3]]), :, 1:3] ** 2, [(5, 6, 7)], True),
    "gather_point": (lambda x: x[jnp.array([3, 1]), jnp.array([0, 4])] * 1.5, [(4, 5)], True),
    "take_along_axis": (lambda x: jnp.take_along_axis(x, jnp.array([[[0], [3]], [[2], [2]]]), axis=1) * 2.0,
                        [(2, 4, 3)], True),
    "scatter_add_rows": (lambda x, u: x.at[jnp.array([1, 3])].add(u), [(5, 4), (2, 4)], True),
    "scatter_set_column_window": (lambda x, u: x.at[jnp.array([0, 2]), 1:3].set(u * 2.0), [(4, 5), (2, 2)], False),
    "scatter_mul_points": (lambda x, u: x.at[jnp.array([2, 0]), jnp.array([1, 1])].multiply(u, unique_indices=True),
                           [(3, 3), (2,)], False),
}


@pytest.mark.parametrize("name", list(EDGE_CASES))
def test_rule_edge_cases_against_jacobian_pattern(name):
    f, shapes, smooth = EDGE_CASES[name]
    rng = np.random.default_rng(2)
    args = [jnp.asarray(rng.normal(size=s), dtype=jnp.float32) for s in shapes]
    graph = sp.trace(f, *args)
    out = graph.outputs[0]
    shape = graph.avals[out].shape
    jac = jax.jit(jax.jacrev(f, argnums=tuple(range(len(args)))))(*args)  # once: every box reads its part
    for _ in range(10):
        box = random_box(rng, shape)
        found, exact = dependencies(graph, out, [box])
        want = jacobian_dependencies(f, args, box, jac)
        for index, arg in enumerate(args):
            got = mask(arg.shape, found[index])
            assert not (want[index] & ~got).any(), f"{name} box {box}: lineage misses part of input {index}"
            if exact and smooth:
                np.testing.assert_array_equal(got, want[index], err_msg=f"{name} box {box} input {index}")


def _scan_cumulative(c0, xs):
    def body(c, x):
        c = c * 0.5 + x
        return c, jnp.sin(c)
    return jax.lax.scan(body, c0, xs)


def _scan_reverse(c0, xs):
    def body(c, x):
        return c + x[:2], x * 2.0 + c[0]
    return jax.lax.scan(body, c0, xs, reverse=True)


def _scan_shared_carries(c0, xs):
    def body(carry, x):
        a, b = carry
        return (b, b + x), a * x
    return jax.lax.scan(body, (c0, c0), xs)


def _scan_consts_and_nested(w, c0, xs):
    def inner(c, x):
        return c + x, c * x

    def body(c, x):
        c2, ys = jax.lax.scan(inner, c, x)
        return jnp.tanh(c2 @ w), ys[::-1] * 2.0
    return jax.lax.scan(body, c0, xs)


SCANS = {
    # name: (function, argument shapes, iterations of xs a block of ys may read: "prefix", "suffix", "same")
    "map": (lambda w, xs: jax.lax.map(lambda x: jnp.tanh(x @ w), xs), [(4, 4), (6, 3, 4)], "same"),
    "cumulative": (_scan_cumulative, [(3,), (6, 3)], "prefix"),
    "reverse": (_scan_reverse, [(2,), (5, 2)], "suffix"),
    "shared_carries": (_scan_shared_carries, [(3,), (6, 3)], "prefix"),
    "consts_and_nested": (_scan_consts_and_nested, [(3, 3), (3,), (4, 2, 3)], "prefix"),
}


@pytest.mark.parametrize("name", list(SCANS))
def test_scan_lineage_looks_inside_the_body(name):
    """Every output of a scan against the Jacobian pattern; a block of ``ys`` never reads iterations of
    ``xs`` the scan has not reached yet (causality), and a ``map`` is exact."""
    f, shapes, reads = SCANS[name]
    rng = np.random.default_rng(4)
    args = [jnp.asarray(rng.normal(size=s), dtype=jnp.float32) for s in shapes]
    graph = sp.trace(f, *args)
    xs_index, length = len(args) - 1, shapes[-1][0]
    for k, out in enumerate(graph.outputs):
        shape = graph.avals[out].shape
        is_y = k == len(graph.outputs) - 1  # every scan here has its ys last
        output_k = jax.jit(lambda *a, k=k: jax.tree_util.tree_leaves(f(*a))[k])
        jac = jax.jit(jax.jacrev(output_k, argnums=tuple(range(len(args)))))(*args)
        for _ in range(8):
            box = random_box(rng, shape)
            found, exact = dependencies(graph, out, [box])
            want = jacobian_dependencies(output_k, args, box, jac)
            for index, arg in enumerate(args):
                got = mask(arg.shape, found[index])
                assert not (want[index] & ~got).any(), f"{name} output {k} box {box}: misses input {index}"
                if exact:
                    np.testing.assert_array_equal(got, want[index], err_msg=f"{name} output {k} box {box}")
            if is_y:
                (start, stop) = box[0]
                allowed = {"same": (start, stop), "prefix": (0, stop), "suffix": (start, length)}[reads]
                read = np.flatnonzero(mask(args[xs_index].shape, found[xs_index]).any(
                    axis=tuple(range(1, len(shapes[-1])))))
                assert read.size and allowed[0] <= read.min() and read.max() < allowed[1], (name, box, read)
        if name == "map":
            assert exact


def test_many_pieces_are_widened_before_they_are_built():
    """A strided slice of a large tensor would read one piece per element: the rule widens to a hull before
    building the product, so lineage stays small (and says it is not exact)."""
    graph = sp.trace(lambda x: x[::2, ::2] * 2.0, jax.ShapeDtypeStruct((4096, 4096), jnp.float32))
    found, exact = dependencies(graph, graph.outputs[0], [((0, 2048), (0, 2048))])
    assert not exact and 1 <= len(found[0]) <= MAX_BOXES
    assert mask((4096, 4096), found[0])[::2, ::2].all()  # still sound: every element read is covered


def test_variadic_window_reads_every_operand_and_says_it_may_over_approximate():
    def f(a, b):
        return jax.lax.reduce_window((a, b), (0.0, 0.0), lambda x, y: (x[0] + y[0], x[1] * y[1]), (2,), (1,),
                                     "VALID")[1]

    graph = sp.trace(f, jnp.ones(6), jnp.ones(6))
    found, exact = dependencies(graph, graph.outputs[0], [((1, 3),)])
    assert not exact
    assert found[1] == [((1, 4),)]  # the windows of outputs 1 and 2: b[1:4]


def test_gather_and_scatter_narrow_the_axes_the_indices_do_not_move():
    """An embedding lookup: a block of rows reads its own indices and, of the table, every row (the indices
    choose) but only the block's columns; a scatter-add block reads the operand under it and only the
    update columns that land there."""
    def embed(table, ids):
        return table[ids]

    graph = sp.trace(embed, jax.ShapeDtypeStruct((50, 8), jnp.float32), jax.ShapeDtypeStruct((6,), jnp.int32))
    found, exact = dependencies(graph, graph.outputs[0], [((2, 4), (0, 4))])
    assert not exact
    assert found[0] == [((0, 50), (0, 4))] and found[1] == [((2, 4),)]

    def add_rows(x, ids, u):
        return x.at[ids].add(u)

    graph = sp.trace(add_rows, jax.ShapeDtypeStruct((10, 8), jnp.float32), jax.ShapeDtypeStruct((3,), jnp.int32),
                     jax.ShapeDtypeStruct((3, 8), jnp.float32))
    found, _ = dependencies(graph, graph.outputs[0], [((0, 5), (6, 8))])
    assert found[0] == [((0, 5), (6, 8))] and found[1] == [((0, 3),)] and found[2] == [((0, 3), (6, 8))]


def _while_elementwise(n, x, c0):
    return jax.lax.fori_loop(0, n, lambda i, c: c * 0.5 + jnp.sin(x), c0)  # n traced: a while loop


def _while_shifting(n, x, c0):
    return jax.lax.fori_loop(0, n, lambda i, c: jnp.concatenate([c[1:], c[:1]]) + x, c0)


def _while_on_data(n, x, c0):
    def cond(state):
        return jnp.sum(state[1][:2]) < 4.0 + n  # reads two elements of the carry: every block depends on them

    def body(state):
        k, c = state
        return k + 1, c + jnp.abs(x) + 0.1
    return jax.lax.while_loop(cond, body, (0, c0))[1]


WHILES = {
    # name: (function, what a block [s, e) of the output reads of x and of c0: "block" or "all"/"block+2")
    "elementwise": (_while_elementwise, "block", "block"),
    "shifting": (_while_shifting, "all", "all"),
    "on_data": (_while_on_data, "block+2", "block+2"),  # the carry the condition reads depends on x[:2]
}


@pytest.mark.parametrize("name", list(WHILES))
def test_while_lineage_looks_inside_the_body_and_the_condition(name):
    """A block of a while loop's result against the Jacobian pattern (forward mode: reverse mode does not
    differentiate while loops), and as narrow as the body and the condition allow: an elementwise body reads the
    block only, a shifting one grows to the whole carry, a condition's reads are read by every block."""
    f, reads_x, reads_c = WHILES[name]
    rng = np.random.default_rng(5)
    n = jnp.int32(3)
    x, c0 = (jnp.asarray(rng.normal(size=8), dtype=jnp.float32) for _ in range(2))
    graph = sp.trace(f, n, x, c0)
    assert "while" in [node.op for node in graph.nodes]
    jac = jax.jit(jax.jacfwd(lambda x, c0: f(n, x, c0), argnums=(0, 1)))(x, c0)
    for start, stop in [(0, 2), (3, 5), (6, 8)]:
        found, exact = dependencies(graph, graph.outputs[0], [((start, stop),)])
        assert not exact
        want = jacobian_dependencies(lambda x, c0: f(n, x, c0), [x, c0], ((start, stop),), jac)
        got = [mask((8,), found[1]), mask((8,), found[2])]
        for w, g in zip(want, got, strict=True):
            assert not (w & ~g).any(), f"{name}: lineage misses a dependency of [{start}:{stop}]"
        block = np.zeros(8, bool)
        block[start:stop] = True
        with_cond = block.copy()
        with_cond[:2] = True
        expected = {"block": block, "all": np.ones(8, bool), "block+2": with_cond}
        np.testing.assert_array_equal(got[0], expected[reads_x], err_msg=f"{name} x [{start}:{stop}]")
        np.testing.assert_array_equal(got[1], expected[reads_c], err_msg=f"{name} c0 [{start}:{stop}]")
        assert mask((), found[0]).all()  # the trip count decides how many iterations run
