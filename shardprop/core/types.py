"""A value's type after splitting: how each device holds its block (``ValueType``).

``layout`` says which block of the value each device holds (per tensor axis, the mesh axes it is laid out over,
major first). ``partial`` names the mesh axes over which the devices of a group each hold one *summand* of that
block: the value is their sum, not yet reduced (Shardy's unreduced axes, JAX's ``P(unreduced=...)``, DTensor's
``Partial``). A mesh axis shards a value or sums it, never both. A maximum (minimum, arg-maximum) over a sharded
axis is partial too until its collective combines the devices' results (``reduction``); only sums move and
wait: the others are finished right after the op that computed them. A cumulative op (``cumsum``) over an axis
sharded over mesh axes computes each block's own scan: partial over those same axes (``reduction`` ``PREFIX``, the
one partial type whose mesh axes also shard it), finished by combining the totals of the blocks before each.
``placement`` says where each device's rows lie when an op ran in place but left them out of their blocks
(``Placement``): a reversal done block by block (each device holds its mirror device's block), blocks joined in
place and rotated (a roll), pieces of other blocks (a concatenation joined in place, a strided slice's picks). A
placed value is whole — nothing pending to combine — and one step of a move (``MIRROR``, ``ROTATE``, ``ROUTE``,
``shardprop.core.steps``) puts its rows in place, planned, priced and run as every other step.
``halo`` is what a windowed op (a convolution, a pooling window) reads past its block along a sharded axis: each
device also holds that many rows of its neighbours' blocks on either side (zeros past the ends of the array). A
haloed value lives only between the move that exchanges the rows and the op that reads them. ``span`` gives a
*ranged* axis's rows (``shardprop.core.layouts.Span``): a slice, pad or concatenation along a sharded axis
leaves each device the rows of its own block (possibly fewer, or none), not equal blocks of the result; a ranged
value lives inside its stage (the program returns, and stages pass, equal blocks). Every move between two types — a
gather, an all-to-all, a psum, a halo exchange, a realignment of ranged rows, taking a whole value as a partial one —
is planned by ``shardprop.core.moves``.

    ``type_string(Aval((16, 8), float32), ValueType((("i",), ()), partial=("j",)))`` is ``'f32[16@i,8]{+j}'``;
    with ``halo=((1, 2), (0, 0))``, ``'f32[16@i<1,2>,8]'``; ranged, ``'f32[15@i[4k:4k+4],8]'``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from enum import StrEnum

from ..expr.graph import short_dtype, value_name
from .layouts import Layout, Span, format_layout, shard_count, uneven_span


class Reduction(StrEnum):
    """How the devices' partial results of a value combine."""

    SUM = "sum"
    MAX = "max"
    MIN = "min"
    PROD = "prod"
    ARGMAX = "argmax"
    ARGMIN = "argmin"
    PREFIX = "prefix"  # a cumulative op scanned block by block: each block lacks what the blocks before it hold
    TOP_K = "top-k"  # a top-k of each block: each device holds its block's k best, the candidates for the whole


class PlacementKind(StrEnum):
    """Where each device's rows lie, when not in its own block (``Placement``)."""

    MIRRORED = "mirrored"  # a reversal done block by block: each device holds the block its mirror device should
    ROTATED = "rotated"  # blocks joined in place, rotated: each device holds rows some blocks further (a roll)
    ROUTED = "routed"  # pieces of other devices' blocks (operands joined in place, a strided slice's picks)


@dataclass(frozen=True, slots=True)
class Placement:
    """Each device's rows held out of their places along the axes laid out over ``mesh_axes``: ``kind`` says how
    (a ``MIRRORED`` block belongs to the device at the mirrored position along every reversed axis), ``axis`` is the
    tensor axis a rotation or a route works along, ``shift`` how many rows further a rotated device's rows lie,
    ``rounds`` the pieces a route carries in rounds (``shardprop.core.rounds.Piece``) and ``fill`` the value of
    the rows no piece lands on (a pad's rows no device holds).

    >>> str(Placement(PlacementKind.ROTATED, ("i",), axis=0, shift=63))
    'rotated i'
    """

    kind: PlacementKind
    mesh_axes: tuple[str, ...]
    axis: int | None = None
    shift: int = 0
    rounds: tuple = ()
    fill: float | int | bool = 0

    def __str__(self) -> str:
        return f"{self.kind} {'*'.join(self.mesh_axes)}"


