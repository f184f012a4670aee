"""Shape ops: broadcast_in_dim, squeeze, transpose, reshape, iota."""

from __future__ import annotations

from ..sharding import Sharded, TensorSharding, shard_count
from .fallback import conservative
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


def reshape_groups(in_shape, out_shape) -> list[tuple[list[int], list[int]]]:
    """Pair up contiguous groups of input and output axes with equal element counts (size-1 axes aside).

    >>> reshape_groups((16, 8), (128,))
    [([0, 1], [0])]
    >>> reshape_groups((6, 4), (2, 3, 4))
    [([0], [0, 1]), ([1], [2])]
    """
    ins = [k for k, n in enumerate(in_shape) if n != 1]
    outs = [k for k, n in enumerate(out_shape) if n != 1]
    groups, i, j = [], 0, 0
    while i < len(ins) and j < len(outs):
        group_in, group_out = [ins[i]], [outs[j]]
        size_in, size_out = in_shape[ins[i]], out_shape[outs[j]]
        i, j = i + 1, j + 1
        while size_in != size_out:
            if size_in < size_out:
                group_in.append(ins[i])
                size_in *= in_shape[ins[i]]
                i += 1
            else:
                group_out.append(outs[j])
                size_out *= out_shape[outs[j]]
                j += 1
        groups.append((group_in, group_out))
    return groups


@register("reshape")
def reshape(ctx: RuleContext, operand: TensorSharding, *dynamic, new_sizes, dimensions, **params) -> RuleOutput:
    """Within each group of axes that reshape merges or splits, the sharding of the group's major input
    axis survives on the group's major output axis when the shard count divides that axis: every block is
    then one contiguous run of the flattened group. Every other axis of the group is needed whole."""
    if dimensions is not None or dynamic:
        return conservative(ctx, operand, *dynamic)
    out_shape = tuple(new_sizes)
    axes: list = [None] * len(out_shape)
    need = [()] * len(operand.shape)
    for group_in, group_out in reshape_groups(operand.shape, out_shape):
        major, target = operand.axes[group_in[0]], group_out[0]
        if isinstance(major, Sharded) and out_shape[target] % shard_count(ctx.mesh_shape, major.mesh_axes):
            continue  # blocks would not line up with the output axis: gather it
        if major is not None:
            axes[target] = ctx.carry(target, out_shape[target], major)
            need[group_in[0]] = operand.layout[group_in[0]]
    return RuleOutput((TensorSharding(out_shape, tuple(axes)),), (tuple(need),))


@register("iota")
def iota(ctx: RuleContext, *, shape, **params) -> RuleOutput:
    """Every axis is created: it adopts what it meets and each device builds its own block (values on a
    sharded axis are offset by the block's start)."""
    return RuleOutput((TensorSharding(tuple(shape), tuple(CREATED if n > 1 else None for n in shape)),), ())
