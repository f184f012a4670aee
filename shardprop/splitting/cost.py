"""The cost model: what moving data costs, in one place.

Everything that counts bytes — the strategies choosing between a gather and a collective, the listing and the
stage table, ``Program.estimated_communication()`` — builds :class:`Transfer`s here and sums their
``moved_bytes``, and the HLO reader (``backends/hlo.py``) builds the same records from a compiled program, so
estimate and measurement compare field by field. ``moved_bytes`` is the ring model of what one device sends:
``2(n-1)/n·size`` for an all-reduce, ``(n-1)/n·size`` of the gathered result for an all-gather,
``(n-1)·size`` of the scattered result for a reduce-scatter, ``(n-1)/n·size`` for an all-to-all and ``size``
for a collective-permute, ``n`` being the number of devices in a group.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum

import numpy as np

from ..expr import jax_adapter as jx
from ..expr.graph import Aval, Node
from ..propagation.sharding import Layout, block_shape, is_all_to_all, moved_axes, received_layout, shard_count
from .collectives import Collective, CollectiveKind
from .decisions import Decisions


class TransferKind(StrEnum):
    """The collectives XLA prints, as it spells them."""

    ALL_REDUCE = "all-reduce"
    ALL_GATHER = "all-gather"
    REDUCE_SCATTER = "reduce-scatter"
    ALL_TO_ALL = "all-to-all"
    COLLECTIVE_PERMUTE = "collective-permute"


@dataclass(frozen=True, slots=True)
class Transfer:
    """One collective: ``kind`` over ``mesh_axes`` (groups of ``group_size`` devices), producing a per-device
    result of ``shape``/``dtype`` (``bytes`` of it); ``moved_bytes`` per device (ring model)."""

    kind: TransferKind
    mesh_axes: tuple[str, ...]
    group_size: int
    shape: tuple[int, ...]
    dtype: str
    bytes: int
    moved_bytes: float
    repeats: int = 1  # executions per run of the program: a collective inside a loop runs once per iteration
    arrays: int = 1   # a collective of a tuple (XLA combines several all-reduces): ``shape`` is its first array's
    unknown_trips: bool = False  # inside a while loop of unknown trip count: counted for one iteration

    @property
    def total_moved_bytes(self) -> float:
        return self.moved_bytes * self.repeats

    def __str__(self) -> str:
        axes = "*".join(self.mesh_axes) or "?"
        times = "" if self.repeats == 1 else f", x{self.repeats} (in a loop)"
        if self.unknown_trips:
            times += ", per iteration of a while loop (its trip count is unknown: counted once)"
        what = f"{self.dtype}{list(self.shape)}" if self.arrays == 1 else \
            f"{self.arrays} arrays ({self.dtype}{list(self.shape)}, ...)"
        return f"{self.kind} over {axes} (groups of {self.group_size}): {what}, " \
               f"{self.bytes} B result, ~{self.moved_bytes:.0f} B moved per device{times}"


def moved(kind: TransferKind, n: int, size: int) -> float:
    """Bytes one device sends in ``kind`` over groups of ``n`` devices with a per-device result of ``size``."""
    if n <= 1:
        return 0.0
    return {TransferKind.ALL_REDUCE: 2 * (n - 1) / n * size, TransferKind.ALL_GATHER: (n - 1) / n * size,
            TransferKind.REDUCE_SCATTER: (n - 1) * size, TransferKind.ALL_TO_ALL: (n - 1) / n * size,
            TransferKind.COLLECTIVE_PERMUTE: float(size)}[TransferKind(kind)]


def total_moved(transfers: Iterable[Transfer]) -> float:
    """Bytes one device moves in ``transfers``, a collective inside a loop counted once per iteration."""
    return sum(t.total_moved_bytes for t in transfers)


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


_HLO_DTYPE = {"bool": "pred", "bfloat16": "bf16"}
_HLO_KIND = {"float": "f", "int": "s", "uint": "u", "complex": "c"}


def hlo_dtype_name(dtype) -> str:
    """The dtype as XLA prints it (``f32``, ``s32``, ``pred``, ``bf16``)."""
    if jx.is_extended_dtype(dtype):
        return str(dtype)
    name = np.dtype(dtype).name
    m = re.fullmatch(r"(float|int|uint|complex)(\d+)", name)
    return _HLO_DTYPE.get(name) or (_HLO_KIND[m[1]] + m[2] if m else name)


def hlo_itemsize(name: str) -> float:
    """Bytes per element of an XLA element type: ``pred`` is a byte; the others carry their bit width in the
    name (``f32``, ``bf16``, ``f8e4m3fn``, ``s4``, ``c64``)."""
    if name == "pred":
        return 1
    m = re.match(r"[a-z]+?(\d+)", name)
    if m is None:
        raise ValueError(f"unknown XLA element type {name!r}")
    return int(m[1]) / 8


def transfer(kind: TransferKind, mesh_axes: tuple[str, ...], aval: Aval, layout: Layout,
             mesh_shape: Mapping[str, int]) -> Transfer:
    """``kind`` over ``mesh_axes`` whose per-device result is a block of ``aval`` laid out as ``layout``."""
    shape = block_shape(aval.shape, layout, mesh_shape)
    nbytes = int(jx.itemsize(aval.dtype) * math.prod(shape))
    n = shard_count(mesh_shape, mesh_axes)
    in_mesh_order = tuple(name for name in mesh_shape if name in mesh_axes)  # as the HLO reports groups
    return Transfer(kind, in_mesh_order, n, shape, hlo_dtype_name(aval.dtype), nbytes, moved(kind, n, nbytes))


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
