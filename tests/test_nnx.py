"""flax NNX objects as arguments (shardprop/stateful.py, issue #31): a training step that updates its model and
optimizer in place does so under autoshard as under nnx.jit (the oracle: the same step under nnx.jit from the same
initialisation), names its inputs by attribute path, and a call that adds a Variable is refused clearly."""

import warnings

import jax
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

import shardprop as sp

RNG = np.random.default_rng(0)
X = RNG.normal(size=(32, 16)).astype(np.float32)
Y = RNG.normal(size=(32, 4)).astype(np.float32)


class MLP(nnx.Module):
    def __init__(self, rngs):
        self.l1 = nnx.Linear(16, 32, rngs=rngs)
        self.l2 = nnx.Linear(32, 4, rngs=rngs)

    def __call__(self, x):
        return self.l2(jax.nn.relu(self.l1(x)))


def train_step(model, optimizer, x, y):
    def loss_fn(model):
        return ((model(x) - y) ** 2).mean()

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss


def fresh():
    model = MLP(nnx.Rngs(0))
    return model, nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)


def same_state(a, b):
    for u, v in zip(jax.tree_util.tree_leaves(nnx.state(a)), jax.tree_util.tree_leaves(nnx.state(b)), strict=True):
        np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("in_specs", [(None, None, P("i"), P("i")), (sp.AUTO, sp.AUTO, P("i"), P("i"))],
                         ids=["unannotated", "searched"])
def test_a_training_step_updates_model_and_optimizer_in_place_as_nnx_jit_does(mesh, in_specs):
    (model, optimizer), (want_model, want_optimizer) = fresh(), fresh()
    step = sp.autoshard(train_step, mesh=mesh, in_specs=in_specs)
    reference = nnx.jit(train_step)
    for _ in range(3):
        loss = step(model, optimizer, X, Y)
        want = reference(want_model, want_optimizer, X, Y)
        np.testing.assert_allclose(float(loss), float(want), rtol=1e-5)
    same_state(model, want_model)
    same_state(optimizer, want_optimizer)
    assert int(optimizer.step[...]) == 3


def test_nnx_inputs_are_named_by_their_attribute_paths(mesh):
    model, optimizer = fresh()
    prog = sp.autoshard(train_step, mesh=mesh, in_specs=(None, None, P("i"), P("i"))).trace(model, optimizer, X, Y)
    names = prog.plan.graph.argument_names
    assert "model.l1.kernel.value" in names and "optimizer.opt_state[0].mu['l1']['kernel'].value" in names
    assert names[-2:] == ("x", "y")


def test_a_call_that_adds_a_variable_is_refused_saying_why(mesh):
    def grows(model, x):
        model.extra = nnx.Param(x.sum())
        return x

    with pytest.raises(sp.TraceError, match="changed the structure of its argument 0 .*create every Variable"):
        sp.autoshard(grows, mesh=mesh, in_specs=None)(MLP(nnx.Rngs(0)), X)


@pytest.mark.parametrize("in_specs", [(None, None, P("i"), P("i")), (sp.AUTO, sp.AUTO, P("i"), P("i")),
                                      (None, sp.AUTO, P("i"), P("i"))],
                         ids=["unannotated", "searched", "optimizer_searched"])
def test_updated_state_comes_back_laid_out_as_it_went_in_so_the_loop_compiles_once(mesh, in_specs):
    """Each updated parameter and moment is returned in its argument's layout (an adam update is computed in the
    moment's layout, which the search may choose finer than the parameter's): calls 2 and 3, fed the objects the
    first call updated, compile nothing — counted, as tests/test_spellings.py counts jax.jit's compiles."""
    from tests.test_spellings import compiles_of

    (model, optimizer), (want_model, want_optimizer) = fresh(), fresh()
    step = sp.autoshard(train_step, mesh=mesh, in_specs=in_specs)
    reference = nnx.jit(train_step)
    counts = []
    for _ in range(3):
        counts.append(compiles_of(lambda: jax.block_until_ready(step(model, optimizer, X, Y))))
        reference(want_model, want_optimizer, X, Y)
    assert counts[0] > 0 and counts[1:] == [0, 0]
    prog = step.trace(model, optimizer, X, Y)
    state = jax.tree_util.tree_leaves((model, optimizer))
    for leaf, spec, name in zip(state, prog.sharded.in_specs, prog.plan.graph.argument_names, strict=False):
        assert sp.spellings.same_spec(leaf.sharding.spec, spec), (name, leaf.sharding.spec, spec)
    same_state(model, want_model)
    same_state(optimizer, want_optimizer)
    if prog.search is not None and "sharding_constraint" in str(prog.graph):  # moved back after the search
        assert "more, returning updated state laid out as it came in" in str(prog.search)


