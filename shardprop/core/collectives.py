"""The collective that finishes a node whose devices each hold a partial result (``Collective``): what an
op's ``finish`` piece returns, and what the split pass decides in.

``CollectiveKind`` is an enum of strings, so ``collective.kind == "psum"`` keeps working, while code compares
against members and a typo is an error, not a silent ``False``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from ..expr import jax_adapter as jx
from ..expr.graph import Aval
from .layouts import Layout, block_shape, shard_count
from .steps import moves_rows, rounds_rows
from .transfers import Transfer, TransferKind, hlo_dtype_name, transfer
from .types import Reduction


class CollectiveKind(StrEnum):
    """The collective that finishes a node whose devices each hold a partial result."""

    PSUM = "psum"
    PMAX = "pmax"
    PMIN = "pmin"
    PPROD = "pprod"                # each device's product, multiplied together (one all-reduce)
    ARGMAX = "argmax"              # each device's winning index, offset, then agreed with pmax/pmin
    ARGMIN = "argmin"
    PREFIX = "prefix"              # each device's block total gathered, the totals before it combined into its scan
    MIRROR = "mirror"              # each device's reversed block sent to its mirror device (a collective-permute)
    TOP_K = "top_k"                # each device's k candidates all-gathered, the k best of them taken
    ROTATE = "rotate"              # blocks joined in place rotated into their places (one or two permutes: a roll)
    ROUTE = "route"                # operands' blocks joined in place, each piece sent to its block (rounds of permutes)

    @property
    def required(self) -> bool:
        """True for the finishes the op's rule relies on (it keeps the axis sharded): applied under every strategy."""
        return self in (CollectiveKind.PREFIX, CollectiveKind.MIRROR, CollectiveKind.ROTATE, CollectiveKind.ROUTE)

    @property
    def reduction(self) -> Reduction:
        """How the devices' partial results combine: the ``reduction`` of the type the node computes."""
        return _REDUCTIONS[self]


@dataclass(frozen=True, slots=True)
class FinishGeometry:
    """Where a finish works, for those that need more than the result's layout: the ``axis`` a top-k, a rotation or a
    route works along; the rows a rotation moves each device's rows by (``shift``); the rounds of pieces a route
    sends each device's rows in (``rounds``, ``shardprop.core.steps.Piece``: a concatenation's operands joined
    in place, a strided slice's picks) and the value of the rows no piece lands on (``fill``: a pad's rows no device
    holds); for a reduction over ranged axes, each one's ``(axis, mesh axes, span, length)`` (``rows``) and, for a
    maximum or a minimum, how many elements of ``fill`` (a pad's value) no device holds for each element of the
    result (``fill_count``): the finish takes them in, and counts them among the ties its derivative averages over."""

    axis: int | None = None
    shift: int = 0
    rounds: tuple = ()
    rows: tuple | None = None
    fill_count: int = 0
    fill: float | int | bool = 0


NO_GEOMETRY = FinishGeometry()


@dataclass(frozen=True, slots=True)
class Collective:
    """A node's partial results (computed partial over ``mesh_axes``) combined by ``kind``, right after the node. Which
    outputs it finishes, and into which layout (a reduce-scatter's is finer), the node's types say."""

    kind: CollectiveKind
    mesh_axes: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.kind} over {'*'.join(self.mesh_axes)}"


_REDUCTIONS = {CollectiveKind.PSUM: Reduction.SUM, CollectiveKind.PMAX: Reduction.MAX,
               CollectiveKind.PMIN: Reduction.MIN, CollectiveKind.PPROD: Reduction.PROD,
               CollectiveKind.ARGMAX: Reduction.ARGMAX, CollectiveKind.ARGMIN: Reduction.ARGMIN,
               CollectiveKind.PREFIX: Reduction.PREFIX, CollectiveKind.MIRROR: Reduction.MIRRORED,
               CollectiveKind.TOP_K: Reduction.TOP_K, CollectiveKind.ROTATE: Reduction.ROTATED,
               CollectiveKind.ROUTE: Reduction.ROUTED}


