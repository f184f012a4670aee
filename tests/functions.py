"""Functions several tests shard: the Nx design note's example and a small MLP (the demo's, kept here so the
tests do not depend on the command-line application)."""

import jax
import jax.numpy as jnp


def nx_example(a, b):
    """The function from the Nx sharding design note."""
    x = a + b
    y = a - b
    z = jnp.sum(x, axis=1)
    w = jnp.sum(y, axis=0)
    return z[:, None] + w[None, :]


def mlp(params, x):
    """A two-layer MLP returning its logits and the mean of squared logits."""
    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    logits = h @ params["w2"] + params["b2"]
    return logits, jnp.mean(logits**2)
