"""The conservative rule for primitives without a proven one: every operand gathered, outputs replicated.

Always correct, never fast; the propagation pass warns once per primitive name when it uses it.
"""

from __future__ import annotations

from ..sharding import TensorSharding
from .registry import RuleContext, RuleOutput


def conservative(ctx: RuleContext, *operands: TensorSharding, **params) -> RuleOutput:
    outputs = tuple(TensorSharding(a.shape, (None,) * len(a.shape)) for a in ctx.out_avals)
    return RuleOutput(outputs, tuple(((),) * len(op.shape) for op in operands))
