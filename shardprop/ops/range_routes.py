"""Ranged rows routed into their blocks: where a concatenation joins its operands' blocks in place (a roll's
rotation, two sequences end to end) or a strided slice leaves each device's picks out of their places, the op runs
in place and a ``rotate`` or ``route`` step (a move) sends each device's rows to the blocks they belong to —
chosen where that moves fewer rows than reading the operands realigned (``shardprop.ops.ranges``' rules' reads).
Here: the finishes' choice (``finish_concatenate``, ``finish_slice``), the placements they leave, and the strided
picks' arithmetic."""

from __future__ import annotations

import functools
from typing import NamedTuple


from ..core.layouts import Sharded, Span, shard_count, standard_span
from ..core.collectives import Collective, CollectiveKind
from ..core.rounds import Piece, in_rounds, realign_rows, rounds_rows, route_rounds
from ..core.types import Placement, PlacementKind, ValueType
from ..expr import jax_adapter as jx

# per operand, per axis: (mesh axes, span) the rule reads that axis in, or None
NeedSpans = tuple[tuple[tuple[tuple[str, ...], Span] | None, ...], ...]


def finish_concatenate(decisions, node):
    """A concatenation whose operands, held ranged in place, are the blocks of the result rotated (``jnp.roll``: the
    slices ``x[63:]`` and ``x[:63]`` of a 64-row axis in blocks of 8 hold, together, every row of the result, each
    device's 7 rows ahead): the op joins them in place and a ``rotate`` step moves each device's rows into its
    block — one permute of the rows crossing a block's edge, as XLA's rotation — where reading each operand realigned
    would permute each apart. Operands in equal blocks (two sequences end to end) are joined in place too and a
    ``route`` step sends each piece to its block, the operands' pieces sharing permutes, where that moves fewer
    rows than realigning each. None otherwise (the rule's realigned reads stand)."""
    dim = node.params["dimension"]
    graph, mesh_shape = decisions.graph, decisions.mesh_shape
    size = graph.avals[node.outputs[0]].shape[dim]
    held = [decisions.type(v) for v in node.operands]
    meshes = {vtype.layout[dim] for vtype in held}
    if len(meshes) != 1 or not next(iter(meshes)) or jx.is_extended_dtype(graph.avals[node.outputs[0]].dtype):
        return None
    (mesh_axes,) = meshes
    count = shard_count(mesh_shape, mesh_axes)
    if decisions.sharded.layout(node.outputs[0])[dim] != mesh_axes:
        return None
    routed = _routed(decisions, node, held, mesh_axes, count)
    if routed is not None:
        return routed
    shifts, offset = set(), 0
    for v, vtype in zip(node.operands, held, strict=True):
        n = graph.avals[v].shape[dim]
        span = vtype.span_of(dim) or (standard_span(n, count) if n % count == 0 else None)
        if span is None or span.fill is not None or count * span.block != size:
            return None
        shifts.add((span.offset - offset) % size)
        offset += n
    if len(shifts) != 1 or shifts == {0}:
        return None
    needs = tuple(ValueType(tuple(mesh_axes if k == dim else m for k, m in enumerate(need.layout)),
                            span=tuple(vtype.span_of(dim) if k == dim else None for k in range(len(need.layout))))
                  for need, vtype in zip(decisions.needs(node.id), held, strict=True))
    return needs, Collective(CollectiveKind.ROTATE, mesh_axes)


