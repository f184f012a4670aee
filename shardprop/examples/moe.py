"""A top-2 mixture of experts in plain ``jax.numpy``, GShard's dispatch: tokens in groups, each token routed to its
two likeliest experts, each expert taking at most a capacity of tokens per group, dispatched and combined by einsums;
with the load-balancing loss, and an SGD training step.

>>> params = init_moe()                                                    # doctest: +SKIP
>>> new_params, loss = moe_train_step(params, x, targets)                  # doctest: +SKIP
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def init_moe(d_model=32, d_ff=64, experts=8, seed=4):
    rng = np.random.default_rng(seed)
    return {"router": (rng.normal(size=(d_model, experts)) / np.sqrt(d_model)).astype(np.float32),
            "w_in": (rng.normal(size=(experts, d_model, d_ff)) / np.sqrt(d_model)).astype(np.float32),
            "w_out": (rng.normal(size=(experts, d_ff, d_model)) / np.sqrt(d_ff)).astype(np.float32)}


def moe_layer(p, x, capacity):
    """A top-2 mixture of experts on ``x`` [groups, tokens, d]: each token routed to its two likeliest experts, each
    expert taking at most ``capacity`` tokens of a group (first choices queue before second choices; the rest are
    dropped), dispatched and combined by einsums. Returns the output and the load-balancing loss."""
    groups, tokens, experts = x.shape[0], x.shape[1], p["router"].shape[1]
    probs = jax.nn.softmax(x @ p["router"], axis=-1)
    gates, chosen = lax.top_k(probs, 2)
    gates = gates / jnp.sum(gates, axis=-1, keepdims=True)
    masks = jax.nn.one_hot(chosen, experts, dtype=x.dtype).transpose(0, 2, 1, 3)  # [groups, choice, tokens, experts]
    queued = masks.reshape(groups, 2 * tokens, experts)
    position = (jnp.cumsum(queued, axis=1) * queued - 1).astype(jnp.int32).reshape(groups, 2, tokens, experts)
    slots = jax.nn.one_hot(position, capacity, dtype=x.dtype)  # position -1 (not routed) or >= capacity: no slot
    dispatch = jnp.sum(slots, axis=1)  # [groups, tokens, experts, capacity]
    combine = jnp.einsum("gks,gkstc->gstc", gates.transpose(0, 2, 1), slots)
    expert_in = jnp.einsum("gsec,gsd->egcd", dispatch, x)
    hidden = jax.nn.gelu(jnp.einsum("egcd,edf->egcf", expert_in, p["w_in"]))
    expert_out = jnp.einsum("egcf,efd->egcd", hidden, p["w_out"])
    balance = experts * jnp.sum(jnp.mean(masks[:, 0], axis=(0, 1)) * jnp.mean(probs, axis=(0, 1)))
    return jnp.einsum("gsec,egcd->gsd", combine, expert_out), balance


def moe_layer_sorted(p, x, capacity):
    """``moe_layer`` with the tokens dispatched by sorting, not by einsums: each group's (token, choice) assignments,
    first choices before second ones, sorted by expert (stably: each expert's queue in that order), the first
    ``capacity`` of each expert's scattered into its buffer and the outputs gathered back. The same output and
    load-balancing loss."""
    groups, tokens, experts = x.shape[0], x.shape[1], p["router"].shape[1]
    probs = jax.nn.softmax(x @ p["router"], axis=-1)
    gates, chosen = lax.top_k(probs, 2)
    gates = gates / jnp.sum(gates, axis=-1, keepdims=True)

    def slots(expert):  # one group's assignments [2 * tokens] (choice-major) -> each one's buffer slot
        order = jnp.argsort(expert, stable=True)
        ranked = expert[order]
        position = jnp.zeros_like(expert).at[order].set(
            jnp.arange(expert.shape[0]) - jnp.searchsorted(ranked, ranked, side="left"))
        return jnp.where(position < capacity, expert * capacity + position, experts * capacity)  # the last: dropped

    slot = jax.vmap(slots)(chosen.transpose(0, 2, 1).reshape(groups, 2 * tokens))
    source = jnp.tile(jnp.arange(tokens), 2)  # the token of each assignment

    def dispatch(x_g, slot_g):
        return jnp.zeros((experts * capacity, x.shape[2]), x.dtype).at[slot_g].set(x_g[source], mode="drop")

    expert_in = jax.vmap(dispatch)(x, slot).reshape(groups, experts, capacity, -1).transpose(1, 0, 2, 3)
    hidden = jax.nn.gelu(jnp.einsum("egcd,edf->egcf", expert_in, p["w_in"]))
    expert_out = jnp.einsum("egcf,efd->egcd", hidden, p["w_out"]).transpose(1, 0, 2, 3).reshape(
        groups, experts * capacity, -1)
    picked = jax.vmap(lambda out_g, slot_g: out_g.at[slot_g].get(mode="fill", fill_value=0))(expert_out, slot)
    weights = gates.transpose(0, 2, 1).reshape(groups, 2 * tokens, 1)
    y = jnp.sum((picked * weights).reshape(groups, 2, tokens, -1), axis=1)
    first = jax.nn.one_hot(chosen[..., 0], experts, dtype=x.dtype)
    balance = experts * jnp.sum(jnp.mean(first, axis=(0, 1)) * jnp.mean(probs, axis=(0, 1)))
    return y, balance


def moe_train_step(params, x, targets, capacity=10, lr=0.1, layer=moe_layer):
    """One SGD step of a residual top-2 mixture-of-experts layer (``layer``: ``moe_layer``, or ``moe_layer_sorted``)
    regressed onto ``targets``, with the load-balancing loss (weight 0.01): the new parameters and the loss."""
    def loss(p):
        y, balance = layer(p, x, capacity)
        return jnp.mean((x + y - targets) ** 2) + 0.01 * balance

    value, grads = jax.value_and_grad(loss)(params)
    return jax.tree_util.tree_map(lambda w, g: w - lr * g, params, grads), value
