"""The project's own benchmark models, in plain ``jax.numpy`` as a user writes them.

Benchmark-sized variants of what ``shardprop.examples`` shows (an MLP train step over any layer sizes, layer norm, a
transformer block with ``n_heads`` as a parameter, an RNN and a GRU), plus a ``fori_loop`` training loop and the
workloads only the benchmark rows use.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..examples.recurrent import rnn_loss  # noqa: F401  (the benchmark's RNN is the example's)


def nx_example(a, b):
    """The function from the Nx sharding design note."""
    x = a + b
    y = a - b
    z = jnp.sum(x, axis=1)
    w = jnp.sum(y, axis=0)
    return z[:, None] + w[None, :]


def matmul(a, b):
    return a @ b


def matmul_scaled(a, b, c):
    """A contraction over a sharded axis whose result is used only sharded: a reduce-scatter finishes it."""
    return (a @ b) * c


# -- an MLP ----------------------------------------------------------------------------------------------------
def init_mlp(sizes, seed=0):
    rng = np.random.default_rng(seed)
    return [{"w": (rng.normal(size=(m, n)) / np.sqrt(m)).astype(np.float32),
             "b": (rng.normal(size=(n,)) * 0.1).astype(np.float32)}
            for m, n in zip(sizes[:-1], sizes[1:], strict=True)]


def mlp_forward(params, x):
    for layer in params[:-1]:
        x = jax.nn.relu(x @ layer["w"] + layer["b"])
    return x @ params[-1]["w"] + params[-1]["b"]


def mlp_loss(params, x, labels):
    logits = mlp_forward(params, x)
    log_probs = logits - jax.nn.logsumexp(logits, axis=-1, keepdims=True)
    return -jnp.mean(jnp.sum(jax.nn.one_hot(labels, logits.shape[-1]) * log_probs, axis=-1))


def mlp_train_step(params, x, labels, lr=0.1):
    value, grads = jax.value_and_grad(mlp_loss)(params, x, labels)
    return jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads), value


def fori_training_loop(params, x, labels, steps=8, lr=0.1):
    """``steps`` SGD steps of the MLP in a ``lax.fori_loop``: every step's gradient is needed whole by the next."""
    def step(_, p):
        grads = jax.grad(mlp_loss)(p, x, labels)
        return jax.tree_util.tree_map(lambda w, g: w - lr * g, p, grads)

    params = lax.fori_loop(0, steps, step, params)
    return params, mlp_loss(params, x, labels)


# -- layer norm and a transformer block ------------------------------------------------------------------------
def layer_norm(x, gamma, beta, eps=1e-5):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mean) ** 2, axis=-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + eps) * gamma + beta


def init_block(d_model, d_ff, seed=0):
    rng = np.random.default_rng(seed)

    def w(*shape):
        return (rng.normal(size=shape) / np.sqrt(shape[0])).astype(np.float32)

    return {"wq": w(d_model, d_model), "wk": w(d_model, d_model), "wv": w(d_model, d_model),
            "wo": w(d_model, d_model), "w1": w(d_model, d_ff), "b1": np.zeros(d_ff, np.float32),
            "w2": w(d_ff, d_model), "b2": np.zeros(d_model, np.float32),
            "ln1_g": np.ones(d_model, np.float32), "ln1_b": np.zeros(d_model, np.float32),
            "ln2_g": np.ones(d_model, np.float32), "ln2_b": np.zeros(d_model, np.float32)}


def attention(x, wq, wk, wv, wo, n_heads):
    batch, seq, d_model = x.shape
    d_head = d_model // n_heads

    def heads(t):  # [batch, seq, d_model] -> [batch, heads, seq, d_head]
        return t.reshape(batch, seq, n_heads, d_head).transpose(0, 2, 1, 3)

    q, k, v = heads(x @ wq), heads(x @ wk), heads(x @ wv)
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) / jnp.sqrt(d_head).astype(x.dtype)
    out = jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(scores, axis=-1), v)
    return out.transpose(0, 2, 1, 3).reshape(batch, seq, d_model) @ wo


