"""The backward pass (propagation/uses.py): a value's uses decide its layout where producing it so costs least.

Each program runs sharded and is compared with the unsharded function (rtol 1e-5); its bytes with jax.jit's on the
same mesh and input shardings; and the ReshardWarnings it raises are counted: the conflicts the backward pass avoids
raise none, a clash of the user's own layouts still warns.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardprop as sp
from shardprop.core.layouts import layout_from_spec
from shardprop.mesh import as_auto_mesh
from shardprop.propagation.propagate import flat_in_specs, propagate_layouts

DATA, MODEL = "data", "model"


def _normal(*shape, seed=0):
    return np.random.default_rng(seed + sum(shape)).normal(size=shape).astype(np.float32)


def _sgd(loss):
    def step(params, x, y):
        grads = jax.grad(loss)(params, x, y)
        return jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads)
    return step


def _out_in_mlp(params, x, y):
    """Weights laid out (out, in), as equinox's Linear: each layer computes h @ W.T."""
    h = x
    for w in params[:-1]:
        h = jax.nn.relu(h @ w.T)
    return jnp.mean((h @ params[-1].T - y) ** 2)


def _in_out_mlp(params, x, y):
    h = jnp.tanh(x @ params[0])
    return jnp.mean((h @ params[1] - y) ** 2)


def _head(w, h, y):
    return jnp.sum((h @ w.T - y) ** 2)


# name -> (function, arguments, in_specs, ReshardWarnings expected, why)
PROGRAMS = {
    # The second layer's weight gradient contracts a cotangent sharded over model (from the last layer's input axis)
    # with an activation held whole: the forward walk kept the cotangent's sharding, the update `p - lr * g` then
    # needed an all-to-all and warned. Taking the activation sliced and the cotangent gathered (it is gathered for
    # the input gradient anyway) produces the gradient in the parameter's layout. The first layer's gradient could be
    # produced so too, by gathering a larger cotangent: the all-to-all at the update is cheaper, a priced choice
    # (as jax.jit makes it), not warned about.
    "three out-in layers, sgd": (_sgd(_out_in_mlp), ([_normal(16, 8), _normal(16, 16), _normal(4, 16)],
                                                     _normal(32, 8), _normal(32, 4)),
                                 ([P(None, MODEL)] * 3, P(DATA), P(DATA)), 0),
    "two out-in layers, sgd": (_sgd(_out_in_mlp), ([_normal(16, 8), _normal(4, 16)], _normal(32, 8),
                                                   _normal(32, 4)), ([P(None, MODEL)] * 2, P(DATA), P(DATA)), 0),
    # Megatron's column-then-row pair: nothing to resolve; the pass must not make it worse
    "megatron pair, sgd": (_sgd(_in_out_mlp), ([_normal(8, 16), _normal(16, 4)], _normal(32, 8), _normal(32, 4)),
                           ([P(None, MODEL), P(MODEL, None)], P(DATA), P(DATA)), 0),
    # An (out, in) head's gradient sums over the batch: computed whole along in (the activation arrives whole there)
    # it would be sliced by the update; taken from the activation's block, each device sums only its columns and the
    # psum is half as large.
    "head gradient, sliced where computed": (_sgd(_head), (_normal(8, 16), _normal(32, 16), _normal(32, 8)),
                                             (P(None, MODEL), P(DATA), P(DATA)), 0),
}


def _trimmed(spec: P) -> tuple:
    entries = list(spec)
    while entries and entries[-1] is None:
        entries.pop()
    return tuple(entries)


def _run(name):
    f, args, specs, _ = PROGRAMS[name]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        comparison = sp.compare_with_jit(f, sp.make_mesh((4, 2), (DATA, MODEL)), specs, *args)
    reshards = [w for w in caught if issubclass(w.category, sp.ReshardWarning)]
    return comparison, reshards


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_a_use_decides_its_operands_layout_where_that_costs_least(name):
    f, args, specs, warned = PROGRAMS[name]
    comparison, reshards = _run(name)
    got, want = comparison.program(*args), f(*args)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)
    assert len(reshards) == warned, [str(w.message).splitlines()[0] for w in reshards]
    assert comparison.shardprop_bytes <= comparison.jit_bytes, str(comparison)
    # the updated parameters keep their own layouts
    assert list(map(_trimmed, comparison.shardprop_out_specs)) == list(map(_trimmed, jax.tree_util.tree_leaves(
        specs[0], is_leaf=lambda s: isinstance(s, P))))


