"""Axis-wise scans and sorts need the scanned axis whole; the other axes keep their sharding."""

from __future__ import annotations

from ..sharding import TensorSharding
from .registry import RuleContext, RuleOutput, register


@register("cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp")
def cumulative(ctx: RuleContext, operand: TensorSharding, *, axis, **params) -> RuleOutput:
    axes = tuple(None if k == axis else ctx.carry(k, n, a)
                 for k, (n, a) in enumerate(zip(operand.shape, operand.axes, strict=True)))
    out = TensorSharding(operand.shape, axes)
    return RuleOutput((out,), (out.layout,))


@register("sort")
def sort(ctx: RuleContext, *operands: TensorSharding, dimension, **params) -> RuleOutput:
    """All operands are sorted together along ``dimension``: their other axes merge like elementwise axes."""
    shape = operands[0].shape
    outputs = tuple(
        TensorSharding(shape, tuple(None if k == dimension else ctx.merge(k, n, [op.axes[k] for op in operands])
                                    for k, n in enumerate(shape)))
        for _ in operands
    )
    return RuleOutput(outputs, (outputs[0].layout,) * len(operands))


@register("top_k")
def top_k(ctx: RuleContext, operand: TensorSharding, *, k, axis=-1, **params) -> RuleOutput:
    axis %= len(operand.shape)
    out_shape = ctx.out_avals[0].shape
    outputs = tuple(
        TensorSharding(out_shape, tuple(None if d == axis else ctx.carry(d, n, operand.axes[d])
                                        for d, n in enumerate(out_shape)))
        for _ in ctx.out_avals
    )
    return RuleOutput(outputs, (outputs[0].layout,))