def _routed(decisions, node, held, mesh_axes, count: int):
    """The ``route`` of ``finish_concatenate``, or None: every operand in equal blocks over ``mesh_axes``,
    the result too, more than one operand laid out, and the shared rounds moving fewer rows than realigning each."""
    dim = node.params["dimension"]
    lengths = tuple(decisions.graph.avals[v].shape[dim] for v in node.operands)
    size = sum(lengths)
    if any(vtype.span_of(dim) is not None or n % count for vtype, n in zip(held, lengths, strict=True)) or size % count:
        return None
    block, offset, apart = size // count, 0, 0
    for n in lengths:
        apart += realign_rows(Span(0, n // count), Span(offset, block), n, count)
        offset += n
    if rounds_rows(route_rounds(lengths, count)) >= apart:
        return None
    needs = tuple(ValueType(tuple(mesh_axes if k == dim else m for k, m in enumerate(need.layout)))
                  for need in decisions.needs(node.id))
    return needs, Collective(CollectiveKind.ROUTE, mesh_axes)


def rotation(node, first, length: int) -> int:
    """How many rows further each device's rows of a concatenation joined in place lie (``finish_concatenate``):
    its first operand's span offset, around the axis's ``length``; 0 when read realigned."""
    span = first.span_of(node.params["dimension"])
    return (span.offset if span is not None else 0) % length


def concatenate_placement(graph, node, operand_type, collective: Collective, mesh_shape) -> Placement:
    """Where a concatenation joined in place leaves each device's rows: rotated by its rotation (a ``rotate``
    finish: operands ranged, a roll), or pieces a route carries (``shardprop.core.rounds.route_rounds``)."""
    dim, mesh_axes = int(node.params["dimension"]), collective.mesh_axes
    if collective.kind is CollectiveKind.ROTATE:
        shift = rotation(node, operand_type, graph.avals[node.outputs[0]].shape[dim])
        return Placement(PlacementKind.ROTATED, mesh_axes, axis=dim, shift=shift)
    rounds = route_rounds(tuple(graph.avals[v].shape[dim] for v in node.operands), shard_count(mesh_shape, mesh_axes))
    return Placement(PlacementKind.ROUTED, mesh_axes, axis=dim, rounds=rounds)


def strided_picks(held: Span, length: int, start: int, stride: int, size: int, device: int) -> tuple[int, int, int]:
    """``(position, row, count)``: the rows of a strided slice (``size`` rows, row ``r`` being operand row
    ``start + stride * r``) that device ``device``'s block of an operand axis of ``length`` (held as ``held`` says)
    holds — ``count`` of them, the first at ``position`` of the block, being the slice's row ``row``.

    >>> strided_picks(Span(0, 8), 64, 0, 3, 22, 1)   # x[::3] of 64 rows in blocks of 8: device 1 holds 9, 12, 15
    (1, 3, 3)
    """
    at = device * held.block - held.offset
    lo = max(at, start, 0)
    hi = min(at + held.block, start + (size - 1) * stride + 1, length)
    if hi <= lo:
        return 0, 0, 0
    first = start + -(-(lo - start) // stride) * stride
    count = max(0, -(-(hi - first) // stride))
    return first - at, (first - start) // stride, count


class StridedPicks(NamedTuple):
    """How a strided slice's rows lie on the devices holding its operand: per device ``(position, row, count)``
    (``strided_picks``), the result's ``block``, whether every device's picks are its rows of the result
    (``in_place``), and otherwise the ``rounds`` of a route carrying them there (None where none can)."""

    picks: tuple[tuple[int, int, int], ...]
    block: int
    in_place: bool
    rounds: tuple | None


@functools.lru_cache(maxsize=1024)
def strided_layout(held: Span, length: int, start: int, stride: int, size: int, count: int) -> StridedPicks:
    """The ``StridedPicks`` of a strided slice (``size`` rows, row ``r`` being operand row ``start + stride * r``)
    of an operand axis of ``length`` in ``count`` blocks held as ``held`` says. The result's block is
    ``ceil(size / count)`` rows, or the most rows one device picks where that is more (``x[0:16:3]`` of blocks of 8:
    devices 0 and 1 pick 3 rows each, blocks of 3 are theirs), so that each device's picks fit in a block, in place
    or routed there (``finish_slice``). A route carries held rows only; the result's rows that are a fill no
    device holds (a pad's) are that fill where they land (no route where some other row is held by no device)."""
    picks = tuple(strided_picks(held, length, start, stride, size, d) for d in range(count))
    every_row = sum(picked for _, _, picked in picks) == size
    routable = every_row or held.fill is not None
    block = -(-size // count)
    if routable:
        block = max(block, *(picked for _, _, picked in picks))
    in_place = every_row and all(picked == 0 or row == device * block
                                 for device, (_, row, picked) in enumerate(picks))
    if in_place or not routable:
        return StridedPicks(picks, block, in_place, None)
    pieces = []
    for device, (_, row, picked) in enumerate(picks):
        for target in range(row // block, (row + picked - 1) // block + 1) if picked else ():
            lo, hi = max(row, target * block), min(row + picked, (target + 1) * block)
            pieces.append(Piece(device, target, lo - row, lo - target * block, hi - lo))
    return StridedPicks(picks, block, False, in_rounds(pieces))


def _route_axis(graph, node, operand_type: ValueType, mesh_shape):
    """``(axis, rounds)``: the first axis a strided slice reading its operand in ``operand_type`` picks rows along
    that are not in its output blocks' places (each device's picks sent on by a ``route``), or None."""
    params = node.params
    shape, out_shape = graph.avals[node.operands[0]].shape, graph.avals[node.outputs[0]].shape
    strides = params["strides"] or (1,) * len(shape)
    for k, (start, stride) in enumerate(zip(params["start_indices"], strides, strict=True)):
        mesh_axes = operand_type.layout[k]
        if stride == 1 or not mesh_axes or out_shape[k] == 0:
            continue
        count = shard_count(mesh_shape, mesh_axes)
        held = operand_type.span_of(k) or standard_span(shape[k], count)
        layout = strided_layout(held, shape[k], int(start), int(stride), out_shape[k], count)
        if layout.in_place:
            continue
        return None if layout.rounds is None else (k, layout.rounds)
    return None


def slice_placement(graph, node, operand_type: ValueType, collective: Collective, mesh_shape) -> Placement:
    """Where a strided slice read in place leaves each device's picks: routed along the axis they are out of place
    on, the rows no device holds landing as the pad's fill."""
    axis, rounds = _route_axis(graph, node, operand_type, mesh_shape)
    span = operand_type.span_of(axis)
    return Placement(PlacementKind.ROUTED, collective.mesh_axes, axis=axis, rounds=rounds,
                     fill=0 if span is None or span.fill is None else span.fill)


def finish_slice(decisions, node):
    """A strided slice whose operand, read in place, leaves each device's picks out of their places in the result's
    blocks (``x[:, ::16]`` of blocks of 8: devices 0, 2, 4, 6 pick a row each, for blocks 0-3): each device picks the
    rows its own block holds and a ``route`` step sends them to their blocks, where that moves fewer rows than
    reading the operand realigned to the rows each block picks from (the rule's read). None otherwise."""
    (operand,) = node.operands
    if jx.is_extended_dtype(decisions.graph.avals[operand].dtype):
        return None
    held, (rule,) = decisions.type(operand), decisions.rule_needs(node.id)
    found = _route_axis(decisions.graph, node, held, decisions.mesh_shape)
    if found is None:
        return None
    k, rounds = found
    mesh_axes = held.layout[k]
    out_axis = decisions.sharded.shardings[node.outputs[0]].axes[k]
    if not isinstance(out_axis, Sharded) or out_axis.mesh_axes != mesh_axes or rule.layout[k] != mesh_axes or \
            rule.span_of(k) is None:
        return None
    count, length = shard_count(decisions.mesh_shape, mesh_axes), decisions.graph.avals[operand].shape[k]
    held_span = held.span_of(k) or standard_span(length, count)
    if rounds_rows(rounds) >= realign_rows(held_span, rule.span_of(k), length, count):
        return None
    layout = tuple(mesh_axes if a == k else m for a, m in enumerate(rule.layout))
    spans = tuple(held.span_of(k) if a == k else rule.span_of(a) for a in range(len(layout)))
    return (ValueType(layout, span=spans if any(s is not None for s in spans) else ()),), \
        Collective(CollectiveKind.ROUTE, mesh_axes)
