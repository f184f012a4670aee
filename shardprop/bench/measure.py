"""One benchmark row: a workload run through shardprop under each strategy and through ``jax.jit``, measured.

``measure`` returns a ``Row``: whether every strategy's result equals the unsharded function's (``jax.jit``
of the function on the unplaced inputs, on one device), the collectives and bytes per device read from each
compiled HLO, each compiled program's peak memory per device (``compiled.memory_analysis()``), the time of our
passes next to XLA's compile times, and the runtime ratio of the ``"auto"`` program to ``jax.jit`` from
interleaved runs on the same placed inputs. The ``"optimal"`` program (every value's layout from the search's one
solve around the row's specs; an unannotated argument laid out as the solve finds best) is measured beside them.
"""

from __future__ import annotations

import time
import traceback
import warnings
from dataclasses import asdict, dataclass, field

import jax
import numpy as np
from jax.sharding import NamedSharding

from ..backends import parse_hlo
from ..expr import trace
from ..api import compile_program
from ..splitting.split import PlanPricer
from ..compare import lower_with_jit
from ..mesh import make_mesh
from ..program import lower
from ..propagation import Walking, propagate_with
from ..splitting import split
from ..core.transfers import total_moved
from .timing import Runtime, interleaved
from .workloads import Workload

STRATEGIES = ("gather", "collective", "auto")  # the splits of one propagated graph; "optimal" is compiled apart


@dataclass(frozen=True)
class Compiled:
    """One compiled program: its collectives (instructions in the HLO; ``runs`` counts each once per loop
    iteration), bytes moved per device, peak memory per device, the seconds XLA took to compile it, and the bytes of
    its outputs each device holds (a sharded output: its blocks; a replicated one: the whole)."""

    collectives: int
    runs: int
    bytes: float
    peak_memory: int | None
    compile_seconds: float
    kinds: tuple[str, ...]
    output_bytes: int | None = None

    @classmethod
    def of(cls, compiled, mesh, compile_seconds: float) -> Compiled:
        transfers = parse_hlo(compiled.as_text(), mesh)
        return cls(len(transfers), sum(t.repeats for t in transfers), total_moved(transfers),
                   peak_memory(compiled), compile_seconds, tuple(sorted({str(t.kind) for t in transfers})),
                   output_bytes(compiled))


def output_bytes(compiled) -> int | None:
    """Bytes of a compiled program's outputs held per device (``compiled.memory_analysis()``), or None."""
    stats = compiled.memory_analysis()
    return None if stats is None else int(stats.output_size_in_bytes)


def peak_memory(compiled) -> int | None:
    """Peak bytes per device of a compiled program: XLA's ``peak_memory_in_bytes`` where it reports one, else
    arguments + outputs + temporaries - aliased (None when the backend has no memory analysis)."""
    stats = compiled.memory_analysis()
    if stats is None:
        return None
    peak = getattr(stats, "peak_memory_in_bytes", 0)
    if peak:
        return int(peak)
    return int(stats.argument_size_in_bytes + stats.output_size_in_bytes + stats.temp_size_in_bytes
               - stats.alias_size_in_bytes)


@dataclass(frozen=True)
class Strategy:
    """One strategy's program: correct against the unsharded function, its largest error, its stages, the
    seconds of splitting and lowering, and what it compiled to."""

    correct: bool
    max_abs_error: float
    stages: int
    split_seconds: float
    lower_seconds: float
    compiled: Compiled


@dataclass
class Row:
    name: str
    kind: str
    parallel: str
    mesh: dict
    rtol: float
    atol: float
    known_gap: str | None
    fewer_expected: str | None
    nodes: int = 0
    trace_seconds: float = 0.0
    propagate_seconds: float = 0.0
    strategies: dict[str, Strategy] = field(default_factory=dict)
    jit: Compiled | None = None
    runtime: Runtime | None = None
    warnings: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def correct(self) -> bool:
        return self.error is None and all(s.correct for s in self.strategies.values())

    @property
    def auto(self) -> Strategy | None:
        return self.strategies.get("auto")

    @property
    def passes_seconds(self) -> float:
        """Our passes for the ``"auto"`` program: trace, propagate, split and lower (not XLA's compile)."""
        auto = self.auto
        extra = auto.split_seconds + auto.lower_seconds if auto else 0.0
        return self.trace_seconds + self.propagate_seconds + extra

    def to_dict(self) -> dict:
        doc = asdict(self)
        doc["correct"] = self.correct
        doc["passes_seconds"] = self.passes_seconds
        return doc


