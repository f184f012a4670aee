"""Convolutions and windowed reductions.

``conv_general_dilated``: the batch axis and the output-feature axis propagate (from the input and the
kernel); spatial and input-feature axes are needed whole. Windowed reductions keep the sharding of axes
whose window is a single element with stride 1 and no padding or dilation; so do the ``select_and_*`` ops
that differentiate a max-pool (their operands merge on those axes).

Lineage: a window reduction's output reads the windows it covers; a convolution reads whole spatial and
input-feature axes, and a scatter into windows the windows that overlap the box (sound, not exact).

Finish: a convolution sums over the input-feature axes of its two operands, so where both are sharded alike
each device convolves its blocks and a ``psum`` adds the partial results, as for a contraction. That is the
kernel gradient of a data-parallel convolution: JAX transposes the batch axis into the input-feature position,
and the small kernel-shaped result is all-reduced instead of the batch-sharded activations being gathered.
"""

from __future__ import annotations

import math

from ..core.blocks import bind_as_is
from ..core.boxes import Box, LineageContext, full_box
from ..core.rules import RuleContext, RuleOutput
from ..core.layouts import TensorSharding
from .contractions import finish_summed_pairs
from .opdef import Family, Linearity, OpDef, defs


def conv_general_dilated(ctx: RuleContext, lhs: TensorSharding, rhs: TensorSharding, *, dimension_numbers,
                         feature_group_count, batch_group_count, **params) -> RuleOutput:
    lhs_spec, rhs_spec, out_spec = dimension_numbers
    out_shape = ctx.out_avals[0].shape
    axes: list = [None] * len(out_shape)
    lhs_need = [()] * len(lhs.shape)
    rhs_need = [()] * len(rhs.shape)
    used: set[str] = set()
    if batch_group_count == 1:
        axes[out_spec[0]] = ctx.carry_unused(out_spec[0], out_shape[out_spec[0]], lhs.axes[lhs_spec[0]], used)
    if feature_group_count == 1 and batch_group_count == 1:
        axes[out_spec[1]] = ctx.carry_unused(out_spec[1], out_shape[out_spec[1]], rhs.axes[rhs_spec[0]], used)
    out = TensorSharding(out_shape, tuple(axes))
    lhs_need[lhs_spec[0]] = out.layout[out_spec[0]]
    rhs_need[rhs_spec[0]] = out.layout[out_spec[1]]
    return RuleOutput((out,), (tuple(lhs_need), tuple(rhs_need)))


def finish_convolution(decisions, node):
    """The input-feature axes (``lhs_spec[1]``, ``rhs_spec[1]``) summed per block and finished by a ``psum`` (see
    :func:`~.contractions.finish_summed_pairs`); not with feature or batch groups, whose features pair by group."""
    if node.params["feature_group_count"] != 1 or node.params["batch_group_count"] != 1:
        return None
    lhs_spec, rhs_spec, _ = node.params["dimension_numbers"]
    return finish_summed_pairs(decisions, node, (lhs_spec[1],), (rhs_spec[1],))


def convolution_work(node, operand_blocks, out_block) -> float:
    """Multiply-adds on blocks: every output element sums over a kernel window of (per-device) input features."""
    _, rhs_spec, _ = node.params["dimension_numbers"]
    rhs_block = operand_blocks[1]
    return float(math.prod(out_block) * math.prod(rhs_block) / max(rhs_block[rhs_spec[0]], 1))


def conv_lineage(ctx: LineageContext, box: Box, output: int, *, dimension_numbers, feature_group_count=1,
                 batch_group_count=1, **params):
    """An output batch row reads the same lhs batch row; an output feature reads its rhs output-feature
    slice when there are no feature groups. Everything else is read whole."""
    lhs_shape, rhs_shape = ctx.in_shapes
    lhs_spec, rhs_spec, out_spec = dimension_numbers.lhs_spec, dimension_numbers.rhs_spec, dimension_numbers.out_spec
    lhs_box = list(full_box(lhs_shape))
    rhs_box = list(full_box(rhs_shape))
    if batch_group_count == 1:
        lhs_box[lhs_spec[0]] = box[out_spec[0]]
    if feature_group_count == 1 and batch_group_count == 1:
        rhs_box[rhs_spec[0]] = box[out_spec[1]]
    return [[tuple(lhs_box)], [tuple(rhs_box)]]


def reduce_window(ctx: RuleContext, *operands: TensorSharding, window_dimensions, window_strides, padding,
                  base_dilation, window_dilation, **params) -> RuleOutput:
    n_arrays = len(ctx.out_avals)  # generic reduce_window takes operands then as many init values
    arrays, inits = operands[:n_arrays], operands[n_arrays:]
    shape = arrays[0].shape
    keep = _trivial_windows(window_dimensions, window_strides, padding, base_dilation, window_dilation)
    out_shape = ctx.out_avals[0].shape
    outputs = tuple(
        TensorSharding(out_shape, tuple(ctx.merge(k, out_shape[k], [a.axes[k] for a in arrays]) if kept else None
                                        for k, kept in enumerate(keep)))
        for _ in range(n_arrays)
    )
    need = outputs[0].layout if shape == out_shape else tuple(
        m if kept else () for m, kept in zip(outputs[0].layout, keep, strict=True))
    return RuleOutput(outputs, (need,) * n_arrays + tuple(((),) * len(i.shape) for i in inits))


