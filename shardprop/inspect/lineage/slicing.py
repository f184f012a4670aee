"""Slices, pads, reversals, concatenation, splits, and the data-dependent slices (sound, not exact)."""

from __future__ import annotations

from .boxes import Box, full_box, product
from .registry import LineageContext, register

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


@register("slice")
def slice_(ctx: LineageContext, box: Box, output: int, *, start_indices, limit_indices, strides=None, **params):
    strides = strides or (1,) * len(box)
    boxes, exact = product([_strided(ctx, s, st, lo, hi) for s, st, (lo, hi) in zip(start_indices, strides, box,
                                                                                      strict=True)])
    ctx.exact = ctx.exact and exact
    return [boxes]


@register("pad")
def pad(ctx: LineageContext, box: Box, output: int, *, padding_config, **params):
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
    box_volume = 1
    for s, e in box:
        box_volume *= e - s
    boxes, exact = product(per_axis) if all(per_axis) else ([], True)
    ctx.exact = ctx.exact and exact
    return [boxes, [()] if covered < box_volume else []]


@register("rev")
def rev(ctx: LineageContext, box: Box, output: int, *, dimensions, **params):
    (shape,) = ctx.in_shapes
    return [[tuple((n - e, n - s) if k in dimensions else (s, e) for k, (n, (s, e)) in enumerate(zip(shape, box,
                                                                                                    strict=True)))]]


@register("concatenate")
def concatenate(ctx: LineageContext, box: Box, output: int, *, dimension, **params):
    out, offset = [], 0
    s, e = box[dimension]
    for shape in ctx.in_shapes:
        n = shape[dimension]
        lo, hi = max(s - offset, 0), min(e - offset, n)
        out.append([box[:dimension] + ((lo, hi),) + box[dimension + 1:]] if lo < hi else [])
        offset += n
    return out


@register("split")
def split(ctx: LineageContext, box: Box, output: int, *, sizes, axis, **params):
    offset = sum(int(n) for n in sizes[:output])
    s, e = box[axis]
    return [[box[:axis] + ((s + offset, e + offset),) + box[axis + 1:]]]


@register("dynamic_slice", exact=False)
def dynamic_slice(ctx: LineageContext, box: Box, output: int, *, slice_sizes, **params):
    """Where the slice starts depends on index values: a sliced axis may read any of its elements."""
    shape = ctx.in_shapes[0]
    box_in = tuple((0, n) if size != n else b for n, size, b in zip(shape, slice_sizes, box, strict=True))
    return [[box_in]] + [[()] for _ in ctx.in_shapes[1:]]


@register("dynamic_update_slice", exact=False)
def dynamic_update_slice(ctx: LineageContext, box: Box, output: int, **params):
    """An element is the operand's or, wherever the update landed, the update's."""
    operand, update = ctx.in_shapes[:2]
    return [[box], [full_box(update)]] + [[()] for _ in ctx.in_shapes[2:]]


@register("gather", exact=False)
def gather(ctx: LineageContext, box: Box, output: int, *, dimension_numbers, slice_sizes, **params):
    """Each output batch element reads its own index vector; the operand axes the indices choose a start on
    may be read anywhere, the others are read where the output box says (a window that starts at 0, or a
    batching axis matched with the indices')."""
    operand_shape, indices_shape = ctx.in_shapes
    dn = dimension_numbers
    batch_positions = [d for d in range(len(box)) if d not in dn.offset_dims]  # ↔ indices axes but the last
    if len(indices_shape) != len(batch_positions) + 1:
        return [[full_box(operand_shape)], [full_box(indices_shape)]]
    indices_box = tuple(box[p] for p in batch_positions) + ((0, indices_shape[-1]),)
    window_axes = [d for d in range(len(operand_shape))
                   if d not in dn.collapsed_slice_dims and d not in dn.operand_batching_dims]
    operand_box = []
    for d, n in enumerate(operand_shape):
        if d in dn.start_index_map:  # where the slice starts depends on index values
            operand_box.append((0, n))
        elif d in dn.operand_batching_dims:
            t = dn.start_indices_batching_dims[list(dn.operand_batching_dims).index(d)]
            operand_box.append(box[batch_positions[t]])
        elif d in dn.collapsed_slice_dims:  # not indexed: the size-1 slice starts at 0
            operand_box.append((0, 1))
        else:  # a window axis starting at 0: output offset j reads element j
            operand_box.append(box[dn.offset_dims[window_axes.index(d)]])
    return [[tuple(operand_box)], [indices_box]]


@register("scatter", "scatter-add", "scatter-sub", "scatter-mul", "scatter-min", "scatter-max", exact=False)
def scatter(ctx: LineageContext, box: Box, output: int, *, dimension_numbers, **params):
    """An output element reads the operand element at its position and whichever updates land there: where
    they land depends on index values on the indexed axes, so every update (and index) may, except along
    window axes the indices do not move, where update offset j lands on element j."""
    operand_shape, indices_shape, updates_shape = ctx.in_shapes[:3]
    dn = dimension_numbers
    window_axes = [d for d in range(len(operand_shape))
                   if d not in dn.inserted_window_dims and d not in dn.operand_batching_dims]
    updates_box = list(full_box(updates_shape))
    for k, u in enumerate(dn.update_window_dims):
        d = window_axes[k]
        if d not in dn.scatter_dims_to_operand_dims:
            updates_box[u] = box[d]
    return [[box], [full_box(indices_shape)], [tuple(updates_box)]] + [[()] for _ in ctx.in_shapes[3:]]
