"""Convolutions.

``conv_general_dilated``: the batch axis and the output-feature axis propagate (from the input and the kernel);
input-feature axes are needed whole. A spatial axis stays sharded where each device can compute its block of the
output from its block of the input and a few rows of its neighbours' (a *halo*, ``.windows``): a SAME or strided
convolution (the output the input's length over the stride, the stride dividing the block), its input gradient (a
dilated input), and its kernel gradient (the kernel's axis sharded like the input's: a partial sum). Other spatial
axes are needed whole. The windowed reductions are in ``pooling.py``.

Lineage: a convolution reads whole spatial and input-feature axes (sound, not exact).

Finish: a convolution sums over the input-feature axes of its two operands, so where both are sharded alike
each device convolves its blocks and a ``psum`` adds the partial results, as for a contraction. That is the
kernel gradient of a data-parallel convolution: JAX transposes the batch axis into the input-feature position,
and the small kernel-shaped result is all-reduced instead of the batch-sharded activations being gathered. The
kernel gradient of a spatially sharded convolution sums over the spatial axes the same way.
"""

from __future__ import annotations

import math


from ..core.blocks import Blocks, bind_as_is
from ..core.boxes import Box, LineageContext, full_box
from ..core.layouts import Sharded, Span, TensorSharding, shard_count
from ..core.rules import RuleContext, RuleOutput
from ..expr import jax_adapter as jx
from .contractions import finish_summed_pairs
from .range_blocks import masked_rows
from .opdef import Family, Linearity, OpDef
from .windows import (dilated_window_reach, past_the_ends, reach_or_bug, summed_window_reach, window_out,
                      window_rows, with_halo)


def conv_general_dilated(ctx: RuleContext, lhs: TensorSharding, rhs: TensorSharding, *, dimension_numbers,
                         feature_group_count, batch_group_count, **params) -> RuleOutput:
    lhs_spec, rhs_spec, out_spec = dimension_numbers
    if rhs.spans or any(k not in lhs_spec[2:] for k, s in enumerate(lhs.spans) if s is not None):
        lhs, rhs = lhs.without_ranges(), rhs.without_ranges()  # ranged rows only a spatial window reads in place
    out_shape = ctx.out_avals[0].shape
    axes: list = [None] * len(out_shape)
    lhs_need = [()] * len(lhs.shape)
    rhs_need = [()] * len(rhs.shape)
    reads: list = [None] * len(lhs.shape)
    used: set[str] = set()
    if batch_group_count == 1:
        axes[out_spec[0]] = ctx.carry_unused(out_spec[0], out_shape[out_spec[0]], lhs.axes[lhs_spec[0]], used)
    if feature_group_count == 1 and batch_group_count == 1:
        axes[out_spec[1]] = ctx.carry_unused(out_spec[1], out_shape[out_spec[1]], rhs.axes[rhs_spec[0]], used)
    for k_in, k_out, window in _spatial(lhs_spec, rhs_spec, out_spec, params, rhs.shape):
        source = lhs.axes[k_in]
        if not isinstance(source, Sharded) or used.intersection(source.mesh_axes):
            continue
        found = _conv_reach(lhs.shape[k_in], shard_count(ctx.mesh_shape, source.mesh_axes), out_shape[k_out], window,
                            source.span)
        if found is not None:
            reach, out_span = found
            axes[k_out] = ctx.carry_window(k_out, out_shape[k_out], source, reach[:2], out_span)
            used.update(source.mesh_axes)
            if source.span is None:
                lhs_need[k_in] = source.mesh_axes
            else:
                reads[k_in] = (source.mesh_axes, source.span)
    out = TensorSharding(out_shape, tuple(axes))
    lhs_need[lhs_spec[0]] = out.layout[out_spec[0]]
    rhs_need[rhs_spec[0]] = out.layout[out_spec[1]]
    spans = (tuple(reads), (None,) * len(rhs.shape)) if any(reads) else None
    return RuleOutput((out,), (tuple(lhs_need), tuple(rhs_need)), need_spans=spans)


