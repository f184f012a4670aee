"""The cost model: what a plan's moves and collectives cost, in one place.

Everything that counts bytes — the strategies choosing between a gather and a collective, the listing and the
stage table, ``Program.estimated_communication()`` — builds ``shardprop.core.transfers.Transfer``s here
and sums their ``moved_bytes``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

from ..expr.graph import Node
from ..core.layouts import block_shape
from ..core.subaxes import sizes_with
from ..core.collectives import Collective, finish_transfers
from ..core.moves import move_bytes as planned_bytes, move_transfers as planned_transfers
from ..core.types import ValueType, held_whole
from ..core.transfers import Transfer, total_moved
from ..ops import finish_geometry, has_record, lookup
from ..ops.opdef import Family
from .decisions import Decisions
from .emit import body_program
from .ir import Compute, Ref, reads, results, transfers_of


def move_transfers(view: Decisions, value: int, have: ValueType, want: ValueType) -> tuple[Transfer, ...]:
    """The collectives that bring ``value`` from type ``have`` to type ``want``, as planned
    (``shardprop.core.moves.plan_move``: gathers, all-to-alls, permutes, a psum or a reduce-scatter of a
    partial sum, halo exchanges, realignments, the mirror, rotation or route of a placed value; local slices and
    taking a value once cost nothing)."""
    aval = view.graph.avals[value]
    return planned_transfers(aval.shape, aval.dtype, have, want, view.mesh_shape)


def move_bytes(view: Decisions, value: int, have: ValueType, want: ValueType) -> float:
    """Bytes one device moves to bring ``value`` from type ``have`` to type ``want`` (ring model)."""
    aval = view.graph.avals[value]
    return planned_bytes(aval.shape, aval.dtype, have, want, view.mesh_shape)


def node_move_bytes(view: Decisions, node: Node, needs: tuple[ValueType, ...] | None = None) -> float:
    """Bytes one device moves to bring every operand of ``node`` into the type ``view`` says it needs (or into
    ``needs``)."""
    edges = view.edges(node) if needs is None else zip(node.operands, needs, strict=True)
    return sum(move_bytes(view, v, view.type(v), need) for v, need in edges)


# Multiply-adds a device does in the time it moves one byte to another (an order of magnitude, for CPU devices):
# the exchange rate between the work a gather makes every device repeat and the bytes a collective moves.
MACS_PER_BYTE = 8.0


def whole_work(graph) -> float:
    """The multiply-adds of ``graph`` run whole on one device, in bytes' worth: spread evenly over ``n`` devices with
    no byte moved, ``whole_work(graph) / n`` is a price no plan beats (``price``)."""
    total = 0.0
    for node in graph.nodes:
        work = lookup(node.op).work if has_record(node.op) else None
        if work is not None:
            total += work(node, [graph.avals[v].shape for v in node.operands],
                          graph.avals[node.outputs[0]].shape) / MACS_PER_BYTE
    return total


def compute_bytes(view: Decisions, node: Node, needs: tuple[ValueType, ...] | None = None) -> float:
    """The multiply-adds one device does for ``node`` with its operands in ``needs`` (default: as ``view`` says),
    in bytes' worth (``MACS_PER_BYTE``); 0 for ops whose record has no ``work`` piece."""
    if lookup(node.op).work is None:
        return 0.0
    graph = view.graph
    needs = view.needs(node.id) if needs is None else needs
    out = node.outputs[0]
    return _work_bytes(node, tuple((graph.avals[v].shape, need.layout) for v, need in zip(node.operands, needs,
                                                                                           strict=True)),
                       (graph.avals[out].shape, view.sharded.layout(out)), tuple(view.mesh_shape.items()))


@functools.lru_cache(maxsize=65536)
def _work_bytes(node: Node, operands: tuple, out: tuple, mesh_items: tuple) -> float:
    """``compute_bytes`` of ``node`` (hashed by identity) on operands and output of these (shape, layout)s: the search
    prices each of its nodes' strategies, many alike."""
    mesh_shape = dict(mesh_items)
    blocks = [block_shape(shape, layout, mesh_shape) for shape, layout in operands]
    return lookup(node.op).work(node, blocks, block_shape(*out, mesh_shape)) / MACS_PER_BYTE


