"""The benchmark models ``shardprop bench --search`` measures, each with the layouts an expert would write.

Training steps (an MLP, a transformer block, a flax MLP with optax's adam, the Llama-style AdamW step, a top-2
mixture of experts) and the Llama-style decoder's KV-cache decode step, on an 8-device or a 4x2 mesh: the arguments,
the specs ``sp.AUTO`` searches from, and every expert layout (data parallel, FSDP, Megatron, FSDP+TP, sequence
sharding, expert parallelism, the cache over heads or over the sequence) as the in_specs of every argument.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from . import models
from ..examples import llama as llama_example
from ..examples import moe as moe_example

DATA, MODEL = "data", "model"

@dataclass(frozen=True)
class Model:
    """A training step, its arguments, the spec of its batch arguments, and the expert layouts of its parameters
    (name -> in_specs for every argument) on ``mesh`` (shape, names)."""

    name: str
    mesh: tuple[tuple[int, ...], tuple[str, ...]]
    f: Callable
    args: tuple
    auto_specs: tuple  # in_specs with sp.AUTO where the search chooses
    experts: dict[str, tuple]


def _mlp_experts(layers: int, two_d: bool) -> dict[str, list]:
    def layer(w, b):
        return {"b": b, "w": w}

    col, row = (P(None, MODEL), P(MODEL)), (P(MODEL, None), P())
    out = {"data parallel": [layer(P(), P())] * layers, "FSDP": [layer(P(DATA), P())] * layers}
    if two_d:
        out["Megatron"] = [layer(*(col if k % 2 == 0 else row)) for k in range(layers)]
        out["FSDP+TP"] = [layer(P(DATA, MODEL), P(MODEL)) if k % 2 == 0 else layer(P(MODEL, DATA), P())
                          for k in range(layers)]
    return out


def mlp(two_d: bool, width: int = 1024, batch: int = 64, layers: int = 3) -> Model:
    params = models.init_mlp((width,) * (layers + 1))
    rng = np.random.default_rng(1)
    x = rng.normal(size=(batch, width)).astype(np.float32)
    labels = rng.integers(0, width, size=batch).astype(np.int32)
    experts = {k: (v, P(DATA), P(DATA)) for k, v in _mlp_experts(layers, two_d).items()}
    from ..search import AUTO
    return Model(f"MLP training step ({layers}x{width}, batch {batch})", ((4, 2), (DATA, MODEL)) if two_d
                 else ((8,), (DATA,)), models.mlp_train_step, (params, x, labels), (AUTO, P(DATA), P(DATA)), experts)


def block_step(params, x, lr=0.1):
    def loss(p):
        return jnp.mean(models.transformer_block(p, x) ** 2)

    value, grads = jax.value_and_grad(loss)(params)
    return jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads), value


def block_specs(hidden):
    """The transformer block's Megatron specs over mesh axis ``hidden``: q/k/v and the first MLP layer by columns, the
    output projection and the second layer by rows (None: replicated, as an unannotated argument adopts)."""
    col, row = P(None, hidden), P(hidden, None)
    return {"wq": col, "wk": col, "wv": col, "wo": row, "w1": col, "b1": P(hidden), "w2": row, "b2": None,
            "ln1_g": None, "ln1_b": None, "ln2_g": None, "ln2_b": None}


def transformer(two_d: bool, d_model: int = 256, d_ff: int = 1024, batch: int = 8, seq: int = 64) -> Model:
    from ..search import AUTO

    params = models.init_block(d_model, d_ff)
    x = np.random.default_rng(2).normal(size=(batch, seq, d_model)).astype(np.float32)
    replicated = {k: P() for k in params}
    fsdp = {k: P(DATA) if v.ndim == 2 else P() for k, v in params.items()}
    experts = {"data parallel": (replicated, P(DATA)), "FSDP": (fsdp, P(DATA))}
    if two_d:
        megatron = {k: (v if v is not None else P()) for k, v in block_specs(MODEL).items()}
        both = {k: P(DATA, MODEL) if s == P(None, MODEL) else P(MODEL, DATA) if s == P(MODEL, None) else s
                for k, s in megatron.items()}
        experts |= {"Megatron": (megatron, P(DATA)), "FSDP+TP": (both, P(DATA)),
                    "data parallel + sequence": (replicated, P(DATA, MODEL)),
                    "FSDP + sequence": (fsdp, P(DATA, MODEL))}
    return Model(f"transformer block training step (d {d_model}, ff {d_ff}, batch {batch}x{seq})",
                 ((4, 2), (DATA, MODEL)) if two_d else ((8,), (DATA,)), block_step, (params, x),
                 (AUTO, P(DATA)), experts)


def flax_adam(two_d: bool, width: int = 512, batch: int = 64) -> Model:
    import flax.linen as nn
    import optax

    from ..search import AUTO

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.relu(nn.Dense(2 * width)(x))
            x = nn.relu(nn.Dense(width)(x))
            return nn.Dense(width)(x)

    model, tx = MLP(), optax.adam(1e-3)
    x = np.random.default_rng(3).normal(size=(batch, width)).astype(np.float32)
    y = np.random.default_rng(4).integers(0, width, size=batch).astype(np.int32)
    params = jax.tree_util.tree_map(np.asarray, model.init(jax.random.key(0), x[:1]))
    opt_state = jax.tree_util.tree_map(np.asarray, tx.init(params))

    def step(params, opt_state, x, y):
        def loss(p):
            return optax.softmax_cross_entropy_with_integer_labels(model.apply(p, x), y).mean()

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    names = sorted(params["params"])

    def layout(kind):
        out = {}
        for k, name in enumerate(names):
            col = k % 2 == 0
            kernel, bias = {"data parallel": (P(), P()), "FSDP": (P(DATA), P()),
                            "Megatron": (P(None, MODEL), P(MODEL)) if col else (P(MODEL, None), P()),
                            "FSDP+TP": (P(DATA, MODEL), P(MODEL)) if col else (P(MODEL, DATA), P())}[kind]
            out[name] = {"bias": bias, "kernel": kernel}
        return {"params": out}

    def with_state(p_specs):
        # the optimizer's moments laid out like the parameters (ZeRO), its count replicated
        state = jax.tree_util.tree_map(lambda _: P(), opt_state)
        adam = state[0]._replace(mu=p_specs, nu=p_specs)
        return (p_specs, (adam, *state[1:]), P(DATA), P(DATA))

    kinds = ["data parallel", "FSDP"] + (["Megatron", "FSDP+TP"] if two_d else [])
    return Model(f"flax MLP + optax adam step ({width}-{2 * width}-{width}-{width}, batch {batch})",
                 ((4, 2), (DATA, MODEL)) if two_d else ((8,), (DATA,)), step, (params, opt_state, x, y),
                 (AUTO, AUTO, P(DATA), P(DATA)), {k: with_state(layout(k)) for k in kinds})


def _llama_layouts(params) -> dict[str, dict]:
    """The Llama-style decoder's expert layouts of its parameters: data parallel, FSDP, Megatron (q/k/v and the
    MLP's up projections by columns, the output projections by rows), FSDP+TP."""
    col, row = P(None, MODEL), P(MODEL, None)
    megatron_layer = {"attn_norm": P(), "wq": col, "wk": col, "wv": col, "wo": row, "mlp_norm": P(),
                      "w_gate": col, "w_up": col, "w_down": row}

    def layout(layer, embed, head):
        return {"embed": embed, "layers": [dict(layer) for _ in params["layers"]], "final_norm": P(), "lm_head": head}

    two_d = {col: P(DATA, MODEL), row: P(MODEL, DATA)}
    return {"data parallel": layout({k: P() for k in megatron_layer}, P(), P()),
            "FSDP": layout({k: P(DATA) if k.startswith("w") else P() for k in megatron_layer}, P(DATA), P(DATA)),
            "Megatron": layout(megatron_layer, P(None, MODEL), col),
            "FSDP+TP": layout({k: two_d.get(s, s) for k, s in megatron_layer.items()}, P(DATA, MODEL),
                              P(DATA, MODEL))}