def _spatial(lhs_spec, rhs_spec, out_spec, params, rhs_shape):
    """Per spatial axis of a convolution: its lhs axis, its output axis, and its window (for ``window_reach``)."""
    strides, padding = params["window_strides"], params["padding"]
    lhs_dilation = params.get("lhs_dilation") or (1,) * len(strides)
    rhs_dilation = params.get("rhs_dilation") or (1,) * len(strides)
    for i, (k_in, k_rhs, k_out) in enumerate(zip(lhs_spec[2:], rhs_spec[2:], out_spec[2:], strict=True)):
        yield k_in, k_out, dict(window=rhs_shape[k_rhs], stride=strides[i], padding=tuple(padding[i]),
                                dilation=rhs_dilation[i], base_dilation=lhs_dilation[i])


def _summed_spatial(params, shapes, lhs_layout, rhs_layout, mesh_shape, lhs_spans=(), rhs_spans=()):
    """``(lhs axis, rhs axis, reach)`` for each spatial axis whose window (the rhs's, ranged where ``rhs_spans``
    says) is sharded like the lhs's and can be summed in blocks (``summed_window_reach``). A ranged lhs axis
    (its blocks from the first row on, every row held) is summed as the frame of its blocks, its padding zeroed."""
    dn = params["dimension_numbers"]
    lhs_shape, rhs_shape = shapes[0], shapes[1]
    for k_in, k_rhs, (_, _, window) in zip(dn.lhs_spec[2:], dn.rhs_spec[2:], _spatial(
            dn.lhs_spec, dn.rhs_spec, dn.out_spec, params, rhs_shape), strict=True):
        if lhs_layout[k_in] and lhs_layout[k_in] == rhs_layout[k_rhs]:
            n = shard_count(mesh_shape, lhs_layout[k_in])
            span, size = (lhs_spans[k_in] if lhs_spans else None), lhs_shape[k_in]
            if span is not None and (span.offset != 0 or span.fill is not None):
                continue
            reach = summed_window_reach(size if span is None else n * span.block, rhs_shape[k_rhs], n,
                                        window_out(size, **window),
                                        **{key: v for key, v in window.items() if key != "window"},
                                        window_span=rhs_spans[k_rhs] if rhs_spans else None)
            if reach is not None:
                yield k_in, k_rhs, reach


def _conv_reaches(params, shapes, layouts, mesh_shape, lhs_spans=(), rhs_spans=()
                  ) -> dict[int, tuple[int, int, tuple[int, int]]]:
    """lhs axis -> ``(before, after, local padding)``: the rows past its block the convolution reads and how the window
    pads the haloed block, for each spatial axis the lhs is consumed sharded on (ranged where ``lhs_spans`` says) —
    ``summed_window_reach`` where the kernel's axis is sharded alike, ``dilated_window_reach`` for a dilated
    input, else ``.windows.window_rows``."""
    lhs_shape, rhs_shape = shapes[0], shapes[1]
    out = params["dimension_numbers"]
    reaches = {k_in: (*reach, (0, min(reach[1], 0)))
               for k_in, _, reach in _summed_spatial(params, shapes, *layouts, mesh_shape, lhs_spans, rhs_spans)}
    for k_in, _, window in _spatial(out.lhs_spec, out.rhs_spec, out.out_spec, params, rhs_shape):
        if layouts[0][k_in] and k_in not in reaches:
            found = _conv_reach(lhs_shape[k_in], shard_count(mesh_shape, layouts[0][k_in]),
                                window_out(lhs_shape[k_in], **window), window, lhs_spans[k_in] if lhs_spans else None)
            reaches[k_in] = reach_or_bug(lhs_shape[k_in], layouts[0][k_in], window, found and found[0])
    return reaches


