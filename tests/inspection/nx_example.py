"""The Nx design note's example, in its own file so that golden outputs name a stable source line."""

import jax.numpy as jnp


def f(a, b):
    x = a + b
    y = a - b
    z = jnp.sum(x, axis=1)
    w = jnp.sum(y, axis=0)
    return z[:, None] + w[None, :]