def reduce_window_lineage(ctx: LineageContext, box: Box, output: int, *, window_dimensions, window_strides,
                          padding, base_dilation=None, window_dilation=None, **params):
    """Output ``o`` reads operand ``[o·stride − lo, o·stride − lo + (w − 1)·dilation]``; where windows
    leave gaps (stride > window) or are dilated, the answer is the hull of the windows (flagged inexact)."""
    n_operands = len(ctx.in_shapes) // 2 if len(ctx.in_shapes) > 1 else 1
    shape = ctx.in_shapes[0]
    base_dilation = base_dilation or (1,) * len(shape)
    window_dilation = window_dilation or (1,) * len(shape)
    if any(d != 1 for d in base_dilation):
        ctx.exact = False
        return [[full_box(s)] for s in ctx.in_shapes]
    box_in = []
    for n, w, st, (lo, _), wd, (s, e) in zip(shape, window_dimensions, window_strides, padding, window_dilation,
                                             box, strict=True):
        if (st > w and e - s > 1) or (wd != 1 and w > 1):  # gaps between windows, or inside a dilated one
            ctx.exact = False
        first, last = s * st - lo, (e - 1) * st - lo + (w - 1) * wd + 1
        box_in.append((max(0, first), min(n, last)))
    if n_operands > 1:  # a variadic window's reducer may pair operands any way: each output reads them all
        ctx.exact = False
    operand_boxes = [[tuple(box_in)] if all(a < b for a, b in box_in) else [] for _ in range(n_operands)]
    return operand_boxes + [[()] for _ in ctx.in_shapes[n_operands:]]


def _trivial_windows(window_dimensions, window_strides, padding, base_dilation=None, window_dilation=None):
    """Per axis: True where the window is one element with stride 1 and no padding or dilation."""
    ones = (1,) * len(window_dimensions)
    return [w == 1 and s == 1 and tuple(p) == (0, 0) and b == 1 and d == 1 for w, s, p, b, d in zip(
        window_dimensions, window_strides, padding, base_dilation or ones, window_dilation or ones, strict=True)]


def select_and_window(ctx: RuleContext, *operands: TensorSharding, window_dimensions, window_strides, padding,
                      base_dilation=None, window_dilation=None, **params) -> RuleOutput:
    """Axes with a trivial window merge the two operands and keep the sharding; the others are needed whole."""
    keep = _trivial_windows(window_dimensions, window_strides, padding, base_dilation, window_dilation)
    out_shape = ctx.out_avals[0].shape
    axes = tuple(ctx.merge(k, n, [op.axes[k] for op in operands]) if kept else None
                 for k, (n, kept) in enumerate(zip(out_shape, keep, strict=True)))
    out = TensorSharding(out_shape, axes)
    need = tuple(m if kept else () for m, kept in zip(out.layout, keep, strict=True))
    return RuleOutput((out,), (need,) * len(operands))


def _windows_over(s: int, e: int, n_windows: int, n: int, w: int, stride: int, lo: int):
    """The windows (``[first, last)``) that overlap operand range ``[s, e)``, and the operand range they cover."""
    first = max(0, -(-(s + lo - w + 1) // stride))
    last = min(n_windows, (e - 1 + lo) // stride + 1)
    return (first, last), (max(0, first * stride - lo), min(n, (last - 1) * stride - lo + w))


def select_and_scatter_lineage(ctx: LineageContext, box: Box, output: int, *, window_dimensions, window_strides,
                               padding, **params):
    """An output element (operand-shaped) receives the source values of the windows that contain it, chosen
    by comparing those windows of the operand."""
    source_shape, operand_shape = ctx.in_shapes  # select_and_scatter_add(source, operand)
    source_box, operand_box = [], []
    for (s, e), n, m, w, st, (lo, _) in zip(box, operand_shape, source_shape, window_dimensions, window_strides,
                                            padding, strict=True):
        windows, covered = _windows_over(s, e, m, n, w, st, lo)
        source_box.append(windows)
        operand_box.append(covered)
    return [[tuple(source_box)] if all(a < b for a, b in source_box) else [], [tuple(operand_box)]]


def select_and_gather_lineage(ctx: LineageContext, box: Box, output: int, *, window_dimensions, window_strides,
                              padding, **params):
    """An output element reads its window of the operand (to select) and of the tangents."""
    shape = ctx.in_shapes[0]
    window = []
    for n, w, st, (lo, _), (s, e) in zip(shape, window_dimensions, window_strides, padding, box, strict=True):
        window.append((max(0, s * st - lo), min(n, (e - 1) * st - lo + w)))
    return [[tuple(window)], [tuple(window)]]


OPS = [
    OpDef("conv_general_dilated", Family.WINDOW, propagate=conv_general_dilated, lineage=conv_lineage,
          lineage_exact=False, per_block=bind_as_is, finish=finish_convolution, pull=None, linear=Linearity.EITHER,
          work=convolution_work),
    *defs(("reduce_window_sum", "reduce_window_max", "reduce_window_min", "reduce_window"), Family.WINDOW,
          propagate=reduce_window, lineage=reduce_window_lineage, lineage_exact=True, per_block=bind_as_is,
          finish=None, pull=None, linear=Linearity.NONE),
    # The max-pool's derivatives: a scatter of the source into the selected element of each window, and a
    # gather of the tangent at it.
    OpDef("select_and_scatter_add", Family.WINDOW, propagate=select_and_window,
          lineage=select_and_scatter_lineage, lineage_exact=False, per_block=bind_as_is, finish=None, pull=None,
          linear=Linearity.NONE),
    OpDef("select_and_gather_add", Family.WINDOW, propagate=select_and_window, lineage=select_and_gather_lineage,
          lineage_exact=False, per_block=bind_as_is, finish=None, pull=None, linear=Linearity.NONE),
]
