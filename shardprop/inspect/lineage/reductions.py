"""Reductions read the whole reduced axes; scans read the prefix (or suffix) of the scanned axis; sorts read
the whole sorted axis of every operand."""

from __future__ import annotations

from .boxes import Box
from .registry import LineageContext, register


@register("reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or", "reduce_xor",
          "argmax", "argmin")
def reduction(ctx: LineageContext, box: Box, output: int, *, axes, **params):
    (shape,) = ctx.in_shapes
    kept = iter(box)
    return [[tuple((0, n) if k in axes else next(kept) for k, n in enumerate(shape))]]


@register("cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp")
def cumulative(ctx: LineageContext, box: Box, output: int, *, axis, reverse=False, **params):
    (shape,) = ctx.in_shapes
    start, stop = box[axis]
    scanned = (start, shape[axis]) if reverse else (0, stop)
    return [[box[:axis] + (scanned,) + box[axis + 1:]]]


@register("sort")
def sort(ctx: LineageContext, box: Box, output: int, *, dimension, num_keys=1, **params):
    """Output ``k`` is operand ``k`` permuted along ``dimension`` by the order of the first ``num_keys``
    operands: it reads those keys and itself, whole along ``dimension``."""
    n = ctx.in_shapes[0][dimension]
    whole = box[:dimension] + ((0, n),) + box[dimension + 1:]
    return [[whole] if k < num_keys or k == output else [] for k in range(len(ctx.in_shapes))]


@register("top_k")
def top_k(ctx: LineageContext, box: Box, output: int, *, axis=-1, **params):
    (shape,) = ctx.in_shapes
    axis %= len(shape)
    return [[box[:axis] + ((0, shape[axis]),) + box[axis + 1:]]]
