"""The Nx sharding data model: shards with parents, per-axis shardings, tensor shardings.

Every axis of every tensor is in one of three states:

* ``None`` — **replicated**: every device holds the whole axis.
* ``Sharded`` — laid out over one or more mesh axes (``mesh_axes``, major first) as equal,
  contiguous ``Shard``s; each shard records the ``parents`` it was computed from, so any output block
  can be traced back to the input slices it needs.
* ``Open`` — **unannotated** ("fully sharded a priori" in the Nx design): the axis adopts the sharding
  of whatever it meets. Opens exist only while propagating; the final product has none.

A ``Layout`` is the communication-relevant summary: per axis, the tuple of mesh axes (``()`` when
replicated). Splitting and lowering only need layouts; shards are for lineage and inspection.
"""

from __future__ import annotations


import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Union

from jax.sharding import PartitionSpec

from ..errors import DuplicateMeshAxisError, IndivisibleAxisError, SpecError, SpecRankError, UnknownMeshAxisError

Layout = tuple[tuple[str, ...], ...]


class Shard:
    """One contiguous range ``[start, start + length)`` of tensor axis ``axis``, with the shards it came from.

    Shards are many (one per block per axis per value), so they are slot objects with ids from a counter,
    and parents are shared tuples of existing shards, never copies.
    """

    __slots__ = ("id", "axis", "start", "length", "parents")

    def __init__(self, id: int, axis: int, start: int, length: int, parents: tuple[Shard, ...]):
        self.id, self.axis, self.start, self.length, self.parents = id, axis, start, length, parents

    @property
    def stop(self) -> int:
        return self.start + self.length

    def __repr__(self) -> str:
        parents = ",".join(str(p.id) for p in self.parents)
        return f"Shard(#{self.id} axis={self.axis} [{self.start}:{self.stop}] parents=[{parents}])"


@dataclass(frozen=True, slots=True, eq=False)
class Span:
    """Which rows of an axis each device holds when they are not the axis's equal blocks (a *ranged* axis, left by a
    slice, a pad or a concatenation along a sharded axis): the device at block index ``d`` holds rows
    ``[d * block - offset, (d + 1) * block - offset)``, padded to ``block`` rows where that range runs past the
    axis's ends (those rows hold anything: whatever reads them masks them). Rows of the axis that no device holds
    are all ``fill`` (a pad's value; None: every row is held by some device).

    Sliced from a 64-row axis in 8 blocks, ``x[:63]`` is ``Span(0, 8)`` (device 7 holds rows 56-62 and a row of
    padding) and ``x[63:]`` is ``Span(63, 8)`` (device 7 holds its one row; the others hold nothing); neither
    moved anything. ``jnp.pad(x, (3, 0))`` is ``Span(-3, 8, fill=0.0)``: rows 0-2 are zeros no device holds.
    """

    offset: int
    block: int
    fill: float | int | bool | None = None

    def __eq__(self, other) -> bool:  # a fill of -0.0 is not one of 0.0 (a reciprocal tells them apart)
        return isinstance(other, Span) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    @property
    def _key(self):
        return self.offset, self.block, fill_key(self.fill)

    def held(self, device: int, size: int) -> tuple[int, int]:
        """``(first, stop)``: the rows of an axis of ``size`` device ``device`` holds (``first == stop``: none)."""
        first = device * self.block - self.offset
        return max(0, min(size, first)), max(0, min(size, first + self.block))

    def covers(self, size: int, count: int) -> bool:
        """True when the ``count`` blocks hold every row of an axis of ``size``."""
        return self.offset >= 0 and count * self.block - self.offset >= size


def fill_key(fill) -> tuple:
    """A fill value as a key that tells -0.0 from 0.0 and a bool from an int (equal as Python numbers)."""
    if isinstance(fill, float):
        return ("float", fill, math.copysign(1.0, fill)) if not math.isnan(fill) else ("float", "nan")
    return (type(fill).__name__, fill)


