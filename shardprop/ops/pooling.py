"""Windowed reductions (pooling) and the derivatives of a max-pool.

``reduce_window_*`` keep the sharding of axes whose window is a single element with stride 1 and no padding or
dilation, and of axes where each device can compute its block of the output from its block and its neighbours'
edges (a halo, ``.windows``: a SAME pool, a strided pool whose stride divides the block, a VALID 2x2 pool); the
rows past the ends of the array become the reduction's identity (-inf for a maximum). ``select_and_scatter_add``
and ``select_and_gather_add`` (a max-pool's gradient and tangent) keep the operand's sharding the same way
(``select_reaches``); trivial windows merge their two operands.

Lineage: a window reduction's output reads the windows it covers; a scatter into windows reads the windows that
overlap the box (sound, not exact).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from ..core.blocks import Blocks, bind_as_is, one_unseen
from ..core.boxes import Box, LineageContext, full_box
from ..core.layouts import Sharded, Span, TensorSharding, shard_count, standard_span
from ..core.types import ValueType
from ..core.rules import RuleContext, RuleOutput
from ..expr import jax_adapter as jx
from .opdef import Family, Linearity, OpDef, defs
from .windows import (identity, past_the_ends, reach_or_bug, trivial_windows, unpadded, window_of, window_out,
                      window_reach, window_rows, with_halo)


def reduce_window(ctx: RuleContext, *operands: TensorSharding, window_dimensions, window_strides, padding,
                  base_dilation, window_dilation, **params) -> RuleOutput:
    n_arrays = len(ctx.out_avals)  # generic reduce_window takes operands then as many init values
    arrays, inits = operands[:n_arrays], operands[n_arrays:]
    shape = arrays[0].shape
    keep = trivial_windows(window_dimensions, window_strides, padding, base_dilation, window_dilation)
    out_shape = ctx.out_avals[0].shape
    if n_arrays > 1 or any(kept and isinstance(a, Sharded) and a.span is not None
                           for kept, a in zip(keep, arrays[0].axes, strict=True)):
        arrays = tuple(a.without_ranges() for a in arrays)  # a ranged axis without a window is read whole
    axes, need, reads = [], [], []
    for k, kept in enumerate(keep):
        source = arrays[0].axes[k]
        found = None
        if not kept and n_arrays == 1 and isinstance(source, Sharded) and source.mesh_axes and _halo_allowed(
                params, padding[k]):
            window = window_of(k, window_dimensions, window_strides, padding, base_dilation, window_dilation)
            found = _rows(shape[k], source, ctx.mesh_shape, out_shape[k], window)
        if kept:
            axes.append(ctx.merge(k, out_shape[k], [a.axes[k] for a in arrays]))
        elif found is not None:
            reach, out_span = found
            axes.append(ctx.carry_window(k, out_shape[k], source, reach, out_span))
        else:
            axes.append(None)
        need.append(axes[-1].mesh_axes if isinstance(axes[-1], Sharded) and source.span is None else ())
        reads.append((source.mesh_axes, source.span) if found is not None and source.span is not None else None)
    outputs = tuple(TensorSharding(out_shape, tuple(axes)) for _ in range(n_arrays))
    scalars = tuple(((),) * len(i.shape) for i in inits)
    spans = (tuple(reads),) + tuple((None,) * len(i.shape) for i in inits) if any(reads) else None
    return RuleOutput(outputs, (tuple(need),) * n_arrays + scalars, need_spans=spans)


def _rows(size: int, source: Sharded, mesh_shape, out_size: int, window: dict):
    """``.windows.window_rows`` for an operand axis laid out as ``source`` (ranged, or equal blocks)."""
    count = shard_count(mesh_shape, source.mesh_axes)
    span = source.span or (Span(0, size // count) if size % count == 0 else None)
    return None if span is None else window_rows(span, size, count, out_size, **window)


def _halo_allowed(params, padding) -> bool:
    """A generic ``reduce_window`` (a ``jaxpr`` reducer) with padding on an axis gets no halo there: XLA leaves the
    padded rows out of its windows, which no fill value past the ends of the array reproduces for an init value
    that is not the reducer's identity (``lax.reduce_window(x, 1., lax.add, ...)``)."""
    return "jaxpr" not in params or tuple(padding) == (0, 0)


