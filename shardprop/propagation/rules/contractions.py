"""``dot_general``: batch axes merge like elementwise axes, free axes keep their operand's sharding, and
contracting axes are a reduction — the op needs them whole, so their sharding is dropped.

When a free axis would reuse a mesh axis already sharding another output axis (``a @ b.T`` with both
sharded on rows), that free axis is consumed whole instead (its operand is gathered along it): one mesh
axis can shard only one axis of the result, and gathering is always correct.
"""

from __future__ import annotations

from ..sharding import Sharded, TensorSharding
from .registry import RuleContext, RuleOutput, register


@register("dot_general")
def dot_general(ctx: RuleContext, lhs: TensorSharding, rhs: TensorSharding, *, dimension_numbers,
                **params) -> RuleOutput:
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
    out_shape = ctx.out_avals[0].shape
    lhs_free = [k for k in range(len(lhs.shape)) if k not in lhs_contract and k not in lhs_batch]
    rhs_free = [k for k in range(len(rhs.shape)) if k not in rhs_contract and k not in rhs_batch]
    axes = []
    for lb, rb in zip(lhs_batch, rhs_batch, strict=True):
        axes.append(ctx.merge(len(axes), lhs.shape[lb], [lhs.axes[lb], rhs.axes[rb]]))
    used = {name for a in axes if isinstance(a, Sharded) for name in a.mesh_axes}
    for operand, free in ((lhs, lhs_free), (rhs, rhs_free)):
        for k in free:
            source = operand.axes[k]
            if isinstance(source, Sharded) and used.intersection(source.mesh_axes):
                source = None
            axes.append(ctx.carry(len(axes), operand.shape[k], source))
            if isinstance(source, Sharded):
                used.update(source.mesh_axes)
    out = TensorSharding(out_shape, tuple(axes))
    layout = out.layout
    nb = len(lhs_batch)
    lhs_need = [()] * len(lhs.shape)
    rhs_need = [()] * len(rhs.shape)
    for i, (lb, rb) in enumerate(zip(lhs_batch, rhs_batch, strict=True)):
        lhs_need[lb] = rhs_need[rb] = layout[i]
    for i, k in enumerate(lhs_free):
        lhs_need[k] = layout[nb + i]
    for i, k in enumerate(rhs_free):
        rhs_need[k] = layout[nb + len(lhs_free) + i]
    return RuleOutput((out,), (tuple(lhs_need), tuple(rhs_need)))
