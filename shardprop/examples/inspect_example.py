"""Small functions for docs/inspecting.md and docs/design.md: the Nx design note's example, a matmul whose result is
scanned (so that some axes end up replicated, and the page can show why), a loss whose IR shows every kind of
instruction, and an RNN gradient (loops)."""

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


def ir_loss(x, w, v):
    """With x P('i', 'j'), w P('j', None), v P('j', None): a contraction finished by a psum, a cumulative sum scanned
    block by block and finished by its block totals, a local slice, and a product left a partial sum down to one
    psum of the scalar."""
    h = jnp.tanh(x @ w)
    y = jnp.cumsum(h, axis=0)
    return jnp.sum((y @ v) * 0.5)


def rnn_grad(w, xs, h0):
    """The gradient of a small RNN's loss with respect to its recurrent weight (a forward and a backward scan)."""
    def loss(w):
        def step(h, x):
            h = jnp.tanh(h @ w + x)
            return h, h

        _, hs = jax.lax.scan(step, h0, xs)
        return jnp.mean(hs ** 2)

    return jax.grad(loss)(w)
