"""Small functions for docs/inspecting.md: the Nx design note's example, and a matmul whose result is
scanned (so that some axes end up replicated, and the page can show why), and an RNN gradient (loops)."""

import jax
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


def rnn_grad(w, xs, h0):
    """The gradient of a small RNN's loss with respect to its recurrent weight (a forward and a backward scan)."""
    def loss(w):
        def step(h, x):
            h = jnp.tanh(h @ w + x)
            return h, h

        _, hs = jax.lax.scan(step, h0, xs)
        return jnp.mean(hs ** 2)

    return jax.grad(loss)(w)
