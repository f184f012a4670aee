"""How a node computed on blocks is finished (``Collective``): what an op's ``finish`` piece returns, and what the
split pass decides in. A sum (``PSUM``) and a placement (``MIRROR``, ``ROTATE``, ``ROUTE``: the op ran in place and
left rows out of their blocks) are finished by moves (``shardprop.core.moves.plan_move``: the computed type holds
the pending sum, or the ``shardprop.core.types.Placement``); the other combines — a maximum, a minimum, a product,
an arg-extreme, a prefix, a top-k — read more than the value (the operand block, the op's own combine) and are a
``Finish`` of their own, priced by ``finish_transfers``.

``CollectiveKind`` is an enum of strings, so ``collective.kind == "psum"`` keeps working, while code compares
against members and a typo is an error, not a silent ``False``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from ..expr import jax_adapter as jx
from ..expr.graph import Aval
from .layouts import Layout, shard_count
from .transfers import Transfer, TransferKind, transfer
from .types import PlacementKind, Reduction


class CollectiveKind(StrEnum):
    """How a node whose devices each hold a partial result, or rows out of their places, is finished."""

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
    def reduction(self) -> Reduction | None:
        """How the devices' partial results combine: the ``reduction`` of the type the node computes; None for a
        placement (the node computes whole values, its rows out of their places)."""
        return _REDUCTIONS.get(self)

    @property
    def placement(self) -> PlacementKind | None:
        """Where the node leaves each device's rows, for a placement (``MIRROR``, ``ROTATE``, ``ROUTE``); else None."""
        return _PLACEMENTS.get(self)

    @property
    def by_moves(self) -> bool:
        """True for the finishes that are planned moves of the value alone (a sum, a placement); False for a
        ``Finish``."""
        return self is CollectiveKind.PSUM or self in _PLACEMENTS


@dataclass(frozen=True, slots=True)
class FinishGeometry:
    """Where a ``Finish`` works, for those that need more than the result's layout (an op's ``geometry`` piece): the
    ``axis`` a top-k works along; for a reduction over ranged axes, each one's ``(axis, mesh axes, span, length)``
    (``rows``) and, for a maximum or a minimum, how many elements of ``fill`` (a pad's value) no device holds for
    each element of the result (``fill_count``): the finish takes them in, and counts them among the ties its
    derivative averages over; ``elementwise`` for partial results combined element by element, reading no operand
    block (a scatter's maximum of integers)."""

    axis: int | None = None
    rows: tuple | None = None
    fill_count: int = 0
    fill: float | int | bool = 0
    elementwise: bool = False


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
               CollectiveKind.PREFIX: Reduction.PREFIX, CollectiveKind.TOP_K: Reduction.TOP_K}
_PLACEMENTS = {CollectiveKind.MIRROR: PlacementKind.MIRRORED, CollectiveKind.ROTATE: PlacementKind.ROTATED,
               CollectiveKind.ROUTE: PlacementKind.ROUTED}


def finish_transfers(kind: CollectiveKind, mesh_axes: tuple[str, ...], aval: Aval, operand_dtype, layout: Layout,
                     mesh_shape, geometry: FinishGeometry | None = None) -> tuple[Transfer, ...]:
    """The all-reduces that finish a partial maximum, minimum, product or arg-extreme of ``aval`` laid out as ``layout``
    (a float ``pmax``/``pmin`` is one all-reduce of integers of the same size: total order keeps NaN and signed
    zeros); ``argmax``/``argmin`` also all-reduce the extreme values (of ``operand_dtype``) and, for floats, a NaN
    flag; ``prefix`` all-gathers one row per device (its block's total) along the scanned axis; ``top_k`` all-gathers
    each device's ``k`` candidates along ``axis`` (one gather per output). (A partial sum and a placement are moves:
    ``shardprop.core.moves.move_transfers``.)"""
    geometry = geometry or NO_GEOMETRY
    if kind is CollectiveKind.TOP_K:  # each device's candidates of this output along ``axis`` (a top-k's values and
        # indices: the values' gather serves both outputs, XLA merging the two identical ones)
        n, axis = shard_count(mesh_shape, mesh_axes), geometry.axis % len(aval.shape)
        gathered = Aval(tuple(n * size if k == axis else size for k, size in enumerate(aval.shape)), aval.dtype)
        return (transfer(TransferKind.ALL_GATHER, mesh_axes, gathered, layout, mesh_shape),)
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