def _conv_reach(size, blocks, out_size, window, span: Span | None = None):
    """``((before, after, local padding), out span)`` — ``dilated_window_reach`` for a dilated input, else
    ``.windows.window_rows`` over the rows the devices hold (equal blocks, or ``span``), the window padding the
    haloed block by the rows it does not read (negative); None where neither applies."""
    if window["base_dilation"] > 1:
        if span is not None:  # as the frame of its blocks, the padding rows (zeroed) standing for padding
            if span.offset != 0 or span.fill is not None:
                return None
            lo, hi = window["padding"]
            frame = blocks * span.block
            window = {**window, "padding": (lo, hi - (frame - size) * window["base_dilation"])}
            size = frame
        found = dilated_window_reach(size, blocks, out_size, **window)
        return None if found is None else (found, None)
    if span is None and size % blocks:
        return None
    found = window_rows(span or Span(0, size // blocks), size, blocks, out_size, **window)
    if found is None:
        return None
    (before, after), out_span = found
    return (before, after, (min(before, 0), min(after, 0))), out_span


def convolution_halo(node, in_shapes, needs, mesh_shape):
    """The lhs of a convolution consumed with the halo of every sharded spatial axis."""
    reaches = _conv_reaches(node.params, in_shapes, (needs[0].layout, needs[1].layout), mesh_shape, needs[0].span,
                            needs[1].span)
    return (with_halo(needs[0], reaches), *needs[1:])


def convolution_block(node, invals, blocks: Blocks) -> list:
    """The convolution on blocks: along a sharded spatial axis the lhs block arrives with its halo, so the window
    runs unpadded there (the halo holds the padding at the ends of the array: zeros), over the rows it reads. A ranged
    axis's padding rows are zeroed too, and its rows no device holds are its fill."""
    spans, rhs_spans = blocks.in_spans or ((), ())
    reaches = _conv_reaches(node.params, blocks.in_global, blocks.in_layouts, blocks.mesh_shape, spans, rhs_spans)
    lhs, rhs = invals
    lhs_spec = node.params["dimension_numbers"].lhs_spec
    if blocks.in_spans:  # ranged rows the convolution sums over (a kernel axis, input features): padding adds nothing;
        # nor, along the batch axis, to the kernel's derivative (a padding row's NaN times its zero cotangent is NaN);
        # a haloed spatial axis is masked by its reach below
        rhs = masked_rows(rhs, blocks, 1, range(rhs.ndim))
        lhs = masked_rows(lhs, blocks, 0, [k for k in range(lhs.ndim) if k not in reaches])
    if not reaches:
        return bind_as_is(node, [lhs, rhs], blocks)
    padding = list(node.params["padding"])
    for i, k in enumerate(lhs_spec[2:]):
        if k in reaches:
            padding[i] = reaches[k][2]
            if spans and spans[k] is not None:
                lhs = past_the_ends(lhs, k, reaches[k][0], blocks.in_global[0][k], blocks.in_layouts[0][k],
                                    blocks.mesh_shape, 0, spans[k])
    return jx.bind(node.primitive, [lhs, rhs], {**node.params, "padding": tuple(padding)})


def finish_convolution(decisions, node):
    """The input-feature axes (``lhs_spec[1]``, ``rhs_spec[1]``) summed per block and finished by a ``psum`` (see
    ``.contractions.finish_summed_pairs``); not with feature or batch groups, whose features pair by group. So
    are the spatial axes whose window is sharded like the input (``summed_window_reach``, the kernel gradient of
    a spatially sharded convolution), each device's input block with its halo."""
    if node.params["feature_group_count"] != 1 or node.params["batch_group_count"] != 1:
        return None
    lhs_spec, rhs_spec, _ = node.params["dimension_numbers"]
    shapes = [decisions.graph.avals[v].shape for v in node.operands]
    lhs, rhs = (decisions.type(v) for v in node.operands)
    spatial = [(k_in, k_rhs) for k_in, k_rhs, _ in _summed_spatial(node.params, shapes, lhs.layout, rhs.layout,
                                                                    decisions.mesh_shape, lhs.span, rhs.span)]
    return finish_summed_pairs(decisions, node, (lhs_spec[1], *(a for a, _ in spatial)),
                               (rhs_spec[1], *(b for _, b in spatial)), reads_ranges=True,
                               own_rows=frozenset(spatial))


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


OPS = [
    OpDef("conv_general_dilated", Family.WINDOW, propagate=conv_general_dilated, lineage=conv_lineage,
          lineage_exact=False, per_block=convolution_block, finish=finish_convolution, pull=None,
          linear=Linearity.EITHER, work=convolution_work, halo=convolution_halo, reads_ranges=True,
          finish_follows_needs=True),
]
