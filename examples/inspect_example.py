"""Two small functions for docs/inspecting.md: the Nx design note's example, and a matmul whose result is
scanned (so that some axes end up replicated, and the page can show why)."""

import jax.numpy as jnp


def nx(a, b):
    x = a + b
    y = a - b
    z = jnp.sum(x, axis=1)
    w = jnp.sum(y, axis=0)
    return z[:, None] + w[None, :]


def scanned_matmul(x, w):
    h = jnp.tanh(x @ w)
    return jnp.cumsum(h, axis=0)
