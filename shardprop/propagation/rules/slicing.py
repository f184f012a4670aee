"""Slicing ops: slice, pad, concatenate, rev, dynamic_slice, dynamic_update_slice.

An axis the op takes whole and unchanged (a full slice, no padding, not the concatenation axis) keeps its
sharding; an axis it cuts, pads, reverses or joins is needed whole and comes out replicated.
"""

from __future__ import annotations

from ..sharding import TensorSharding
from .registry import RuleContext, RuleOutput, register


def _keep_axes(ctx: RuleContext, operand: TensorSharding, keep: list[bool], out_shape) -> RuleOutput:
    axes = tuple(ctx.carry(k, out_shape[k], operand.axes[k]) if kept else None for k, kept in enumerate(keep))
    need = tuple(m if kept else () for m, kept in zip(operand.layout, keep, strict=True))
    return RuleOutput((TensorSharding(tuple(out_shape), axes),), (need,))


def _scalar_needs(operands) -> tuple:
    return tuple(((),) * len(op.shape) for op in operands)


@register("slice")
def slice_(ctx: RuleContext, operand: TensorSharding, *, start_indices, limit_indices, strides, **params):
    keep = [s == 0 and lim == n and (strides is None or strides[k] == 1)
            for k, (s, lim, n) in enumerate(zip(start_indices, limit_indices, operand.shape, strict=True))]
    return _keep_axes(ctx, operand, keep, ctx.out_avals[0].shape)


@register("pad")
def pad(ctx: RuleContext, operand: TensorSharding, padding_value: TensorSharding, *, padding_config, **params):
    keep = [tuple(cfg) == (0, 0, 0) for cfg in padding_config]
    out = _keep_axes(ctx, operand, keep, ctx.out_avals[0].shape)
    return RuleOutput(out.outputs, out.needs + _scalar_needs([padding_value]))


@register("rev")
def rev(ctx: RuleContext, operand: TensorSharding, *, dimensions, **params):
    keep = [k not in dimensions for k in range(len(operand.shape))]
    return _keep_axes(ctx, operand, keep, operand.shape)


@register("dynamic_slice")
def dynamic_slice(ctx: RuleContext, operand: TensorSharding, *indices: TensorSharding, slice_sizes, **params):
    # A slice as long as its axis starts at 0 whatever the index (indices are clamped), so it stays whole.
    keep = [s == n for s, n in zip(slice_sizes, operand.shape, strict=True)]
    out = _keep_axes(ctx, operand, keep, ctx.out_avals[0].shape)
    return RuleOutput(out.outputs, out.needs + _scalar_needs(indices))


@register("dynamic_update_slice")
def dynamic_update_slice(ctx: RuleContext, operand: TensorSharding, update: TensorSharding,
                         *indices: TensorSharding, **params):
    axes = []
    for k, n in enumerate(operand.shape):
        if update.shape[k] == n:  # the update covers the axis: operand and update blocks line up
            axes.append(ctx.merge(k, n, [operand.axes[k], update.axes[k]]))
        else:
            axes.append(None)
    out = TensorSharding(operand.shape, tuple(axes))
    return RuleOutput((out,), (out.layout, out.layout) + _scalar_needs(indices))


@register("concatenate")
def concatenate(ctx: RuleContext, *operands: TensorSharding, dimension, **params):
    out_shape = ctx.out_avals[0].shape
    axes = tuple(None if k == dimension else ctx.merge(k, n, [op.axes[k] for op in operands])
                 for k, n in enumerate(out_shape))
    out = TensorSharding(out_shape, axes)
    return RuleOutput((out,), (out.layout,) * len(operands))
