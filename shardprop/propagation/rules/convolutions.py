"""Convolutions and windowed reductions.

``conv_general_dilated``: the batch axis and the output-feature axis propagate (from the input and the
kernel); spatial and input-feature axes are needed whole. Windowed reductions keep the sharding of axes
whose window is a single element with stride 1 and no padding or dilation.
"""

from __future__ import annotations

from ..sharding import TensorSharding
from .registry import RuleContext, RuleOutput, register


@register("conv_general_dilated")
def conv_general_dilated(ctx: RuleContext, lhs: TensorSharding, rhs: TensorSharding, *, dimension_numbers,
                         feature_group_count, batch_group_count, **params) -> RuleOutput:
    lhs_spec, rhs_spec, out_spec = dimension_numbers
    out_shape = ctx.out_avals[0].shape
    axes: list = [None] * len(out_shape)
    lhs_need = [()] * len(lhs.shape)
    rhs_need = [()] * len(rhs.shape)
    if batch_group_count == 1:
        axes[out_spec[0]] = ctx.carry(out_spec[0], out_shape[out_spec[0]], lhs.axes[lhs_spec[0]])
    if feature_group_count == 1 and batch_group_count == 1:
        axes[out_spec[1]] = ctx.carry(out_spec[1], out_shape[out_spec[1]], rhs.axes[rhs_spec[0]])
    out = TensorSharding(out_shape, tuple(axes))
    lhs_need[lhs_spec[0]] = out.layout[out_spec[0]]
    rhs_need[rhs_spec[0]] = out.layout[out_spec[1]]
    return RuleOutput((out,), (tuple(lhs_need), tuple(rhs_need)))


@register("reduce_window_sum", "reduce_window_max", "reduce_window_min", "reduce_window")
def reduce_window(ctx: RuleContext, *operands: TensorSharding, window_dimensions, window_strides, padding,
                  base_dilation, window_dilation, **params) -> RuleOutput:
    n_arrays = len(ctx.out_avals)  # generic reduce_window takes operands then as many init values
    arrays, inits = operands[:n_arrays], operands[n_arrays:]
    shape = arrays[0].shape
    keep = [w == 1 and s == 1 and tuple(p) == (0, 0) and b == 1 and d == 1
            for w, s, p, b, d in zip(window_dimensions, window_strides, padding, base_dilation, window_dilation,
                                     strict=True)]
    out_shape = ctx.out_avals[0].shape
    outputs = tuple(
        TensorSharding(out_shape, tuple(ctx.merge(k, out_shape[k], [a.axes[k] for a in arrays]) if kept else None
                                        for k, kept in enumerate(keep)))
        for _ in range(n_arrays)
    )
    need = outputs[0].layout if shape == out_shape else tuple(
        m if kept else () for m, kept in zip(outputs[0].layout, keep, strict=True))
    return RuleOutput(outputs, (need,) * n_arrays + tuple(((),) * len(i.shape) for i in inits))
