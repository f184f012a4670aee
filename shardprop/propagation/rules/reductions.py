"""Reductions drop sharding on the reduced axes: the op needs those axes whole (the split pass cuts there)
and the other axes keep their sharding."""

from __future__ import annotations

from ..sharding import TensorSharding
from .registry import RuleContext, RuleOutput, register


@register("reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or", "reduce_xor",
          "argmax", "argmin")
def reduction(ctx: RuleContext, operand: TensorSharding, *, axes, **params) -> RuleOutput:
    reduced = set(axes)
    kept = [k for k in range(len(operand.shape)) if k not in reduced]
    out_shape = ctx.out_avals[0].shape
    out = TensorSharding(out_shape, tuple(
        ctx.carry(i, out_shape[i], operand.axes[k]) for i, k in enumerate(kept)
    ))
    need = tuple(() if k in reduced else m for k, m in enumerate(operand.layout))
    return RuleOutput((out,), (need,))