class Megatron(nnx.Module):
    """The flax way to lay out parameters: nnx.with_partitioning on the kernels (column, then row split)."""

    def __init__(self, rngs):
        init = nnx.initializers.lecun_normal()
        self.l1 = nnx.Linear(16, 32, kernel_init=nnx.with_partitioning(init, (None, "j")), rngs=rngs)
        self.l2 = nnx.Linear(32, 4, kernel_init=nnx.with_partitioning(init, ("j", None)), rngs=rngs)

    def __call__(self, x):
        return self.l2(jax.nn.relu(self.l1(x)))


def test_unannotated_variables_take_the_specs_their_sharding_metadata_declares(mesh):
    """nnx.get_partition_spec's specs (nnx.with_partitioning) lay out an unannotated model whose arrays are not yet
    placed (eager sharding off); the stage table says where each spec came from; values equal nnx.jit's."""
    def fresh_megatron():
        with nnx.use_eager_sharding(False):
            model = Megatron(nnx.Rngs(0))
            return model, nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)

    (model, optimizer), (want_model, want_optimizer) = fresh_megatron(), fresh_megatron()
    step = sp.autoshard(train_step, mesh=mesh, in_specs=(None, None, P("i"), P("i")))
    for _ in range(2):
        np.testing.assert_allclose(float(step(model, optimizer, X, Y)),
                                   float(nnx.jit(train_step)(want_model, want_optimizer, X, Y)), rtol=1e-5)
    same_state(model, want_model)
    same_state(optimizer, want_optimizer)
    prog = step.trace(model, optimizer, X, Y)
    specs = dict(zip(prog.plan.graph.argument_names, prog.sharded.in_specs, strict=True))
    assert specs["model.l1.kernel.value"] == P(None, "j") and specs["model.l2.kernel.value"] == P("j")
    assert specs["optimizer.opt_state[0].mu['l1']['kernel'].value"] == P(None, "j")
    assert "<- model.l1.kernel.value (its Variable's sharding metadata)" in str(prog.stages[0])
    assert {i["name"]: i["spec_source"] for i in sp.to_json(prog)["inputs"]}["model.l1.kernel.value"] == "metadata"
    assert "its Variable's sharding metadata (nnx.with_partitioning" in str(sp.explain(prog, "model.l1.kernel.value"))


