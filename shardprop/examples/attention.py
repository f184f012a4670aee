"""Multi-head self-attention and a pre-norm transformer block."""

import jax
import jax.numpy as jnp
import numpy as np

from shardprop.examples.layernorm import layer_norm


def init_block(d_model=32, n_heads=4, d_ff=64, seed=0):
    rng = np.random.default_rng(seed)

    def w(*shape):
        return (rng.normal(size=shape) / np.sqrt(shape[0])).astype(np.float32)

    return {
        "wq": w(d_model, d_model), "wk": w(d_model, d_model), "wv": w(d_model, d_model), "wo": w(d_model, d_model),
        "w1": w(d_model, d_ff), "b1": np.zeros(d_ff, np.float32), "w2": w(d_ff, d_model),
        "b2": np.zeros(d_model, np.float32),
        "ln1_g": np.ones(d_model, np.float32), "ln1_b": np.zeros(d_model, np.float32),
        "ln2_g": np.ones(d_model, np.float32), "ln2_b": np.zeros(d_model, np.float32),
    }


def multi_head_attention(x, wq, wk, wv, wo, n_heads=4):
    batch, seq, d_model = x.shape
    d_head = d_model // n_heads

    def heads(t):  # [batch, seq, d_model] -> [batch, heads, seq, d_head]
        return t.reshape(batch, seq, n_heads, d_head).transpose(0, 2, 1, 3)

    q, k, v = heads(x @ wq), heads(x @ wk), heads(x @ wv)
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) / jnp.sqrt(d_head).astype(x.dtype)
    weights = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bhqk,bhkd->bhqd", weights, v)
    return out.transpose(0, 2, 1, 3).reshape(batch, seq, d_model) @ wo


def transformer_block(params, x, n_heads=4):
    h = layer_norm(x, params["ln1_g"], params["ln1_b"])
    x = x + multi_head_attention(h, params["wq"], params["wk"], params["wv"], params["wo"], n_heads)
    h = layer_norm(x, params["ln2_g"], params["ln2_b"])
    h = jax.nn.gelu(h @ params["w1"] + params["b1"])
    return x + h @ params["w2"] + params["b2"]
