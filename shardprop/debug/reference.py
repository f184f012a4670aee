"""The unsharded reference: ``compare()`` and ``first_divergence()``.

The oracle is the traced graph evaluated unsharded on one device, each node's own JAX primitive bound on whole
arrays (what ``jax.core.eval_jaxpr`` does with the traced program; one ``jax.jit`` per stage's group of nodes so
a 10^4-node program is not dispatched op by op). No shardprop rule, plan or per-block piece takes part, so a bug
in any of them shows up as a difference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from rich import box
from rich.table import Table

from ..expr import jax_adapter as jx
from ..expr.graph import CONSTANT, PARAMETER, value_name
from ..propagation.sharding import is_refinement, layout_to_spec
from ..splitting import Plan, Stage
from ..splitting.cost import gathered_axes
from .findings import Where, as_numpy


@dataclass(frozen=True)
class Tolerance:
    """``rtol``/``atol`` as given; ``None`` picks per dtype: ``rtol`` 100 ulps (1.2e-5 for f32), ``atol``
    ``rtol`` times the largest magnitude of the reference value (sums finished by a collective add in another
    order, so their error scales with the values summed, not with each element)."""

    rtol: float | None = None
    atol: float | None = None

    def for_value(self, ref: np.ndarray) -> tuple[float, float]:
        if ref.dtype.kind not in "fc":
            return 0.0, 0.0
        rtol = self.rtol if self.rtol is not None else 100 * float(np.finfo(ref.dtype).eps)
        if self.atol is not None:
            return rtol, self.atol
        finite = np.abs(ref[np.isfinite(ref)])
        return rtol, rtol * float(finite.max(initial=0.0))

    def __str__(self) -> str:
        rtol = "100 ulps" if self.rtol is None else f"{self.rtol:g}"
        atol = "rtol × max|reference|" if self.atol is None else f"{self.atol:g}"
        return f"rtol {rtol}, atol {atol}"


@dataclass(frozen=True)
class NodeError:
    """One value against the reference: max abs and max relative error, and whether it agrees."""

    where: Where
    max_abs: float
    max_rel: float
    agrees: bool

    def to_dict(self) -> dict[str, Any]:
        return {**self.where.to_dict(), "max_abs": self.max_abs, "max_rel": self.max_rel, "agrees": self.agrees}


def errors(sharded: np.ndarray, ref: np.ndarray, tolerance: Tolerance) -> tuple[float, float, bool]:
    """``(max abs, max relative, agrees)`` of ``sharded`` against ``ref`` (NaN agrees with NaN, an infinity
    with the same infinity)."""
    if sharded.shape != ref.shape:
        return float("inf"), float("inf"), False
    if ref.dtype.kind not in "fc":
        diff = np.abs(sharded.astype(np.float64) - ref.astype(np.float64)) if ref.dtype.kind != "b" else \
            (sharded != ref).astype(np.float64)
        worst = float(diff.max(initial=0.0))
        return worst, worst / max(float(np.abs(ref.astype(np.float64)).max(initial=0.0)), 1.0), worst == 0
    rtol, atol = tolerance.for_value(ref)
    agrees = bool(np.allclose(sharded, ref, rtol=rtol, atol=atol, equal_nan=True))
    both_finite = np.isfinite(sharded) & np.isfinite(ref)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        diff = np.abs(sharded.astype(np.complex128 if ref.dtype.kind == "c" else np.float64) - ref)[both_finite]
        scale = np.abs(ref)[both_finite].astype(np.float64)
        rel = diff / np.maximum(scale, np.finfo(np.float64).tiny)
    mismatch = ~(both_finite | (np.isnan(sharded) & np.isnan(ref)) | (sharded == ref))
    if mismatch.any():  # a NaN or infinity on one side only
        return float("inf"), float("inf"), agrees
    return float(diff.max(initial=0.0)), float(rel.max(initial=0.0)), agrees


class Reference:
    """The unsharded values of the program's nodes, evaluated stage group by stage group on one device; each
    value is dropped once the stages that read it have been evaluated."""

    def __init__(self, plan: Plan, args: list):
        self.plan = plan
        device = jax.devices()[0]
        self.env = {v: jax.device_put(x, device) for v, x in zip(plan.graph.inputs, args, strict=True)}
        self._last_read = {}
        for stage in plan.stages:
            for i in stage.inputs:
                self._last_read[i.value] = stage.id

    def evaluate(self, stage: Stage) -> dict[int, jax.Array]:
        """Every value ``stage`` computes, unsharded."""
        graph = self.plan.graph
        inputs = tuple(dict.fromkeys(i.value for i in stage.inputs))
        nodes = [graph.nodes[n] for n in stage.nodes]
        produced = tuple(v for node in nodes for v in node.outputs)

        def run(*values):
            env = dict(zip(inputs, values, strict=True))
            for node in nodes:
                if node.op == CONSTANT:
                    env[node.output] = np.asarray(node.params["value"])
                    continue
                env.update(zip(node.outputs, jx.bind(node.primitive, [env[u] for u in node.operands],
                                                     dict(node.params)), strict=True))
            return [env[v] for v in produced]

        results = dict(zip(produced, jax.jit(run)(*(self.env[v] for v in inputs)), strict=True))
        self.env.update((v, x) for v, x in results.items() if self._last_read.get(v, -1) > stage.id)
        for v in inputs:
            if self._last_read.get(v, -1) <= stage.id and v in self.env:
                del self.env[v]
        return results


@dataclass(frozen=True)
class ErrorTable:
    """``dbg.compare()``: per value computed so far, its error against the unsharded reference. A rich
    renderable; ``str()`` is the same table as plain text."""

    rows: tuple[NodeError, ...]
    tolerance: Tolerance
    stages: int

    @property
    def agree(self) -> bool:
        return all(r.agrees for r in self.rows)

    @property
    def disagreeing(self) -> tuple[NodeError, ...]:
        return tuple(r for r in self.rows if not r.agrees)

    def for_stage(self, k: int) -> ErrorTable:
        """The rows of stage ``k`` only."""
        return ErrorTable(tuple(r for r in self.rows if r.where.stage == k), self.tolerance, 1)

    def summary(self) -> str:
        bad = self.disagreeing
        worst = max((r.max_abs for r in self.rows), default=0.0)
        if not bad:
            return f"all {len(self.rows)} values agree with the unsharded reference (max abs error {worst:g}; " \
                   f"{self.tolerance})"
        return f"{len(bad)} of {len(self.rows)} values differ from the unsharded reference (first: " \
               f"{bad[0].where.name}, `{bad[0].where.op}`; {self.tolerance})"

    def __rich__(self) -> Table:
        table = Table(title=f"sharded vs unsharded, {self.stages} stage(s)", caption=self.summary(),
                      box=box.SIMPLE_HEAVY)
        for name in ("stage", "value", "op", "max abs err", "max rel err", ""):
            table.add_column(name, justify="right" if "err" in name or name == "stage" else "left")
        for r in self.rows:
            w = r.where
            table.add_row(str(w.stage), w.typed, w.op, f"{r.max_abs:.3g}", f"{r.max_rel:.3g}",
                          "ok" if r.agrees else "DIFFERS")
        return table

    def __str__(self) -> str:
        from ..inspect.pictures import as_text

        return as_text(self, width=140)

    def to_dict(self) -> dict[str, Any]:
        return {"agree": self.agree, "tolerance": str(self.tolerance), "stages": self.stages,
                "values": [r.to_dict() for r in self.rows]}


@dataclass(frozen=True)
class Divergence:
    """The first node whose sharded value differs while its operands agree: the fault is its rule or its
    lowering. Its value and node, its operands' shardings, the plan's decision and the blocks that differ."""

    error: NodeError
    operands: tuple[str, ...]
    decision: tuple[str, ...]
    blocks: tuple[str, ...]

    @property
    def where(self) -> Where:
        return self.error.where

    def __str__(self) -> str:
        e = self.error
        lines = [f"first divergence: {e.where}",
                 f"  max abs error {e.max_abs:.3g}, max rel error {e.max_rel:.3g}; its operands agree",
                 "  operands:", *([f"    {o}" for o in self.operands] or ["    (none)"]),
                 "  the plan:", *(f"    {d}" for d in self.decision),
                 f"  blocks that differ ({len(self.blocks)}):", *(f"    {b}" for b in self.blocks)]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {**self.error.to_dict(), "operands": list(self.operands), "decision": list(self.decision),
                "blocks": list(self.blocks)}


class Comparer:
    """The comparison of a session's stages with the reference, made once per stage as stages run (so comparing
    after every step costs one reference evaluation per stage in all). Values are compared in program order;
    the reference value is kept only for values that differ (to show their blocks)."""

    def __init__(self, session, tolerance: Tolerance):
        self.session, self.tolerance = session, tolerance
        self.reference = Reference(session.plan, session.args)
        self.rows: list[NodeError] = []
        self.differing: dict[int, np.ndarray] = {}
        self.stages = 0

    def advance(self) -> None:
        """Compare the stages run since the last call."""
        session, plan = self.session, self.session.plan
        graph = plan.graph
        for stage in session.stages_run[self.stages:]:
            refs = self.reference.evaluate(stage)
            values = session.stage_values(stage)
            for n in stage.nodes:
                node = graph.nodes[n]
                if node.op in (CONSTANT, PARAMETER):
                    continue  # the same on both sides
                for v in node.outputs:
                    ref, got = as_numpy(refs[v]), as_numpy(values[v])
                    max_abs, max_rel, agrees = errors(got, ref, self.tolerance)
                    self.rows.append(NodeError(Where.of(plan, v), max_abs, max_rel, agrees))
                    if not agrees:
                        self.differing[v] = ref
            self.stages += 1

    def table(self) -> ErrorTable:
        self.advance()
        return ErrorTable(tuple(self.rows), self.tolerance, self.stages)

    def first_divergence(self) -> Divergence | None:
        self.advance()
        session, graph = self.session, self.session.plan.graph
        first = next((r for r in self.rows if not r.agrees), None)
        if first is None:
            return None
        v = first.where.value
        node = graph.nodes[graph.producer[v]]
        # Program order is a topological order: every operand was compared before this value, and agreed.
        return Divergence(first, tuple(_operands(session.plan, node)), tuple(decision(session.plan, node)),
                          tuple(_differing_blocks(session, v, session.value(v), self.differing[v], self.tolerance)))


def _operands(plan: Plan, node) -> list[str]:
    from ..inspect.listing import typed_name

    return [f"{typed_name(plan, u, plan.layout(u))}  {layout_to_spec(plan.layout(u))}, consumed as "
            f"{layout_to_spec(need)}" for u, need in plan.edges(node)]


def decision(plan: Plan, node) -> list[str]:
    """What the plan decided for ``node``: how each operand reaches it and what finishes it."""
    stage = plan.stage_of(node.id)
    lines = []
    for u, need in plan.edges(node):
        have, name = plan.layout(u), value_name(u)
        here = plan.stage_of(plan.graph.producer[u]) == stage
        gathered = () if here else gathered_axes(have, need)
        if have == need:
            lines.append(f"{name}: used as held, {layout_to_spec(need)}")
        elif gathered:
            lines.append(f"{name}: gathered over {'*'.join(gathered)} before stage {stage} "
                         f"({layout_to_spec(have)} -> {layout_to_spec(need)})")
        elif all(is_refinement(h, w) for h, w in zip(have, need, strict=True)):
            lines.append(f"{name}: local slice {layout_to_spec(have)} -> {layout_to_spec(need)}, no communication")
        else:
            lines.append(f"{name}: consumed as {layout_to_spec(need)} from {layout_to_spec(have)}")
    collective = plan.collective(node.id)
    if collective is not None:
        lines.append(f"finished by {collective} inside stage {stage}")
    else:
        lines.append(f"computed on each device's blocks (rule {plan.sharded.rules[node.id]}), no collective")
    return lines


def _differing_blocks(session, v: int, array, ref: np.ndarray, tolerance: Tolerance) -> list[str]:
    tolerance = Tolerance(*tolerance.for_value(ref))  # the whole value's scale, for every block
    out = []
    for block in session.device_blocks(v, array):
        want, got = ref[block.slices], as_numpy(block.data)
        if got.shape != want.shape:
            out.append(f"{block.where()}: holds shape {got.shape}, the slice has {want.shape}")
            continue
        max_abs, _, agrees = errors(got, want, tolerance)
        if not agrees:
            out.append(f"{block.where()}: max abs error {max_abs:.3g}")
    return out
