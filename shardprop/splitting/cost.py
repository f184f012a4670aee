"""The cost model: what a plan's moves and collectives cost, in one place.

Everything that counts bytes — the strategies choosing between a gather and a collective, the listing and the
stage table, ``Program.estimated_communication()`` — builds :class:`~shardprop.core.transfers.Transfer`s here
and sums their ``moved_bytes``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..expr import jax_adapter as jx
from ..expr.graph import Aval, Node
from ..core.layouts import Layout, block_shape, is_all_to_all, moved_axes, received_layout
from ..core.collectives import Collective, CollectiveKind
from ..core.transfers import Transfer, TransferKind, total_moved, transfer
from .decisions import Decisions


@dataclass(frozen=True, slots=True)
class Move:
    """How a value held as ``have`` reaches a consumer that needs ``want``: ``kind`` (an all-gather, an
    all-to-all, or None when ``want`` is a local slice of ``have``) over ``mesh_axes``, arriving laid out as
    ``received`` (``want`` is a local slice of it)."""

    kind: TransferKind | None
    mesh_axes: tuple[str, ...]
    received: Layout

    @property
    def short(self) -> str:
        """``gather i*j``, ``all-to-all i`` (for tables and graph edges)."""
        verb = {None: "slice", TransferKind.ALL_GATHER: "gather", TransferKind.ALL_TO_ALL: "all-to-all"}[self.kind]
        return f"{verb} {'*'.join(self.mesh_axes)}".rstrip()

    def __str__(self) -> str:
        axes = "*".join(self.mesh_axes)
        return {None: "a local slice", TransferKind.ALL_GATHER: f"gathered over {axes}",
                TransferKind.ALL_TO_ALL: f"all-to-all over {axes}"}[self.kind]


def movement(have: Layout, want: Layout) -> Move:
    """The :class:`Move` from ``have`` to ``want`` (see ``received_layout``).

    >>> str(movement((("i",), ("j",)), (("i",), ())))
    'gathered over j'
    >>> str(movement(((), ("i",)), (("i",), ())))
    'all-to-all over i'
    """
    received, axes = received_layout(have, want), moved_axes(have, want)
    if not axes:
        return Move(None, (), received)
    return Move(TransferKind.ALL_TO_ALL if is_all_to_all(have, want) else TransferKind.ALL_GATHER, axes, received)


def move_transfer(view: Decisions, value: int, have: Layout, want: Layout) -> Transfer | None:
    """The collective that brings ``value`` from ``have`` to a layout ``want`` is a local slice of (an
    all-gather, or an all-to-all when only tensor axes change; None: nothing to move)."""
    move = movement(have, want)
    if move.kind is None:
        return None
    return transfer(move.kind, move.mesh_axes, view.graph.avals[value], move.received, view.mesh_shape)


def move_bytes(view: Decisions, value: int, have: Layout, want: Layout) -> float:
    """Bytes one device receives when ``value``, held as ``have``, is moved so that ``want`` is a local slice of
    it (ring model: ``(n-1)/n`` of the gathered block for an all-gather, of the kept block for an all-to-all)."""
    found = move_transfer(view, value, have, want)
    return 0.0 if found is None else found.moved_bytes


def node_move_bytes(view: Decisions, node: Node, needs: tuple[Layout, ...] | None = None) -> float:
    """Bytes one device receives to bring every operand of ``node`` into the layout ``view`` says it needs (or
    into ``needs``)."""
    edges = view.edges(node) if needs is None else zip(node.operands, needs, strict=True)
    return sum(move_bytes(view, v, view.layout(v), need) for v, need in edges)


# Multiply-adds a device does in the time it moves one byte to another (an order of magnitude, for CPU devices):
# the exchange rate between the work a gather makes every device repeat and the bytes a collective moves.
MACS_PER_BYTE = 8.0


def compute_bytes(view: Decisions, node: Node, needs: tuple[Layout, ...] | None = None) -> float:
    """The multiply-adds one device does for ``node`` with its operands in ``needs`` (default: as ``view`` says),
    in bytes' worth (:data:`MACS_PER_BYTE`); 0 for ops whose record has no ``work`` piece."""
    from ..ops import lookup

    work = lookup(node.op).work
    if work is None:
        return 0.0
    graph, mesh_shape = view.graph, view.mesh_shape
    needs = view.needs(node.id) if needs is None else needs
    blocks = [block_shape(graph.avals[v].shape, need, mesh_shape) for v, need in zip(node.operands, needs,
                                                                                       strict=True)]
    out = node.outputs[0]
    return work(node, blocks, block_shape(graph.avals[out].shape, view.sharded.layout(out), mesh_shape)) / MACS_PER_BYTE