def agree(got, want, rtol: float, atol: float) -> tuple[bool, float]:
    """Whether every leaf of ``got`` equals ``want``'s within ``atol + rtol × max|want|`` (per leaf: sums
    reassociated across blocks err relative to the leaf's scale, not to each element), and the largest error."""
    got_leaves, got_tree = jax.tree_util.tree_flatten(got)
    want_leaves, want_tree = jax.tree_util.tree_flatten(want)
    if got_tree != want_tree:
        return False, float("inf")
    ok, worst = True, 0.0
    for g, w in zip(got_leaves, want_leaves, strict=True):
        g, w = np.asarray(g), np.asarray(w)
        if g.shape != w.shape or g.dtype != w.dtype:
            return False, float("inf")
        if g.size == 0:
            continue
        if not np.issubdtype(w.dtype, np.inexact):
            ok &= bool(np.array_equal(g, w))
            continue
        error = float(np.max(np.abs(g.astype(np.float64) - w.astype(np.float64))))
        worst = max(worst, error)
        ok &= bool(np.isfinite(error)) and error <= atol + rtol * float(np.max(np.abs(w.astype(np.float64))))
    return ok, worst


def _timed(fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - start


def _optimal(f, args, in_specs, mesh, want, workload: Workload) -> Strategy:
    """The ``strategy="optimal"`` program of the row (its search is its split seconds), measured as compiled."""
    program, seconds = _timed(lambda: compile_program(f, args, mesh=mesh, in_specs=in_specs, strategy="optimal"))
    compiled, compile_seconds = _timed(lambda: program.lower(*args).compile())
    ok, error = agree(program(*args), want, workload.rtol, workload.atol)
    return Strategy(ok, error, len(program.plan.stages), seconds, 0.0, Compiled.of(compiled, mesh, compile_seconds))


def measure(workload: Workload, rounds: int) -> Row:
    """The row of ``workload``: every strategy compiled, run and checked, ``jax.jit`` compiled, and ``rounds``
    interleaved rounds of the ``"auto"`` program against ``jax.jit``. An exception is recorded, not raised."""
    mesh = make_mesh(*workload.mesh_shape)
    row = Row(workload.name, workload.kind, workload.parallel, dict(mesh.shape), workload.rtol, workload.atol,
              workload.known_gap, workload.fewer_expected)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _measure(workload, mesh, rounds, row)
        seen = dict.fromkeys(f"{w.category.__name__}: {w.message}" for w in caught
                             if not issubclass(w.category, DeprecationWarning))  # libraries' own deprecations
        row.warnings = list(seen)
    except Exception as err:  # noqa: BLE001 -- a failing row is a finding to report, not the end of the run
        row.error = f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=-3)}"
    return row


def _measure(workload: Workload, mesh, rounds: int, row: Row) -> None:
    f, args, in_specs = workload.build()
    want = jax.jit(f)(*args)  # the unsharded function: unplaced inputs, one device
    graph, row.trace_seconds = _timed(trace, f, *args)
    row.nodes = len(graph.nodes)
    walking = Walking(price=PlanPricer("auto"))
    sharded, row.propagate_seconds = _timed(lambda: propagate_with(graph, in_specs, mesh=mesh, strict=False,
                                                                   conflicts="reshard", walking=walking))
    flat, tree = jax.tree_util.tree_flatten(args)
    placed = jax.tree_util.tree_unflatten(tree, [jax.device_put(x, NamedSharding(mesh, s))
                                                 for x, s in zip(flat, sharded.in_specs, strict=True)])
    programs = {}
    for strategy in STRATEGIES:
        plan, split_seconds = _timed(lambda s=strategy: split(sharded, strategy=s))
        program, lower_seconds = _timed(lower, plan, mesh)
        compiled, compile_seconds = _timed(lambda p=program: p.lower(*placed).compile())
        ok, error = agree(program(*placed), want, workload.rtol, workload.atol)
        row.strategies[strategy] = Strategy(ok, error, len(plan.stages), split_seconds, lower_seconds,
                                            Compiled.of(compiled, mesh, compile_seconds))
        programs[strategy] = program
    row.strategies["optimal"] = _optimal(f, args, in_specs, mesh, want, workload)
    compiled, compile_seconds = _timed(lambda: lower_with_jit(f, mesh, sharded.in_specs, *args).compile())
    row.jit = Compiled.of(compiled, mesh, compile_seconds)
    if rounds > 0:
        row.runtime = interleaved(programs["auto"], jax.jit(f), placed, rounds)