def test_explain_says_a_layout_came_backward_from_a_use():
    comparison, _ = _run("head gradient, sliced where computed")
    prog = comparison.program
    contraction = next(n for n in prog.plan.graph.nodes if n.op == "dot_general" and n.id in
                       {node for node, _ in prog.plan.sharded.views})
    text = str(sp.explain(prog, contraction.outputs[0]))
    assert "backward from a use: `sub`" in text and "(axis 1 sliced over model)" in text, text


def test_a_priced_move_is_no_error_under_conflicts_error_and_explain_says_why():
    """The first layer's gradient meets its parameter in another layout: the backward pass priced producing it in
    place (a larger cotangent gathered) against the all-to-all at the update, which costs less. The move is chosen,
    not a clash of the user's layouts: no warning, no error under conflicts='error', and explain says so."""
    f, args, specs, _ = PROGRAMS["two out-in layers, sgd"]
    mesh = sp.make_mesh((4, 2), (DATA, MODEL))
    prog = sp.autoshard(f, mesh=mesh, in_specs=specs, conflicts="error").trace(*args)
    (node,) = prog.plan.sharded.priced
    text = str(sp.explain(prog, prog.plan.graph.nodes[node].outputs[0]))
    assert "the cheapest way" in text and "moved to resolve a sharding conflict" in text, text


@pytest.mark.parametrize("name,f,specs", [
    ("x + x.T", lambda x, y: x + x.T, (P(DATA), None)),
    ("two arguments laid out crosswise", lambda x, y: x * y, (P(DATA, MODEL), P(MODEL, DATA))),
])
def test_a_clash_of_the_users_own_layouts_warns_and_halts_under_conflicts_error(name, f, specs):
    """No node could produce the moved operand in the other layout by a choice: x + x.T's all-to-all before the
    transpose costs what it costs after; two arguments are laid out as the user says. The conflict stays where the
    user's code meets it: warned, and refused under conflicts='error'."""
    mesh = sp.make_mesh((4, 2), (DATA, MODEL))
    args = (_normal(16, 16), _normal(16, 16, seed=1))
    with pytest.warns(sp.ReshardWarning, match="resolved a sharding conflict"):
        prog = sp.autoshard(f, mesh=mesh, in_specs=specs).trace(*args)
    assert not prog.plan.sharded.views and not prog.plan.sharded.priced
    with pytest.raises(sp.ShardingConflictError):
        sp.autoshard(f, mesh=mesh, in_specs=specs, conflicts="error").trace(*args)


def test_the_design_notes_example_prints_what_they_show():
    """docs/design.md pastes `python -m shardprop.examples.backward`'s explain output and bytes: checked against a
real run."""
    import pathlib
    import runpy

    example = runpy.run_path(str(pathlib.Path(__file__).parents[2] / "shardprop" / "examples" / "backward.py"))
    mesh = sp.make_mesh((4, 2), (DATA, MODEL))
    prog = sp.autoshard(example["step"], mesh=mesh, in_specs=example["SPECS"]).trace(*example["arguments"]())
    design = (pathlib.Path(__file__).parents[2] / "docs" / "design.md").read_text()
    for line in str(sp.explain(prog, "t")).splitlines():
        if "origin: `transpose`" in line or line.startswith("t:") or "finishes the result" in line:
            assert line in design, line
    comparison = sp.compare_with_jit(example["step"], mesh, example["SPECS"], *example["arguments"]())
    assert (comparison.shardprop_bytes, comparison.jit_bytes) == (960, 1088) and "960 B per device, where" in design


def test_a_product_meeting_an_argument_laid_out_crosswise_still_warns():
    """`a @ w + b`, `a` and `b` laid out crosswise: the contraction could follow the unannotated `w` instead, but only
    by an all-to-all of `a` — the clash is the user's (found by review: it was priced, silently)."""
    mesh = sp.make_mesh((4, 2), (DATA, MODEL))
    args = (_normal(64, 16), _normal(16, 8), _normal(64, 8))
    specs = (P(DATA, MODEL), None, P(MODEL, DATA))
    with pytest.warns(sp.ReshardWarning, match="in `add`"):
        got = sp.autoshard(lambda a, w, b: a @ w + b, mesh=mesh, in_specs=specs)(*args)
    np.testing.assert_allclose(np.asarray(got), args[0] @ args[1] + args[2], rtol=1e-5, atol=1e-5)
    with pytest.raises(sp.ShardingConflictError):
        sp.autoshard(lambda a, w, b: a @ w + b, mesh=mesh, in_specs=specs, conflicts="error").trace(*args)


