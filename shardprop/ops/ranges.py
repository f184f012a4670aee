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

import math

import numpy as np

from ..core.boxes import Box, LineageContext, product
from ..core.layouts import Shard, Sharded, fill_key, Span, TensorSharding, shard_count, standard_span
from ..core.rules import RuleContext, RuleOutput
from ..expr import jax_adapter as jx
from .opdef import Family, Linearity, OpDef, Trait
from .range_blocks import concatenate_block, pad_block, slice_block
from .range_routes import concatenate_placement, finish_concatenate, finish_slice, slice_placement, strided_layout

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
                 finish=None, pull=None, linear=linear, reads_ranges=True, traits=frozenset({Trait.PIECEWISE}))


OPS = [
    OpDef("slice", Family.SLICING, propagate=slice_, lineage=slice_lineage, lineage_exact=True, per_block=slice_block,
          finish=finish_slice, pull=None, linear=Linearity.FIRST, reads_ranges=True, placement=slice_placement),
    _ranged("pad", pad, pad_lineage, pad_block, Linearity.NONE),  # the padding value would be summed too
    OpDef("concatenate", Family.SLICING, propagate=concatenate, lineage=concatenate_lineage, lineage_exact=True,
          per_block=concatenate_block, finish=finish_concatenate, pull=None, linear=Linearity.JOINT,
          reads_ranges=True, placement=concatenate_placement, traits=frozenset({Trait.PIECEWISE})),
]
