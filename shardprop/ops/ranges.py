"""Slices, pads and concatenations along a sharded axis: the axis stays sharded, each device keeping the rows of its
own block — a *ranged* axis (``shardprop.core.layouts.Span``), as Nx gives every shard a range.

``x[:, :63]`` of a 64-row axis in 8 blocks leaves device 7 rows 56-62 (and a row of padding), ``x[:, 63:]`` leaves
device 7 its one row and the others none, ``jnp.pad(x, (3, 0))`` leaves every block where it was, rows 0-2 being zeros
no device holds: nothing moves. Where the result divides into equal blocks (``jnp.roll``, a shift, the
``K`` shifted slices of a causal convolution, two sequences joined), the op reads its operand's rows *realigned* to
those blocks — each device receives the rows it lacks from the devices holding them, a few per permute — and its
result is an ordinary sharded value. An
axis taken whole keeps its sharding (ranged or not); a strided slice keeps it where every block is ``s`` times its
output block (``x[::2]``), and a pad whose interior padding spreads every block in place (their gradients).

A rule that knows nothing of ranges sees a ranged axis replicated: its operand is gathered along it (only the rows
the devices hold, the span's padding dropped) — what ``jax.jit`` does for an uneven result, which a JAX array cannot
hold sharded either.

Lineage: each output element reads the operand element it was cut from, or the padding value.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
from jax import lax

from ..core.blocks import Blocks, block_index, cut_outputs
from ..core.boxes import Box, LineageContext, product
from ..core.layouts import Shard, Sharded, fill_key, Span, TensorSharding, shard_count, standard_span
from ..core.collectives import Collective, CollectiveKind, FinishGeometry
from ..core.steps import Piece, in_rounds, realign_rows, rounds_rows, route_rounds
from ..core.rules import RuleContext, RuleOutput
from ..core.types import ValueType
from ..expr import jax_adapter as jx
from .opdef import Family, Linearity, OpDef
from .windows import past_the_ends

# per operand, per axis: (mesh axes, span) the rule reads that axis in, or None
NeedSpans = tuple[tuple[tuple[tuple[str, ...], Span] | None, ...], ...]


def _rows(ctx: RuleContext, operand: TensorSharding, k: int) -> tuple[tuple[str, ...], Span] | None:
    """``(mesh axes, span)`` of operand axis ``k`` when it is laid out over mesh axes (equal blocks: the standard
    span); None when it is whole (or open), or when the result is a PRNG key array (whose blocks are not padded
    or masked: its ranged axes are read whole)."""
    a = operand.axes[k]
    if not isinstance(a, Sharded) or not a.mesh_axes or jx.is_extended_dtype(ctx.out_avals[0].dtype):
        return None
    return a.mesh_axes, a.span or standard_span(operand.shape[k], shard_count(ctx.mesh_shape, a.mesh_axes))


def _kept(ctx: RuleContext, operand: TensorSharding, k: int, size: int):
    """Operand axis ``k`` taken whole: ``(output axis, need layout, need span)`` — ranged or not, as it is held."""
    a = operand.axes[k]
    if isinstance(a, Sharded) and a.span is not None:
        return ctx.ranged(k, size, a.mesh_axes, a.span, [(a, 0)]), (), (a.mesh_axes, a.span)
    return (ctx.carry(k, size, a), operand.layout[k], None)


def _cut(ctx: RuleContext, operand: TensorSharding, k: int, size: int, shift: int, fill):
    """Output axis ``k`` of ``size`` rows, row ``r`` being operand row ``r + shift`` (or ``fill``, a pad's value, where
    that is not one; None for a slice): ``(output axis, need layout, need span)``, or None when the operand axis is
    not laid out over mesh axes. Where the output is equal blocks as long as the operand's, the op reads its operand
    realigned to them; else each device keeps the rows it holds (nothing moves)."""
    rows = _rows(ctx, operand, k)
    if rows is None:
        return None
    mesh_axes, span = rows
    source = operand.axes[k]
    count = shard_count(ctx.mesh_shape, mesh_axes)
    if size % count == 0:  # equal blocks: each device reads the rows its block needs (a few move)
        out = Span(0, size // count)
        need = Span(-shift, size // count, span.fill)
    else:  # each device keeps its rows: out row r = operand row r + shift
        out = Span(span.offset + shift, span.block, None)
        need = span
    if not out.covers(size, count):  # the rows no device holds: the padding value, or those the operand lacked too
        out = Span(out.offset, out.block, span.fill if fill is None else fill)
    return ctx.ranged(k, size, mesh_axes, out, [(source, shift)]), (), (mesh_axes, need)


def slice_(ctx: RuleContext, operand: TensorSharding, *, start_indices, limit_indices, strides, **params):
    """An axis taken whole keeps its sharding (ranged or not); a sharded axis sliced with stride 1 stays sharded,
    each device keeping its rows (realigned to equal blocks where the slice is as long as ``count`` blocks); a
    strided slice keeps the axis where every block is ``s`` times its output block (``x[::2]``)."""
    out_shape = ctx.out_avals[0].shape
    strides = strides or (1,) * len(out_shape)
    axes, need, spans = [], [], []
    for k, (s, lim, n, stride) in enumerate(zip(start_indices, limit_indices, operand.shape, strides, strict=True)):
        s, lim, stride, size = int(s), int(lim), int(stride), out_shape[k]
        cut = None
        if s == 0 and lim == n and stride == 1:
            cut = _kept(ctx, operand, k, size)
        elif size == 0:  # nothing taken: the operand read as it is held (nothing moves)
            held = operand.axes[k]
            ranged = isinstance(held, Sharded) and held.span is not None
            cut = (None, () if ranged else operand.layout[k], (held.mesh_axes, held.span) if ranged else None)
        elif stride == 1 and size > 0:
            cut = _cut(ctx, operand, k, size, s, None)
        elif size > 0:
            cut = _stepped(ctx, operand, k, size, s, stride)
        axis, layout, span = cut if cut is not None else (None, (), None)
        axes.append(axis)
        need.append(layout)
        spans.append(span)
    return _output(TensorSharding(tuple(out_shape), tuple(axes)), [tuple(need)], [tuple(spans)])


def _stepped(ctx: RuleContext, operand: TensorSharding, k: int, size: int, start: int, stride: int):
    """Output axis ``k`` of ``size`` rows, row ``r`` being operand row ``start + stride * r`` (a strided slice):
    ``(output axis, need layout, need span)``, or None when the operand axis is not laid out over mesh axes. The
    output is in blocks of ``strided_layout``'s rows (equal where they divide it, else ranged); each device picks
    its block's rows in place where they are its rows of the result (``x[::2]``, ``x[::9]`` of blocks of 8), else
    reads the ``stride`` times as many operand rows its block picks from, realigned there (``x[::3]``: a few rows
    move; a ``route`` of each device's own picks may replace that: ``finish_slice``)."""
    rows = _rows(ctx, operand, k)
    if rows is None:
        return None
    mesh_axes, span = rows
    count = shard_count(ctx.mesh_shape, mesh_axes)
    length = operand.shape[k]
    layout = strided_layout(span, length, start, stride, size, count)
    block = layout.block
    need = span if layout.in_place else Span(-start, stride * block, span.fill)
    out = _stepped_axis(ctx, k, size, mesh_axes, block, start, stride, operand.axes[k])
    standard = operand.axes[k].span is None and need == span
    return out, (mesh_axes if standard else ()), (None if standard else (mesh_axes, need))


def _stepped_axis(ctx: RuleContext, k: int, size: int, mesh_axes, block: int, start: int, stride: int, source):
    """The output axis of a strided slice in blocks of ``block``: each device's shard has as parents the operand shards
    holding the rows it picks."""
    axis = ctx.ranged(k, size, mesh_axes, Span(0, block), [])
    shards = []
    for shard in axis.shards:
        first, stop = start + stride * shard.start, start + stride * (shard.stop - 1) + 1
        parents = tuple(s for s in source.shards if shard.length and s.start < stop and first < s.stop)
        shards.append(Shard(shard.id, shard.axis, shard.start, shard.length, parents))
    return Sharded(axis.mesh_axes, tuple(shards), axis.span)


def _output(out: TensorSharding, needs: list, spans: list) -> RuleOutput:
    read = tuple(spans) if any(s is not None for per in spans for s in per) else None
    return RuleOutput((out,), tuple(needs), need_spans=read)


def pad(ctx: RuleContext, operand: TensorSharding, padding_value: TensorSharding, *, padding_config, **params):
    """An axis not padded keeps its sharding (ranged or not); a sharded axis padded (or cut: negative padding) at its
    ends by a literal value stays sharded, each device keeping its rows — the padding rows are the value, no device
    holds them — or realigned to equal blocks where the result is as long as ``count`` blocks. A sharded axis spread
    every ``s``-th element from one of the first ``s`` (the gradient of ``x[1::2]``) keeps its sharding, each device
    spreading its own block."""
    fill = ctx.scalar_constant(1)
    if isinstance(fill, float) and math.isnan(fill):
        fill = None  # a NaN row cannot be told from another: pad on whole rows
    out_shape = ctx.out_avals[0].shape
    axes, need, spans = [], [], []
    writes = any(tuple(c) != (0, 0, 0) for c in padding_config)
    for k, (lo, hi, interior) in enumerate((int(lo), int(hi), int(i)) for lo, hi, i in padding_config):
        size = out_shape[k]
        cut = None
        rows = _rows(ctx, operand, k)
        if (lo, hi, interior) == (0, 0, 0):
            held = rows[1] if rows is not None else None
            if writes and held is not None and held.fill is not None and (fill is None or
                                                                        fill_key(held.fill) != fill_key(fill)):
                # rows no device holds, of another value than the pad writes across them: held by some device
                # first (their corner with the pad's rows is the pad's value, not their fill)
                count = shard_count(ctx.mesh_shape, rows[0])
                covering = Span(0, -(-size // count))
                cut = (ctx.ranged(k, size, rows[0], covering, [(operand.axes[k], 0)]), (), (rows[0], covering))
            else:
                cut = _kept(ctx, operand, k, size)
        elif interior == 0 and rows is not None and fill is not None and size > 0 and (
                rows[1].fill is None or fill_key(rows[1].fill) == fill_key(fill)):
            cut = _cut(ctx, operand, k, size, -lo, fill)
        elif rows is not None and operand.axes[k].span is None and _spread_in_blocks(operand, k, lo, hi, interior):
            cut = (ctx.carry(k, size, operand.axes[k]), operand.layout[k], None)
        elif interior > 0 and rows is not None and rows[1].fill is None and fill is not None and size > 0:
            cut = _spread(ctx, operand, k, size, lo, interior + 1, fill)
        axis, layout, span = cut if cut is not None else (None, (), None)
        axes.append(axis)
        need.append(layout)
        spans.append(span)
    scalar = ((),) * len(padding_value.shape)
    return _output(TensorSharding(tuple(out_shape), tuple(axes)), [tuple(need), scalar],
                   [tuple(spans), (None,) * len(padding_value.shape)])


def _spread(ctx: RuleContext, operand: TensorSharding, k: int, size: int, low: int, stride: int, fill):
    """Output axis ``k`` of ``size`` rows, operand row ``j`` landing on row ``low + stride * j`` (a pad with interior
    padding: the gradient of a strided window or slice): each device spreads its own block in place, ``stride`` times
    as long — a ranged axis whose rows no device holds (before ``low``, past the last block) are the pad's value."""
    mesh_axes, span = _rows(ctx, operand, k)
    count = shard_count(ctx.mesh_shape, mesh_axes)
    out = Span(stride * span.offset - low, stride * span.block)
    if not out.covers(size, count):
        out = Span(out.offset, out.block, fill)
    axis = ctx.ranged(k, size, mesh_axes, out, [])
    return axis, (), (mesh_axes, span)


def _spread_in_blocks(operand: TensorSharding, k: int, low: int, high: int, interior: int) -> bool:
    """Axis ``k`` padded to every ``interior + 1``-th element from ``low``, ending a stride's length past the last: each
    block of the output is the block of the operand at the same position, padded alike."""
    stride = interior + 1
    return bool(operand.layout[k]) and stride > 1 and 0 <= low < stride and high == stride - 1 - low


def concatenate(ctx: RuleContext, *operands: TensorSharding, dimension, **params):
    """The other axes merge as an elementwise op's. Along the joined axis, when the operands laid out on it agree on
    their mesh axes, the result stays sharded over them: in equal blocks where it divides (``jnp.roll``: two slices
    joined; two sequences end to end), else in the operands' blocks, ranged; each device reads the rows of each
    operand that land in its block (its own and a neighbour's few, realigned; an operand held whole is cut locally).
    Otherwise the joined axis is needed whole and comes out replicated."""
    out_shape = ctx.out_avals[0].shape
    plain = [TensorSharding(op.shape, tuple(None if k != dimension and r is not None else a for k, (a, r) in
                                            enumerate(zip(op.axes, op.spans or (None,) * len(op.shape), strict=True))))
             for op in operands]
    axes = [None if k == dimension else ctx.merge(k, n, [op.axes[k] for op in plain]) for k, n in enumerate(out_shape)]
    laid = {rows for rows in (_rows(ctx, op, dimension) for op in plain) if rows is not None}
    size = out_shape[dimension]
    out_layout = tuple(a.mesh_axes if isinstance(a, Sharded) else () for a in axes)
    needs = [tuple(m if k != dimension else () for k, m in enumerate(out_layout)) for _ in operands]
    meshes = {mesh_axes for mesh_axes, _ in laid}
    if len(meshes) != 1 or size == 0:
        return RuleOutput((TensorSharding(out_shape, tuple(axes)),), tuple(needs))
    (mesh_axes,) = meshes
    count = shard_count(ctx.mesh_shape, mesh_axes)
    blocks = {span.block for _, span in laid}
    if size % count == 0:  # equal blocks of the result
        block = size // count
    elif len(blocks) == 1 and count * min(blocks) >= size:  # the operands' blocks, ranged
        block = min(blocks)
    else:
        return RuleOutput((TensorSharding(out_shape, tuple(axes)),), tuple(needs))
    if any(set(mesh_axes) & set(m) for m in out_layout):
        return RuleOutput((TensorSharding(out_shape, tuple(axes)),), tuple(needs))
    spans, offset, sources = [], 0, []
    for op in plain:
        rows = _rows(ctx, op, dimension)
        fill = None if rows is None else rows[1].fill
        reads = [None] * len(out_shape)
        reads[dimension] = (mesh_axes, Span(offset, block, fill))
        spans.append(tuple(reads))
        if rows is not None:
            sources.append((op.axes[dimension], -offset))
        offset += op.shape[dimension]
    axes[dimension] = ctx.ranged(dimension, size, mesh_axes, Span(0, block), sources)
    return _output(TensorSharding(out_shape, tuple(axes)), needs, spans)


def split_in_place(ctx: RuleContext, operand: TensorSharding, axis: int) -> RuleOutput | None:
    """The pieces of a ``split`` along an axis laid out over mesh axes, each ranged in place — every device keeps the
    rows of its block that are the piece's (each piece's block is the operand's block, the other pieces' rows its
    padding): nothing moves. None for an axis held whole."""
    rows = _rows(ctx, operand, axis)
    if rows is None:
        return None
    mesh_axes, span = rows
    count = shard_count(ctx.mesh_shape, mesh_axes)
    outputs, offset = [], 0
    kept = [None if k == axis else _kept(ctx, operand, k, n) for k, n in enumerate(operand.shape)]
    for aval in ctx.out_avals:
        size = aval.shape[axis]
        piece = Span(span.offset + offset, span.block, None)
        if not piece.covers(size, count):
            piece = Span(piece.offset, piece.block, span.fill)
        axes = tuple(ctx.ranged(axis, size, mesh_axes, piece, [(operand.axes[axis], offset)]) if k == axis else
                     kept[k][0] for k in range(len(aval.shape)))
        outputs.append(TensorSharding(aval.shape, axes))
        offset += size
    need = tuple(() if k == axis else kept[k][1] for k in range(len(operand.shape)))
    reads = tuple((mesh_axes, span) if k == axis else kept[k][2] for k in range(len(operand.shape)))
    return RuleOutput(tuple(outputs), (need,), need_spans=(reads,))


def split_block(node, invals, blocks: Blocks) -> list:
    """Pieces kept in place (ranged): each is the operand's block itself; else each device cuts its block of each
    piece out of the whole axis."""
    (x,) = invals
    axis = node.params["axis"]
    if blocks.out_spans and any(spans and spans[axis] is not None for spans in blocks.out_spans):
        return [x] * len(blocks.out_global)
    return cut_outputs(list(lax.split(x, node.params["sizes"], axis)), blocks)


def keep_ranges(ctx: RuleContext, plain: RuleOutput, operands: tuple[TensorSharding, ...],
                pairs: list[tuple[int, int, int]]) -> RuleOutput:
    """The result of a rule that reads each axis of ``pairs`` row by row — ``(operand, operand axis, output axis)``:
    row ``r`` of the output axis is computed from row ``r`` of each operand axis mapped to it (an elementwise op, a
    broadcast's mapped axes, a reduction's kept axes, a contraction's free axes) — with its ranged operand axes kept
    ranged. ``plain`` is the rule's answer for the operands without their ranges. Where the operand axes mapped to
    one output axis are ranged over the same mesh axes, the output axis holds the first one's range — equal blocks
    where another operand is held in them, blocks that hold every row where some rows are a fill no device holds
    (the op would change it) — and every operand is read in it (another range, or equal blocks over those mesh
    axes, realigned; an operand held whole cut locally); otherwise the rule's answer stands (the ranged operand is
    gathered)."""
    if len(plain.outputs) != 1 or jx.is_extended_dtype(ctx.out_avals[0].dtype):
        return plain
    groups: dict[int, list[tuple[int, int]]] = {}
    for i, k, a in pairs:
        groups.setdefault(a, []).append((i, k))
    out = list(plain.outputs[0].axes)
    needs = [list(n) for n in plain.needs]
    reads: list[list] = [[None] * len(op.shape) for op in operands]
    for a, members in groups.items():
        axes = [operands[i].axes[k] for i, k in members]
        ranged = [(x.mesh_axes, x.span) for x in axes if isinstance(x, Sharded) and x.span is not None]
        if not ranged or len({m for m, _ in ranged}) != 1:
            continue
        mesh_axes, span = ranged[0]  # the first range: the others are realigned to it
        others = {x.mesh_axes for x in axes if isinstance(x, Sharded) and x.span is None}
        used = {name for b, x in enumerate(out) if b != a and isinstance(x, Sharded) for name in x.mesh_axes}
        if others - {mesh_axes} or used & set(mesh_axes):
            continue
        size = plain.outputs[0].shape[a]
        count = shard_count(ctx.mesh_shape, mesh_axes)
        if mesh_axes in others and size % count == 0:  # another operand in equal blocks: the result too
            span = standard_span(size, count)
        elif span.fill is not None:  # rows no device holds: every operand read in blocks that hold them all
            span = Span(0, -(-size // count))
        out[a] = ctx.ranged(a, size, mesh_axes, span, [(x, 0) for x in axes if isinstance(x, Sharded)])
        for i, k in members:
            needs[i][k] = ()
            reads[i][k] = (mesh_axes, span)
    if all(r is None for per in reads for r in per):
        return plain
    return plain._replace(outputs=(TensorSharding(plain.outputs[0].shape, tuple(out)),),
                          needs=tuple(tuple(n) for n in needs), need_spans=tuple(tuple(r) for r in reads))


def finish_concatenate(decisions, node):
    """A concatenation whose operands, held ranged in place, are the blocks of the result rotated (``jnp.roll``: the
    slices ``x[63:]`` and ``x[:63]`` of a 64-row axis in blocks of 8 hold, together, every row of the result, each
    device's 7 rows ahead): the op joins them in place and a ``rotate`` finish moves each device's rows into its
    block — one permute of the rows crossing a block's edge, as XLA's rotation — where reading each operand realigned
    would permute each apart. Operands in equal blocks (two sequences end to end) are joined in place too and a
    ``route`` finish sends each piece to its block, the operands' pieces sharing permutes, where that moves fewer
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
    """The ``route`` finish of ``finish_concatenate``, or None: every operand in equal blocks over ``mesh_axes``,
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


def concatenate_geometry(graph, node, operand_type, mesh_shape) -> FinishGeometry:
    """A concatenation's finish geometry: its axis, its rotation (joined in place, ranged: a roll) and, for operands
    joined in equal blocks, the rounds of its route (``shardprop.core.steps.route_rounds``)."""
    dim = node.params["dimension"]
    length = graph.avals[node.outputs[0]].shape[dim]
    mesh_axes = operand_type.layout[dim]
    rounds = ()
    if mesh_axes and operand_type.span_of(dim) is None:
        rounds = route_rounds(tuple(graph.avals[v].shape[dim] for v in node.operands), shard_count(mesh_shape,
                                                                                                   mesh_axes))
    return FinishGeometry(axis=dim, shift=rotation(node, operand_type, length), rounds=rounds)


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


def slice_geometry(graph, node, operand_type: ValueType, mesh_shape) -> FinishGeometry:
    """A strided slice's finish geometry: the axis its picks are routed along, and the route's rounds."""
    found = _route_axis(graph, node, operand_type, mesh_shape)
    if found is None:
        return FinishGeometry()
    span = operand_type.span_of(found[0])  # the rows no device holds land as the pad's fill
    return FinishGeometry(axis=found[0], rounds=found[1], fill=0 if span is None or span.fill is None else span.fill)


def finish_slice(decisions, node):
    """A strided slice whose operand, read in place, leaves each device's picks out of their places in the result's
    blocks (``x[:, ::16]`` of blocks of 8: devices 0, 2, 4, 6 pick a row each, for blocks 0-3): each device picks the
    rows its own block holds and a ``route`` finish sends them to their blocks, where that moves fewer rows than
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


# ---- on blocks -------------------------------------------------------------------------------------------------------

def row_index(blocks: Blocks, span: Span, mesh_axes, shape, axis: int):
    """The global row each position of this device's block along ``axis`` holds (``span``'s rows), broadcastable."""
    here = block_index(mesh_axes, blocks.mesh_shape) * span.block - span.offset
    return lax.broadcasted_iota(jnp.int32, tuple(n if k == axis else 1 for k, n in enumerate(shape)), axis) + here


def masked_rows(x, blocks: Blocks, operand: int, axes, value=0):
    """Operand ``operand``'s block ``x`` with the padding of its ranged axes among ``axes`` (the rows past the axis's
    ends a device's block holds) set to ``value``: what an op summing or combining those rows must not read."""
    spans = blocks.in_spans[operand] if blocks.in_spans else ()
    for k in axes:
        if spans and spans[k] is not None:
            x = past_the_ends(x, k, 0, blocks.in_global[operand][k], blocks.in_layouts[operand][k], blocks.mesh_shape,
                              value, spans[k])
    return x


def _out_span(blocks: Blocks, k: int, axis: int) -> Span | None:
    """The rows output ``k``'s block holds along ``axis`` when the op computed it in place (ranged, or equal blocks
    read realigned); None when the axis is computed the ordinary way."""
    spans = blocks.out_spans[k] if blocks.out_spans else None
    span = spans[axis] if spans else None
    if span is None and blocks.out_layouts[k][axis] and blocks.in_spans and any(
            s and s[axis] is not None for s in blocks.in_spans):
        return standard_span(blocks.out_global[k][axis], shard_count(blocks.mesh_shape, blocks.out_layouts[k][axis]))
    return span


def _in_place_axes(blocks: Blocks) -> list[int]:
    return [k for k in range(len(blocks.out_global[0])) if _out_span(blocks, 0, k) is not None]


def slice_block(node, invals, blocks: Blocks) -> list:
    """Along an axis kept in place (ranged, or read realigned to the output's blocks) the block is the output's
    block; an axis taken whole or strided in blocks is sliced on the block; any other axis as the op says. An axis
    laid out in equal blocks that arrived whole is computed whole and cut (the operand was gathered)."""
    (x,) = invals
    placed = set(_in_place_axes(blocks))
    params = node.params
    strides = params["strides"] or (1,) * x.ndim
    start, limit, step = [], [], []
    for k, (s, lim, stride) in enumerate(zip(params["start_indices"], params["limit_indices"], strides, strict=True)):
        b, g, have = blocks.out_blocks[0][k], blocks.out_global[0][k], blocks.in_blocks[0][k]
        if blocks.out_global[0][k] == 0:  # an empty slice
            start.append(0), limit.append(0), step.append(1)
        elif stride > 1 and (k in placed or have != blocks.in_global[0][k]):  # the rows its block picks
            x, first = _picked(x, k, int(s), int(stride), blocks)
            start.append(first), limit.append(first + (b - 1) * stride + 1), step.append(stride)
        elif k in placed:
            start.append(0), limit.append(b), step.append(1)
        elif have == blocks.in_global[0][k]:  # whole: as the op says, cut below where it holds a block
            start.append(s), limit.append(lim), step.append(stride)
        else:  # taken whole or strided in blocks: the block's own elements
            start.append(s), limit.append(lim if b == g else s + (b - 1) * stride + 1), step.append(stride)
    out = lax.slice(x, start, limit, step)
    return _cut_whole(out, blocks)


def _picked(x, k: int, start: int, stride: int, blocks: Blocks):
    """``(x, first)``: the block ``x`` and the position along ``k`` its first pick of a strided slice lies at — the
    same on every device that picks (in place, or read realigned: a constant), else this device's own (read in its
    operand's blocks, a ``route`` to follow: ``x`` moved to start at it)."""
    spans = blocks.in_spans[0] if blocks.in_spans else ()
    length, size, b = blocks.in_global[0][k], blocks.out_global[0][k], blocks.out_blocks[0][k]
    count = shard_count(blocks.mesh_shape, blocks.in_layouts[0][k])
    held = spans[k] if spans and spans[k] is not None else standard_span(length, count)
    picks = strided_layout(held, length, start, stride, size, count).picks
    firsts = {position for position, _, picked in picks if picked}
    reach = (b - 1) * stride + 1
    if len(firsts) <= 1:  # (padded where the result's block reaches past this one: picks from a pad's fill rows too)
        first = min(firsts, default=0)
        short = first + reach - x.shape[k]
        return (x if short <= 0 else lax.pad(x, lax.full((), 0, x.dtype),
                                             [(0, short, 0) if a == k else (0, 0, 0) for a in range(x.ndim)])), first
    padded = lax.pad(x, lax.full((), 0, x.dtype), [(0, reach, 0) if a == k else (0, 0, 0) for a in range(x.ndim)])
    here = block_index(blocks.in_layouts[0][k], blocks.mesh_shape)
    at = jnp.asarray(np.array([min(position, x.shape[k]) for position, _, _ in picks], np.int32))[here]
    return lax.dynamic_slice_in_dim(padded, at, reach, k), 0


def _cut_whole(out, blocks: Blocks) -> list:
    """``out`` cut to this device's block along the axes it came out whole but is held in equal blocks."""
    return cut_outputs([out], blocks)


def pad_block(node, invals, blocks: Blocks) -> list:
    """Along an axis kept in place, each row is the operand's row it lands on, or the padding value where that is
    not a row of the operand; the other axes are padded as the op says (interior padding spreads a block in place)."""
    x, value = invals
    placed = _in_place_axes(blocks)
    spread = [k for k in placed if node.params["padding_config"][k][2]]  # each block spread in place, ranged
    if spread:  # an operand's padding rows (past its ends) spread onto rows of the result: the pad's value there
        x = masked_rows(x, blocks, 0, spread, value.astype(x.dtype))
    config = [(0, c[2], c[2]) if k in spread else (0, 0, 0) if k in placed else tuple(c)
              for k, c in enumerate(node.params["padding_config"])]
    out = lax.pad(x, value.astype(x.dtype), config)
    placed = [k for k in placed if k not in spread]
    if not placed:
        return _cut_whole(out, blocks)
    keep = None
    for k in placed:
        lo = node.params["padding_config"][k][0]
        row = row_index(blocks, _out_span(blocks, 0, k), blocks.out_layouts[0][k], out.shape, k) - lo
        inside = (row >= 0) & (row < blocks.in_global[0][k])
        keep = inside if keep is None else keep & inside
    return _cut_whole(jnp.where(keep, out, value.astype(x.dtype)), blocks)


def concatenate_block(node, invals, blocks: Blocks) -> list:
    """Along the joined axis kept in blocks, each device's rows are those of the operand each lands in (every operand
    arrived realigned to the output's blocks, or — a ``rotate`` finish to follow — in place, the rows rotated);
    else the operands joined as they are."""
    axis = node.params["dimension"]
    span = _out_span(blocks, 0, axis)
    if span is None:
        return _cut_whole(lax.concatenate(invals, axis), blocks)
    row = row_index(blocks, span, blocks.out_layouts[0][axis], invals[0].shape, axis)
    first = blocks.in_spans[0][axis] if blocks.in_spans and blocks.in_spans[0] else None
    if first is not None and first.offset % blocks.out_global[0][axis]:  # joined in place, rotated: a roll
        size = blocks.out_global[0][axis]
        row = (row - first.offset) % size
    out, offset = invals[0], 0
    for k, (x, shape) in enumerate(zip(invals, blocks.in_global, strict=True)):
        n = shape[axis]
        if k:  # (the first is where the others are not: an empty first operand leaves the second at offset 0)
            out = jnp.where((row >= offset) & (row < offset + n), x, out)
        offset += n
    return [out]


# ---- lineage ---------------------------------------------------------------------------------------------------------

# A strided slice reads single elements; more than this many on one axis are widened to their hull.
MAX_STRIDED = 256


def _strided(ctx: LineageContext, start: int, stride: int, lo: int, hi: int) -> list[tuple[int, int]]:
    """Operand intervals read by output range ``[lo, hi)`` of ``start + k·stride``."""
    if lo >= hi:
        return []
    if stride == 1:
        return [(start + lo, start + hi)]
    if hi - lo > MAX_STRIDED:
        ctx.exact = False
        return [(start + lo * stride, start + (hi - 1) * stride + 1)]
    return [(start + k * stride, start + k * stride + 1) for k in range(lo, hi)]


def slice_lineage(ctx: LineageContext, box: Box, output: int, *, start_indices, limit_indices, strides=None,
                  **params):
    strides = strides or (1,) * len(box)
    boxes, exact = product([_strided(ctx, s, st, lo, hi) for s, st, (lo, hi) in zip(start_indices, strides, box,
                                                                                      strict=True)])
    ctx.exact = ctx.exact and exact
    return [boxes]


def pad_lineage(ctx: LineageContext, box: Box, output: int, *, padding_config, **params):
    """Operand element ``j`` lands at ``lo + j·(interior + 1)``; the padding value is read where the box
    covers a position no operand element lands on."""
    shape = ctx.in_shapes[0]
    per_axis, covered = [], 1
    for n, (lo, _, interior), (s, e) in zip(shape, padding_config, box, strict=True):
        step = interior + 1
        first = max(0, -(-(s - lo) // step))
        last = min(n, -(-(e - lo) // step))  # exclusive
        per_axis.append([(first, last)] if first < last else [])
        covered *= max(0, last - first)
    box_volume = int(np.prod([e - s for s, e in box])) if box else 1
    boxes, exact = product(per_axis) if all(per_axis) else ([], True)
    ctx.exact = ctx.exact and exact
    return [boxes, [()] if covered < box_volume else []]


def concatenate_lineage(ctx: LineageContext, box: Box, output: int, *, dimension, **params):
    out, offset = [], 0
    s, e = box[dimension]
    for shape in ctx.in_shapes:
        n = shape[dimension]
        lo, hi = max(s - offset, 0), min(e - offset, n)
        out.append([box[:dimension] + ((lo, hi),) + box[dimension + 1:]] if lo < hi else [])
        offset += n
    return out


def _ranged(name, propagate, lineage, per_block, linear) -> OpDef:
    return OpDef(name, Family.SLICING, propagate=propagate, lineage=lineage, lineage_exact=True, per_block=per_block,
                 finish=None, pull=None, linear=linear, reads_ranges=True)


OPS = [
    OpDef("slice", Family.SLICING, propagate=slice_, lineage=slice_lineage, lineage_exact=True, per_block=slice_block,
          finish=finish_slice, pull=None, linear=Linearity.FIRST, reads_ranges=True),
    _ranged("pad", pad, pad_lineage, pad_block, Linearity.NONE),  # the padding value would be summed too
    OpDef("concatenate", Family.SLICING, propagate=concatenate, lineage=concatenate_lineage, lineage_exact=True,
          per_block=concatenate_block, finish=finish_concatenate, pull=None, linear=Linearity.JOINT,
          reads_ranges=True),
]
