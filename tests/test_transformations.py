"""JAX's transformations applied to an autoshard function or a Program — jax.grad, jax.jvp, jax.vmap, jax.jit —
under every strategy, each against the same transformation of the unsharded function (issue #14)."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import shardprop as sp
from shardprop.splitting.split import STRATEGIES

RNG = np.random.default_rng(14)
X = RNG.normal(size=(32, 8)).astype(np.float32)
W = RNG.normal(size=(8, 4)).astype(np.float32) / 3
LABELS = RNG.integers(0, 4, size=32)


def cross_entropy(x, w):
    """Softmax cross-entropy: with the class axis sharded, its max and sum are finished by pmax and psum."""
    logits = x @ w
    return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - jnp.take_along_axis(logits, LABELS[:, None], 1)[:, 0])


def max_pool(x, w):
    """A max over a sharded axis with ties across devices (relu zeros): the derivative averages over all of
    them, as jnp.max's does."""
    return jnp.sum(jnp.max(jax.nn.relu(x @ w - 1.0), axis=0) ** 2) + jnp.sum(jnp.min(x, axis=0))


def argmax_gate(x, w):
    """argmax has no derivative, but what it gates does: its finish must not stand in the way."""
    logits = x @ w
    return jnp.sum(jnp.where(jnp.argmax(logits, axis=0)[None, :] == 1, logits, 0.0))


FUNCTIONS = {"cross_entropy": (cross_entropy, (P("i"), P(None, "j"))),
             "cross_entropy_classes_sharded": (cross_entropy, (P(None, "i"), P("i", "j"))),
             "max_pool": (max_pool, (P("i"), None)), "argmax_gate": (argmax_gate, (P("i"), None))}


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sp.ReshardWarning)
        yield


def close(got, want, tol=2e-5):
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=tol, atol=tol)


@pytest.mark.covering
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_grad_and_jvp_of_an_autoshard_function(mesh, name, strategy):
    f, in_specs = FUNCTIONS[name]
    fs = sp.autoshard(f, mesh=mesh, in_specs=in_specs, strategy=strategy)
    close(jax.grad(fs, argnums=(0, 1))(X, W), jax.jit(jax.grad(f, argnums=(0, 1)))(X, W))  # (one reference compile)
    if strategy != "auto":
        return  # forward mode and the Program itself once (the suite's time budget): the finishes are the same
    tangents = (np.ones_like(X), np.full_like(W, 0.5))
    close(jax.jvp(fs, (X, W), tangents), jax.jvp(f, (X, W), tangents))
    close(jax.value_and_grad(fs.trace(X, W), argnums=1)(X, W), jax.value_and_grad(f, argnums=1)(X, W))


def test_ties_across_devices_share_the_derivative_as_unsharded():
    mesh = jax.make_mesh((8,), ("i",), axis_types=(jax.sharding.AxisType.Auto,))
    x = np.zeros((16, 3), np.float32)
    x[:3, 0] = 2.0          # three ties, one device holds two of them (rows 0, 1), another one (row 2)
    x[[0, 5, 9, 13], 1] = 1.0
    for reduce in (jnp.max, jnp.min):
        def f(x, reduce=reduce):
            return jnp.sum(reduce(x, axis=0) * jnp.arange(1.0, 4.0))
        fs = sp.autoshard(f, mesh=mesh, in_specs=(P("i"),), strategy="collective")
        close(jax.grad(fs)(x), jax.grad(f)(x), tol=1e-6)