def transformer_block(params, x, n_heads=8):
    h = layer_norm(x, params["ln1_g"], params["ln1_b"])
    x = x + attention(h, params["wq"], params["wk"], params["wv"], params["wo"], n_heads)
    h = layer_norm(x, params["ln2_g"], params["ln2_b"])
    return x + jax.nn.gelu(h @ params["w1"] + params["b1"]) @ params["w2"] + params["b2"]


# -- recurrent networks ----------------------------------------------------------------------------------------
# the examples' Elman RNN (rnn_loss), its weights scaled for wider layers here
def init_rnn(features, seed=0):
    rng = np.random.default_rng(seed)
    return {"w": (rng.normal(size=(features, features)) * 0.3 / np.sqrt(features / 16)).astype(np.float32),
            "u": (rng.normal(size=(features, features)) * 0.3 / np.sqrt(features / 16)).astype(np.float32),
            "b": (rng.normal(size=(features,)) * 0.1).astype(np.float32)}




def init_gru(features, seed=1):
    rng = np.random.default_rng(seed)
    scale = 0.3 / np.sqrt(features / 16)
    return {"wx": (rng.normal(size=(features, 3 * features)) * scale).astype(np.float32),
            "wh": (rng.normal(size=(features, 3 * features)) * scale).astype(np.float32),
            "b": (rng.normal(size=(3 * features,)) * 0.1).astype(np.float32)}


def gru_loss(params, xs, h0):
    """A GRU as model libraries write it: one matmul for the three gates, split with ``jnp.split``."""
    def step(h, x):
        rx, zx, nx = jnp.split(x @ params["wx"] + params["b"], 3, axis=-1)
        rh, zh, nh = jnp.split(h @ params["wh"], 3, axis=-1)
        r, z = jax.nn.sigmoid(rx + rh), jax.nn.sigmoid(zx + zh)
        h = (1 - z) * jnp.tanh(nx + r * nh) + z * h
        return h, h

    _, hs = lax.scan(step, h0, xs)
    return jnp.mean(hs ** 2)


def accumulated_conv_gradient(kernel, microbatches):
    """Gradient accumulation: a convolution's kernel gradient summed over microbatches in a ``lax.scan``."""
    def loss(k, x):
        y = lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return jnp.mean(jnp.tanh(y) ** 2)

    return lax.scan(lambda g, x: (g + jax.grad(loss)(kernel, x), None), jnp.zeros_like(kernel), microbatches)[0]


def embedding_sequence_gradient(table, ids):
    """The table's gradient of a recurrent model that looks up one token per step (a scatter-add per step)."""
    def loss(table):
        def step(h, ids_t):
            h = jnp.tanh(h + table[ids_t])
            return h, jnp.sum(h ** 2)

        return jnp.mean(lax.scan(step, jnp.zeros((ids.shape[1], table.shape[1])), ids)[1])

    return jax.grad(loss)(table)


def summed_product(x, w):
    """A loss that sums a product: its contraction's psum can wait for the sum (a scalar)."""
    return jnp.sum(jnp.tanh(x) @ w) / x.shape[0]


def init_cnn(channels=8, features=16, classes=10, seed=2):
    """A two-convolution network's parameters (3x3 kernels, HWIO), its classifier's weights and bias."""
    rng = np.random.default_rng(seed)
    return {"k1": (rng.normal(size=(3, 3, channels, features)) * 0.2).astype(np.float32),
            "k2": (rng.normal(size=(3, 3, features, features)) * 0.1).astype(np.float32),
            "w": (rng.normal(size=(features, classes)) * 0.1).astype(np.float32),
            "b": np.zeros((classes,), np.float32)}


def cnn_loss(params, images, labels):
    """Convolution, ReLU, a 3x3 max-pool of stride 2, convolution, ReLU, global average, classifier, cross-entropy
    (NHWC images: rows sharded, every device holds a band of each image)."""
    def conv(x, k):
        return jax.lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))

    h = jax.nn.relu(conv(images, params["k1"]))
    h = jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME")
    h = jax.nn.relu(conv(h, params["k2"]))
    logits = jnp.mean(h, axis=(1, 2)) @ params["w"] + params["b"]
    return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * jax.nn.one_hot(labels, logits.shape[-1]), axis=-1))