def finishing_types(view: Decisions, node: Node, collective: Collective,
                    outputs: tuple[int, ...] | None = None, needs=None) -> list[tuple[int, ValueType, ValueType]]:
    """``(value, computed, held)`` for each output ``collective`` finishes: each device computes its partial result
    laid out as propagation said (ranged where the finish keeps it: ``Decisions.finished_types``), the
    collective combines them into the type the plan holds the value in (whole; a reduce-scatter's finer). The
    outputs are ``outputs`` (positions) if given, else those ``view`` records as computed partial (a loop finishes
    only the carries it kept partial), else all (a collective being weighed, the node reading its operands in
    ``needs``)."""
    if outputs is None:
        outputs = tuple(k for k, v in enumerate(node.outputs) if v in view.computed) or range(len(node.outputs))
    weighed = [k for k in outputs if node.outputs[k] not in view.computed]
    found = {v: (v, view.computed[v], view.type(v)) for v in node.outputs if v in view.computed}
    if weighed:
        found |= {t[0]: t for t in view.finished_types(node, view.needs(node.id) if needs is None else needs,
                                                       collective, weighed)}
    return [found[node.outputs[k]] for k in outputs]


def collective_transfers(view: Decisions, node: Node, collective: Collective,
                         outputs: tuple[int, ...] | None = None, needs=None) -> list[Transfer]:
    """The collectives that finish ``node`` (see ``finishing_types``): a sum's or a placement's move (an all-reduce
    or a reduce-scatter; a mirror's, rotation's or route's permutes), a maximum's, minimum's or arg-extreme's
    all-reduces (``shardprop.core.collectives.finish_transfers``)."""
    graph = view.graph
    out = []
    for v, computed, held in finishing_types(view, node, collective, outputs, needs):
        if computed.is_partial_sum or computed.placement is not None:
            out += move_transfers(view, v, computed, held)
            continue
        out += finish_transfers(collective.kind, collective.mesh_axes, graph.avals[v],
                                graph.avals[node.operands[0]].dtype, computed.layout, view.mesh_shape,
                                finish_geometry(graph, node, (view.needs(node.id) if needs is None else needs)[0],
                                                view.mesh_shape))
    return out


def collective_bytes(view: Decisions, node: Node, collective: Collective,
                     outputs: tuple[int, ...] | None = None, needs=None) -> float:
    """Bytes one device moves in the collectives that finish ``node`` (see ``collective_transfers``)."""
    return total_moved(collective_transfers(view, node, collective, outputs, needs))


def estimate(plan) -> list[Transfer]:
    """The cost model's view of a ``shardprop.Plan`` before compiling: every move and finishing collective of
    its IR, stage by stage, a loop body's once per iteration."""
    return [t for stage in plan.stages for t in instructions_transfers(stage.instructions)]


def price(plan) -> float:
    """What a plan costs, as layouts are chosen by it (propagation's candidates, the split's strategies): the bytes per
    device its moves and finishes send (``estimate``) plus the work each device does in its contractions and
    convolutions, in bytes' worth (``compute_bytes``) — a layout that gathers a batch saves an all-reduce but
    makes every device repeat the whole matmul."""
    work = sum(compute_bytes(plan, node) for node in plan.graph.nodes
               if has_record(node.op) and lookup(node.op).work is not None)
    return total_moved(estimate(plan)) + work


def instructions_transfers(instructions) -> list[Transfer]:
    """What ``instructions`` send between devices: each move's and finish's collective, and a loop's or a cond's
    bodies' (each collective with the number of times it runs: a scan's length; once for a while loop, whose
    trip count is unknown, and its condition once more)."""
    out: list[Transfer] = []
    for instruction in instructions:
        out += transfers_of(instruction)
        if isinstance(instruction, Compute) and instruction.bodies:
            for body in instruction.bodies:
                unknown = body.plan.body.carries != () and body.repeats is None
                # a while loop's condition runs once more than its body (the check that ends it)
                times = (body.repeats or 1) + (body.plan.body.name == "cond" and body.plan.body.carries != ())
                out += [replace(t, repeats=t.repeats * times, unknown_trips=t.unknown_trips or unknown)
                        for t in instructions_transfers(body.instructions)]
    return out