@dataclass(frozen=True, slots=True)
class ValueType:
    """How each device holds a value: its ``layout``, the mesh axes over which it is an unreduced sum (a set,
    kept sorted so that equal types compare equal; a whole value's ``reduction`` is always ``SUM``), the
    neighbours' rows it also holds (``halo``), a ranged axis's rows (``span``), and where an op left its rows
    (``placement``, a whole value's only)."""

    layout: Layout
    partial: tuple[str, ...] = ()
    reduction: Reduction = Reduction.SUM  # how the partial results combine (meaningful when partial)
    # per tensor axis, (rows before, rows after) of the neighbours' blocks each device also holds; () for none
    halo: tuple[tuple[int, int], ...] = ()
    # per tensor axis, the rows each device holds of a ranged axis (laid out over the layout's mesh axes), or None;
    # () for none
    span: tuple[Span | None, ...] = ()
    placement: Placement | None = None  # rows held out of their places (a whole value's only), or None: in place
    # types key the IR's refs, asked for on every edge: hashed once
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        if self.halo and not any(lo or hi for lo, hi in self.halo):  # no rows from anyone: one spelling
            object.__setattr__(self, "halo", ())
        if self.span and all(s is None for s in self.span):
            object.__setattr__(self, "span", ())
        if not self.partial:  # the common case, on every edge of 10^5-node graphs
            if self.reduction is not Reduction.SUM:  # a whole value is a whole value, however it was combined
                object.__setattr__(self, "reduction", Reduction.SUM)
        else:
            if list(self.partial) != sorted(self.partial):  # a set of mesh axes: one spelling, so equal types are equal
                object.__setattr__(self, "partial", tuple(sorted(self.partial)))
            used = {name for m in self.layout for name in m}
            if used & set(self.partial) and self.reduction is not Reduction.PREFIX:
                raise ValueError(f"a mesh axis cannot both shard and sum a value: layout {self.layout}, partial "
                                 f"{self.partial}")
            if self.placement is not None:
                raise ValueError(f"a partial value is combined in place: partial {self.partial}, {self.placement}")
        object.__setattr__(self, "_hash", hash((self.layout, self.partial, self.reduction, self.halo, self.span,
                                                self.placement)))

    def __hash__(self) -> int:
        return self._hash

    @property
    def rows_in_place(self) -> bool:
        """True when each device's block holds the rows its layout (and span) name, or a partial result of them —
        not rows bound for other devices (``placement``: a reversal, a rotation or a route still pending) nor a
        top-k's candidates."""
        return self.placement is None and (not self.partial or self.reduction is not Reduction.TOP_K)

    @property
    def pending(self) -> bool:
        """True while something remains to be done to the devices' blocks before they are the value's: a combine
        (``partial``) or putting the rows in place (``placement``). A pending value never leaves its stage."""
        return bool(self.partial) or self.placement is not None

    def in_place(self) -> ValueType:
        """This type with its rows in their places: what the step that undoes ``placement`` leaves."""
        return ValueType(self.layout, self.partial, self.reduction, self.halo, self.span) if self.placement else self

    @property
    def is_partial_sum(self) -> bool:
        """Partial, and summed: the only partial values that move and wait (linear ops pass them on)."""
        return bool(self.partial) and self.reduction is Reduction.SUM

    def without_halo(self) -> ValueType:
        """This type without the neighbours' rows: the blocks a halo exchange starts from."""
        return ValueType(self.layout, self.partial, self.reduction, span=self.span,
                         placement=self.placement) if self.halo else self

    @property
    def even_layout(self) -> Layout:
        """The layout of the axes held in equal blocks: ``layout`` with its ranged axes whole."""
        if not self.span:
            return self.layout
        return tuple(() if s is not None else m for m, s in zip(self.layout, self.span, strict=True))

    def span_of(self, axis: int) -> Span | None:
        """The rows each device holds along ``axis`` when it is ranged; None for equal blocks (or whole)."""
        return self.span[axis] if self.span else None

    def without_span(self) -> ValueType:
        """This type as equal blocks of its frame (the array padded to whole blocks): what the collectives see."""
        return ValueType(self.layout, self.partial, self.reduction, self.halo,
                         placement=self.placement) if self.span else self

    def frame(self, shape: tuple[int, ...], mesh_shape) -> tuple[int, ...]:
        """``shape`` with each ranged axis as long as its blocks together (``count * block``): the global shape a
        ranged value's blocks make up inside ``shard_map``."""
        if not self.span:
            return tuple(shape)
        return tuple(n if s is None else shard_count(mesh_shape, m) * s.block
                     for n, m, s in zip(shape, self.layout, self.span, strict=True))

    def halo_of(self, axis: int) -> tuple[int, int]:
        """``(rows before, rows after)`` this type holds past its block along tensor axis ``axis``."""
        return self.halo[axis] if self.halo else (0, 0)


