"""flax NNX objects as arguments (shardprop/stateful.py, issue #31): a training step that updates its model and
optimizer in place does so under autoshard as under nnx.jit (the oracle: the same step under nnx.jit from the same
initialisation), names its inputs by attribute path, and a call that adds a Variable is refused clearly."""

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
