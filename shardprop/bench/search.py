"""The layout search against the layouts an expert would write (``shardprop bench --search``).

For each model and mesh, every expert layout (data parallel, Megatron, FSDP, FSDP+TP; sequence sharding for the
transformer) is compiled by shardprop and measured — bytes moved per device read from the compiled HLO, memory per
device from ``compiled.memory_analysis()`` (arguments + outputs + temporaries - aliased) — and so is the layout
``sp.AUTO`` chooses, without a limit and with one below data parallel's footprint. The search's time is set beside
the time XLA takes to compile the chosen program. Every program's result is compared with the unsharded function's.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from ..backends import parse_hlo
from ..core.transfers import total_moved
from ..splitting.cost import price
from . import models

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


@dataclass
class Measured:
    layout: str
    bytes: float
    memory: int
    fits: bool = True
    equal: bool = True
    compile_seconds: float = 0.0
    search_seconds: float | None = None
    check_seconds: float = 0.0  # of the search's time: compiling plans to check the memory limit
    specs: str = ""
    price: float = 0.0  # the cost model's: bytes moved plus the work each device does, in bytes' worth
    certificate: str = ""  # the search's: "optimal", or how far from the bound


@dataclass
class Result:
    model: str
    mesh: str
    limit: int | None
    experts: list[Measured] = field(default_factory=list)
    searched: Measured | None = None
    error: str | None = None


def compiled_footprint(compiled) -> int:
    """Bytes per device a compiled program holds: arguments + outputs + temporaries - aliased
    (``compiled.memory_analysis()``)."""
    m = compiled.memory_analysis()
    return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes)


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


def transformer(two_d: bool, d_model: int = 256, d_ff: int = 1024, batch: int = 8, seq: int = 64) -> Model:
    from ..search import AUTO
    from .workloads import block_specs

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


def llama(batch: int = 8, seq: int = 32) -> Model:
    """The Llama-style AdamW step (``models.llama_train_step``: d 64, 2 layers, 8 query heads on 2 KV heads) on the
    4x2 mesh; the moments are left ``None`` for the search (they take their parameter's layout)."""
    from ..search import AUTO

    params = models.init_llama()
    zeros = jax.tree_util.tree_map(np.zeros_like, params)
    rng = np.random.default_rng(5)
    tokens = rng.integers(0, 128, size=(batch, seq)).astype(np.int32)
    targets = rng.integers(0, 128, size=(batch, seq)).astype(np.int32)
    col, row = P(None, MODEL), P(MODEL, None)  # Megatron: q/k/v and the MLP's up projections by columns, out by rows
    megatron_layer = {"attn_norm": P(), "wq": col, "wk": col, "wv": col, "wo": row, "mlp_norm": P(),
                      "w_gate": col, "w_up": col, "w_down": row}

    def layout(layer, embed, head):
        return {"embed": embed, "layers": [dict(layer) for _ in params["layers"]], "final_norm": P(), "lm_head": head}

    two_d = {P(None, MODEL): P(DATA, MODEL), P(MODEL, None): P(MODEL, DATA)}
    experts = {"data parallel": layout({k: P() for k in megatron_layer}, P(), P()),
               "FSDP": layout({k: P(DATA) if k.startswith("w") else P() for k in megatron_layer}, P(DATA), P(DATA)),
               "Megatron": layout(megatron_layer, P(None, MODEL), col),
               "FSDP+TP": layout({k: two_d.get(s, s) for k, s in megatron_layer.items()}, P(DATA, MODEL),
                                 P(DATA, MODEL))}
    return Model(f"Llama-style AdamW step (d 64, 2 layers, 8 heads on 2 KV heads, batch {batch}x{seq})",
                 ((4, 2), (DATA, MODEL)), models.llama_train_step, (params, zeros, zeros, tokens, targets),
                 (AUTO, None, None, P(DATA), P(DATA)),
                 {name: (specs, specs, specs, P(DATA), P(DATA)) for name, specs in experts.items()})


MODELS = (lambda: mlp(False), lambda: mlp(True), lambda: transformer(False), lambda: transformer(True),
          lambda: flax_adam(False), lambda: flax_adam(True), llama)


# adam's first step moves every parameter by about lr * sign(gradient): where a gradient is near 0 its sign, and so a
# step of up to lr = 1e-3, follows rounding; every layout (data parallel too) is within 1e-4 of the unsharded step
RTOL, ATOL = 2e-4, 1e-4


def _equal(got, want) -> bool:
    return all(np.allclose(np.asarray(a), np.asarray(b), rtol=RTOL, atol=ATOL)
               for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True))


# the searched layout's timings are the median of this many runs, each a fresh search and a fresh XLA compile,
# interleaved (the machines are noisy)
TIMING_RUNS = 3


