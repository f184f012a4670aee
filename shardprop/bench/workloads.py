"""The benchmark's workloads: what runs, on which mesh, with which input shardings.

A ``Workload`` names a function, builds its arguments and input specs (lazily: a library row imports its
library only when it runs), and says how it is parallelised — ``data`` (the batch over the 8 devices of mesh axis
``data``), ``tensor`` (hidden units, heads or classes over the 8 devices of ``model``) or ``2-D`` (batch over
``data`` and hidden over ``model`` on a (4, 2) mesh). ``known_gap`` explains a row expected to miss a goal;
``fewer_expected`` says why shardprop should move fewer bytes than ``jax.jit`` on it. ``workloads`` is the
registry; the real-library rows are in ``shardprop.bench.libraries``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from jax.sharding import PartitionSpec as P

from . import experts, models
from ..examples import moe as moe_example
from .experts import block_specs
from .models import nx_example

DATA, MODEL, ROWS, SEQ = "data", "model", "rows", "seq"
MESHES = {"data": ((8,), (DATA,)), "tensor": ((8,), (MODEL,)), "2-D": ((4, 2), (DATA, MODEL)),
          "spatial": ((8,), (ROWS,)), "sequence": ((8,), (SEQ,))}


class Case(NamedTuple):
    """What a workload runs: ``f(*args)`` with ``in_specs`` (a pytree prefix of ``args``, as autoshard takes)."""

    f: Callable
    args: tuple
    in_specs: Any


@dataclass(frozen=True)
class Workload:
    name: str
    kind: str  # "own" (the project's models), "loop" (scan / fori_loop) or "library" (flax, equinox, haiku, optax)
    parallel: str  # a key of MESHES: "data", "tensor", "2-D", "spatial" (image rows) or "sequence"
    build: Callable[[], Case]
    rtol: float = 1e-5
    atol: float = 1e-5
    quick: bool = False  # in the --quick subset
    requires: tuple[str, ...] = ()  # modules the row imports; missing ones skip it with a note
    known_gap: str | None = None  # why this row is expected to miss a goal
    fewer_expected: str | None = None  # why shardprop should move fewer bytes than jax.jit here

    @property
    def mesh_shape(self) -> tuple[tuple[int, ...], tuple[str, ...]]:
        return MESHES[self.parallel]


def arrays(seed: int = 0):
    """``normal(*shape)``: a float32 array drawn from a fixed seed (the same numbers on every run)."""
    rng = np.random.default_rng(seed)

    def normal(*shape, scale=1.0):
        return (rng.normal(size=shape) * scale).astype(np.float32)

    return normal, rng


# -- the project's own models ----------------------------------------------------------------------------------
def _nx_2d() -> Case:
    normal, _ = arrays()
    return Case(nx_example, (normal(1024, 1024), normal(1024, 1024)), (P(DATA, MODEL), P(DATA, MODEL)))


def _matmul(parallel: str) -> Callable[[], Case]:
    def build() -> Case:
        normal, _ = arrays()
        a, b = normal(512, 1024), normal(1024, 512)
        specs = {"tensor": (P(None, MODEL), P(MODEL, None)), "2-D": (P(DATA, MODEL), P(MODEL, None))}[parallel]
        return Case(models.matmul, (a, b), specs)

    return build


def _matmul_scaled() -> Case:
    normal, _ = arrays()
    return Case(models.matmul_scaled, (normal(512, 1024), normal(1024, 512), normal(512, 512)),
                (P(DATA, MODEL), P(MODEL, None), P(DATA, MODEL)))


def mlp_specs(batch, hidden):
    """Specs of a two-layer MLP's (params, x, labels): the hidden units over ``hidden`` (Megatron's column then
    row split), the batch over ``batch``; None: replicated."""
    if hidden is None:
        params = [{"w": P(), "b": P()}, {"w": P(), "b": P()}]
    else:
        params = [{"w": P(None, hidden), "b": P(hidden)}, {"w": P(hidden, None), "b": P()}]
    return params, P(batch), P(batch)


def _mlp(parallel: str, f=models.mlp_train_step, sizes=(256, 512, 128), batch=256) -> Callable[[], Case]:
    def build() -> Case:
        normal, rng = arrays()
        params = models.init_mlp(sizes)
        x, labels = normal(batch, sizes[0]), rng.integers(0, sizes[-1], size=batch).astype(np.int32)
        specs = {"data": mlp_specs(DATA, None), "tensor": mlp_specs(None, MODEL), "2-D": mlp_specs(DATA, MODEL)}
        return Case(f, (params, x, labels), specs[parallel])

    return build


def _layer_norm(parallel: str) -> Callable[[], Case]:
    def build() -> Case:
        normal, _ = arrays()
        x, gamma, beta = normal(1024, 512), 1 + normal(512, scale=0.1), normal(512, scale=0.1)
        specs = {"data": (P(DATA), None, None), "tensor": (P(None, MODEL), P(MODEL), None),
                 "2-D": (P(DATA, MODEL), None, None)}[parallel]
        return Case(models.layer_norm, (x, gamma, beta), specs)

    return build


def _transformer(parallel: str) -> Callable[[], Case]:
    def build() -> Case:
        normal, _ = arrays()
        block, x = models.init_block(128, 256), normal(16, 64, 128)
        specs = {"data": (None, P(DATA)), "tensor": (block_specs(MODEL), None),
                 "2-D": (block_specs(MODEL), P(DATA))}[parallel]
        return Case(models.transformer_block, (block, x), specs)

    return build


# -- loops -----------------------------------------------------------------------------------------------------
def _rnn_grad() -> Case:
    import jax

    normal, _ = arrays(3)
    xs, h0 = normal(16, 64, 64), normal(64, 64)
    return Case(jax.grad(models.rnn_loss), (models.init_rnn(64), xs, h0), (None, P(None, DATA), P(DATA)))


def _gru_grad_2d() -> Case:
    import jax

    normal, _ = arrays(4)
    xs, h0 = normal(16, 64, 64), normal(64, 64)
    gates = {"wx": P(None, MODEL), "wh": P(None, MODEL), "b": P(MODEL)}
    return Case(jax.grad(models.gru_loss), (models.init_gru(64), xs, h0), (gates, P(None, DATA), P(DATA)))


def _accumulated_conv() -> Case:
    normal, _ = arrays(5)
    return Case(models.accumulated_conv_gradient, (normal(3, 3, 8, 16, scale=0.2), normal(4, 32, 16, 16, 8)),
                (None, P(None, DATA)))


def _embedding_sequence() -> Case:
    normal, rng = arrays(6)
    ids = rng.integers(0, 64, size=(16, 128)).astype(np.int32)
    return Case(models.embedding_sequence_gradient, (normal(64, 32, scale=0.1), ids), (None, P(None, DATA)))


def _summed_product() -> Case:
    normal, _ = arrays(7)
    return Case(models.summed_product, (normal(512, 256), normal(256, 512, scale=0.05)), (P(None, MODEL), P(MODEL)))


def _cnn_spatial() -> Case:
    normal, rng = arrays(8)
    labels = rng.integers(0, 10, size=(8,)).astype(np.int32)
    return Case(models.cnn_train_step, (models.init_cnn(), normal(8, 64, 32, 8), labels), (None, P(None, ROWS), None))


def _lenet_spatial() -> Case:
    normal, rng = arrays(11)
    labels = rng.integers(0, 10, size=(8,)).astype(np.int32)
    return Case(models.lenet_train_step, (models.init_cnn(), normal(8, 64, 32, 8), labels),
                (None, P(None, ROWS), None))


def _kv_decode() -> Case:
    normal, _ = arrays(9)
    batch, seq, steps, dim = 4, 256, 6, 32
    return Case(models.kv_cache_decode, (normal(batch, seq, dim), normal(batch, seq, dim), normal(batch, steps, dim),
                                         normal(batch, steps, dim), normal(batch, steps, dim), np.int32(100)),
                (P(None, SEQ), P(None, SEQ), None, None, None, None))


def _sequence_mixer(parallel: str) -> Callable[[], Case]:
    def case() -> Case:
        normal, rng = arrays(10)
        kernel, head = models.init_sequence_mixer()
        labels = rng.integers(0, 1001, size=(4, 256)).astype(np.int32)
        specs = (None, None, P(None, SEQ), P(None, SEQ)) if parallel == "sequence" else \
            (None, P(None, MODEL), P(DATA), P(DATA))
        return Case(models.sequence_mixer_gradient, (kernel, head, normal(4, 256, 32), labels), specs)
    return case


def _language_model(build: Callable, layout: str, *, f: Callable | None = None,
                    tokens: P | None = None) -> Callable[[], Case]:
    """A language model of ``experts`` (the Llama-style step, the top-2 MoE step, the KV-cache decode step) in one of
    its expert layouts; ``f`` in place of the model's function (the MoE step with the sorted dispatch), ``tokens``
    the Llama step's tokens' and targets' spec (their sequence over ``model``: sequence parallelism)."""
    def case() -> Case:
        model = build()
        specs = model.experts[layout]
        if tokens is not None:
            specs = (*specs[:3], tokens, tokens)
        return Case(f or model.f, model.args, specs)
    return case


