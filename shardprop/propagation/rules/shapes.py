"""Shape ops that move axes without touching data along them: broadcast_in_dim, squeeze, transpose."""

from __future__ import annotations

from ..sharding import TensorSharding
from .registry import CREATED, RuleContext, RuleOutput, register


@register("broadcast_in_dim")
def broadcast_in_dim(ctx: RuleContext, operand: TensorSharding, *dynamic_shape, shape, broadcast_dimensions,
                     **params) -> RuleOutput:
    """Mapped axes keep the operand's sharding; new axes and size-1 axes broadcast to a larger size are
    *created*: they start unannotated and adopt the sharding of what they meet (each device then builds only
    its block)."""
    source_of = {d: k for k, d in enumerate(broadcast_dimensions)}
    axes = []
    for d, size in enumerate(shape):
        k = source_of.get(d)
        if k is not None and operand.shape[k] == size:
            axes.append(ctx.carry(d, size, operand.axes[k]))
        else:
            axes.append(CREATED if size > 1 else None)
    return RuleOutput((TensorSharding(tuple(shape), tuple(axes)),), (operand.layout,) + tuple(
        ((),) * len(t.shape) for t in dynamic_shape))


@register("squeeze")
def squeeze(ctx: RuleContext, operand: TensorSharding, *, dimensions, **params) -> RuleOutput:
    dropped = {d % len(operand.shape) for d in dimensions}
    kept = [k for k in range(len(operand.shape)) if k not in dropped]
    out = TensorSharding(tuple(operand.shape[k] for k in kept), tuple(
        ctx.carry(i, operand.shape[k], operand.axes[k]) for i, k in enumerate(kept)))
    return RuleOutput((out,), (operand.layout,))


@register("transpose")
def transpose(ctx: RuleContext, operand: TensorSharding, *, permutation, **params) -> RuleOutput:
    out = TensorSharding(tuple(operand.shape[k] for k in permutation), tuple(
        ctx.carry(d, operand.shape[k], operand.axes[k]) for d, k in enumerate(permutation)))
    return RuleOutput((out,), (operand.layout,))