def body_transfers(view: Decisions, node_id: int) -> list[Transfer]:
    """What the bodies of a loop or a cond move (see ``instructions_transfers``), as decided in ``view``."""
    plans = view.body_plans(node_id)
    if not plans:
        return []
    return instructions_transfers([Compute(node_id, (), (), tuple(body_program(plan) for plan in plans))])


# XLA's CPU buffers start at 64-byte boundaries (a scalar temporary takes 64 B); a tuple of outputs is a table of
# 8-byte pointers
ALIGNMENT, POINTER = 64, 8


@dataclass(frozen=True)
class Footprint:
    """Bytes one device holds while a plan runs, as ``compiled.memory_analysis()`` splits them: its ``arguments``'
    blocks, its ``outputs``' blocks, and ``temporaries`` — the most the values in between (moved copies, partial
    results, a loop body's) hold at once."""

    arguments: int
    outputs: int
    temporaries: int
    aliased: int = 0  # donated arguments' buffers that hold outputs
    lendable: int = 0  # the donated arguments' bytes: the most XLA's aliasing can take off

    @property
    def total(self) -> int:
        return self.arguments + self.outputs + self.temporaries - self.aliased

    @property
    def least(self) -> int:
        """Bytes no compiled program of the plan holds less than: ``memory_analysis()`` counts the arguments it reads
        and its outputs block for block as these do, and only temporaries and aliasing are XLA's to decide (the plan
        of ``Footprint(10, 4, 7, lendable=2).least`` holds at least 12 bytes)."""
        return self.arguments + self.outputs - min(self.lendable, self.outputs)


def ref_bytes(graph, ref: Ref, mesh_shape) -> int:
    """Bytes of one device's block of ``ref`` (a halo's neighbour rows included)."""
    aval = graph.avals[ref.value]
    names = [n for m in ref.type.layout for n in m]
    shape = block_shape(aval.shape, ref.type.layout, sizes_with(names, mesh_shape))
    if ref.type.halo:
        shape = tuple(n + lo + hi for n, (lo, hi) in zip(shape, ref.type.halo, strict=True))
    return math.prod(shape) * aval.dtype.itemsize


def footprint(plan, donated: tuple[int, ...] = ()) -> Footprint:
    """The per-device memory of ``plan`` (``Footprint``): arguments (those it reads or returns) and outputs as they are
    laid out — exactly what ``memory_analysis()`` counts of them — and the peak of the values live in between, walking
    the stages' IR in order (a value is live from the instruction that makes it to its last reader; a loop's or a
    cond's body adds its own peak while it runs). XLA schedules and reuses buffers differently (it fuses more, or
    combines all-reduces and keeps their operands live together), so the total is within about 0.8x to 1.3x of what
    ``memory_analysis()`` reports: good to rank plans, and the layout search compiles its choice before trusting a
    limit. ``donated`` argument leaves (flat indices) lend their buffers to outputs of their shape, dtype and block,
    as XLA aliases them."""
    graph, mesh_shape = plan.graph, plan.mesh_shape
    read = _read_arguments(graph)
    arguments = {Ref(v, held_whole(plan.sharded.layout(v))) for v in read}
    outputs = {plan.stages[s.stage].output_refs[s.index] if s.stage is not None else None
               for s in plan.output_sources} - {None}
    argument_bytes = sum(ref_bytes(graph, r, mesh_shape) for r in arguments)
    # XLA returns several outputs as a tuple: a table of one pointer per output
    output_bytes = sum(ref_bytes(graph, Ref(v, plan.output_type(k)), mesh_shape)
                       for k, v in enumerate(graph.outputs)) + POINTER * (len(graph.outputs) > 1) * len(graph.outputs)
    instructions = [(stage, i) for stage in plan.stages for i in stage.instructions]
    held = arguments | outputs
    lent = {graph.inputs[k] for k in donated} & read
    lendable = sum(ref_bytes(graph, r, mesh_shape) for r in arguments if r.value in lent)
    return Footprint(argument_bytes, output_bytes,
                     _peak_live(graph, mesh_shape, [i for _, i in instructions], held,
                                stage_inputs=list(_stage_starts(plan))),
                     _aliased(plan, [k for k in donated if graph.inputs[k] in lent]), lendable)


