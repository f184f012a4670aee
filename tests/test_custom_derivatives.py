"""Custom derivative rules survive sharding (shardprop/derivatives.py): the graph inlines relu's custom_jvp, a
user's custom_vjp or a safe norm, so a Program is differentiated as the user's function is — each result
against the same transformation of the unsharded function under every strategy (found by a new-user pass:
relu's derivative at 0 came out 1/2, a clipped gradient unclipped)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import shardprop as sp
from shardprop.splitting.split import STRATEGIES
from tests.test_transformations import close


@jax.custom_vjp
def clip_gradient(v):
    return v


clip_gradient.defvjp(lambda v: (v, None), lambda _, g: (jnp.clip(g, -0.1, 0.1),))


@jax.custom_jvp
def safe_norm(v):
    return jnp.sqrt(jnp.sum(v * v, axis=-1))


@safe_norm.defjvp
def _safe_norm_jvp(primals, tangents):
    (v,), (t,) = primals, tangents
    n = safe_norm(v)
    return n, jnp.sum(v * t, axis=-1) / jnp.where(n == 0, 1.0, n)


X = np.round(np.random.default_rng(3).normal(size=(16, 8)), 0).astype(np.float32)  # many exact zeros
X[2] = 0.0
W = np.random.default_rng(4).normal(size=(8, 8)).astype(np.float32) / 3

FUNCTIONS = {
    "relu at zero": (lambda x, w: jnp.sum(jax.nn.relu(x) @ w), (P("i"), None)),
    "custom_vjp clipping": (lambda x, w: jnp.sum(clip_gradient(x @ w) * 3.0), (P("i"), P(None, "j"))),
    "safe norm of a zero row": (lambda x, w: jnp.sum(safe_norm(x) * 2.0) + jnp.sum(w), (P("i"), None)),
    "gelu and a solve": (lambda x, w: jnp.sum(jax.nn.gelu(x @ jnp.linalg.solve(w + 3 * jnp.eye(8), w))),
                         (P("i"), None)),
}


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_gradients_apply_the_custom_rules(mesh, name, strategy):
    f, in_specs = FUNCTIONS[name]
    fs = sp.autoshard(f, mesh=mesh, in_specs=in_specs, strategy=strategy)
    close(jax.grad(fs, argnums=(0, 1))(X, W), jax.grad(f, argnums=(0, 1))(X, W))
    close(fs(X, W), f(X, W))
    if strategy != "auto":
        return  # the rest once (the suite's time budget): the derivative programs are strategy-independent
    close(jax.jit(jax.value_and_grad(fs))(X, W), jax.value_and_grad(f)(X, W))
    if "custom_vjp" not in name:
        tangents = (np.ones_like(X), np.ones_like(W))
        close(jax.jvp(fs, (X, W), tangents), jax.jvp(f, (X, W), tangents))
    else:  # no forward mode through a custom_vjp, as under jax.jit: JAX's own refusal
        with pytest.raises(TypeError, match="forward-mode autodiff"):
            jax.jvp(fs, (X, W), (X, W))


def test_a_custom_rule_under_vmap_of_grad_and_with_integer_arguments(mesh):
    def f(x, labels):
        return jnp.sum(jax.nn.relu(x) * (labels[:, None] == 1))

    labels = np.arange(16) % 3
    fs = sp.autoshard(f, mesh=mesh, in_specs=(P("i"), P("i")))
    batch = np.stack([X, -X, X * 0])
    close(jax.vmap(jax.grad(fs), in_axes=(0, None))(batch, labels),
          jax.vmap(jax.grad(f), in_axes=(0, None))(batch, labels))


def test_a_program_lowered_without_its_function_refuses_to_be_differentiated(mesh):
    graph = sp.trace(lambda x: jax.nn.relu(x).sum(), X)
    prog = sp.lower(sp.split(sp.propagate(graph, (P("i"),), mesh=mesh)))
    np.testing.assert_allclose(float(prog(X)), float(jax.nn.relu(X).sum()), rtol=1e-6)
    with pytest.raises(sp.OptionError, match="custom derivative rules .custom_jvp_call."):
        jax.grad(prog)(X)


@jax.custom_jvp
def damp(y):  # the identity, with derivative 0.1
    return y


damp.defjvp(lambda p, t: (damp(p[0]), 0.1 * t[0]))


@jax.custom_jvp
def cube(x):  # x**3 / 3, with derivative damp(x**2): a rule calling another custom rule
    return x ** 3 / 3


cube.defjvp(lambda p, t: (cube(p[0]), damp(p[0] ** 2) * t[0]))

SECOND_ORDER = {
    "a rule calling a custom rule": (lambda x: jnp.sum(cube(x)), np.arange(1.0, 9.0, dtype=np.float32), (P("i"),)),
    "solve": (lambda a: jnp.sum(jnp.linalg.solve(a, jnp.arange(1.0, 9.0))),
              np.eye(8, dtype=np.float32) * 3 + np.arange(64, dtype=np.float32).reshape(8, 8) / 64, (P("i"),)),
}


@pytest.mark.parametrize("name", sorted(SECOND_ORDER))
def test_second_derivatives_through_rules_inside_rules(mesh, name):
    """Found by a new-user pass: the derivative program's own custom rules were lost when JAX linearized it a
    second time (hessians of solve came out zero). Such higher orders are JAX's own, with a FallbackWarning."""
    f, x, in_specs = SECOND_ORDER[name]
    fs = sp.autoshard(f, mesh=mesh, in_specs=in_specs)
    close(jax.grad(fs)(x), jax.grad(f)(x))
    with pytest.warns(sp.FallbackWarning, match="higher-order derivative"):
        close(jax.hessian(fs)(x), jax.hessian(f)(x))
    close(jax.grad(lambda x: jnp.sum(jax.grad(fs)(x)))(x), jax.grad(lambda x: jnp.sum(jax.grad(f)(x)))(x))
