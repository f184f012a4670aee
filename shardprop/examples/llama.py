"""A Llama-style decoder in plain ``jax.numpy``, as its authors write it: RMSNorm, rotary position embeddings,
grouped-query attention (8 query heads on 2 KV heads) under a causal mask, a SwiGLU MLP; a training step with a
hand-written AdamW, and a greedy decoding step over a KV cache [batch, seq, kv_heads, d_head] per layer.

>>> params = init_llama()                                                   # doctest: +SKIP
>>> new_params, m, v, loss = llama_train_step(params, zeros, zeros, tokens, targets)   # doctest: +SKIP
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def init_llama(vocab=128, d_model=64, layers=2, heads=8, kv_heads=2, d_ff=128, seed=3):
    rng = np.random.default_rng(seed)
    d_head = d_model // heads

    def w(*shape):
        return (rng.normal(size=shape) / np.sqrt(shape[0])).astype(np.float32)

    def layer():
        return {"attn_norm": np.ones(d_model, np.float32), "wq": w(d_model, heads * d_head),
                "wk": w(d_model, kv_heads * d_head), "wv": w(d_model, kv_heads * d_head),
                "wo": w(heads * d_head, d_model),
                "mlp_norm": np.ones(d_model, np.float32), "w_gate": w(d_model, d_ff), "w_up": w(d_model, d_ff),
                "w_down": w(d_ff, d_model)}

    return {"embed": w(vocab, d_model), "layers": [layer() for _ in range(layers)],
            "final_norm": np.ones(d_model, np.float32), "lm_head": w(d_model, vocab)}


def rms_norm(x, gain, eps=1e-6):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * gain


def rope(x):
    """Rotary position embedding of ``x`` [batch, seq, heads, d_head] (positions 0..seq-1)."""
    half = x.shape[-1] // 2
    angles = jnp.arange(x.shape[1], dtype=jnp.float32)[:, None] / 10000.0 ** (jnp.arange(half) / half)
    cos, sin = jnp.cos(angles)[None, :, None, :], jnp.sin(angles)[None, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


def grouped_query_attention(p, x, heads, kv_heads):
    batch, seq, _ = x.shape
    d_head = p["wq"].shape[1] // heads
    q = rope((x @ p["wq"]).reshape(batch, seq, heads, d_head))
    k = rope((x @ p["wk"]).reshape(batch, seq, kv_heads, d_head))
    v = (x @ p["wv"]).reshape(batch, seq, kv_heads, d_head)
    k, v = jnp.repeat(k, heads // kv_heads, axis=2), jnp.repeat(v, heads // kv_heads, axis=2)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d_head).astype(np.float32)
    scores = jnp.where(jnp.tril(jnp.ones((seq, seq), bool)), scores, -1e9)  # causal
    out = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)
    return out.reshape(batch, seq, heads * d_head) @ p["wo"]


def llama_loss(params, tokens, targets, heads=8, kv_heads=2):
    h = params["embed"][tokens]
    for p in params["layers"]:
        h = h + grouped_query_attention(p, rms_norm(h, p["attn_norm"]), heads, kv_heads)
        m = rms_norm(h, p["mlp_norm"])
        h = h + (jax.nn.silu(m @ p["w_gate"]) * (m @ p["w_up"])) @ p["w_down"]
    logits = rms_norm(h, params["final_norm"]) @ params["lm_head"]
    log_probs = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(log_probs, targets[..., None], axis=-1))


def llama_train_step(params, m, v, tokens, targets, lr=1e-3, b1=0.9, b2=0.95, eps=1e-8, decay=0.1):
    """One AdamW step (its first: bias corrections of step 1) of the Llama-style decoder; returns the new parameters,
    moments and the loss."""
    loss, grads = jax.value_and_grad(llama_loss)(params, tokens, targets)
    m = jax.tree_util.tree_map(lambda m, g: b1 * m + (1 - b1) * g, m, grads)
    v = jax.tree_util.tree_map(lambda v, g: b2 * v + (1 - b2) * g * g, v, grads)
    params = jax.tree_util.tree_map(
        lambda p, m, v: p - lr * (m / (1 - b1) / (jnp.sqrt(v / (1 - b2)) + eps) + decay * p), params, m, v)
    return params, m, v, loss


def rope_at(x, pos):
    """Rotary position embedding of one token's ``x`` [batch, heads, d_head] at position ``pos``."""
    half = x.shape[-1] // 2
    angles = pos.astype(jnp.float32) / 10000.0 ** (jnp.arange(half) / half)
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


def llama_decode_step(params, cache_k, cache_v, tokens, pos, heads=8, kv_heads=2):
    """One greedy-decoding step of the Llama-style decoder: every sequence's token at position ``pos``, its key and
    value written into each layer's cache [batch, seq, kv_heads, d_head] there, attention over the positions written
    so far (the KV heads repeated to the query heads). Returns the logits and the updated caches."""
    batch = tokens.shape[0]
    h = params["embed"][tokens]
    new_k, new_v = [], []
    for p, ck, cv in zip(params["layers"], cache_k, cache_v, strict=True):
        x = rms_norm(h, p["attn_norm"])
        d_head = p["wq"].shape[1] // heads
        q = rope_at((x @ p["wq"]).reshape(batch, heads, d_head), pos)
        k = rope_at((x @ p["wk"]).reshape(batch, kv_heads, d_head), pos)
        v = (x @ p["wv"]).reshape(batch, kv_heads, d_head)
        ck = lax.dynamic_update_slice(ck, k[:, None], (0, pos, 0, 0))
        cv = lax.dynamic_update_slice(cv, v[:, None], (0, pos, 0, 0))
        keys, values = jnp.repeat(ck, heads // kv_heads, axis=2), jnp.repeat(cv, heads // kv_heads, axis=2)
        scores = jnp.einsum("bhd,bshd->bhs", q, keys) / np.sqrt(d_head).astype(np.float32)
        scores = jnp.where(jnp.arange(ck.shape[1]) <= pos, scores, -1e9)  # the positions written so far
        out = jnp.einsum("bhs,bshd->bhd", jax.nn.softmax(scores, axis=-1), values)
        h = h + out.reshape(batch, heads * d_head) @ p["wo"]
        m = rms_norm(h, p["mlp_norm"])
        h = h + (jax.nn.silu(m @ p["w_gate"]) * (m @ p["w_up"])) @ p["w_down"]
        new_k.append(ck)
        new_v.append(cv)
    return rms_norm(h, params["final_norm"]) @ params["lm_head"], new_k, new_v