def llama(batch: int = 8, seq: int = 32) -> Model:
    """The Llama-style AdamW step (``examples.llama.llama_train_step``: d 64, 2 layers, 8 query heads on 2 KV heads)
    on the 4x2 mesh; the moments are left ``None`` for the search (they take their parameter's layout)."""
    from ..search import AUTO

    params = llama_example.init_llama()
    zeros = jax.tree_util.tree_map(np.zeros_like, params)
    rng = np.random.default_rng(5)
    tokens = rng.integers(0, 128, size=(batch, seq)).astype(np.int32)
    targets = rng.integers(0, 128, size=(batch, seq)).astype(np.int32)
    return Model(f"Llama-style AdamW step (d 64, 2 layers, 8 heads on 2 KV heads, batch {batch}x{seq})",
                 ((4, 2), (DATA, MODEL)), llama_example.llama_train_step, (params, zeros, zeros, tokens, targets),
                 (AUTO, None, None, P(DATA), P(DATA)),
                 {name: (specs, specs, specs, P(DATA), P(DATA)) for name, specs in _llama_layouts(params).items()})


def mixture_of_experts(groups: int = 8, tokens: int = 32, d_model: int = 32) -> Model:
    """``examples.moe.moe_train_step`` (8 experts, top-2, capacity 10 per group) on the 4x2 mesh, the token groups over
    ``data``: the experts all-to-all'd over ``data`` (expert parallelism), with their hidden units over ``model`` too,
    or over ``model`` alone (beside the groups)."""
    from ..search import AUTO

    params = moe_example.init_moe(d_model)
    rng = np.random.default_rng(6)
    x, targets = (rng.normal(size=(groups, tokens, d_model)).astype(np.float32) for _ in range(2))
    experts = {"data parallel": {"router": P(), "w_in": P(), "w_out": P()},
               "expert parallel": {"router": P(), "w_in": P(DATA), "w_out": P(DATA)},
               "expert parallel + TP": {"router": P(), "w_in": P(DATA, None, MODEL), "w_out": P(DATA, MODEL, None)},
               "experts over model": {"router": P(), "w_in": P(MODEL), "w_out": P(MODEL)}}
    return Model(f"top-2 mixture-of-experts step (8 experts, d {d_model}, {groups} groups of {tokens} tokens)",
                 ((4, 2), (DATA, MODEL)), moe_example.moe_train_step, (params, x, targets), (AUTO, P(DATA), P(DATA)),
                 {name: (specs, P(DATA), P(DATA)) for name, specs in experts.items()})