def _read_arguments(graph) -> set[int]:
    """The arguments the program reads or returns: ``jax.jit`` leaves the others out of the compiled program."""
    returned = set(graph.outputs)
    return {v for v in graph.inputs if graph.consumers[v] or v in returned}


def _aliased(plan, donated) -> int:
    """Bytes of the ``donated`` arguments (those the program reads) whose buffers an output takes (each output once:
    same shape, dtype, block)."""
    graph, mesh_shape = plan.graph, plan.mesh_shape
    free = [(graph.avals[v], ref_bytes(graph, Ref(v, plan.output_type(k)), mesh_shape))
            for k, v in enumerate(graph.outputs)]
    total = 0
    for k in donated:
        v = graph.inputs[k]
        mine = (graph.avals[v], ref_bytes(graph, Ref(v, held_whole(plan.sharded.layout(v))), mesh_shape))
        if mine in free:
            free.remove(mine)
            total += mine[1]
    return total


def _stage_starts(plan):
    """(position of a stage's first instruction, the stage), for the stages' inputs read there."""
    position = 0
    for stage in plan.stages:
        yield position, stage
        position += len(stage.instructions)


# Families whose results XLA fuses into their readers, and the families that fuse such operands in: an elementwise
# or shape op's value takes memory only where another reader needs it made (a contraction, a collective) or a
# later stage reads it
FUSED_FAMILIES = frozenset({Family.ELEMENTWISE, Family.SHAPE})
FUSING_FAMILIES = FUSED_FAMILIES | {Family.REDUCTION}


def _family_in(graph, instruction, families) -> bool:
    if not isinstance(instruction, Compute) or instruction.bodies:
        return False
    op = graph.nodes[instruction.node].op
    return has_record(op) and lookup(op).family in families


def _peak_live(graph, mesh_shape, instructions, held, stage_inputs=()) -> int:
    """The most bytes the refs ``instructions`` make hold at once (``held`` refs not counted: arguments, outputs).
    A ref lives from the instruction that makes it — a move from as early as its source exists: XLA schedules an
    argument's all-gather at the program's start — to its last reader; a stage input is read at its stage's start;
    a loop's body adds its own peak while its loop runs. An elementwise or shape op's result read only by such ops
    and reductions of its stage takes no memory: XLA fuses it into them."""
    made_at: dict[Ref, int] = {}
    last_read: dict[Ref, int] = {}
    materialized: set[Ref] = set()
    for position, stage in stage_inputs:
        for stage_input in stage.inputs:
            last_read[stage_input.ref] = max(last_read.get(stage_input.ref, -1), position)
            materialized.add(stage_input.ref)
    change = [0] * (len(instructions) + 1)
    for position, instruction in enumerate(instructions):
        fused, fusing = (_family_in(graph, instruction, FUSED_FAMILIES),
                         _family_in(graph, instruction, FUSING_FAMILIES))
        earliest = (position if isinstance(instruction, Compute)
                    else max((made_at.get(ref, 0) for ref in reads(instruction)), default=0))
        for ref in reads(instruction):
            last_read[ref] = max(last_read.get(ref, -1), position)
            if not fusing:
                materialized.add(ref)
        for ref in results(instruction):
            made_at.setdefault(ref, earliest)
            if not fused:
                materialized.add(ref)
        if isinstance(instruction, Compute) and instruction.bodies:
            transient = max(_peak_live(body.plan.body.sharded.graph, mesh_shape, body.instructions, set(body.inputs))
                            for body in instruction.bodies)
            change[position] += transient
            change[position + 1] -= transient
    for ref, start in made_at.items():
        if ref not in held and ref in materialized:
            size = -(-ref_bytes(graph, ref, mesh_shape) // ALIGNMENT) * ALIGNMENT
            change[start] += size
            change[max(last_read.get(ref, start), start) + 1] -= size
    peak = current = 0
    for delta in change:
        current += delta
        peak = max(peak, current)
    return peak