def _sorted_moe_step(params, x, targets):
    """The top-2 MoE step with the tokens dispatched by sorting (``examples.moe.moe_layer_sorted``)."""
    return moe_example.moe_train_step(params, x, targets, layer=moe_example.moe_layer_sorted)


# Why expert parallelism moves fewer bytes than jax.jit (both MoE dispatches)
TOKENS_TO_EXPERTS = ("the tokens' all-to-all to their experts and back moves each token's activations once; jax.jit "
                     "gathers the experts' weights")

# Why rows miss a goal, as measured on the development machine (8 virtual CPU devices on 2 cores).
REDUCE_SCATTER_ON_CPU = (
    "the reduce-scatter moves half jax.jit's bytes, but XLA:CPU runs it slower than its all-reduce of the same "
    "array (1.9x in a shard_map of psum_scatter against psum and a slice on this machine)")

OWN = [
    Workload("summed product", "own", "tensor", _summed_product, rtol=1e-4, atol=1e-4,
             fewer_expected="the contraction's psum waits for the sum: a scalar all-reduced, where jax.jit "
                            "all-reduces the 512x512 product"),
    Workload("nx_example", "own", "2-D", _nx_2d, quick=True),
    Workload("matmul", "own", "tensor", _matmul("tensor"), rtol=1e-4, atol=1e-4),
    Workload("matmul", "own", "2-D", _matmul("2-D"), rtol=1e-4, atol=1e-4, quick=True),
    Workload("matmul_reduce_scatter", "own", "2-D", _matmul_scaled, rtol=1e-4, atol=1e-4, quick=True,
             fewer_expected="the contraction's partial sums are reduce-scattered where jax.jit all-reduces",
             known_gap=REDUCE_SCATTER_ON_CPU),
    Workload("mlp_train_step", "own", "data", _mlp("data"), rtol=1e-4, atol=1e-5),
    Workload("mlp_train_step", "own", "tensor", _mlp("tensor"), rtol=1e-4, atol=1e-5),
    Workload("mlp_train_step", "own", "2-D", _mlp("2-D"), rtol=1e-4, atol=1e-5),
    Workload("layer_norm", "own", "data", _layer_norm("data")),
    Workload("layer_norm", "own", "tensor", _layer_norm("tensor"), rtol=1e-4, atol=1e-5),
    Workload("layer_norm", "own", "2-D", _layer_norm("2-D"), rtol=1e-4, atol=1e-5, quick=True),
    Workload("transformer_block", "own", "data", _transformer("data"), rtol=1e-4, atol=1e-4),
    Workload("transformer_block", "own", "tensor", _transformer("tensor"), rtol=1e-4, atol=1e-4),
    Workload("transformer_block", "own", "2-D", _transformer("2-D"), rtol=1e-4, atol=1e-4),
    Workload("sequence mixer gradient", "own", "sequence", _sequence_mixer("sequence"), rtol=2e-4, atol=2e-5,
             fewer_expected="the sequence stays sharded through the causal convolution's pad and shifted slices "
                            "(a few rows from the neighbour each) and the roll (one row), where jax.jit moves more"),
    Workload("sequence mixer gradient", "own", "2-D", _sequence_mixer("2-D"), rtol=2e-4, atol=2e-5,
             known_gap="fewer bytes than jax.jit now, but the cross-entropy's gradient builds two (4, 256, 1001) "
                       "arrays whole along the vocabulary on every device (the take_along_axis gradient's scatter-add "
                       "into zeros, a broadcast) and cuts each device's rows out after: their operands are not "
                       "ranged, and taking a layout from a consumer is backward propagation (issue #28)"),
    Workload("cnn_train_step", "own", "spatial", _cnn_spatial, rtol=2e-4, atol=2e-5, quick=True,
             fewer_expected="the image rows stay sharded through the convolutions, the max-pool and their gradients "
                            "(halo exchanges of a row or two); jax.jit gathers rows for the max-pool's gradient"),
    Workload("lenet_train_step", "own", "spatial", _lenet_spatial, rtol=2e-4, atol=2e-5,
             fewer_expected="every VALID window's uneven output rows stay where they are computed (ranged), read by "
                            "the next window with a halo and by the gradients in place; jax.jit moves more rows"),
    # (AdamW's first step moves a parameter by about lr = 1e-3 times the sign of its gradient, which rounding decides
    # where the gradient is near 0: compared within lr)
    Workload("Llama step (GQA, Megatron)", "own", "2-D", _language_model(experts.llama, "Megatron"), rtol=1e-4,
             atol=1e-3),
    Workload("Llama step (GQA, Megatron + sequence)", "own", "2-D",
             _language_model(experts.llama, "Megatron", tokens=P(DATA, MODEL)), rtol=1e-4, atol=1e-3),
    Workload("top-2 MoE step (expert parallel)", "own", "2-D",
             _language_model(experts.mixture_of_experts, "expert parallel"), rtol=1e-4, atol=1e-5,
             fewer_expected=TOKENS_TO_EXPERTS),
    Workload("top-2 MoE step, sorted dispatch (expert parallel)", "own", "2-D",
             _language_model(experts.mixture_of_experts, "expert parallel", f=_sorted_moe_step), rtol=1e-4,
             atol=1e-5, fewer_expected=TOKENS_TO_EXPERTS),
    Workload("Llama decode (cache over heads)", "own", "2-D",
             _language_model(experts.kv_decode, "Megatron, cache over heads"), rtol=1e-4, atol=1e-5),
    Workload("Llama decode (cache over sequence)", "own", "2-D",
             _language_model(experts.kv_decode, "Megatron, cache over sequence"), rtol=1e-4, atol=1e-5),
]