def kv_decode(batch: int = 8, seq: int = 128) -> Model:
    """``examples.llama.llama_decode_step`` on the 4x2 mesh, the tokens over ``data``; ``sp.AUTO`` lays out the
    parameters and both caches (returned for the next step: in the layout they came in). Experts: data parallel,
    Megatron with the cache's KV heads over ``model``, Megatron with the cache's sequence over ``model``."""
    from ..search import AUTO

    params = llama_example.init_llama()
    rng = np.random.default_rng(7)
    d_head = params["layers"][0]["wk"].shape[1] // 2
    caches = [[rng.normal(size=(batch, seq, 2, d_head)).astype(np.float32) for _ in params["layers"]]
              for _ in range(2)]
    tokens = rng.integers(0, params["embed"].shape[0], size=(batch,)).astype(np.int32)
    layouts = _llama_layouts(params)
    experts = {"data parallel": (layouts["data parallel"], P(DATA)),
               "Megatron, cache over heads": (layouts["Megatron"], P(DATA, None, MODEL)),
               "Megatron, cache over sequence": (layouts["Megatron"], P(DATA, MODEL))}
    return Model(f"Llama-style KV-cache decode step (batch {batch}, cache of {seq}, 2 KV heads)",
                 ((4, 2), (DATA, MODEL)), llama_example.llama_decode_step,
                 (params, *caches, tokens, np.int32(seq // 2 + 6)),
                 (AUTO, AUTO, AUTO, P(DATA), P()),
                 {name: (specs, cache, cache, P(DATA), P()) for name, (specs, cache) in experts.items()})


MODELS = (lambda: mlp(False), lambda: mlp(True), lambda: transformer(False), lambda: transformer(True),
          lambda: flax_adam(False), lambda: flax_adam(True), llama, mixture_of_experts, kv_decode)


