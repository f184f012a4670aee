"""One step of a move (``Step``): what it does to a block, and what it costs — the collective XLA compiles
it to (``step_transfer``). The steps are planned by ``.moves`` and run by ``shardprop/backends/moves.py``."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum

import numpy as np

from ..expr import jax_adapter as jx
from ..expr.graph import Aval
from .layouts import Layout, Span, shard_count, standard_span
from .layouts import block_shape
from .rounds import Piece, moves_rows, rotation_pieces, rounds_rows, span_rounds
from .subaxes import coordinate, parents, sizes_with, span
from .transfers import Transfer, TransferKind, hlo_dtype_name, moved, transfer
from .types import PlacementKind, ValueType


class StepKind(StrEnum):
    """What one step does to a block (see ``Step``)."""

    SLICE = "slice"                # cut this device's finer block locally: free
    ALL_GATHER = "all-gather"      # an axis gives up its minor-most mesh axes
    ALL_TO_ALL = "all-to-all"      # an axis hands its minor-most mesh axes to another axis's minor end
    PERMUTE = "permute"            # every device receives, whole, a block some other device holds
    PSUM = "psum"                  # a partial sum is reduced over some of its mesh axes
    PSUM_SCATTER = "psum-scatter"  # ... and scattered over them along an axis (a reduce-scatter)
    TAKE_ONCE = "take-once"        # a whole value becomes a partial sum: the first device of a group keeps it
    HALO = "halo"                  # every device receives rows of a neighbour's block next to its own (a shift)
    REALIGN = "realign"            # ranged rows (or equal blocks) moved into other blocks: a few rows per permute
    UNSPAN = "unspan"              # a ranged axis gathered: the rows each device holds, the padding dropped
    TAKE_ROWS = "take-rows"        # a whole axis cut into ranged rows: each device its own, locally (free)
    MIRROR = "mirror"              # each device's block sent to the device at the mirrored position (a reversal's)
    ROTATE = "rotate"              # each device's rows, some rows further around the axis, into its block (a roll's)
    ROUTE = "route"                # pieces of other devices' blocks sent to their blocks, in rounds of permutes


# The collective XLA compiles each communicating step to.
TRANSFER_KIND = {
    StepKind.ALL_GATHER: TransferKind.ALL_GATHER,
    StepKind.ALL_TO_ALL: TransferKind.ALL_TO_ALL,
    StepKind.PERMUTE: TransferKind.COLLECTIVE_PERMUTE,
    StepKind.PSUM: TransferKind.ALL_REDUCE,
    StepKind.PSUM_SCATTER: TransferKind.REDUCE_SCATTER,
    StepKind.HALO: TransferKind.COLLECTIVE_PERMUTE,
    StepKind.REALIGN: TransferKind.COLLECTIVE_PERMUTE,
    StepKind.UNSPAN: TransferKind.ALL_GATHER,
    StepKind.MIRROR: TransferKind.COLLECTIVE_PERMUTE,
    StepKind.ROTATE: TransferKind.COLLECTIVE_PERMUTE,
    StepKind.ROUTE: TransferKind.COLLECTIVE_PERMUTE,
}

# The step that puts a placed value's rows in their places (``shardprop.core.types.Placement``).
_PLACING = {PlacementKind.MIRRORED: StepKind.MIRROR, PlacementKind.ROTATED: StepKind.ROTATE,
            PlacementKind.ROUTED: StepKind.ROUTE}


@dataclass(frozen=True, slots=True)
class Step:
    """One move: ``kind`` over ``mesh_axes``, taking a block held as ``before`` to one held as ``after``.

    ``axis`` is the tensor axis a slice cuts, a gather gathers, a reduce-scatter scatters, or an all-to-all
    concatenates (the axis giving up ``mesh_axes``); ``to_axis`` is the axis an all-to-all splits (the axis
    receiving them). A permute's device pairs follow from ``before``, ``after`` and the mesh
    (``permute_pairs``); its ``mesh_axes`` are the mesh axes either layout uses, in mesh order. Between the
    ends of a move, ``mesh_axes`` and the types may name sub-axes (``i[minor 2]``, ``.subaxes``); a permute's
    ``mesh_axes`` are whole. A halo step adds to ``axis`` the rows ``after`` holds past the block that ``before``
    does not, all from device ``d - shift`` (``halo_rows``); its ``mesh_axes`` are the axis's.

    >>> str(Step(StepKind.ALL_GATHER, ("j",), ValueType(((), ("i", "j"))), ValueType(((), ("i",))), axis=1))
    'all-gather over j on axis 1'
    """

    kind: StepKind
    mesh_axes: tuple[str, ...]
    before: ValueType
    after: ValueType
    axis: int | None = None
    to_axis: int | None = None
    shift: int = 0  # a halo step: device d receives from device d - shift along ``axis``'s mesh axes
    length: int = 0  # a step on ranged rows (realign, unspan, take-rows): the length of ``axis``

    def __str__(self) -> str:
        over = f"{'take once' if self.kind is StepKind.TAKE_ONCE else self.kind} over {'*'.join(self.mesh_axes)}"
        if self.kind is StepKind.ALL_TO_ALL:
            return f"{over} from axis {self.axis} to axis {self.to_axis}"
        if self.kind is StepKind.PSUM_SCATTER:
            return f"{over} onto axis {self.axis}"
        if self.kind is StepKind.HALO:
            side, rows = _halo_side(self)
            return f"{over} on axis {self.axis}: {rows} row{'s' * (rows != 1)} {side}"
        if self.kind is StepKind.REALIGN:
            return f"{over} on axis {self.axis}: rows shifted by {realign_shift(self)}"
        if self.kind is StepKind.ROTATE:
            return f"{over} on axis {self.axis}: rows from {self.before.placement.shift} rows further"
        return over if self.axis is None else f"{over} on axis {self.axis}"

    @property
    def short(self) -> str:
        """``gather j@1``, ``all-to-all i@2->1``, ``psum j``: for tables and graph edges."""
        verb = "gather" if self.kind is StepKind.ALL_GATHER else str(self.kind)
        axes = "*".join(self.mesh_axes)
        if self.kind is StepKind.ALL_TO_ALL:
            return f"{verb} {axes}@{self.axis}->{self.to_axis}"
        if self.kind is StepKind.HALO:
            lo, hi = self.after.halo_of(self.axis)
            return f"{verb} {axes}@{self.axis}<{lo},{hi}>"
        return f"{verb} {axes}" if self.axis is None else f"{verb} {axes}@{self.axis}"


def step_transfer(step: Step, shape: tuple[int, ...], dtype, mesh_shape: Mapping[str, int]) -> Transfer | None:
    """The collective ``step`` compiles to, priced; None for a step that sends nothing between devices (a
    slice, taking once, a collective over groups of one device, or of an empty value, which XLA drops).

    The per-device result XLA reports is the block ``after`` holds: the gathered block, the scattered block,
    and for an all-to-all, a permute and a psum the block itself (the same size before and after)."""
    sizes = step_sizes(step, mesh_shape)
    if not _exchanges(step, sizes) or 0 in shape:
        return None
    if step.kind in (StepKind.ROTATE, StepKind.ROUTE):
        return _placing_transfer(step, shape, dtype, sizes)
    if step.kind is StepKind.HALO:  # a ranged axis's neighbours' rows: blocks of its frame
        return _halo_transfer(step, step.before.frame(shape, sizes), dtype, sizes)
    if step.kind in (StepKind.REALIGN, StepKind.UNSPAN):
        return _rows_transfer(step, shape, dtype, sizes)
    shape = step.before.frame(shape, sizes)  # a ranged axis moves as its blocks
    groups = tuple(n for n in step.mesh_axes if sizes[n] > 1)  # a mesh axis of size 1 groups nothing
    found = transfer(TRANSFER_KIND[step.kind], groups, Aval(tuple(shape), as_dtype(dtype)), step.after.layout,
                     sizes)
    # over a sub-axis, the groups are devices of its mesh axis (as the HLO reader names them)
    return found if sizes is mesh_shape else replace(found, mesh_axes=parents(groups, mesh_shape))


def exchanges(step: Step, mesh_shape: Mapping[str, int]) -> bool:
    """True when ``step`` sends data between devices: a collective over groups of more than one device (a
    permute that moves some block; one that only renames mesh axes of size 1 moves none)."""
    return step.kind in TRANSFER_KIND and _exchanges(step, step_sizes(step, mesh_shape))


def _exchanges(step: Step, sizes: Mapping[str, int]) -> bool:
    """``exchanges``, given the sizes of the mesh axes and sub-axes ``step`` names."""
    if step.kind not in TRANSFER_KIND:
        return False
    if step.kind is StepKind.PERMUTE:
        return without_trivial(step.before.layout, sizes) != without_trivial(step.after.layout, sizes)
    if step.kind is StepKind.HALO:  # a neighbour that far away exists
        return shard_count(sizes, step.mesh_axes) > abs(step.shift)
    if step.kind is StepKind.REALIGN:
        return any(moves_rows(r) for r in realign_rounds(step, shard_count(sizes, step.mesh_axes)))
    if step.kind is StepKind.UNSPAN:
        return shard_count(sizes, step.mesh_axes) > 1 and unspan_rows(step, shard_count(sizes, step.mesh_axes)) > 0
    if step.kind is StepKind.ROUTE:
        return any(moves_rows(r) for r in step.before.placement.rounds)
    return shard_count(sizes, step.mesh_axes) > 1


def permute_pairs(step: Step, mesh_shape: Mapping[str, int]) -> tuple[tuple[int, int], ...]:
    """``(source, destination)`` pairs for ``lax.ppermute`` over ``step.mesh_axes``: device numbers are linear
    indices over those axes, major first (whole mesh axes: the layouts may use sub-axes of them). Each device
    receives the block it wants from a device holding it; one already holding its block sends to itself (XLA keeps
    such pairs as local copies), so the pairs are a bijection and no device is left with zeros.

    >>> s = Step(StepKind.PERMUTE, ("i", "j"), ValueType((("i",), ("j",))), ValueType((("j",), ("i",))))
    >>> permute_pairs(s, {"i": 2, "j": 2})
    ((0, 0), (1, 2), (2, 1), (3, 3))
    """
    return _pairs(step.mesh_axes, step.before.layout, step.after.layout, tuple(mesh_shape.items()))


@functools.lru_cache(maxsize=4096)
def _pairs(names: tuple[str, ...], have: Layout, want: Layout, mesh: tuple[tuple[str, int], ...]):
    sizes = dict(mesh)
    devices = list(itertools.product(*(range(sizes[n]) for n in names)))

    def block(layout: Layout, coords: tuple[int, ...]) -> tuple[int, ...]:
        at = dict(zip(names, coords, strict=True))
        return tuple(_linear(m, at, sizes) for m in layout)

    holders: dict[tuple[int, ...], list[int]] = {}
    needers: dict[tuple[int, ...], list[int]] = {}
    pairs = []
    for d, coords in enumerate(devices):
        held, wanted = block(have, coords), block(want, coords)
        if held == wanted:
            pairs.append((d, d))
        else:
            holders.setdefault(held, []).append(d)
            needers.setdefault(wanted, []).append(d)
    for key, to in needers.items():
        pairs += zip(holders[key], to, strict=True)
    return tuple(sorted(pairs))


def _linear(mesh_axes: tuple[str, ...], at: Mapping[str, int], mesh_shape: Mapping[str, int]) -> int:
    """The block number of a device at ``at`` (per mesh axis) along an axis laid out over ``mesh_axes``."""
    index = 0
    for name in mesh_axes:
        _, _, size = span(name, mesh_shape)
        index = index * size + coordinate(name, at, mesh_shape)
    return index


def step_sizes(step: Step, mesh_shape: Mapping[str, int]) -> Mapping[str, int]:
    """``mesh_shape`` and the sizes of the sub-axes ``step`` uses (``.subaxes``): ``mesh_shape`` itself when it
    uses none, the common case."""
    groups = (step.mesh_axes, *step.before.layout, *step.after.layout)
    for m in groups:  # plain loops: this runs for every step priced
        for n in m:
            if n not in mesh_shape:
                return sizes_with(itertools.chain(*groups), mesh_shape)
    return mesh_shape


def without_trivial(layout: Layout, mesh_shape: Mapping[str, int]) -> Layout:
    """``layout`` without its mesh axes of size 1 (which select nothing)."""
    return tuple(tuple(n for n in m if mesh_shape[n] > 1) for m in layout)


def as_dtype(dtype):
    return dtype if jx.is_extended_dtype(dtype) else np.dtype(dtype)




def _halo_side(step: Step) -> tuple[str, int]:
    """A halo step's side (``"before"``, ``"after"``) and the rows it adds."""
    (lo0, hi0), (lo1, hi1) = step.before.halo_of(step.axis), step.after.halo_of(step.axis)
    return ("before", lo1 - lo0) if lo1 != lo0 else ("after", hi1 - hi0)


