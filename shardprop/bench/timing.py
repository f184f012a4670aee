"""Clocks: interleaved runtime ratios, the per-call overhead of a cached program, and how the passes scale.

These machines are small and shared, so every comparison is *interleaved*: rounds alternate between the two
callables (and which one goes first), both see the same noise, and the result is the distribution of per-round
ratios — its median and its spread — rather than two absolute times.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """(25th percentile, median, 75th percentile)."""
    q1, q2, q3 = np.percentile(np.asarray(values, dtype=np.float64), (25, 50, 75))
    return float(q1), float(q2), float(q3)


@dataclass(frozen=True)
class Runtime:
    """Per-round ratios ours / theirs: median, interquartile range and extremes; each side's median seconds per
    call; ``rounds`` rounds of ``calls`` calls each."""

    ratio: float
    ratio_q1: float
    ratio_q3: float
    ratio_min: float
    ratio_max: float
    ours_seconds: float
    theirs_seconds: float
    rounds: int
    calls: int

    def to_dict(self) -> dict:
        return asdict(self)


def _per_call(f, args, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        jax.block_until_ready(f(*args))  # block on each: a call's time includes its dispatch and its run
    return (time.perf_counter() - start) / calls


def interleaved(ours, theirs, args, rounds: int, round_seconds: float = 0.02, warmup: int = 3) -> Runtime:
    """Time ``ours(*args)`` against ``theirs(*args)`` in ``rounds`` alternating rounds (both already compiled by
    ``warmup`` calls each); a round is as many calls as fill about ``round_seconds``."""
    for f in (ours, theirs):
        for _ in range(warmup):
            jax.block_until_ready(f(*args))
    single = min(_per_call(theirs, args, 1) for _ in range(3))
    calls = max(1, min(100, math.ceil(round_seconds / max(single, 1e-6))))
    mine, yours = [], []
    for k in range(rounds):
        first, second = (ours, theirs) if k % 2 == 0 else (theirs, ours)  # neither always runs right after the other
        a, b = _per_call(first, args, calls), _per_call(second, args, calls)
        mine.append(a if first is ours else b)
        yours.append(b if first is ours else a)
    ratios = [m / y for m, y in zip(mine, yours, strict=True)]
    q1, median, q3 = quartiles(ratios)
    return Runtime(median, q1, q3, min(ratios), max(ratios), statistics.median(mine), statistics.median(yours),
                   rounds, calls)


def _median_us_per_call(cycles: dict[str, list[tuple]], rounds: int, calls: int) -> dict[str, float]:
    """Median microseconds per call of each named cycle of ``(function, args)`` calls, over ``rounds`` interleaved
    rounds (the order reversed every other round) of ``calls`` calls, each blocked on (dispatch and run)."""
    for cycle in cycles.values():
        for _ in range(10):
            for f, args in cycle:
                jax.block_until_ready(f(*args))
    per_call = {name: [] for name in cycles}
    for k in range(rounds):
        order = list(cycles.items()) if k % 2 == 0 else list(reversed(cycles.items()))
        for name, cycle in order:
            start = time.perf_counter()
            for n in range(calls):
                f, args = cycle[n % len(cycle)]
                jax.block_until_ready(f(*args))
            per_call[name].append((time.perf_counter() - start) / calls * 1e6)
    return {name: statistics.median(times) for name, times in per_call.items()}


def call_overhead(function, mesh, args, other_args, specs, rounds: int, calls: int = 100) -> list[dict]:
    """Median microseconds per call (blocking on each) of ``jax.jit`` with ``in_shardings``, a cached
    ``shardprop.Program`` and an autoshard function, over interleaved rounds of ``calls`` calls: once with
    arguments already placed (``jax.Array``), once with NumPy arrays. Each is measured twice: called with ``args``
    every time, and called alternately with ``args`` and ``other_args`` (another shape, as train and eval batches
    or a last short batch are), where ``jax.jit`` and the autoshard function each dispatch between two compiled
    programs and the ``Program`` column alternates between the two Programs traced (one is fixed to its shapes).
    One dict per kind of argument; the alternating measurement under ``"alternating"``."""
    from ..api import autoshard

    shardings = tuple(NamedSharding(mesh, s) for s in specs)
    fs = autoshard(function, mesh=mesh, in_specs=specs)
    jitted = jax.jit(function, in_shardings=shardings)
    out = []
    for kind, place in (("jax.Array", True), ("NumPy", False)):
        one, two = ((tuple(jax.device_put(x, s) for x, s in zip(a, shardings, strict=True)) if place else tuple(a))
                    for a in (args, other_args))
        programs = fs.trace(*one), fs.trace(*two)
        row = {"arguments": kind, "rounds": rounds, "calls": calls}
        for mode, pairs in (("same", ((0, one),)), ("alternating", ((0, one), (1, two)))):
            us = _median_us_per_call({"jit": [(jitted, a) for _, a in pairs],
                                      "program": [(programs[k], a) for k, a in pairs],
                                      "autoshard": [(fs, a) for _, a in pairs]}, rounds, calls)
            measured = {"jit_us": us["jit"], "program_us": us["program"], "autoshard_us": us["autoshard"],
                        "program_ratio": us["program"] / us["jit"], "autoshard_ratio": us["autoshard"] / us["jit"]}
            if mode == "same":
                row.update(measured)
            else:
                row["alternating"] = measured
        out.append(row)
    return out


def small_call_overhead(mesh, rounds: int) -> list[dict]:
    """``call_overhead`` of the Nx example at 16×8 (alternating with 8×8) on ``mesh``'s first two axes."""
    from .models import nx_example

    a = np.linspace(-1, 1, 128, dtype=np.float32).reshape(16, 8)
    spec = P(*mesh.axis_names[:2])
    return call_overhead(nx_example, mesh, (a, a + 1), (a[:8], a[:8] - 1), (spec, spec), rounds)


