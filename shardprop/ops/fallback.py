"""The conservative rule for primitives without a proven one: every operand gathered, outputs replicated.

Always correct, never fast; the propagation pass warns once per primitive name when it uses it. Its lineage is
every element of every operand (sound, not exact). A primitive without a record runs outside ``shard_map``, in a
stage of its own under the program's ``jax.jit``, on the whole (gathered) arrays: whatever it is — a
``shard_map`` of the user's, a host callback, an op JAX cannot lower under manual sharding — it then runs as it
would under ``jax.jit``.
"""

from __future__ import annotations

from ..core.blocks import bind_globally
from ..core.boxes import Box, LineageContext, full_box
from ..core.rules import RuleContext, RuleOutput
from ..core.layouts import TensorSharding
from .opdef import Family, Linearity, OpDef


def conservative(ctx: RuleContext, *operands: TensorSharding, **params) -> RuleOutput:
    outputs = tuple(TensorSharding(a.shape, (None,) * len(a.shape)) for a in ctx.out_avals)
    return RuleOutput(outputs, tuple(((),) * len(op.shape) for op in operands))


def whole_operands(ctx: LineageContext, box: Box, output: int, **params) -> list[list[Box]]:
    """Every element of every operand (always sound)."""
    return [[full_box(shape)] for shape in ctx.in_shapes]


def fallback_for(name: str) -> OpDef:
    """The record used for primitive ``name`` when it has none of its own."""
    return OpDef(name, Family.FALLBACK, propagate=conservative, lineage=whole_operands, lineage_exact=False,
                 per_block=bind_globally, finish=None, pull=None, linear=Linearity.NONE,
                 runs_outside_shard_map=True)
