"""The layout search against the layouts an expert would write (``shardprop bench --search``).

For each model and mesh, every expert layout (data parallel, Megatron, FSDP, FSDP+TP; sequence sharding for the
transformer) is compiled by shardprop and measured — bytes moved per device read from the compiled HLO, memory per
device from ``compiled.memory_analysis()`` (arguments + outputs + temporaries - aliased) — and so is the layout
``sp.AUTO`` chooses, without a limit and with one below data parallel's footprint. The search's time is set beside
the time XLA takes to compile the chosen program. Every program's result is compared with the unsharded function's.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import asdict, dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from ..backends import parse_hlo
from ..core.transfers import total_moved
from ..splitting.cost import price
from . import models
from .experts import DATA, MODEL, MODELS, Model


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
    cold_seconds: float | None = None  # the first search, every cache of the process cleared before it
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
    for run in range(runs):
        if run == 0 and runs > 1:
            forget_caches()  # the first search as a new process makes it (the planner's moves not yet priced)
        fs = sp.autoshard(model.f, mesh=mesh, in_specs=in_specs, memory_limit=memory_limit)
        program = fs.trace(*model.args)
        search = program.search
        if search is not None:
            searches.append(search.seconds)
            checks.append(search.compile_seconds)
            chosen.add(search.chosen.specs)
        # under a limit the program runs the executable its memory check compiled: XLA's compile timed afresh
        jax.clear_caches()
        started = time.perf_counter()
        compiled = program.lower(*model.args).compile()
        compiles.append(time.perf_counter() - started)
    assert len(chosen) <= 1, f"the search chose differently on two runs: {chosen}"
    moved = total_moved(parse_hlo(compiled.as_text(), program.mesh))
    return Measured(name, moved, compiled_footprint(compiled), True, _equal(fs(*model.args), reference),
                    statistics.median(compiles), statistics.median(searches) if searches else None,
                    statistics.median(checks) if checks else 0.0, searches[0] if len(searches) > 1 else None,
                    "" if search is None else str(search), price(program.plan),
                    "" if search is None else search.certificate)


def forget_caches() -> None:
    """Clear every cache of shardprop's modules (``functools`` caches: the move planner's, the rules'...) and JAX's:
    what a search in a new process starts from."""
    for name, module in list(sys.modules.items()):
        if name == "shardprop" or name.startswith("shardprop."):
            for value in list(vars(module).values()):
                if callable(getattr(value, "cache_clear", None)):
                    value.cache_clear()
    jax.clear_caches()


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
    search_seconds: float  # the median of ``TIMING_RUNS`` searches, as the models' rows
    compile_seconds: float
    moved: float
    equal: bool
    certificate: str = ""
    cold_seconds: float | None = None  # the first, every cache of the process cleared before it


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
    XLA's compile of the chosen program (each the median of ``TIMING_RUNS``, the first search after every cache of
    the process was cleared, as the models' rows)."""
    import shardprop as sp

    from ..search import AUTO

    mesh = sp.make_mesh((4, 2), (DATA, MODEL))
    x = np.random.default_rng(2).normal(size=(8, 32, 128)).astype(np.float32)
    rows = []
    for blocks in stacks:
        params = [models.init_block(128, 512, seed=k) for k in range(blocks)]
        searches, compiles = [], []
        for run in range(TIMING_RUNS):
            if run == 0:
                forget_caches()
            fs = sp.autoshard(stack_step, mesh=mesh, in_specs=(AUTO, P(DATA)))
            program = fs.trace(params, x)
            searches.append(program.search.seconds)
            jax.clear_caches()
            started = time.perf_counter()
            compiled = program.lower(params, x).compile()
            compiles.append(time.perf_counter() - started)
        row = Scaled(blocks, len(jax.tree_util.tree_leaves(params)), len(program.plan.graph.nodes),
                     statistics.median(searches), statistics.median(compiles),
                     total_moved(parse_hlo(compiled.as_text(), mesh)),
                     _equal(fs(params, x), jax.jit(stack_step)(params, x)), program.search.certificate, searches[0])
        say(f"stack of {blocks} blocks: search {row.search_seconds:.2f} s, XLA compile {row.compile_seconds:.2f} s")
        rows.append(row)
    return rows


def _seconds(searched: Measured | None) -> str:
    if searched is None:
        return "-"
    checks = f" ({searched.check_seconds:.2f} compiling)" if searched.check_seconds else ""
    cold = f"; cold {searched.cold_seconds:.2f}" if searched.cold_seconds is not None else ""
    return f"{searched.search_seconds:.2f}{checks}{cold}"


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
             "is the search's own time (`prog.search.seconds`, the median of three fresh searches in one process: "
             "trace and lowering not included; the chosen plan, "
             "which `compile_program` builds either way, is) and, under a limit, the part of it spent compiling "
             "the chosen plan to check its memory — the executable the program's first call then runs (it compiles "
             "nothing more); *cold* is the first of the three, every cache of the process cleared before it "
             "(shardprop's and JAX's): the search a new process makes, its move planner pricing every move afresh; "
             "*XLA compile s* is `prog.lower(...).compile()` of the chosen program, compiled afresh "
             "(the median of three, each after its search).", "",
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
                  "their strategies, built once; the core left after shrinking is bounded by message passing and "
                  "solved on the strategies the bound leaves: design.md, *Solve*). "
                  "*search s* is `prog.search.seconds`, *XLA compile s* `prog.lower(...).compile()` of the chosen "
                  "program, each the median of three as above (*cold*: the first search, every cache of the process "
                  "cleared before it); *equal*: the result equals the unsharded step's.", "",
                  "| blocks | parameters | graph nodes | search s | XLA compile s | bytes moved | certificate "
                  "| equal |",
                  "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r.blocks} | {r.parameters} | {r.nodes:,} | {r.search_seconds:.2f}; cold {r.cold_seconds:.2f} | "
                  f"{r.compile_seconds:.2f} | "
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