def _pool_reaches(params, shape, need, mesh_shape) -> dict[int, tuple[int, int]]:
    """Axis -> its halo (``.windows.window_rows``) for each axis with a window that a windowed reduction
    consumes sharded (``need``: its operand's type, ranged or not)."""
    names = ("window_dimensions", "window_strides", "padding", "base_dilation", "window_dilation")
    reaches = {}
    for k, kept in enumerate(trivial_windows(*(params.get(n) for n in names))):
        if need.layout[k] and not kept:
            window = window_of(k, *(params.get(n) for n in names))
            count = shard_count(mesh_shape, need.layout[k])
            span = need.span_of(k) or Span(0, shape[k] // count)
            found = window_rows(span, shape[k], count, window_out(shape[k], **window), **window)
            reaches[k] = reach_or_bug(shape[k], need.layout[k], window, found and found[0])
    return reaches


def pool_halo(node, in_shapes, needs, mesh_shape):
    """The operand of a windowed reduction consumed with the halo of every sharded axis with a window."""
    reaches = _pool_reaches(node.params, in_shapes[0], needs[0], mesh_shape)
    return (with_halo(needs[0], reaches), *needs[1:])


def pool_block(node, invals, blocks: Blocks) -> list:
    """The windowed reduction on blocks: along a sharded axis with a window the block arrives with its halo, whose
    rows past the ends of the array become the reduction's identity (what it pads with: the init value, -inf for a
    maximum) — the rows of a ranged axis no device holds, its fill — and the window runs unpadded there."""
    spans = blocks.in_spans[0] if blocks.in_spans else (None,) * len(blocks.in_layouts[0])
    need = ValueType(blocks.in_layouts[0], span=spans)
    reaches = _pool_reaches(node.params, blocks.in_global[0], need, blocks.mesh_shape)
    if not reaches:
        return bind_as_is(node, invals, blocks)
    x, *inits = invals
    fill = inits[0] if inits else identity(node.primitive.name, x.dtype)
    padding = list(node.params["padding"])
    for k, reach in reaches.items():
        x = past_the_ends(x, k, reach[0], blocks.in_global[0][k], blocks.in_layouts[0][k], blocks.mesh_shape, fill,
                          spans[k])
        x, padding[k] = unpadded(x, k, reach), (0, 0)
    out = jx.bind(node.primitive, [x, *inits], {**node.params, "padding": tuple(padding)})
    if node.primitive.name != "reduce_window_sum":
        return out
    return [summed_windows(y, tuple(blocks.mesh_shape.items())) for y in out]


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def summed_windows(y, mesh_items):
    """``y``, a block's window sums, whose tangent is multiplied by a 1 XLA cannot fold (``one_unseen``). A block's
    windows are differentiated by padding their cotangent and summing its windows; where that cotangent is itself a
    padded block of one row along the windowed axis — a strided slice's, keeping one row a block — XLA:CPU's
    algebraic simplifier folds the two pads and the window sum into a broadcast of the row (jaxlib 0.10.2:
    ``reduce_window(pad(pad(x)))``, ``x`` of one row, window 2), and the gradient gains the rows the windows beside
    it should have left at zero. The product keeps the two pads apart; exact, and a no-op without a derivative."""
    return y


@summed_windows.defjvp
def _summed_windows_jvp(mesh_items, primals, tangents):
    (y,), (y_dot,) = primals, tangents
    return y, y_dot * one_unseen(dict(mesh_items), y_dot.dtype)


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


def select_and_scatter(ctx: RuleContext, *operands: TensorSharding, **params) -> RuleOutput:
    """``select_and_scatter_add``: see ``select_and_window``."""
    return select_and_window("select_and_scatter_add", ctx, *operands, **params)


def select_and_gather(ctx: RuleContext, *operands: TensorSharding, **params) -> RuleOutput:
    """``select_and_gather_add``: see ``select_and_window``."""
    return select_and_window("select_and_gather_add", ctx, *operands, **params)


def _ranges_clash(operands: tuple[TensorSharding, ...]) -> bool:
    """An axis held in ranged rows over mesh axes another axis of an operand is laid out over: read so, the operands
    would be needed over one mesh axis twice (a max pool's cotangent ranged over ``k`` beside windows laid over ``k``
    along the next axis). The ranges are then read whole."""
    for o in operands:
        for k, a in enumerate(o.axes):
            if isinstance(a, Sharded) and a.span is not None and any(
                    isinstance(b, Sharded) and set(a.mesh_axes) & set(b.mesh_axes)
                    for p in operands for j, b in enumerate(p.axes) if j != k):
                return True
    return False


def select_and_window(op: str, ctx: RuleContext, *operands: TensorSharding, window_dimensions, window_strides,
                      padding, base_dilation=None, window_dilation=None, **params) -> RuleOutput:
    """Axes with a trivial window merge the two operands and keep the sharding; an axis with a window keeps the
    operand's (the second) where each device can compute its block from its own and its neighbours' edges
    (``select_reaches``); the others are needed whole."""
    keep = trivial_windows(window_dimensions, window_strides, padding, base_dilation, window_dilation)
    out_shape = ctx.out_avals[0].shape
    first = operands[0]
    if op != "select_and_scatter_add" or any(
            kept and isinstance(a, Sharded) and a.span is not None for o in operands
            for kept, a in zip(keep, o.axes, strict=True)) or _ranges_clash(operands):
        operands = tuple(o.without_ranges() for o in operands)  # ranged windows: a VALID pool's cotangent, alone
    first, operand = operands
    axes, reads, operand_reads = [], [None] * len(out_shape), [None] * len(out_shape)
    for k, (n, kept) in enumerate(zip(out_shape, keep, strict=True)):
        source = operand.axes[k]
        windows = first.axes[k]
        span = windows.span if isinstance(windows, Sharded) else None
        rows = source.span if isinstance(source, Sharded) else None
        stride = window_strides[k]
        if rows is not None and span is None and rows.block % stride == 0:  # the source read in the operand's blocks
            span, windows = Span(0, rows.block // stride), source
        reach = None if kept or not isinstance(source, Sharded) else select_reaches(
            op, operand.shape[k], shard_count(ctx.mesh_shape, source.mesh_axes),
            **window_of(k, window_dimensions, window_strides, padding, base_dilation, window_dilation),
            windows=(first.shape[k], span) if span is not None and windows.mesh_axes == source.mesh_axes else None,
            rows=rows)
        if kept:
            axes.append(ctx.merge(k, n, [op.axes[k] for op in operands]))
        elif reach is not None:
            axes.append(ctx.carry_window(k, n, source, reach[1], rows))
            if span is not None:
                reads[k] = (source.mesh_axes, span)
            if rows is not None:
                operand_reads[k] = (source.mesh_axes, rows)
        else:
            axes.append(None)
    out = TensorSharding(out_shape, tuple(axes))
    need = tuple(m if kept or out.layout[k] else () for k, (m, kept) in enumerate(zip(out.layout, keep, strict=True)))
    if not any(reads) and not any(operand_reads):
        return RuleOutput((out,), (need,) * len(operands))
    first_need = tuple(() if reads[k] else m for k, m in enumerate(need))
    operand_need = tuple(() if operand_reads[k] else m for k, m in enumerate(need))
    return RuleOutput((out,), (first_need, operand_need), need_spans=(tuple(reads), tuple(operand_reads)))


def select_reaches(op: str, size: int, blocks: int, *, window: int, stride: int, padding: tuple[int, int],
                   dilation: int = 1, base_dilation: int = 1, windows: tuple[int, Span] | None = None,
                   rows: Span | None = None):
    """``(first operand's reach, operand's reach)`` (each ``(before, after)``) for a max-pool's derivative along an
    axis of the operand ``size`` long in ``blocks`` even blocks, the windows ``size / stride`` many, or None.

    ``select_and_gather_add`` (tangent, operand -> per window) reads as a pooling window does (``window_reach``).
    ``select_and_scatter_add`` (per-window source, operand -> per operand row) computes a device's rows from every
    window that overlaps them: the source's windows before and after its own, and the operand rows those windows
    cover; the rows its windows scatter into its neighbours' rows are the neighbours' to compute. ``windows``: the
    source's length and span where it is ranged (a VALID pool's cotangent, its last blocks short: each device's
    windows those its operand block starts, the padding zeroed). ``rows``: the operand's span where it is ranged
    too (a pool after a VALID window), its blocks from the first row on: computed as the frame of its blocks, the
    padding never selected.

    >>> select_reaches("select_and_scatter_add", 64, 8, window=3, stride=2, padding=(0, 1))   # a 3x3/2 SAME pool
    ((1, 0), (2, 1))
    >>> select_reaches("select_and_scatter_add", 64, 8, window=3, stride=1, padding=(0, 0),   # a 3x3 VALID pool
    ...                windows=(62, Span(0, 8)))
    ((2, 0), (2, 2))
    """
    count = window_out(size, window=window, stride=stride, padding=padding, dilation=1, base_dilation=1)
    if rows is not None:
        if op != "select_and_scatter_add" or rows.offset != 0 or rows.fill is not None or windows is None:
            return None
        size = blocks * rows.block
    if blocks <= 1 or dilation != 1 or base_dilation != 1 or size % blocks or padding[0] < 0:
        return None
    block, before = size // blocks, padding[0]
    if block % stride:
        return None
    if windows is None and count * stride != size or windows is not None and (
            op != "select_and_scatter_add" or windows[0] != count or windows[1] != Span(0, block // stride)):
        return None
    if op == "select_and_gather_add":
        reach = window_reach(size, blocks, count, window=window, stride=stride, padding=padding)
        return None if reach is None else (reach, reach)
    windows_before = (window - 1 - before) // stride  # the windows that start in a block before and reach into it
    windows_after = (before - 1) // stride + 1
    rows = (before + windows_before * stride, (windows_after - 1) * stride - before + window)
    if max(rows[0], 0) + max(rows[1], 0) > (blocks - 1) * block or min(windows_before, windows_after) < 0:
        return None
    return (windows_before, windows_after), rows


def _select_reaches(node, in_shapes, layouts, mesh_shape, spans=(), operand_spans=()):
    """Axis -> ``select_reaches`` for each axis with a window the op consumes its operand sharded on (``spans``:
    the source's, where it is ranged)."""
    names = ("window_dimensions", "window_strides", "padding", "base_dilation", "window_dilation")
    params = [node.params.get(n) for n in names]
    reaches = {}
    for k, kept in enumerate(trivial_windows(*params)):
        if layouts[1][k] and not kept:
            span, rows = spans[k] if spans else None, operand_spans[k] if operand_spans else None
            count = shard_count(mesh_shape, layouts[1][k])
            if span is None and rows is not None and layouts[0][k] == layouts[1][k]:
                span = standard_span(in_shapes[0][k], count)  # the windows in equal blocks, which a type spells None
            found = select_reaches(node.op, in_shapes[1][k], count, **window_of(k, *params),
                                   windows=None if span is None else (in_shapes[0][k], span), rows=rows)
            if found is None:
                raise ValueError(f"`{node.op}` along axis {k} has no halo: the rule keeps such an axis whole (a "
                                 "shardprop bug)")
            reaches[k] = found
    return reaches


def select_halo(node, in_shapes, needs, mesh_shape):
    """Both operands of a max-pool's derivative consumed with their halos (``select_reaches``)."""
    reaches = _select_reaches(node, in_shapes, [n.layout for n in needs], mesh_shape, needs[0].span, needs[1].span)
    return (with_halo(needs[0], {k: r[0] for k, r in reaches.items()}),
            with_halo(needs[1], {k: r[1] for k, r in reaches.items()}))


def select_block(node, invals, blocks: Blocks) -> list:
    """A max-pool's derivative on haloed blocks: the operand's rows past the ends of the array can never be selected
    (the lowest value for a maximum), the windows run unpadded, and ``select_and_scatter_add`` keeps the rows of its
    own block."""
    spans, operand_spans = blocks.in_spans or ((), ())
    reaches = _select_reaches(node, blocks.in_global, blocks.in_layouts, blocks.mesh_shape, spans, operand_spans)
    if not reaches:
        return bind_as_is(node, invals, blocks)
    first, operand = invals
    fill = identity("reduce_window_max" if node.params["select_prim"] is lax.ge_p else "reduce_window_min",
                     operand.dtype)
    padding = list(node.params["padding"])
    for k, (first_reach, rows) in reaches.items():
        size, mesh_axes = blocks.in_global[1][k], blocks.in_layouts[1][k]
        operand = unpadded(past_the_ends(operand, k, rows[0], size, mesh_axes, blocks.mesh_shape, fill,
                                         operand_spans[k] if operand_spans else None), k, rows)
        if spans and spans[k] is not None:  # windows past the last one (a ranged source's padding) scatter nothing
            first = past_the_ends(first, k, first_reach[0], blocks.in_global[0][k], mesh_axes, blocks.mesh_shape, 0,
                                  spans[k])
        first = unpadded(first, k, first_reach)
        padding[k] = (0, 0)
    out = jx.bind(node.primitive, [first, operand], {**node.params, "padding": tuple(padding)})[0]
    if node.op == "select_and_scatter_add":
        for k, (_, rows) in reaches.items():
            if rows[1] < 0:  # its last rows, in no window (a stride longer than the window), receive nothing
                out = lax.pad(out, jnp.zeros((), out.dtype),
                              [(0, -rows[1], 0) if j == k else (0, 0, 0) for j in range(out.ndim)])
            span = operand_spans[k] if operand_spans else None
            block = span.block if span is not None else blocks.in_global[1][k] // shard_count(
                blocks.mesh_shape, blocks.in_layouts[1][k])
            out = lax.slice_in_dim(out, rows[0], rows[0] + block, axis=k)
    return [out]


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
    *defs(("reduce_window_sum", "reduce_window_max", "reduce_window_min", "reduce_window"), Family.WINDOW,
          propagate=reduce_window, lineage=reduce_window_lineage, lineage_exact=True, per_block=pool_block,
          finish=None, pull=None, linear=Linearity.NONE, halo=pool_halo, reads_ranges=True),
    # The max-pool's derivatives: a scatter of the source into the selected element of each window, and a
    # gather of the tangent at it.
    OpDef("select_and_scatter_add", Family.WINDOW, propagate=select_and_scatter,
          lineage=select_and_scatter_lineage, lineage_exact=False, per_block=select_block, finish=None, pull=None,
          linear=Linearity.NONE, halo=select_halo, reads_ranges=True),
    OpDef("select_and_gather_add", Family.WINDOW, propagate=select_and_gather, lineage=select_and_gather_lineage,
          lineage_exact=False, per_block=select_block, finish=None, pull=None, linear=Linearity.NONE,
          halo=select_halo),
]