@functools.lru_cache(maxsize=65536)
def held_whole(layout: Layout) -> ValueType:
    """The type of a whole (not partial) value laid out as ``layout``: one shared instance per layout (the passes ask
    on every edge of 10^5-node graphs)."""
    return ValueType(layout)


def whole(layouts) -> tuple[ValueType, ...]:
    """Layouts as the types of whole (not partial) values."""
    return _whole(tuple(layouts))


@functools.lru_cache(maxsize=65536)
def _whole(layouts: tuple) -> tuple[ValueType, ...]:
    # a graph has few distinct layouts, asked for on every edge
    return tuple(held_whole(layout) for layout in layouts)


def type_string(aval, vtype: ValueType) -> str:
    """``f32[16@i,8@j]``: dtype, and each axis's size ``@`` the mesh axes it is laid out over (``<1,1>``: one row of
    each neighbour's block on either side, a halo); a partial sum over
    ``j`` adds ``{+j}`` (a partial maximum ``{max j}``): ``f32[16@i,8]{+j}``. The one spelling of a sharded type,
    in every listing, table and message."""
    text = f"{short_dtype(aval.dtype)}[{format_layout(aval.shape, vtype.layout, vtype.halo, vtype.span)}]"
    return f"{text}{{{pending_text(vtype)}}}" if vtype.pending else text


def pending_text(vtype: ValueType) -> str:
    """The combine (or placement) still pending, as a type spells it inside its braces: ``+j`` (a sum over ``j``),
    ``max i*j``, ``rotated i``; ``""`` when nothing is pending."""
    if vtype.placement is not None:
        return str(vtype.placement)
    if not vtype.partial:
        return ""
    how = "+" if vtype.reduction is Reduction.SUM else f"{vtype.reduction} "
    return f"{how}{'*'.join(vtype.partial)}"


def typed(value: int, aval, vtype: ValueType) -> str:
    """``c:f32[16@i,8]``: the value's listing name and its ``type_string``."""
    return f"{value_name(value)}:{type_string(aval, vtype)}"


def carried_type(shape: tuple[int, ...], layout: Layout, mesh_shape, partial: tuple[str, ...] = ()) -> ValueType:
    """The type of a value laid out as ``layout`` (partial over ``partial``), each axis its mesh axes do not divide
    ranged in blocks of ``ceil(n / count)`` rows (``shardprop.core.layouts.uneven_span``: a loop's carry)."""
    rows = tuple(uneven_span(n, shard_count(mesh_shape, m)) if m else None for n, m in zip(shape, layout, strict=True))
    return ValueType(layout, partial, span=rows if any(r is not None for r in rows) else ())