def measure_layout(model: Model, mesh, in_specs, name: str, reference, memory_limit=None, runs: int = 1) -> Measured:
    """Compile ``model`` with ``in_specs`` under shardprop; its bytes (HLO), memory, equality with ``reference``; the
    search's and XLA's compile times, the medians of ``runs`` fresh ones."""
    import shardprop as sp

    searches, checks, compiles, chosen = [], [], [], set()
    for _ in range(runs):
        fs = sp.autoshard(model.f, mesh=mesh, in_specs=in_specs, memory_limit=memory_limit)
        program = fs.trace(*model.args)
        search = program.search
        if search is not None:
            searches.append(search.seconds)
            checks.append(search.compile_seconds)
            chosen.add(search.chosen.specs)
        started = time.perf_counter()
        compiled = program.lower(*model.args).compile()
        compiles.append(time.perf_counter() - started)
    assert len(chosen) <= 1, f"the search chose differently on two runs: {chosen}"
    moved = total_moved(parse_hlo(compiled.as_text(), program.mesh))
    return Measured(name, moved, compiled_footprint(compiled), True, _equal(fs(*model.args), reference),
                    statistics.median(compiles), statistics.median(searches) if searches else None,
                    statistics.median(checks) if checks else 0.0, "" if search is None else str(search),
                    price(program.plan), "" if search is None else search.certificate)


def run(models=MODELS, say=print) -> list[Result]:
    """Every model's experts and searched layouts, without a limit and with one below data parallel's footprint:
    60% of it, or 5% above the leanest expert's where that is more (the batch's own memory may not shrink)."""
    import shardprop as sp

    results = []
    for build in models:
        model = build()
        mesh = sp.make_mesh(*model.mesh)
        reference = jax.jit(model.f)(*model.args)
        experts = [measure_layout(model, mesh, specs, name, reference) for name, specs in model.experts.items()]
        dp = next(e for e in experts if e.layout == "data parallel")
        leanest = min(e.memory for e in experts)
        for limit in (None, max(int(0.6 * dp.memory), int(1.05 * leanest))):
            result = Result(model.name, "x".join(map(str, model.mesh[0])), limit,
                            [Measured(**{**asdict(e), "fits": limit is None or e.memory <= limit}) for e in experts])
            try:
                result.searched = measure_layout(model, mesh, model.auto_specs, "sp.AUTO", reference, limit,
                                                 runs=TIMING_RUNS)
                result.searched.fits = limit is None or result.searched.memory <= limit
            except sp.MemoryLimitError as err:
                result.error = str(err)
            say(f"{model.name} on {result.mesh}, limit {limit}: "
                f"{result.searched.bytes if result.searched else result.error}")
            results.append(result)
    return results


@dataclass
class Scaled:
    """The search on a stack of transformer blocks: its size, the search's time and XLA's compile of the choice."""

    blocks: int
    parameters: int
    nodes: int
    search_seconds: float
    compile_seconds: float
    moved: float
    equal: bool
    certificate: str = ""


def stack_step(params, x, lr=0.1):
    """A training step of a stack of transformer blocks (one dict of parameters per block, in a list)."""
    def loss(ps):
        h = x
        for p in ps:
            h = models.transformer_block(p, h)
        return jnp.mean(h ** 2)

    value, grads = jax.value_and_grad(loss)(params)
    return jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads), value


# the stacks the scaling rows search (blocks of d 128, ff 512 on the 4x2 mesh)
STACKS = (1, 4, 8, 24)


def scaling(stacks=STACKS, say=print) -> list[Scaled]:
    """``sp.AUTO`` on stacks of ``stacks`` transformer blocks: how the search's time grows with the model, beside
    XLA's compile of the chosen program (one run each: the largest take tens of seconds)."""
    import shardprop as sp

    from ..search import AUTO

    mesh = sp.make_mesh((4, 2), (DATA, MODEL))
    x = np.random.default_rng(2).normal(size=(8, 32, 128)).astype(np.float32)
    rows = []
    for blocks in stacks:
        params = [models.init_block(128, 512, seed=k) for k in range(blocks)]
        fs = sp.autoshard(stack_step, mesh=mesh, in_specs=(AUTO, P(DATA)))
        program = fs.trace(params, x)
        started = time.perf_counter()
        compiled = program.lower(params, x).compile()
        compile_seconds = time.perf_counter() - started
        row = Scaled(blocks, len(jax.tree_util.tree_leaves(params)), len(program.plan.graph.nodes),
                     program.search.seconds, compile_seconds, total_moved(parse_hlo(compiled.as_text(), mesh)),
                     _equal(fs(params, x), jax.jit(stack_step)(params, x)), program.search.certificate)
        say(f"stack of {blocks} blocks: search {row.search_seconds:.2f} s, XLA compile {compile_seconds:.2f} s")
        rows.append(row)
    return rows