def collective_transfers(view: Decisions, node: Node, collective: Collective) -> list[Transfer]:
    """The collectives that finish ``node``: an all-reduce (a reduce-scatter for ``psum_scatter``) of each
    output's block; ``argmax``/``argmin`` also all-reduce the extreme values and, for floats, a NaN flag (a float
    ``pmax``/``pmin`` is one all-reduce of integers of the same size: total order keeps NaN and signed zeros)."""
    graph = view.graph
    kind = TransferKind.REDUCE_SCATTER if collective.kind is CollectiveKind.PSUM_SCATTER else TransferKind.ALL_REDUCE
    # A reduce-scatter's result is the finer block the plan holds; an all-reduce's the block it computed.
    layout = view.layout if kind is TransferKind.REDUCE_SCATTER else view.computed_layout
    out = []
    for k, v in enumerate(node.outputs):
        if not collective.finishes(k):
            continue
        aval = graph.avals[v]
        out.append(transfer(kind, collective.mesh_axes, aval, layout(v), view.mesh_shape))
        extra = []
        if collective.kind in (CollectiveKind.ARGMAX, CollectiveKind.ARGMIN):
            operand_dtype = graph.avals[node.operands[0]].dtype
            extra = [operand_dtype] + ([np.dtype(np.int32)] if jx.dtype_kind(operand_dtype) == "f" else [])
        out += [transfer(kind, collective.mesh_axes, Aval(aval.shape, np.dtype(dt)), layout(v), view.mesh_shape)
                for dt in extra]
    return out


def collective_bytes(view: Decisions, node: Node, collective: Collective) -> float:
    """Bytes one device moves in the collectives that finish ``node`` (see :func:`collective_transfers`)."""
    return total_moved(collective_transfers(view, node, collective))


def estimate(plan) -> list[Transfer]:
    """The cost model's view of a :class:`~shardprop.Plan` before compiling: an all-gather for every stage
    input that arrives coarser than it is held (the same value and layout once), and the collectives that
    finish nodes, stage by stage."""
    out: list[Transfer] = []
    seen: set = set()
    for stage in plan.stages:
        out += stage_estimate(plan, stage, seen)
    return out


def stage_estimate(plan, stage, seen: set | None = None) -> list[Transfer]:
    """The transfers of one stage: the gathers of its inputs (a ``(value, layout)`` already in ``seen`` is not
    gathered again; ``seen`` is updated) and the collectives that finish its nodes. Without ``seen``: the
    stage run on its own, as the debugger runs it."""
    seen = set() if seen is None else seen
    out: list[Transfer] = []
    for i in stage.inputs:
        found = move_transfer(plan, i.value, plan.layout(i.value), i.layout)
        if found is not None and (i.value, i.layout) not in seen:
            seen.add((i.value, i.layout))
            out.append(found)
    for n in stage.nodes:
        collective = plan.collective(n)
        if collective is not None:
            out += collective_transfers(plan, plan.graph.nodes[n], collective)
        out += body_transfers(plan, n)
    return out


def body_transfers(view: Decisions, node_id: int) -> list[Transfer]:
    """What the bodies of a loop or a cond move, each collective with the number of times it runs (a scan's
    length; once for a while loop, whose trip count is unknown): the operands its nodes need coarser than held
    (each value and layout once per iteration), the collectives finishing its nodes, the outputs moved into the
    layouts the loop takes them in, and the bodies of its own loops."""
    out: list[Transfer] = []
    for plan in view.body_plans(node_id) or ():
        body, inner = plan.body, plan.decisions
        graph = inner.graph
        moves = {(v, need) for node in graph.nodes for v, need in inner.edges(node)}
        moves |= set(zip(graph.outputs, body.out_layouts, strict=True))
        once: list[Transfer] = []
        for v, need in sorted(moves):
            found = move_transfer(inner, v, inner.layout(v), need)
            if found is not None:
                once.append(found)
        for node in graph.nodes:
            collective = inner.collective(node.id)
            if collective is not None:
                once += collective_transfers(inner, node, collective)
            once += body_transfers(inner, node.id)
        out += [replace(t, repeats=t.repeats * (body.repeats or 1),
                        unknown_trips=t.unknown_trips or (body.carries != () and body.repeats is None)) for t in once]
    return out
