"""A function for docs/debugging.md that takes a logarithm (the page debugs the Nx example from
``inspect_example.py`` too)."""

import jax.numpy as jnp


def log_returns(prices):
    ratio = prices[:, 1:] / prices[:, :-1]
    returns = jnp.log(ratio)
    return jnp.mean(returns, axis=1)