def spelled(span: Span | None, size: int, count: int) -> Span | None:
    """``span`` as a type spells it: None where it is the equal blocks of an axis of ``size`` in ``count`` blocks."""
    if span is None or (span.offset == 0 and size % count == 0 and span.block == size // count):
        return None
    return span


def uneven_span(size: int, count: int) -> Span | None:
    """The span of an axis of ``size`` its ``count`` blocks do not divide: blocks of ``ceil(size / count)`` rows, the
    last ones short (an uneven argument's, a loop's carry); None where they divide it (equal blocks).

    >>> uneven_span(10, 8), uneven_span(64, 8)
    (Span(offset=0, block=2, fill=None), None)
    """
    return None if size % count == 0 else Span(0, -(-size // count))


def standard_span(size: int, count: int) -> Span:
    """The span of an axis of ``size`` laid out in ``count`` equal blocks (``size`` divisible by ``count``)."""
    return Span(0, size // count)


class Sharded:
    """An axis laid out over ``mesh_axes`` as ``len(shards)`` equal blocks, or — with a ``span`` — as blocks of
    the rows the span says (a ranged axis: each shard is the range a device holds, possibly empty)."""

    __slots__ = ("mesh_axes", "shards", "span")

    def __init__(self, mesh_axes: tuple[str, ...], shards: tuple[Shard, ...], span: Span | None = None):
        self.mesh_axes, self.shards, self.span = mesh_axes, shards, span

    def __repr__(self) -> str:
        ranged = "" if self.span is None else f" {self.span}"
        return f"Sharded({'*'.join(self.mesh_axes)}: {' '.join(f'#{s.id}' for s in self.shards)}{ranged})"


class Open:
    """An unannotated axis. ``key`` is the ``(value, axis)`` where it was created, used to resolve it."""

    __slots__ = ("key",)

    def __init__(self, key: tuple[int, int]):
        self.key = key

    def __repr__(self) -> str:
        return f"Open{self.key}"


AxisSharding = Union[Sharded, Open, None]


@dataclass(frozen=True, slots=True)
class TensorSharding:
    """The sharding of one tensor: one ``AxisSharding`` per axis."""

    shape: tuple[int, ...]
    axes: tuple[AxisSharding, ...]
    # Computed once: splitting and lowering ask for it on every edge. A ranged axis is no equal blocks of the
    # array: its layout is () (what a rule that knows nothing of ranges sees, and what the program returns), and
    # ``spans`` names its mesh axes and rows.
    layout: Layout = field(init=False, repr=False, compare=False)
    spans: tuple[tuple[tuple[str, ...], Span] | None, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "layout", tuple(a.mesh_axes if isinstance(a, Sharded) and a.span is None else ()
                                                 for a in self.axes))
        ranged = any(isinstance(a, Sharded) and a.span is not None for a in self.axes)
        object.__setattr__(self, "spans", tuple((a.mesh_axes, a.span) if isinstance(a, Sharded) and a.span is not None
                                                else None for a in self.axes) if ranged else ())

    def without_ranges(self) -> TensorSharding:
        """This sharding with its ranged axes replicated: what a rule that knows nothing of ranges is given (it then
        consumes the operand whole along them: gathered, the span's padding dropped)."""
        if not self.spans:
            return self
        return TensorSharding(self.shape, tuple(None if r is not None else a
                                                for a, r in zip(self.axes, self.spans, strict=True)))

    @property
    def spec(self) -> PartitionSpec:
        return layout_to_spec(self.layout)

    def format_dims(self) -> str:
        """``16@i,8@j``: each axis size, ``@`` the mesh axes it is sharded over (``?`` while open)."""
        return ",".join(_format_dim(n, a) for n, a in zip(self.shape, self.axes, strict=True))


def _format_dim(size: int, axis: AxisSharding) -> str:
    if isinstance(axis, Sharded):
        names = axis.mesh_axes
        return f"{size}@{names[0]}" if len(names) == 1 else f"{size}@({','.join(names)})"
    if isinstance(axis, Open):
        return f"{size}@?"
    return str(size)


def format_layout(shape: tuple[int, ...], layout: Layout, halo: tuple[tuple[int, int], ...] = (),
                  spans: tuple[Span | None, ...] = ()) -> str:
    """``16@i,8``; with a halo of one row on either side of axis 0, ``16@i<1,1>,8``; ranged (``Span``), the rows
    of device ``k``'s block: ``63@i[8k:8k+8],8`` (``x[:63]`` of 64 rows in 8 blocks), ``67@i[8k+3:8k+11]`` (64
    rows padded by 3 before)."""
    def one(n, m, rows, span) -> str:
        text = str(n) if not m else (f"{n}@{m[0]}" if len(m) == 1 else f"{n}@({','.join(m)})")
        if span is not None:
            text += f"[{_row(span.block, -span.offset)}:{_row(span.block, span.block - span.offset)}]"
        return text if rows == (0, 0) else f"{text}<{rows[0]},{rows[1]}>"

    return ",".join(one(n, m, halo[k] if halo else (0, 0), spans[k] if spans else None)
                    for k, (n, m) in enumerate(zip(shape, layout, strict=True)))


def _row(block: int, at: int) -> str:
    return f"{block}k" if at == 0 else f"{block}k{at:+d}"


def layout_to_spec(layout: Layout) -> PartitionSpec:
    entries = [None if not m else (m[0] if len(m) == 1 else m) for m in layout]
    while entries and entries[-1] is None:
        entries.pop()
    return PartitionSpec(*entries)


def shard_count(mesh_shape: Mapping[str, int], mesh_axes: tuple[str, ...]) -> int:
    return math.prod(mesh_shape[name] for name in mesh_axes)


def block_shape(shape: tuple[int, ...], layout: Layout, mesh_shape: Mapping[str, int]) -> tuple[int, ...]:
    """The per-device block shape of a tensor of ``shape`` laid out as ``layout``."""
    return tuple(n // shard_count(mesh_shape, m) for n, m in zip(shape, layout, strict=True))


def layout_from_spec(spec, shape: tuple[int, ...], mesh_shape: Mapping[str, int], what: str,
                     uneven: bool = False) -> Layout:
    """Validate a user's ``PartitionSpec`` for an argument of ``shape`` and return its layout.

    ``what`` names the argument in error messages (``"argument 0"``); ``uneven``: an axis its mesh axes do not
    divide is accepted (the caller lays it out in ranges, the last blocks short) rather than refused.
    """
    if not isinstance(spec, PartitionSpec):
        raise SpecError(f"{what}: expected a PartitionSpec or None, got {spec!r}")
    entries = tuple(spec)
    if len(entries) > len(shape):
        raise SpecRankError(
            f"{what}: spec {spec} has {len(entries)} entries but the argument has rank {len(shape)} "
            f"(shape {shape})"
        )
    layout: list[tuple[str, ...]] = []
    seen: set[str] = set()
    for axis, entry in enumerate(entries + (None,) * (len(shape) - len(entries))):
        if not (entry is None or isinstance(entry, str | tuple | list)):
            hint = (" (sp.AUTO stands for a whole spec: in_specs=sp.AUTO, or sp.AUTO in place of the argument's "
                    "PartitionSpec)" if repr(entry) == "sp.AUTO" else "")
            raise SpecError(f"{what}: spec {spec} has entry {entry!r} for axis {axis}: expected a mesh axis name, a "
                            f"tuple of names, or None{hint}")
        names = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        for name in names:
            if not isinstance(name, str) or name not in mesh_shape:
                raise UnknownMeshAxisError(
                    f"{what}: spec {spec} names mesh axis {name!r}, but the mesh has axes {tuple(mesh_shape)}"
                )
            if name in seen:
                raise DuplicateMeshAxisError(
                    f"{what}: spec {spec} uses mesh axis {name!r} for two tensor axes; a mesh axis may shard "
                    "at most one axis of a tensor"
                )
            seen.add(name)
        count = shard_count(mesh_shape, names)
        if shape[axis] % count and not uneven:
            raise IndivisibleAxisError(
                f"{what}: axis {axis} has size {shape[axis]}, not divisible by {count} "
                f"(mesh axes {'*'.join(names)} of spec {spec}, mesh {dict(mesh_shape)})"
            )
        layout.append(names)
    return tuple(layout)


def is_refinement(coarse: tuple[str, ...], fine: tuple[str, ...]) -> bool:
    """True when blocks laid out over ``fine`` can be cut locally out of blocks over ``coarse``: ``coarse``
    is a prefix of ``fine`` (replicated → sharded, or ``i`` → ``(i, j)``), so no communication is needed."""
    return fine[: len(coarse)] == coarse


def layout_refines(produced: Layout, needed: Layout) -> bool:
    """True when every axis of ``needed`` is a local slice of ``produced`` (no communication needed)."""
    if produced == needed:  # the common case, on every edge of the graph
        return True
    return all(n[: len(p)] == p for p, n in zip(produced, needed, strict=True))


def uses_mesh_axes_once(layout: Layout) -> bool:
    """True when no mesh axis shards two axes of the tensor (a layout must)."""
    names = [name for m in layout for name in m]
    return len(names) == len(set(names))


def common_layout(produced: Layout, needed: Layout) -> Layout:
    """Per axis, the longest common prefix: what must be moved so that ``needed`` is a local slice of it."""
    out = []
    for p, n in zip(produced, needed, strict=True):
        k = 0
        while k < min(len(p), len(n)) and p[k] == n[k]:
            k += 1
        out.append(p[:k])
    return tuple(out)