LOOPS = [
    Workload("rnn_grad (scan)", "loop", "data", _rnn_grad, rtol=2e-4, atol=2e-5,
             fewer_expected="the weight gradients' sums stay partial through the backward scan: one all-reduce "
                            "after it, where jax.jit all-reduces on every step"),
    Workload("gru_grad (scan)", "loop", "2-D", _gru_grad_2d, rtol=2e-4, atol=2e-5,
             fewer_expected="the gate weights' gradient sums stay partial through the backward scan"),
    Workload("gradient accumulation (scan)", "loop", "data", _accumulated_conv, rtol=2e-4, atol=2e-5,
             fewer_expected="the kernel gradient's sum stays partial through the microbatches: one all-reduce after "
                            "them, where jax.jit all-reduces every microbatch's gradient"),
    Workload("embedding gradient (scan)", "loop", "data", _embedding_sequence, rtol=2e-4, atol=2e-5,
             fewer_expected="each step's scatter-add of the batch's rows stays a partial sum through the loop: one "
                            "all-reduce of the table's gradient after it, where jax.jit all-reduces every step"),
    Workload("mlp fori_loop training", "loop", "data", _mlp("data", models.fori_training_loop, batch=128),
             rtol=2e-4, atol=2e-5),
    Workload("mlp fori_loop training", "loop", "2-D", _mlp("2-D", models.fori_training_loop, batch=128),
             rtol=2e-4, atol=2e-5),
    Workload("kv-cache decode (fori_loop)", "loop", "sequence", _kv_decode, rtol=1e-4, atol=1e-5),
]


def select(rows: list[Workload], *, quick: bool, only: str | None) -> list[Workload]:
    """The rows a run measures: the quick subset with ``quick``; with ``only``, those whose name, kind or
    parallelism contains it (case-insensitive), as ``name/parallel`` also matches (``mlp_train_step/2-D``)."""
    if quick:
        rows = [w for w in rows if w.quick]
    if only:
        needle = only.lower()
        rows = [w for w in rows if any(needle in text.lower() for text in
                                       (w.name, w.kind, w.parallel, f"{w.name}/{w.parallel}"))]
    return rows