def first_calls(mesh, calls: int = 3) -> dict:
    """Seconds of a training loop's first ``calls`` steps (blocking on each, compiles included): an MLP training
    step (3 layers of 512, Megatron's column/row layouts, the batch over the first mesh axis) called on freshly
    initialised NumPy parameters, then on each call's own outputs — under shardprop, and under ``jax.jit`` with the
    same ``in_shardings`` (and the parameters' ``out_shardings``). A step that compiles again when fed its own
    outputs shows as a second slow call. ``{"shardprop": [s, ...], "jax.jit": [s, ...]}``."""
    from ..api import autoshard
    from .models import init_mlp, mlp_train_step

    data, model = mesh.axis_names[:2]
    layers = [{"w": P(None, model), "b": P(model)}, {"w": P(model, None), "b": P()}, {"w": P(None, model),
                                                                                       "b": P(model)}]
    specs = (layers, P(data), P(data))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 512)).astype(np.float32)
    labels = rng.integers(0, 512, size=64).astype(np.int32)
    shardings = jax.tree_util.tree_map(lambda s: NamedSharding(mesh, s), specs)
    steps = {"shardprop": autoshard(mlp_train_step, mesh=mesh, in_specs=specs),
             "jax.jit": jax.jit(mlp_train_step, in_shardings=shardings, out_shardings=(shardings[0], None))}
    seconds: dict[str, list[float]] = {}
    for name, step in steps.items():
        params, seconds[name] = init_mlp((512, 512, 512, 512)), []
        for _ in range(calls):
            start = time.perf_counter()
            params, loss = jax.block_until_ready(step(params, x, labels))
            seconds[name].append(time.perf_counter() - start)
    return seconds


# -- how the passes scale ----------------------------------------------------------------------------------------
def deep(x, w, layers):
    """``layers`` blocks of a matmul, elementwise ops, a mean over one axis and a max over the other: about 14
    graph nodes per block, every reduction over a sharded axis."""
    for _ in range(layers):
        h = jnp.tanh(x @ w + 1.0) * 0.5 - x
        x = h - jnp.mean(h, axis=1, keepdims=True)
        x = x / (jnp.max(jnp.abs(x), axis=0) + 1.0)
    return x.sum()


def passes_seconds(mesh, layers: int) -> tuple[int, float, float, float]:
    """(nodes, trace seconds, propagate seconds, split seconds) of ``deep`` with ``layers`` blocks, its input
    sharded over ``mesh``'s first two axes."""
    from ..expr import trace
    from ..propagation import propagate
    from ..splitting import split

    x = jax.ShapeDtypeStruct((64, 32), jnp.float32)
    w = jax.ShapeDtypeStruct((32, 32), jnp.float32)
    t0 = time.perf_counter()
    graph = trace(lambda x, w: deep(x, w, layers), x, w)
    t1 = time.perf_counter()
    sharded = propagate(graph, (P(*mesh.axis_names[:2]), None), mesh=mesh)
    t2 = time.perf_counter()
    split(sharded)
    t3 = time.perf_counter()
    return len(graph.nodes), t1 - t0, t2 - t1, t3 - t2


def scaling(mesh, layer_counts) -> list[dict]:
    """``passes_seconds`` at each of ``layer_counts``, one dict per size."""
    rows = []
    for layers in layer_counts:
        nodes, traced, propagated, split = passes_seconds(mesh, layers)
        rows.append({"layers": layers, "nodes": nodes, "trace_s": traced, "propagate_s": propagated,
                     "split_s": split, "total_s": traced + propagated + split})
    return rows
