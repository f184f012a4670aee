"""The collective that finishes a node whose devices each hold a partial result (:class:`Collective`): what an
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
from .layouts import Layout
from .transfers import Transfer, TransferKind, transfer
from .types import Reduction


class CollectiveKind(StrEnum):
    """The collective that finishes a node whose devices each hold a partial result."""

    PSUM = "psum"
    PMAX = "pmax"
    PMIN = "pmin"
    ARGMAX = "argmax"              # each device's winning index, offset, then agreed with pmax/pmin
    ARGMIN = "argmin"

    @property
    def reduction(self) -> Reduction:
        """How the devices' partial results combine: the ``reduction`` of the type the node computes."""
        return Reduction.SUM if self is CollectiveKind.PSUM else Reduction(str(self).removeprefix("p"))


@dataclass(frozen=True, slots=True)
class Collective:
    """A node's partial results (computed partial over ``mesh_axes``) combined by ``kind``, right after the node. Which
    outputs it finishes, and into which layout (a reduce-scatter's is finer), the node's types say."""

    kind: CollectiveKind
    mesh_axes: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.kind} over {'*'.join(self.mesh_axes)}"


def finish_transfers(kind: CollectiveKind, mesh_axes: tuple[str, ...], aval: Aval, operand_dtype, layout: Layout,
                     mesh_shape) -> tuple[Transfer, ...]:
    """The all-reduces that finish a partial maximum, minimum or arg-extreme of ``aval`` laid out as ``layout``
    (a float ``pmax``/``pmin`` is one all-reduce of integers of the same size: total order keeps NaN and signed
    zeros); ``argmax``/``argmin`` also all-reduce the extreme values (of ``operand_dtype``) and, for floats, a NaN
    flag. (A partial sum is a move: :func:`~shardprop.core.moves.move_transfers`.)"""
    dtypes = [aval.dtype]
    if kind in (CollectiveKind.ARGMAX, CollectiveKind.ARGMIN):
        dtypes += [operand_dtype] + ([np.dtype(np.int32)] if jx.dtype_kind(operand_dtype) == "f" else [])
    return tuple(transfer(TransferKind.ALL_REDUCE, mesh_axes, Aval(aval.shape, np.dtype(dt)), layout, mesh_shape)
                 for dt in dtypes)
