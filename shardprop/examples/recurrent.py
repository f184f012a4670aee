"""Loops and branches as training code writes them: an RNN and a GRU over a sequence (``lax.scan``), a stack of
layers scanned over their stacked weights, a loop with a traced trip count (``fori_loop``), a ``while_loop`` run
until the values grow past a bound, a ``cond``, a rematerialised (``jax.checkpoint``) layer, and a loss through a
``cond`` and a ``switch`` (whose gradient differentiates through both)."""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def init_rnn(features=16, seed=0):
    rng = np.random.default_rng(seed)
    return {"w": (rng.normal(size=(features, features)) * 0.3).astype(np.float32),
            "u": (rng.normal(size=(features, features)) * 0.3).astype(np.float32),
            "b": (rng.normal(size=(features,)) * 0.1).astype(np.float32)}


def rnn_loss(params, xs, h0):
    """An Elman RNN over ``xs`` (time, batch, features) from ``h0`` (batch, features); mean squared state."""
    def step(h, x):
        h = jnp.tanh(h @ params["w"] + x @ params["u"] + params["b"])
        return h, h

    _, hs = lax.scan(step, h0, xs)
    return jnp.mean(hs ** 2)


def init_gru(features=16, seed=1):
    rng = np.random.default_rng(seed)
    return {"wx": (rng.normal(size=(features, 3 * features)) * 0.3).astype(np.float32),
            "wh": (rng.normal(size=(features, 3 * features)) * 0.3).astype(np.float32),
            "b": (rng.normal(size=(3 * features,)) * 0.1).astype(np.float32)}


def gru_loss(params, xs, h0):
    """A GRU as model libraries write it: one matmul for the three gates, split with ``jnp.split``."""
    def step(h, x):
        gx = x @ params["wx"] + params["b"]
        gh = h @ params["wh"]
        rx, zx, nx = jnp.split(gx, 3, axis=-1)
        rh, zh, nh = jnp.split(gh, 3, axis=-1)
        r, z = jax.nn.sigmoid(rx + rh), jax.nn.sigmoid(zx + zh)
        n = jnp.tanh(nx + r * nh)
        h = (1 - z) * n + z * h
        return h, h

    _, hs = lax.scan(step, h0, xs)
    return jnp.mean(hs ** 2)


def stacked_layers(ws, x):
    """Layers applied in a scan over their stacked weights ``ws`` (layers, features, features)."""
    def layer(h, w):
        return jax.nn.relu(h @ w), None

    h, _ = lax.scan(layer, x, ws)
    return jnp.mean(h ** 2)


def fori_smoothing(x, steps):
    """``steps`` (traced) rounds of mixing every row with the column means."""
    return lax.fori_loop(0, steps, lambda i, c: jnp.tanh(c * 1.1 + jnp.mean(c, axis=0)), x)


def grow_until(x):
    """A ``while_loop`` whose condition reads the data: scale until the sum of squares passes a bound."""
    return lax.while_loop(lambda c: jnp.sum(c * c) < 1e4, lambda c: c * 1.5 + 1.0, x)


def centered_if_positive(x):
    """A ``cond`` whose predicate is computed from the (sharded) data, one branch with a mean inside."""
    return lax.cond(jnp.sum(x) > 0, lambda v: v - jnp.mean(v, axis=0), lambda v: v * 2.0, x)


def remat_loss(w, x):
    """A layer under ``jax.checkpoint`` with a policy (dots saved, the rest recomputed in the backward pass)."""
    layer = jax.checkpoint(lambda w, x: jnp.sin(x @ w) @ w, policy=jax.checkpoint_policies.dots_saveable)
    return jnp.sum(layer(w, x) ** 2)


def nested_loops(x):
    """A scan whose body runs a ``fori_loop``."""
    def outer(c, _):
        c = lax.fori_loop(0, 3, lambda i, d: d * 0.9 + jnp.mean(d, axis=0), c)
        return c, jnp.sum(c)

    return lax.scan(outer, x, None, length=4)


def branchy_loss(x):
    """A loss through a ``cond`` and a ``lax.switch`` whose branches keep different intermediates for the backward
    pass (its gradient fills the branch not taken with placeholders)."""
    h = lax.cond(jnp.sum(x) > 0, lambda v: v * 2.0, jax.nn.relu, x)
    k = (jnp.sum(h) > 1.0).astype(jnp.int32) + (jnp.max(h) > 2.0).astype(jnp.int32)
    h = lax.switch(k, [jnp.tanh, jax.nn.relu, lambda v: v - jnp.mean(v, axis=0)], h)
    return jnp.sum(h ** 2)