def cnn_train_step(params, images, labels, lr=0.1):
    """One SGD step of ``cnn_loss``: the loss and the updated parameters."""
    loss, grads = jax.value_and_grad(cnn_loss)(params, images, labels)
    return loss, jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads)


def lenet_loss(params, images, labels):
    """LeNet's shape: VALID convolutions, each followed by ReLU and a 2x2 average pool, global average, classifier,
    cross-entropy. With the rows sharded, every window's output rows are uneven on the devices (62 of 64, 31, 29,
    14): each device keeps its rows in place (ranged)."""
    def conv(x, k):
        return jax.lax.conv_general_dilated(x, k, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"))

    def pool(x):
        return jax.lax.reduce_window(x, 0.0, jax.lax.add, (1, 2, 2, 1), (1, 2, 2, 1), "VALID") / 4

    h = pool(jax.nn.relu(conv(images, params["k1"])))
    h = pool(jax.nn.relu(conv(h, params["k2"])))
    logits = jnp.mean(h, axis=(1, 2)) @ params["w"] + params["b"]
    return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * jax.nn.one_hot(labels, logits.shape[-1]), axis=-1))


def lenet_train_step(params, images, labels, lr=0.1):
    """One SGD step of ``lenet_loss``: the loss and the updated parameters."""
    loss, grads = jax.value_and_grad(lenet_loss)(params, images, labels)
    return loss, jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads)


def kv_cache_decode(cache_k, cache_v, queries, keys, values, start):
    """Greedy decoding's attention over a sequence-sharded KV cache: each step writes its key and value at its
    position (a ``dynamic_update_slice`` along the sharded axis), attends over the positions written so far (a
    masked softmax over the sharded axis): the caches and each step's attended value."""
    seq = cache_k.shape[1]

    def step(t, carry):
        cache_k, cache_v, out = carry
        pos = start + t
        cache_k = jax.lax.dynamic_update_slice(cache_k, keys[:, t][:, None], (0, pos, 0))
        cache_v = jax.lax.dynamic_update_slice(cache_v, values[:, t][:, None], (0, pos, 0))
        scores = jnp.einsum("bd,bsd->bs", queries[:, t], cache_k) / np.sqrt(cache_k.shape[-1])
        scores = jnp.where(jnp.arange(seq)[None, :] <= pos, scores, -jnp.inf)
        attended = jnp.einsum("bs,bsd->bd", jax.nn.softmax(scores, axis=-1), cache_v)
        return cache_k, cache_v, out.at[:, t].set(attended)

    out = jnp.zeros(queries.shape, queries.dtype)
    return jax.lax.fori_loop(0, queries.shape[1], step, (cache_k, cache_v, out))


def init_sequence_mixer(features=32, padded=1008, width=4, seed=3):
    """A causal depthwise convolution's kernel, and an output projection onto a vocabulary padded to ``padded``
    columns (a multiple of the mesh)."""
    rng = np.random.default_rng(seed)
    return (jnp.asarray(rng.normal(size=(width, features)) * 0.3, jnp.float32),
            jnp.asarray(rng.normal(size=(features, padded)) * 0.1, jnp.float32))


def sequence_mixer_loss(kernel, head, x, labels, vocab=1001):
    """A token-mixing layer over a sequence: a causal depthwise convolution (the sequence padded on the left, the
    kernel's shifted slices), a token shift (``jnp.roll``), then the cross-entropy of a projection onto the padded
    vocabulary sliced back to ``vocab``."""
    width, length = kernel.shape[0], x.shape[1]
    padded = jnp.pad(x, ((0, 0), (width - 1, 0), (0, 0)))
    h = jax.nn.gelu(sum(padded[:, k:k + length] * kernel[k] for k in range(width)))
    h = h + 0.5 * jnp.roll(h, 1, axis=1)
    log_probs = jax.nn.log_softmax(h @ head[:, :vocab], axis=-1)
    return -jnp.mean(jnp.take_along_axis(log_probs, labels[..., None], axis=-1))


def sequence_mixer_gradient(kernel, head, x, labels):
    """The gradients of ``sequence_mixer_loss`` with respect to the kernel and the projection."""
    return jax.grad(sequence_mixer_loss, argnums=(0, 1))(kernel, head, x, labels)
