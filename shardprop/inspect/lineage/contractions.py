"""Contractions and windows: ``dot_general`` reads whole contracted axes; window reductions read the windows
their outputs cover; convolutions read whole spatial and input-feature axes (sound, not exact)."""

from __future__ import annotations

from .boxes import Box, full_box
from .registry import LineageContext, register


@register("dot_general")
def dot_general(ctx: LineageContext, box: Box, output: int, *, dimension_numbers, **params):
    """Output axes are the batch axes, then the lhs free axes, then the rhs free axes (``lax.dot_general``)."""
    (lhs_c, rhs_c), (lhs_b, rhs_b) = dimension_numbers
    lhs_shape, rhs_shape = ctx.in_shapes
    n_batch = len(lhs_b)
    lhs_free = [k for k in range(len(lhs_shape)) if k not in lhs_c and k not in lhs_b]
    rhs_free = [k for k in range(len(rhs_shape)) if k not in rhs_c and k not in rhs_b]

    def operand_box(shape, contracting, batch, free, first_free):
        out = []
        for k, n in enumerate(shape):
            if k in contracting:
                out.append((0, n))
            elif k in batch:
                out.append(box[list(batch).index(k)])
            else:
                out.append(box[first_free + free.index(k)])
        return tuple(out)

    return [[operand_box(lhs_shape, lhs_c, lhs_b, lhs_free, n_batch)],
            [operand_box(rhs_shape, rhs_c, rhs_b, rhs_free, n_batch + len(lhs_free))]]


@register("reduce_window_sum", "reduce_window_max", "reduce_window_min", "reduce_window")
def reduce_window(ctx: LineageContext, box: Box, output: int, *, window_dimensions, window_strides, padding,
                  base_dilation=None, window_dilation=None, **params):
    """Output ``o`` reads operand ``[o·stride − lo, o·stride − lo + (w − 1)·dilation]``; where windows
    leave gaps (stride > window) or are dilated, the answer is the hull of the windows (flagged inexact)."""
    n_operands = len(ctx.in_shapes) // 2 if len(ctx.in_shapes) > 1 else 1
    shape = ctx.in_shapes[0]
    base_dilation = base_dilation or (1,) * len(shape)
    window_dilation = window_dilation or (1,) * len(shape)
    if any(d != 1 for d in base_dilation):
        ctx.exact = False
        return [[full_box(s)] for s in ctx.in_shapes]
    box_in = []
    for n, w, st, (lo, _), wd, (s, e) in zip(shape, window_dimensions, window_strides, padding, window_dilation,
                                             box, strict=True):
        if (st > w and e - s > 1) or (wd != 1 and w > 1):  # gaps between windows, or inside a dilated one
            ctx.exact = False
        first, last = s * st - lo, (e - 1) * st - lo + (w - 1) * wd + 1
        box_in.append((max(0, first), min(n, last)))
    if n_operands > 1:  # a variadic window's reducer may pair operands any way: each output reads them all
        ctx.exact = False
    operand_boxes = [[tuple(box_in)] if all(a < b for a, b in box_in) else [] for _ in range(n_operands)]
    return operand_boxes + [[()] for _ in ctx.in_shapes[n_operands:]]


@register("conv_general_dilated", exact=False)
def conv(ctx: LineageContext, box: Box, output: int, *, dimension_numbers, feature_group_count=1,
         batch_group_count=1, **params):
    """An output batch row reads the same lhs batch row; an output feature reads its rhs output-feature
    slice when there are no feature groups. Everything else is read whole."""
    lhs_shape, rhs_shape = ctx.in_shapes
    lhs_spec, rhs_spec, out_spec = dimension_numbers.lhs_spec, dimension_numbers.rhs_spec, dimension_numbers.out_spec
    lhs_box = list(full_box(lhs_shape))
    rhs_box = list(full_box(rhs_shape))
    if batch_group_count == 1:
        lhs_box[lhs_spec[0]] = box[out_spec[0]]
    if feature_group_count == 1 and batch_group_count == 1:
        rhs_box[rhs_spec[0]] = box[out_spec[1]]
    return [[tuple(lhs_box)], [tuple(rhs_box)]]