def test_a_model_created_under_the_mesh_keeps_its_placed_layouts(mesh):
    """flax's eager sharding places each annotated Variable when it is created under jax.set_mesh: unannotated,
    the program keeps those layouts (the arrays' own, as under jax.jit)."""
    with jax.set_mesh(mesh):
        model = Megatron(nnx.Rngs(0))
    apply = sp.autoshard(lambda m, x: m(x), mesh=mesh, in_specs=(None, P("i")))
    prog = apply.trace(model, X)
    specs = dict(zip(prog.plan.graph.argument_names, prog.sharded.in_specs, strict=True))
    assert specs["m.l1.kernel.value"] == P(None, "j") and specs["m.l2.kernel.value"] == P("j")
    assert "<- m.l1.kernel.value (its array's own layout)" in str(prog.stages[0])
    np.testing.assert_allclose(np.asarray(apply(model, X)), np.asarray(model(X)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("spelling", ["get_partition_spec_of_state", "nested_dict", "module_shaped"])
def test_a_model_spec_given_by_attribute_path(mesh, spelling):
    """The spec trees flax users write: nnx.get_partition_spec of the model's state (a State), a nested dict by
    attribute path (a path's spec covers what is under it), or nnx.get_partition_spec(model) (shaped like it)."""
    with nnx.use_eager_sharding(False):
        model = Megatron(nnx.Rngs(0))
    spec = {"get_partition_spec_of_state": lambda: nnx.get_partition_spec(nnx.state(model)),
            "nested_dict": lambda: {"l1": {"kernel": P(None, "j")}, "l2": P("j")},
            "module_shaped": lambda: nnx.get_partition_spec(model)}[spelling]()
    apply = sp.autoshard(lambda m, x: m(x), mesh=mesh, in_specs=(spec, P("i")))
    prog = apply.trace(model, X)
    specs = dict(zip(prog.plan.graph.argument_names, prog.sharded.in_specs, strict=True))
    assert specs["m.l1.kernel.value"] == P(None, "j") and specs["m.l2.kernel.value"] == P("j")
    np.testing.assert_allclose(np.asarray(apply(model, X)), np.asarray(model(X)), rtol=1e-5, atol=1e-6)


def test_a_path_that_names_no_variable_is_refused_briefly(mesh):
    model, _ = fresh()
    with pytest.raises(sp.SpecTreeError, match=r"names l1\.kernal, which is no Variable of it") as caught:
        sp.autoshard(lambda m, x: m(x), mesh=mesh, in_specs=({"l1": {"kernal": P()}}, P("i"))).trace(model, X)
    assert "(call at test_nnx.py:" in str(caught.value)
    with pytest.raises(sp.SpecTreeError, match="is not a pytree prefix") as caught:
        sp.autoshard(lambda m, x: m(x), mesh=mesh, in_specs=([P(), P()], P("i"))).trace(model, X)
    assert len(str(caught.value)) < 1200  # a module's structure abridged, not 3,000 characters of its repr


def test_compare_with_jit_counts_the_update_of_a_step_that_updates_in_place(mesh):
    """jax.jit of a step that only returns its loss would drop the backward pass and the optimizer: both sides
    compile the step returning the objects' state, as nnx.jit does (found by a new-user pass: 6 B reported)."""
    model, optimizer = fresh()
    result = sp.compare_with_jit(train_step, mesh, (None, None, P("i"), P("i")), model, optimizer, X, Y)
    assert len(result.shardprop_out_specs) == len(result.jit_out_specs) == 1 + len(
        jax.tree_util.tree_leaves((model, optimizer)))
    assert result.jit_bytes > 1000 and result.shardprop_bytes > 1000  # the gradients' all-reduces, both sides
    assert "model.l1.kernel.value" in str(result)


def test_the_search_prices_returning_updated_state_so_it_moves_no_more_than_the_unannotated_step(mesh):
    """The search weighs moving each updated Variable back to its argument's layout (the program does): its choice
    moves no more than the unannotated step (a GPT step chose 982,662 B against 762,630 B before, found by a
    new-user pass), and its summary's bytes are the program's own estimate."""
    from shardprop.core.transfers import total_moved

    def moved(in_specs):
        model, optimizer = fresh()
        prog = sp.autoshard(train_step, mesh=mesh, in_specs=in_specs).trace(model, optimizer, X, Y)
        return prog, total_moved(prog.estimated_communication())

    searched, searched_bytes = moved((sp.AUTO, sp.AUTO, P("i"), P("i")))
    _, unannotated_bytes = moved((None, None, P("i"), P("i")))
    assert searched_bytes <= unannotated_bytes
    assert searched.search.chosen.moved + searched.search.returned_moves == pytest.approx(searched_bytes, rel=0.02)


class Counter(nnx.Module):
    """A state updated in another layout than it came in: the step constrains its new value transposed."""

    def __init__(self):
        self.total = nnx.Variable(np.arange(128, dtype=np.float32).reshape(16, 8))


@pytest.mark.parametrize("written", ["fixed", "adopted"])
def test_an_update_computed_in_another_layout_is_returned_in_its_arguments(mesh, written):
    """The step lays the new total out as ``P(None, 'i')``; it came in ``P('i', None)`` — written by the user (pinned
    before propagation) or adopted from ``x`` (known after it: pinned, and planned again): the program returns it
    moved back (a sharding constraint added to the traced graph, not a second trace), with no warning (the move is
    the rule's, not a clash of the user's layouts), so the next call, fed it, compiles nothing — and the values are
    ``nnx.jit``'s."""
    from jax.sharding import NamedSharding

    from tests.test_spellings import compiles_of

    def step(counter, x):
        new = counter.total[...] * 2 + x
        counter.total[...] = jax.lax.with_sharding_constraint(new, NamedSharding(mesh, P(None, "i")))
        return new.sum()

    counter, want = Counter(), Counter()
    x = RNG.normal(size=(16, 8)).astype(np.float32)
    in_specs = (P("i", None), None) if written == "fixed" else (None, P("i", None))
    stepped = sp.autoshard(step, mesh=mesh, in_specs=in_specs)
    with warnings.catch_warnings():
        warnings.simplefilter("error", sp.ReshardWarning)
        counts = [compiles_of(lambda: jax.block_until_ready(stepped(counter, x))) for _ in range(2)]
    for _ in range(2):
        nnx.jit(step)(want, x)
    assert counts[0] > 0 and counts[1] == 0
    assert sp.spellings.same_spec(counter.total[...].sharding.spec, P("i", None)), counter.total[...].sharding
    np.testing.assert_allclose(np.asarray(counter.total[...]), np.asarray(want.total[...]), rtol=1e-6)
    prog = stepped.trace(counter, x)
    assert str(prog.graph).count("sharding_constraint") == 2, str(prog.graph)  # the step's own, and the pin