def _constrained_sum(mesh):
    return lambda c: jax.lax.with_sharding_constraint(c.sum(0) * 2, NamedSharding(mesh, P(DATA)))


@pytest.mark.parametrize("name,f,want", [
    ("a sum laid out by out_specs", lambda mesh: lambda c: c.sum(0), lambda c: c.sum(0)),
    ("a sum laid out by a constraint", _constrained_sum, lambda c: c.sum(0) * 2),
    ("an outer product of a sum", lambda mesh: lambda c: jnp.outer(c.sum(0), jnp.arange(8.0)),
     lambda c: np.outer(c.sum(0), np.arange(8.0))),
])
def test_a_reduction_takes_its_operand_as_its_use_asks(name, f, want):
    """A sum whose use wants it sliced over another mesh axis takes its operand's kept axis sliced; its partial-sum
    finish reads the kept axis as the rule takes it (found by review: each device summed its whole row block and
    handed back all 8 values as its 2-value block)."""
    mesh = sp.make_mesh((4, 2), (DATA, MODEL))
    c = _normal(8, 8)
    out_specs = P(DATA) if name == "a sum laid out by out_specs" else None
    got = sp.autoshard(f(mesh), mesh=mesh, in_specs=(P(MODEL),), out_specs=out_specs)(c)
    np.testing.assert_allclose(np.asarray(got), want(c), rtol=1e-5, atol=1e-5)