def test_a_function_differentiated_on_one_mesh_then_another_equals_the_unsharded_gradient(meshes):
    """Regression (found by the suite's ordering, jax 0.10): JAX caches the trace of an eager op (``o * w`` in the
    loss) by its operands' avals without their mesh, so the cotangent of the second program's output came with the
    first program's mesh, and the derivative's jit, left to take the output's sharding from it, raised JAX's
    IndivisibleError. The program declares its outputs' shardings."""
    # (run alone, the eager op's first trace in the process is this test's, on the first mesh; in the suite
    # another test may have traced it first, unsharded, which hid the bug)
    x = np.random.default_rng(0).normal(size=(8, 24)).astype(np.float32)

    def f(x):
        return (2.0 * jnp.sum(x, axis=1))[2:6]

    def loss(g):
        return lambda x: jnp.sum(g(x) * jnp.cos(jnp.arange(4, dtype=jnp.float32)))

    grads = [jax.grad(loss(sp.autoshard(f, mesh=meshes[mesh_name], in_specs=(spec,))))(x)
             for mesh_name, spec in [("8", P("i", None)), ("4x2", P("i", "j")), ("2x4", P("i", "j"))]]
    want = np.asarray(jax.grad(loss(f))(x))  # (after: JAX's eager ops first traced on the meshes)
    for got in grads:
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_vmap_batches_outside_the_annotated_axes(mesh, strategy):
    def f(x, w):
        return jnp.tanh(x @ w).sum(0)

    fs = sp.autoshard(f, mesh=mesh, in_specs=(P("i"), P(None, "j")), strategy=strategy)
    batch = RNG.normal(size=(3, 32, 8)).astype(np.float32)  # 3 does not divide the mesh: it must stay whole
    close(jax.vmap(fs, in_axes=(0, None))(batch, W), jax.vmap(f, in_axes=(0, None))(batch, W))
    if strategy != "auto":
        return  # the other batch positions and PRNG keys once (the suite's time budget)
    close(jax.vmap(fs, in_axes=(1, None))(batch.transpose(1, 0, 2), W), jax.vmap(f, in_axes=(0, None))(batch, W))
    close(jax.vmap(fs.trace(X, W), in_axes=(0, None))(batch, W), jax.vmap(f, in_axes=(0, None))(batch, W))

    def per_example_noise(key, x):
        return x + jax.random.normal(key, x.shape)

    keys = jax.random.split(jax.random.key(3), 5)
    noisy = sp.autoshard(per_example_noise, mesh=mesh, in_specs=(None, P("i")), strategy=strategy)
    close(jax.vmap(noisy, in_axes=(0, None))(keys, X), jax.vmap(per_example_noise, in_axes=(0, None))(keys, X))


def test_jit_of_an_autoshard_function_and_of_a_program(mesh):
    fs = sp.autoshard(cross_entropy, mesh=mesh, in_specs=(P("i"), P(None, "j")))
    close(jax.jit(fs)(X, W), cross_entropy(X, W))
    close(jax.jit(fs.trace(X, W))(X, W), cross_entropy(X, W))
    close(jax.jit(jax.grad(fs, argnums=1))(X, W), jax.grad(cross_entropy, argnums=1)(X, W))


def test_a_training_step_differentiated_through_the_program(mesh):
    def loss(params, x):
        h = jax.nn.relu(x @ params["w1"])
        return jnp.mean(jnp.max(h @ params["w2"], axis=-1) ** 2)

    params = {"w1": RNG.normal(size=(8, 16)).astype(np.float32), "w2": RNG.normal(size=(16, 8)).astype(np.float32)}

    def step(params, x):
        return jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, jax.grad(loss)(params, x))

    sharded_loss = sp.autoshard(loss, mesh=mesh, in_specs=({"w1": P(None, "j"), "w2": P("j", "i")}, P("i")))
    close(step(params, X), jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, jax.grad(sharded_loss)(params, X)))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_transformations_through_a_resolved_conflict(mesh, strategy):
    def symmetric_energy(x):
        return jnp.sum(jnp.tanh(x + x.T) ** 2)

    square = RNG.normal(size=(16, 16)).astype(np.float32)
    fs = sp.autoshard(symmetric_energy, mesh=mesh, in_specs=(P("i"),), strategy=strategy)
    close(jax.grad(fs)(square), jax.grad(symmetric_energy)(square))
    batch = RNG.normal(size=(3, 16, 16)).astype(np.float32)
    close(jax.vmap(fs)(batch), jax.vmap(symmetric_energy)(batch))
    close(jax.jit(jax.grad(fs))(square), jax.grad(symmetric_energy)(square))
