"""Elementwise ops read the same element of every operand (numpy broadcasting: a size-1 or missing axis
reads its one element)."""

from __future__ import annotations

from ...propagation.rules.elementwise import NARY, UNARY
from .boxes import Box
from .registry import LineageContext, register


def _aligned(box: Box, out_shape, shape) -> Box:
    offset = len(out_shape) - len(shape)
    return tuple((0, 1) if n == 1 and out_shape[k + offset] != 1 else box[k + offset] for k, n in enumerate(shape))


@register(*UNARY, *NARY)
def elementwise(ctx: LineageContext, box: Box, output: int, **params):
    out_shape = ctx.out_shapes[output]
    return [[_aligned(box, out_shape, shape)] for shape in ctx.in_shapes]


@register("bitcast_convert_type")
def bitcast_convert_type(ctx: LineageContext, box: Box, output: int, **params):
    if ctx.in_shapes[0] == ctx.out_shapes[0]:
        return [[box]]
    # a width change adds or drops a minor axis: the leading axes map one to one
    (shape,) = ctx.in_shapes
    common = min(len(shape), len(box))
    return [[box[:common] + tuple((0, n) for n in shape[common:])]]


@register("optimization_barrier")
def identity(ctx: LineageContext, box: Box, output: int, **params):
    return [[box] if k == output else [] for k in range(len(ctx.in_shapes))]
