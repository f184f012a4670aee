"""What moving data costs: one ``Transfer`` per collective, priced by the ring model.

The cost model (``splitting/cost.py``), the move planner (``core/moves.py``) and the HLO reader
(``backends/hlo.py``) all build these records, so an estimate and a measurement compare field by field.
``moved_bytes`` is what one device sends: ``2(n-1)/n·size`` for an all-reduce, ``(n-1)/n·size`` of the gathered
result for an all-gather, ``(n-1)·size`` of the scattered result for a reduce-scatter, ``(n-1)/n·size`` for an
all-to-all and ``size`` for a collective-permute, ``n`` being the number of devices in a group.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from ..expr import jax_adapter as jx
from ..expr.graph import Aval
from .layouts import Layout, block_shape, shard_count


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
    # a collective of a tuple (XLA combines several all-reduces): ``shape`` is its first array's; or the permutes of
    # one step that moves rows in pieces (a realign, a rotation, a route): ``shape`` is their pieces' rows together
    arrays: int = 1
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
