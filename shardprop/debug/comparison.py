"""``compare()`` and ``first_divergence()``: every sharded value against the unsharded reference.

Two questions, two yardsticks. *Does a value agree with the unsharded function?* — its error against the
reference (``.reference``), within the tolerance for its scale. *Which node is at fault?* — a value can
differ only because what it was computed from differs (rounding carried through a gradient), so the first value
that differs is then re-computed unsharded from its *sharded* operands: if that gives another value, the node's
own rule or lowering is at fault (the planted-bug tests check exactly this); if not, the difference was carried
in, and the search goes on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from rich import box
from rich.table import Table

from ..distributed import any_process
from ..expr import jax_adapter as jx
from ..expr.graph import CONSTANT, PARAMETER, value_name
from ..core.layouts import layout_to_spec
from ..core.types import typed
from ..inspect.listing import move_equation
from ..inspect.pictures import as_text
from ..splitting import Plan
from .findings import FindingKind, Where, as_numpy, check_value
from .reference import Reference, Tolerance, bind_whole, errors, own_scale, terms


@dataclass(frozen=True)
class NodeError:
    """One value against the reference: max abs and max relative error, whether it agrees, and whether its
    own node is at fault (``fault``: re-computed unsharded from its sharded operands, it still differs)."""

    where: Where
    max_abs: float
    max_rel: float
    agrees: bool
    fault: bool = False

    @property
    def status(self) -> str:
        return "FAULT" if self.fault else ("ok" if self.agrees else "differs")

    def to_dict(self) -> dict[str, Any]:
        return {**self.where.to_dict(), "max_abs": self.max_abs, "max_rel": self.max_rel, "agrees": self.agrees,
                "fault": self.fault}


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


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

    @property
    def fault(self) -> NodeError | None:
        """The value whose own node is at fault (``first_divergence()``'s), if the comparison found one."""
        return next((r for r in self.rows if r.fault), None)

    def for_stage(self, k: int) -> ErrorTable:
        """The rows of stage ``k`` only."""
        return ErrorTable(tuple(r for r in self.rows if r.where.stage == k), self.tolerance, 1)

    def summary(self) -> str:
        bad, n = self.disagreeing, len(self.rows)
        worst = max((r.max_abs for r in self.rows), default=0.0)
        if not bad:
            every = "the value agrees" if n == 1 else f"all {n} values agree"
            return f"{every} with the unsharded reference (max abs error {worst:g}; {self.tolerance})"
        head = f"{len(bad)} of {_plural(n, 'value')} differ from the unsharded reference ({self.tolerance})"
        fault = self.fault
        if fault is not None:
            return f"{head}; the first at fault: {fault.where.name} (`{fault.where.op}`)"
        return f"{head}; no node is at fault so far: computed from its sharded operands, each gives its own " \
               "value (the differences are rounding carried through)"

    def __rich__(self) -> Table:
        table = Table(title=f"sharded vs unsharded, {_plural(self.stages, 'stage')}", caption=self.summary(),
                      box=box.SIMPLE_HEAVY)
        for name in ("stage", "value", "op", "max abs err", "max rel err", ""):
            table.add_column(name, justify="right" if "err" in name or name == "stage" else "left")
        for r in self.rows:
            w = r.where
            table.add_row(str(w.stage), w.typed, w.op, f"{r.max_abs:.3g}", f"{r.max_rel:.3g}", r.status)
        return table

    def __str__(self) -> str:
        return as_text(self, width=140)

    def to_dict(self) -> dict[str, Any]:
        return {"agree": self.agree, "tolerance": str(self.tolerance), "stages": self.stages,
                "values": [r.to_dict() for r in self.rows]}


@dataclass(frozen=True)
class Divergence:
    """The first node at fault: its value differs from the reference, and computed unsharded from its own
    sharded operands it gives another value — so its rule or its lowering is wrong. Its value and node, its
    operands' shardings, the plan's decision for it and the blocks that differ."""

    error: NodeError
    own_error: float
    operands: tuple[str, ...]
    decision: tuple[str, ...]
    blocks: tuple[str, ...]

    @property
    def where(self) -> Where:
        return self.error.where

    def __str__(self) -> str:
        e = self.error
        lines = [f"first divergence: {e.where}",
                 f"  max abs error {e.max_abs:.3g} (max rel {e.max_rel:.3g}) against the unsharded function; "
                 f"computed unsharded from its own sharded operands it differs by {self.own_error:.3g}, so the "
                 "fault is this node's (its operands agree)",
                 "  operands:", *([f"    {o}" for o in self.operands] or ["    (none)"]),
                 "  the plan:", *(f"    {d}" for d in self.decision),
                 f"  blocks that differ ({len(self.blocks)}):", *(f"    {b}" for b in self.blocks)]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {**self.error.to_dict(), "own_error": self.own_error, "operands": list(self.operands),
                "decision": list(self.decision), "blocks": list(self.blocks)}


class Comparer:
    """The comparison of a session's stages with the reference, made once per stage as stages run (comparing
    after every step costs one reference evaluation per stage in all), for one tolerance."""

    def __init__(self, session, tolerance: Tolerance):
        self.session, self.tolerance = session, tolerance
        self.reference = Reference(session.plan, session.args)
        self.rows: list[NodeError] = []
        self.row_of: dict[int, int] = {}  # value -> its row (arguments and constants have none: they agree)
        self.divergence: Divergence | None = None
        self.stages = 0

    def advance(self) -> None:
        """Compare the stages run since the last call."""
        session, plan = self.session, self.session.plan
        graph = plan.graph
        for stage in session.stages_run[self.stages:]:
            with jx.no_mesh_context():  # unsharded, on one device, whatever mesh the user has set
                refs = self.reference.evaluate(stage)
            values = session.stage_values(stage)
            computed = [v for n in stage.nodes for v in graph.nodes[n].outputs
                        if graph.nodes[n].op not in (CONSTANT, PARAMETER)]
            wholes = session.gathered({v: values[v] for v in computed})  # one gather on several processes
            compared = []  # (node, its first row, its outputs whole) for every node compared
            for n in stage.nodes:
                node = graph.nodes[n]
                if node.op in (CONSTANT, PARAMETER):
                    continue  # the same on both sides
                first, got = len(self.rows), {}
                for v in node.outputs:
                    ref, got[v] = as_numpy(refs[v]), as_numpy(wholes[v].whole)
                    self.rows.append(NodeError(Where.of(plan, v), *errors(got[v], ref, self.tolerance, own_scale(ref),
                                                                          graph.avals[v].dtype)))
                    self.row_of[v] = len(self.rows) - 1
                compared.append((node, first, got))
            # Looking for a fault gathers more values: on several processes all look, or none (one agreement per
            # stage), even if their own references were to round differently.
            differs = any_process([not all(r.agrees for r in self.rows[first:first + len(node.outputs)])
                                   for node, first, _ in compared])
            for (node, first, got), look in zip(compared, differs, strict=True):
                if look:
                    self._look_for_fault(node, values, first, got)
            self.stages += 1

    def _look_for_fault(self, node, values: dict, first: int, got: dict) -> None:
        """Is ``node`` itself at fault? Re-compute it unsharded from its sharded operands and compare (``got``:
        its outputs whole, as compared with the reference), each element within a rounding unit of the terms it is
        made of. At fault: it differs from the reference and from what it was given. Not at fault, its operands
        agreeing: it agrees — its difference is theirs, carried through (an optimizer dividing by a gradient near 0
        amplifies its rounding a thousandfold)."""
        session, plan = self.session, self.session.plan
        graph = plan.graph
        held = {u: values[u] if u in values else session.held(u) for u in node.operands
                if graph.nodes[graph.producer[u]].op != CONSTANT}
        gathered = session.gathered(held)
        if any(f.kind is FindingKind.REPLICAS_DIFFER for u in held for f in check_value(session, u, gathered[u])):
            return  # an operand's devices disagree on what it is: the difference was carried in (check() says)
        with jx.no_mesh_context():  # unsharded, on one device, whatever mesh the user has set
            operands = [self.reference.place(held[u]) if u in held else
                        np.asarray(graph.nodes[graph.producer[u]].params["value"]) for u in node.operands]
            made = bind_whole(node, operands)
            bounds = terms(node, operands, made)
        local = [as_numpy(x) for x in made]
        # (a PRNG key is compared as its key data, one axis longer than the key array: exactly)
        bounds = [b if b.shape == ref.shape else np.zeros(ref.shape) for b, ref in zip(bounds, local, strict=True)]
        own = [errors(got[v], ref, self.tolerance, bound, graph.avals[v].dtype)
               for v, ref, bound in zip(node.outputs, local, bounds, strict=True)]
        # Only an output that differs from the reference, and computed right from what it was given still differs,
        # is at fault (otherwise the difference was carried in); the processes agree on which (blocks are gathered).
        faults = any_process([not self.rows[first + k].agrees and not agrees for k, (_, _, agrees) in enumerate(own)])
        given = all(self.rows[self.row_of[u]].agrees for u in node.operands if u in self.row_of)
        carried = any_process([not (given and agrees) for _, _, agrees in own])  # True: some process objects
        for k, v in enumerate(node.outputs):
            row = self.rows[first + k]
            if not faults[k]:
                if not row.agrees and not carried[k]:
                    self.rows[first + k] = NodeError(row.where, row.max_abs, row.max_rel, True)
                continue
            row = self.rows[first + k] = _with_fault(row)
            if self.divergence is None:  # a later fault is marked in the table; the first is the divergence
                rtol, _ = self.tolerance.for_value(local[k], None, graph.avals[v].dtype)
                blocks = _differing_blocks(session, v, values[v], local[k], Tolerance(rtol, self.tolerance.atol),
                                           bounds[k])
                self.divergence = Divergence(row, own[k][0], tuple(_operands(plan, node)), tuple(decision(plan, node)),
                                             tuple(blocks))

    def table(self) -> ErrorTable:
        self.advance()
        return ErrorTable(tuple(self.rows), self.tolerance, self.stages)

    def first_divergence(self) -> Divergence | None:
        self.advance()
        return self.divergence


def _with_fault(row: NodeError) -> NodeError:
    return NodeError(row.where, row.max_abs, row.max_rel, row.agrees, fault=True)


def _operands(plan: Plan, node) -> list[str]:
    return [f"{typed(u, plan.graph.avals[u], plan.type(u))}  {layout_to_spec(plan.layout(u))}, consumed as "
            f"{layout_to_spec(need.layout)}" for u, need in plan.edges(node)]


def decision(plan: Plan, node) -> list[str]:
    """What the plan decided for ``node``: how each operand reaches it and what finishes it."""
    stage = plan.stage_of(node.id)
    ir = plan.node_ir(node.id)
    lines = []
    for u, need in dict.fromkeys(plan.edges(node)):
        have, name = plan.type(u), value_name(u)
        moves = [m for m in (ir.moves_in if ir else ()) if m.source.value == u and m.result.value == u]
        how = f"{layout_to_spec(have.layout)} -> {layout_to_spec(need.layout)}"
        if have == need:
            lines.append(f"{name}: used as held, {layout_to_spec(need.layout)}")
        elif any(m.transfer is not None for m in moves):
            steps = ", then ".join(f"{m.step} in stage {plan.stage_running(m)}" for m in moves)
            lines.append(f"{name}: {steps} ({how})")
        elif need.partial and not have.partial:
            lines.append(f"{name}: taken once over {'*'.join(need.partial)} (zero on the other devices of each group), "
                         "no communication")
        else:
            lines.append(f"{name}: local slice {how}, no communication")
    finishes = ir.finishes if ir else ()
    if finishes:
        lines.append(f"finished by {', then '.join(move_equation(f) for f in finishes)} inside stage {stage}")
    else:
        lines.append(f"computed on each device's blocks (rule {plan.sharded.rules[node.id]}), no collective")
    return lines


def _differing_blocks(session, v: int, array, ref: np.ndarray, tolerance: Tolerance, scale: np.ndarray) -> list[str]:
    """The blocks of ``v`` that differ from their slice of ``ref`` (``tolerance`` and ``scale``: the value's, per
    element)."""
    out = []
    for block in session.device_blocks(v, array, all_processes=True):
        want, got = ref[block.slices], as_numpy(block.data)
        if got.shape != want.shape:
            out.append(f"{block.where()}: holds shape {got.shape}, the slice has {want.shape}")
            continue
        max_abs, _, agrees = errors(got, want, tolerance, np.broadcast_to(scale, ref.shape)[block.slices])
        if not agrees:
            out.append(f"{block.where()}: max abs error {max_abs:.3g}")
    return out