def finish_transfers(kind: CollectiveKind, mesh_axes: tuple[str, ...], aval: Aval, operand_dtype, layout: Layout,
                     mesh_shape, geometry: FinishGeometry | None = None) -> tuple[Transfer, ...]:
    """The all-reduces that finish a partial maximum, minimum, product or arg-extreme of ``aval`` laid out as ``layout``
    (a float ``pmax``/``pmin`` is one all-reduce of integers of the same size: total order keeps NaN and signed
    zeros); ``argmax``/``argmin`` also all-reduce the extreme values (of ``operand_dtype``) and, for floats, a NaN
    flag; ``prefix`` all-gathers one row per device (its block's total) along the scanned axis; ``top_k`` all-gathers
    each device's ``k`` candidates along ``axis`` (one gather per output); ``rotate`` permutes the rows ``shift`` rows
    further along ``axis`` into each device's block (``rotation_pieces``); ``route`` permutes the pieces of the
    joined blocks to theirs, in rounds (one record, as a realign's). (A partial sum is a move:
    ``shardprop.core.moves.move_transfers``.)"""
    geometry = geometry or NO_GEOMETRY
    axis, shift = geometry.axis, geometry.shift
    if kind is CollectiveKind.ROUTE:
        count = shard_count(mesh_shape, mesh_axes)
        rounds = geometry.rounds
        framed = tuple(count if k == axis else n for k, n in enumerate(aval.shape))  # (the routed axis may be ranged)
        piece = tuple(rounds_rows(rounds) if k == axis else n
                      for k, n in enumerate(block_shape(framed, layout, mesh_shape)))
        groups = tuple(n for n in mesh_shape if n in mesh_axes and mesh_shape[n] > 1)
        nbytes = _nbytes(piece, aval.dtype)
        return (Transfer(TransferKind.COLLECTIVE_PERMUTE, groups, count, piece, hlo_dtype_name(aval.dtype), nbytes,
                         float(nbytes), arrays=sum(map(moves_rows, rounds))),)
    if kind is CollectiveKind.TOP_K:  # each device's candidates of this output along ``axis`` (a top-k's values and
        # indices: the values' gather serves both outputs, XLA merging the two identical ones)
        n, axis = shard_count(mesh_shape, mesh_axes), axis % len(aval.shape)
        gathered = Aval(tuple(n * size if k == axis else size for k, size in enumerate(aval.shape)), aval.dtype)
        return (transfer(TransferKind.ALL_GATHER, mesh_axes, gathered, layout, mesh_shape),)
    if kind is CollectiveKind.ROTATE:  # the rows of the one or two blocks each device's rows lie in
        block = block_shape(aval.shape, layout, mesh_shape)
        return tuple(Transfer(TransferKind.COLLECTIVE_PERMUTE, tuple(n for n in mesh_shape if n in mesh_axes),
                              shard_count(mesh_shape, mesh_axes), piece, hlo_dtype_name(aval.dtype),
                              _nbytes(piece, aval.dtype), float(_nbytes(piece, aval.dtype)))
                     for piece in rotation_pieces(block, axis, shift, shard_count(mesh_shape, mesh_axes)))
    if kind is CollectiveKind.MIRROR:  # the block itself, once
        return (transfer(TransferKind.COLLECTIVE_PERMUTE, mesh_axes, aval, layout, mesh_shape),)
    if kind is CollectiveKind.PREFIX:
        (axis,) = [k for k, m in enumerate(layout) if m == tuple(mesh_axes)]
        n = shard_count(mesh_shape, mesh_axes)
        totals = Aval(tuple(n if k == axis else size for k, size in enumerate(aval.shape)), aval.dtype)
        gathered = tuple(() if k == axis else m for k, m in enumerate(layout))
        return (transfer(TransferKind.ALL_GATHER, mesh_axes, totals, gathered, mesh_shape),)
    dtypes = [aval.dtype]
    if kind in (CollectiveKind.ARGMAX, CollectiveKind.ARGMIN):
        dtypes += [operand_dtype] + ([np.dtype(np.int32)] if jx.dtype_kind(operand_dtype) == "f" else [])
    return tuple(transfer(TransferKind.ALL_REDUCE, mesh_axes, Aval(aval.shape, np.dtype(dt)), layout, mesh_shape)
                 for dt in dtypes)


def rotation_pieces(block: tuple[int, ...], axis: int, shift: int, count: int) -> list[tuple[int, ...]]:
    """The pieces a rotation by ``shift`` rows along ``axis`` (of ``count`` blocks of ``block``) sends: positions
    ``[0, B - r)`` of each device's block come from the block ``q`` devices further (around the end), positions
    ``[B - r, B)`` from the one ``q + 1`` further (``shift = q·B + r``); a piece from the device itself sends nothing.

    >>> rotation_pieces((4, 8, 2), 1, 63, 8)   # jnp.roll by 1 of 64 rows in blocks of 8: one row from the device before
    [(4, 1, 2)]
    """
    return [tuple(n if k != axis else stop - first for k, n in enumerate(block))
            for first, stop, away in rotation_split(block[axis], shift, count) if away]


def rotation_split(rows: int, shift: int, count: int) -> list[tuple[int, int, int]]:
    """``(first, stop, away)``: rows ``[first, stop)`` of the block ``away`` devices further (around the end) make up
    each device's block rotated by ``shift`` rows — in order, the empty pieces left out; ``away`` 0 is its own."""
    q, r = divmod(shift % (rows * count), rows)
    return [(first, stop, away) for first, stop, away in ((r, rows, q % count), (0, r, (q + 1) % count))
            if stop > first]


def _nbytes(shape: tuple[int, ...], dtype) -> int:
    return int(jx.itemsize(np.dtype(dtype)) * int(np.prod(shape)))