def halo_step(mesh_axes: tuple[str, ...], before: ValueType, after: ValueType, axis: int, block: int) -> Step:
    """The halo step from ``before`` to ``after`` along ``axis`` (blocks of ``block`` rows): the rows it adds all
    lie in one device's block, ``shift`` devices away.

    >>> s = halo_step(("i",), ValueType((("i",),)), ValueType((("i",),), halo=((2, 0),)), 0, 8)
    >>> s.shift, halo_rows(s, 8)
    (1, (6, 2))
    """
    (lo0, hi0), (lo1, hi1) = before.halo_of(axis), after.halo_of(axis)
    # the rows added, relative to the start of device d's block; relative row r is in device d + floor(r / B)'s
    first, last = (-lo1, -lo0 - 1) if lo1 != lo0 else (block + hi0, block + hi1 - 1)
    if first // block != last // block:
        raise ValueError(f"a halo step adds rows of one block: {before.halo_of(axis)} -> {after.halo_of(axis)} "
                         f"with blocks of {block}")
    shift = -(first // block)
    return Step(StepKind.HALO, mesh_axes, before, after, axis, shift=shift)


def halo_rows(step: Step, block: int) -> tuple[int, int]:
    """``(first, rows)``: device ``d`` receives rows ``[first, first + rows)`` of device ``d - step.shift``'s block
    (``block`` rows long) for a halo step."""
    (lo0, hi0), (lo1, hi1) = step.before.halo_of(step.axis), step.after.halo_of(step.axis)
    if lo1 != lo0:
        return step.shift * block - lo1, lo1 - lo0
    return hi0 + (step.shift + 1) * block, hi1 - hi0


def _halo_transfer(step: Step, shape: tuple[int, ...], dtype, sizes: Mapping[str, int]) -> Transfer:
    """A halo step's collective-permute: its result is the rows it adds, across the block (and the rows earlier halo
    steps added on other axes)."""
    piece = [n // shard_count(sizes, m) + sum(step.before.halo_of(k)) for k, (n, m) in
             enumerate(zip(shape, step.before.layout, strict=True))]
    piece[step.axis] = _halo_side(step)[1]
    dtype = as_dtype(dtype)
    nbytes = int(jx.itemsize(dtype) * int(np.prod(piece)))
    groups = tuple(n for n in sizes if n in step.mesh_axes and sizes[n] > 1)
    return Transfer(TransferKind.COLLECTIVE_PERMUTE, groups, shard_count(sizes, groups), tuple(piece),
                    hlo_dtype_name(dtype), nbytes, float(nbytes))


def step_span(vtype: ValueType, axis: int, length: int, mesh_shape: Mapping[str, int]) -> Span | None:
    """The rows each device holds along ``axis`` (of ``length``) as a ``Span``: its span when ranged, equal
    blocks as ``Span(0, length / count)``; None when the axis is whole."""
    span = vtype.span_of(axis)
    if span is not None:
        return span
    mesh_axes = vtype.layout[axis]
    if not mesh_axes:
        return None
    count = shard_count(mesh_shape, mesh_axes)
    if length % count:
        raise ValueError(f"{vtype} lays axis {axis} of {length} out in {count} equal blocks, which do not divide it")
    return standard_span(length, count)


def realign_shift(step: Step) -> int:
    """How many rows further along the axis the start of each device's block is after a realign step than before."""
    before, after = step.before.span_of(step.axis), step.after.span_of(step.axis)
    return (before.offset if before else 0) - (after.offset if after else 0)


def realign_rounds(step: Step, count: int) -> tuple[tuple[Piece, ...], ...]:
    """A realign step's pieces in rounds, each round one ``ppermute`` (every device sends at most one piece and
    receives at most one): first the pieces a device keeps (sent nowhere), then the others, those from the same
    number of blocks away together. Only rows of the axis move; a row of it no device holds is the span's fill."""
    held = step.before.span_of(step.axis) or standard_span(step.length, count)
    wanted = step.after.span_of(step.axis) or standard_span(step.length, count)
    return span_rounds(held, wanted, step.length, count)


def unspan_rows(step: Step, count: int) -> int:
    """The rows each device sends in an unspan step: the most any device holds (each sends that many, padded)."""
    span = step.before.span_of(step.axis)
    return max(stop - first for first, stop in (span.held(d, step.length) for d in range(count)))


def unspan_sums(step: Step, count: int, dtype) -> bool:
    """True when an unspan step all-reduces the axis whole (each device's rows placed among zeros, summed: exact for
    integers) rather than all-gathering the rows each device holds, padded to the most any holds: where that padding
    makes the gather move more (``2 * length`` rows against ``count * most``: a strided slice's few rows on a few
    devices), for 32-bit integers. Floats are gathered: XLA:CPU's sum flushes subnormals and turns -0.0 into 0.0."""
    dtype = as_dtype(dtype)
    return dtype.itemsize == 4 and jx.dtype_kind(dtype) in "iu" and 2 * step.length < count * unspan_rows(step, count)


def _rows_transfer(step: Step, shape: tuple[int, ...], dtype, sizes: Mapping[str, int]) -> Transfer:
    """The collectives of a step on ranged rows: a realign's one or two collective-permutes (one record: the rows
    of both), an unspan's all-gather of the rows each device holds."""
    count = shard_count(sizes, step.mesh_axes)
    frame = step.before.frame(shape, sizes)
    piece = [n // shard_count(sizes, m) for n, m in zip(frame, step.before.layout, strict=True)]
    dtype = as_dtype(dtype)
    groups = tuple(n for n in sizes if n in step.mesh_axes and sizes[n] > 1)
    if step.kind is StepKind.REALIGN:  # one collective-permute per round, of its longest piece
        rounds = [r for r in realign_rounds(step, count) if moves_rows(r)]
        piece[step.axis] = rounds_rows(realign_rounds(step, count))
        nbytes = int(jx.itemsize(dtype) * int(np.prod(piece)))
        return Transfer(TransferKind.COLLECTIVE_PERMUTE, groups, shard_count(sizes, groups), tuple(piece),
                        hlo_dtype_name(dtype), nbytes, float(nbytes), arrays=len(rounds))
    summed = unspan_sums(step, count, dtype)
    piece[step.axis] = step.length if summed else count * unspan_rows(step, count)  # the result
    nbytes = int(jx.itemsize(dtype) * int(np.prod(piece)))
    n = shard_count(sizes, groups)
    kind = TransferKind.ALL_REDUCE if summed else TransferKind.ALL_GATHER
    return Transfer(kind, groups, n, tuple(piece), hlo_dtype_name(dtype), nbytes, moved(kind, n, nbytes))


def placing_step(vtype: ValueType) -> Step:
    """The step that puts the rows of a value held as ``vtype`` (placed: ``vtype.placement``) in their places: a
    mirror, a rotation or a route over the placement's mesh axes, leaving ``vtype.in_place()``.

    >>> from shardprop.core.types import Placement
    >>> str(placing_step(ValueType((("i",),), placement=Placement(PlacementKind.MIRRORED, ("i",)))))
    'mirror over i'
    """
    placement = vtype.placement
    return Step(_PLACING[placement.kind], placement.mesh_axes, vtype, vtype.in_place(), placement.axis)


def _placing_transfer(step: Step, shape: tuple[int, ...], dtype, sizes: Mapping[str, int]) -> Transfer:
    """A rotate or route step's collective-permutes, in one record as a realign's (``arrays``: how many): a rotation
    sends the rows of the one or two blocks each device's rows lie in (``shardprop.core.rounds.rotation_pieces``), a
    route the longest piece of each round that moves rows."""
    dtype, layout, placement = as_dtype(dtype), step.before.layout, step.before.placement
    groups = tuple(n for n in sizes if n in step.mesh_axes and sizes[n] > 1)
    count = shard_count(sizes, step.mesh_axes)
    if step.kind is StepKind.ROTATE:
        pieces = rotation_pieces(block_shape(shape, layout, sizes), step.axis, placement.shift, count)
        piece, arrays = list(pieces[0]), len(pieces)
        piece[step.axis] = sum(p[step.axis] for p in pieces)
    else:  # the routed axis may be ranged: blocks of its frame
        framed = tuple(count if k == step.axis else n for k, n in enumerate(shape))
        piece, arrays = list(block_shape(framed, layout, sizes)), sum(map(moves_rows, placement.rounds))
        piece[step.axis] = rounds_rows(placement.rounds)
    nbytes = int(jx.itemsize(dtype) * int(np.prod(piece)))
    return Transfer(TransferKind.COLLECTIVE_PERMUTE, groups, count, tuple(piece), hlo_dtype_name(dtype), nbytes,
                    float(nbytes), arrays=arrays)
