"""Small functions for docs/debugging.md: the Nx design note's example, and one that takes a logarithm."""

import jax.numpy as jnp


def nx(a, b):
    x = a + b
    y = a - b
    z = jnp.sum(x, axis=1)
    w = jnp.sum(y, axis=0)
    return z[:, None] + w[None, :]


def log_returns(prices):
    ratio = prices[:, 1:] / prices[:, :-1]
    returns = jnp.log(ratio)
    return jnp.mean(returns, axis=1)