def test_the_design_notes_mirror_example_prints_what_they_show():
    """docs/design.md pastes `python -m shardprop.examples.mirrors`'s explain output: checked against a real run, the
    gradients laid out like their arguments and equal to the unsharded ones."""
    import pathlib
    import runpy

    example = runpy.run_path(str(pathlib.Path(__file__).parents[2] / "shardprop" / "examples" / "mirrors.py"))
    mesh = sp.make_mesh((2, 2), ("x", "y"))
    args = example["arguments"]()
    prog = sp.autoshard(example["gradients"], mesh=mesh, in_specs=example["SPECS"]).trace(*args)
    assert prog.out_specs == example["SPECS"]
    for got, want in zip(prog(*args), example["gradients"](*args), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    design = (pathlib.Path(__file__).parents[2] / "docs" / "design.md").read_text()
    for line in str(sp.explain(prog, prog.plan.graph.outputs[0])).splitlines():
        if "origin: `broadcast_in_dim`" in line or line.startswith("g:"):
            assert line in design, line


def test_a_result_no_node_can_produce_sliced_is_returned_sliced_like_its_argument():
    """A sort along the sharded axis needs it whole; its result, shaped like the argument and read by no node, is
    returned sliced like it — free — and explain says so. An output the user laid out (out_specs) is left so."""
    mesh = sp.make_mesh((4, 2), (DATA, MODEL))
    x = _normal(8, 4)
    prog = sp.autoshard(lambda x: jnp.sort(x, axis=0), mesh=mesh, in_specs=(P(DATA),)).trace(x)
    assert prog.out_specs == (P(DATA),) and prog.plan.sharded.spec(prog.plan.graph.outputs[0]) == P()
    got = prog(x)
    assert got.sharding.spec == P(DATA)
    np.testing.assert_array_equal(np.asarray(got), np.sort(x, axis=0))
    (axis, _) = sp.explain(prog, prog.plan.graph.outputs[0]).axes
    assert axis.origin.startswith("returned as output 0 sliced over data, laid out like argument x (a)")
    pinned = sp.autoshard(lambda x: jnp.sort(x, axis=0), mesh=mesh, in_specs=(P(DATA),), out_specs=P()).trace(x)
    assert pinned.out_specs == (P(),) and pinned(x).sharding.spec == P()


def test_a_view_changes_only_the_axes_it_asks_for():
    """A view asks an operand laid out otherwise on some axes; where the views made an open axis upstream adopt a mesh
    axis (here the gradient's constant seed, adopting the argument's row sharding), the view's other axes keep it
    rather than gathering it back. Found by the fuzzer: the gradient of a strided max window after a roll came out
    P(None, ('j','k')) although P('i', ('j','k')), its argument's layout, moves no more (4 B either way)."""
    mesh = sp.make_mesh((2, 2, 2), ("i", "j", "k"))

    def f(x):
        v = jnp.roll(x, 0, axis=1)
        w = jax.lax.reduce_window(v, -jnp.inf, jax.lax.max, (1, 1, 1), (2, 1, 1), "SAME")
        return jnp.sum(v * jnp.cos(jnp.arange(8.0).reshape(v.shape))) + jnp.sum(w * jnp.cos(jnp.arange(4.0)))[None]

    x = _normal(2, 4, 1)
    grad = jax.grad(lambda x: f(x)[0])
    prog = sp.autoshard(grad, mesh=mesh, in_specs=(P("i", ("j", "k")),)).trace(x)
    assert _trimmed(prog.out_specs[0]) == ("i", ("j", "k"))
    assert sum(t.moved_bytes for t in prog.estimated_communication()) <= 4.0
    np.testing.assert_allclose(np.asarray(prog(x)), np.asarray(grad(x)), rtol=1e-5, atol=1e-6)


def test_one_value_returned_for_two_arguments_comes_back_like_each():
    """The gradients of x0 + x1 are one value, returned twice: with x0 laid out P(None, 'i') and x1 P('j', 'i'), the
    value is made in what both layouts start with and each output is its slice (free), rather than made like x1 and
    gathered for x0. Found by the fuzzer."""
    mesh = sp.make_mesh((4, 2), (DATA, MODEL))
    x0, x1 = _normal(2, 4), _normal(2, 4, seed=1)
    grad = jax.grad(lambda a, b: jnp.sum((a + b) * jnp.cos(jnp.arange(8.0).reshape(2, 4))), (0, 1))
    prog = sp.autoshard(grad, mesh=mesh, in_specs=(P(None, DATA), P(MODEL, DATA))).trace(x0, x1)
    assert prog.out_specs == (P(None, DATA), P(MODEL, DATA))
    assert sum(t.moved_bytes for t in prog.estimated_communication()) == 0
    got = prog(x0, x1)
    assert [g.sharding.spec for g in got] == [P(None, DATA), P(MODEL, DATA)]
    for g, w in zip(got, grad(x0, x1), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6)


def test_a_value_its_readers_slice_is_made_as_held_where_an_output_mirrors_another_slice_of_it():
    """The gradient of x0 + x1 with x1 broadcast: x0's gradient is the cotangent itself, x1's its sum over the
    broadcast axis. The sum slices the cotangent over j (x1's layout), x0's gradient mirrors i: made replicated, as
    the forward walk made it, each takes its own slice (free), rather than made over j and x0's gradient left so.
    Found by the fuzzer."""
    mesh = sp.make_mesh((2, 2, 2), ("i", "j", "k"))
    x0, x1 = _normal(1, 3, 2), _normal(1, 1, 2, seed=1)
    grad = jax.grad(lambda a, b: jnp.sum((a + b) * jnp.cos(jnp.arange(6.0).reshape(1, 3, 2))), (0, 1))
    prog = sp.autoshard(grad, mesh=mesh, in_specs=(P(None, None, "i"), P(None, None, "j"))).trace(x0, x1)
    assert [_trimmed(s) for s in prog.out_specs] == [(None, None, "i"), (None, None, "j")]
    assert sum(t.moved_bytes for t in prog.estimated_communication()) == 0
    for g, w in zip(prog(x0, x1), grad(x0, x1), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6)


def test_an_output_whose_chain_would_cost_to_adopt_is_returned_sliced():
    """grad of cumsum(x0) with respect to (x0, x1): x0's gradient is a reversed cumsum of the seed, x1's a zero
    broadcast. Adopting x0's layout all along the seed's chain would finish the cumsum across devices (28 B); made
    replicated and returned sliced it moves nothing — both are priced — and the zeros adopt x1's layout. Found by
    the fuzzer."""
    mesh = sp.make_mesh((8,), ("i",))
    x0, x1 = _normal(8), _normal(8, seed=1)
    grad = jax.grad(lambda a, b: jnp.sum(jax.lax.cumsum(a, axis=0) * jnp.cos(jnp.arange(8.0))), (0, 1))
    prog = sp.autoshard(grad, mesh=mesh, in_specs=(P("i"), P("i"))).trace(x0, x1)
    assert prog.out_specs == (P("i"), P("i"))
    assert sum(t.moved_bytes for t in prog.estimated_communication()) == 0
    for g, w in zip(prog(x0, x1), grad(x0, x1), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6)


def test_a_created_value_a_reshape_cannot_carry_is_made_whole_and_sliced_for_its_view():
    """grad of (x0.reshape(2, 4), x0[:1]) with respect to (x0, x1, x2): every gradient is computed from constants
    alone (the weights' iota and cos). The view asking x0's gradient over i reaches the iota through a reshape to
    (2, 4), which cannot carry an 8-way axis: adopting i there would gather the iota (28 B); made whole and sliced for
    the view it moves nothing, and every gradient comes out in its argument's layout. Found by the fuzzer (older than
    issue #50)."""
    mesh = sp.make_mesh((8,), ("i",))
    xs = _normal(8), _normal(8, seed=1), _normal(8, seed=2)

    def loss(a, b, c):
        outs = (a.reshape(2, 4), jax.lax.slice_in_dim(a, 0, 1, 1, axis=0))
        return sum(jnp.sum(o * jnp.cos(jnp.arange(o.size, dtype=o.dtype).reshape(o.shape))) for o in outs)

    grad = jax.grad(loss, (0, 1, 2))
    prog = sp.autoshard(grad, mesh=mesh, in_specs=(P("i"),) * 3).trace(*xs)
    assert prog.out_specs == (P("i"),) * 3
    assert sum(t.moved_bytes for t in prog.estimated_communication()) == 0
    for g, w in zip(prog(*xs), grad(*xs), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6)


def test_a_windowed_result_is_returned_sliced_rather_than_computed_from_a_halo():
    """grad of a windowed sum (window 3 along the axis over j) of constants alone: computing the gradient sliced over
    j would take a halo of its operand (12 B); computed whole, as the forward walk makes it, and returned sliced like
    its argument it moves nothing — the returned view alone is a candidate too. Found by the fuzzer (older than issue
    #50)."""
    mesh = sp.make_mesh((4, 2), ("i", "j"))
    x = _normal(1, 2, 1)

    def loss(a):
        window = jax.lax.reduce_window(a, 0.0, jax.lax.add, (1, 3, 1), (1, 1, 1), "SAME")
        return jnp.sum(window * jnp.cos(jnp.arange(2.0).reshape(1, 2, 1)))

    prog = sp.autoshard(jax.grad(loss), mesh=mesh, in_specs=P("i", "j", None)).trace(x)
    assert prog.out_specs == (P(None, "j"),)  # like its argument: axis 0 (one row) is not split over i
    assert sum(t.moved_bytes for t in prog.estimated_communication()) == 0
    np.testing.assert_allclose(np.asarray(prog(x)), np.asarray(jax.grad(loss)(x)), rtol=1e-6)


@pytest.mark.parametrize("name,f,specs", [
    # tokens and the table's features over one mesh axis: the tokens are gathered, not the table
    ("lookup", lambda t, i: t[i] * 2, (P(None, DATA), P(DATA))),
    # ... and where a dense layer follows over a 2-D layout, the table's gather may be the cheaper: priced, not guessed
    ("lookup then dense", lambda t, i, w: jnp.tanh(t[i] @ w), (P(DATA, MODEL), P(MODEL), None)),
    ("lookup then dense, crosswise", lambda t, i, w: jnp.tanh(t[i] @ w), (P(MODEL, DATA), P(DATA), None)),
])
def test_a_lookup_whose_batch_and_window_share_a_mesh_axis_is_taken_the_cheaper_way(name, f, specs):
    mesh = sp.make_mesh((4, 2), (DATA, MODEL))
    args = (_normal(64, 16), (np.arange(32).reshape(8, 4) * 5 % 64).astype(np.int32), _normal(16, 12))[:len(specs)]
    comparison = sp.compare_with_jit(f, mesh, specs, *args)
    np.testing.assert_allclose(np.asarray(comparison.program(*args)), np.asarray(f(*args)), rtol=1e-5, atol=1e-6)
    assert comparison.shardprop_bytes <= comparison.jit_bytes, str(comparison)
    if name == "lookup":
        prog = comparison.program
        gather = next(n for n in prog.plan.graph.nodes if n.op == "gather")
        assert "the plan moves less with the indices gathered" in str(sp.explain(prog, gather.outputs[0]))
        assert comparison.shardprop_bytes < 1024  # the table's gather alone would move 1,024 B


def _walked(graph, specs, mesh, *, backward=True, **internal):
    """``propagate`` through its internal entry, with its internal settings (``lineage``, ``memo``)."""
    mesh_shape = dict(mesh.shape)
    layouts = [None if spec is None else layout_from_spec(spec, graph.avals[v].shape, mesh_shape, "", uneven=True)
               for spec, v in zip(flat_in_specs(specs, graph), graph.inputs, strict=True)]
    return propagate_layouts(graph, layouts, as_auto_mesh(mesh), conflicts="reshard",
                             walking=sp.Walking(backward=backward), **internal)


@pytest.mark.parametrize("backward", [True, False])
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_without_lineage_every_layout_is_the_same(name, backward):
    # the backward pass's candidates are walked with lineage=False (comparing them reads layouts alone): the same
    # layouts, no shards
    f, args, specs, _ = PROGRAMS[name]
    mesh = sp.make_mesh((4, 2), (DATA, MODEL))
    graph = sp.trace(f, *args)
    full = _walked(graph, specs, mesh, backward=backward)
    bare = _walked(graph, specs, mesh, backward=backward, lineage=False)
    assert [s.layout for s in bare.shardings] == [s.layout for s in full.shardings]
    assert bare.needs == full.needs and bare.in_specs == full.in_specs
    assert any(full.shards(v, k) for v in range(len(graph.avals)) for k in range(len(graph.avals[v].shape)))
    if backward is False:  # (the backward pass reads the forward walk's lineage: that walk makes shards still)
        assert not any(bare.shards(v, k) for v in range(len(graph.avals)) for k in range(len(graph.avals[v].shape)))
    assert sp.split(bare).stages and len(sp.split(bare).stages) == len(sp.split(full).stages)
    # a memo shared by walks on other layouts first gives what a fresh propagation gives
    memo: dict = {}
    replicated = jax.tree_util.tree_map(lambda s: P(), specs, is_leaf=lambda s: isinstance(s, P))
    for other in (replicated, specs):
        _walked(graph, other, mesh, backward=backward, lineage=False, memo=memo)
    remembered = _walked(graph, specs, mesh, backward=backward, lineage=False, memo=memo)
    assert memo and [s.layout for s in remembered.shardings] == [s.layout for s in full.shardings]
    assert remembered.needs == full.needs


def test_without_lineage_a_loop_carry_derived_beside_a_ranged_constant_is_the_same():
    """A while loop carrying x0 (4 rows over i*j: even) whose body also reads x0[:2] (2 rows over 4 devices: ranged):
    without lineage a derived axis took the finest source's own ranged rows (the constant's), and the carry came out
    replicated where with lineage it is x0's layout. Found by the fuzzer (older than issue #50)."""
    mesh = sp.make_mesh((2, 2, 2), ("i", "j", "k"))

    def f(x0, x1):
        head = jax.lax.dynamic_slice_in_dim(x0, 0, 2, axis=0)

        def body(c):
            jax.lax.dot_general(c, head, (((1,), (1,)), ((), ())))
            return jnp.tanh(jnp.tanh(c))

        return jax.lax.while_loop(lambda t: t[0] < 2, lambda t: (t[0] + 1, body(t[1])), (0, x0))[1], x0 * x1

    x = _normal(4, 1)
    graph = sp.trace(f, x, x)
    specs = (P(("i", "j"), "k"), P(("i", "j"), None))
    for backward in (True, False):
        full = _walked(graph, specs, mesh, backward=backward)
        bare = _walked(graph, specs, mesh, backward=backward, lineage=False)
        assert [s.layout for s in bare.shardings] == [s.layout for s in full.shardings]
        assert bare.needs == full.needs and full.out_specs[0] == P(("i", "j"))