def _seconds(searched: Measured | None) -> str:
    if searched is None:
        return "-"
    checks = f" ({searched.check_seconds:.2f} compiling)" if searched.check_seconds else ""
    return f"{searched.search_seconds:.2f}{checks}"


def _mb(n: float) -> str:
    return f"{n / 1e6:.2f} MB"


def markdown(results: list[Result], command: str, scaled: list[Scaled] = ()) -> str:
    """The tables ``docs/search.md`` holds."""
    lines = ["# The layout search against the experts' layouts", "",
             f"Generated by `{command}`; do not edit. Per device: *moved* is the bytes the compiled HLO's collectives "
             "send, *memory* is `compiled.memory_analysis()`'s arguments + outputs + temporaries - aliased. The "
             "limit is `memory_limit=`: none, then below data parallel's memory (60% of it, or 5% above the "
             "leanest expert's where that is more); an expert layout over the limit is struck through. *price* is "
             "what `sp.AUTO` minimises, the cost model's bytes moved plus the work each device does in bytes' worth "
             "(`shardprop.splitting.cost.price`); *cheapest expert* is the expert layout of least price among those "
             "that fit, *certificate* what the solver proved of the choice (optimal within the cost model, or its "
             "gap to the bound). Every program's "
             "result is compared with the unsharded function's (rtol 2e-4, atol 1e-4: adam's first step moves a "
             "parameter by about lr = 1e-3 times the sign of its gradient, which rounding decides where the "
             "gradient is near 0; every layout, data parallel too, is within 1e-4 of the unsharded step). *search s* "
             "is the search's own time (`prog.search.seconds`, the median of three fresh searches: trace and "
             "lowering not included; the chosen plan, "
             "which `compile_program` builds either way, is) and, under a limit, the part of it spent compiling "
             "the chosen plan to check its memory; *XLA compile s* is `prog.lower(...).compile()` of the chosen "
             "program (the median of three, each after its search).", "",
             "| model | mesh | limit | cheapest expert (fits) | its bytes / memory / price | sp.AUTO bytes / memory "
             "/ price | certificate | search s | XLA compile s | all equal |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        fitting = [e for e in r.experts if e.fits]
        best = min(fitting, key=lambda e: e.price) if fitting else None
        s = r.searched
        equal = all(e.equal for e in r.experts) and (s is None or s.equal)
        lines.append(
            f"| {r.model} | {r.mesh} | {'none' if r.limit is None else _mb(r.limit)} | "
            f"{best.layout if best else '(none fits)'} | "
            f"{f'{_mb(best.bytes)} / {_mb(best.memory)} / {_mb(best.price)}' if best else '-'} | "
            f"{f'{_mb(s.bytes)} / {_mb(s.memory)} / {_mb(s.price)}' if s else r.error} | "
            f"{s.certificate if s else '-'} | {_seconds(s)} | {f'{s.compile_seconds:.2f}' if s else '-'} | "
            f"{'yes' if equal else 'NO'} |")
    if scaled:
        lines += ["", "## A deeper model", "",
                  "`sp.AUTO` on training steps of stacks of transformer blocks (d 128, ff 512, batch 8x32 over `data`) "
                  "on the 4x2 mesh, every parameter searched: one solve over every value's layout (nodes alike share "
                  "their strategies, built once). "
                  "One run each (*search s* is `prog.search.seconds`, *XLA compile s* `prog.lower(...).compile()` of "
                  "the chosen program); *equal*: the result equals the unsharded step's.", "",
                  "| blocks | parameters | graph nodes | search s | XLA compile s | bytes moved | certificate "
                  "| equal |",
                  "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r.blocks} | {r.parameters} | {r.nodes:,} | {r.search_seconds:.2f} | {r.compile_seconds:.2f} | "
                  f"{_mb(r.moved)} | {r.certificate} | {'yes' if r.equal else 'NO'} |" for r in scaled]
    lines += ["", "## Every layout", ""]
    for r in results:
        lines += [f"### {r.model}, mesh {r.mesh}, limit {'none' if r.limit is None else _mb(r.limit)}", "",
                  "| layout | bytes moved | memory | price | fits |", "|---|---|---|---|---|"]
        for e in r.experts + ([r.searched] if r.searched else []):
            name = e.layout if e.fits else f"~~{e.layout}~~"
            lines.append(f"| {name} | {_mb(e.bytes)} | {_mb(e.memory)} | {_mb(e.price)} | "
                         f"{'yes' if e.fits else 'no'} |")
        if r.searched:
            lines += ["", "```", r.searched.specs, "```"]
        lines.append("")
    return "\n".join(lines)
