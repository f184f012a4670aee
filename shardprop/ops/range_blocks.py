"""Slices, pads and concatenations along a sharded axis on per-device blocks (``shardprop.ops.ranges``' ``per_block``
pieces), and the masks other ops put on a ranged axis's padding (``masked_rows``)."""

from __future__ import annotations


import jax.numpy as jnp
import numpy as np
from jax import lax

from ..core.blocks import Blocks, block_index, block_rows, cut_outputs
from ..core.layouts import Span, shard_count, standard_span
from .range_routes import strided_layout
from .windows import past_the_ends

# per operand, per axis: (mesh axes, span) the rule reads that axis in, or None
NeedSpans = tuple[tuple[tuple[tuple[str, ...], Span] | None, ...], ...]


def split_block(node, invals, blocks: Blocks) -> list:
    """Pieces kept in place (ranged): each is the operand's block itself; else each device cuts its block of each
    piece out of the whole axis."""
    (x,) = invals
    axis = node.params["axis"]
    if blocks.out_spans and any(spans and spans[axis] is not None for spans in blocks.out_spans):
        return [x] * len(blocks.out_global)
    return cut_outputs(list(lax.split(x, node.params["sizes"], axis)), blocks)


def row_index(blocks: Blocks, span: Span, mesh_axes, shape, axis: int):
    """The global row each position of this device's block along ``axis`` holds (``span``'s rows), broadcastable."""
    return block_rows(tuple(n if k == axis else 1 for k, n in enumerate(shape)), axis, mesh_axes, blocks.mesh_shape,
                      span.block, -span.offset)


def masked_rows(x, blocks: Blocks, operand: int, axes, value=0):
    """Operand ``operand``'s block ``x`` with the padding of its ranged axes among ``axes`` (the rows past the axis's
    ends a device's block holds) set to ``value``: what an op summing or combining those rows must not read."""
    spans = blocks.in_spans[operand] if blocks.in_spans else ()
    for k in axes:
        if spans and spans[k] is not None:
            x = past_the_ends(x, k, 0, blocks.in_global[operand][k], blocks.in_layouts[operand][k], blocks.mesh_shape,
                              value, spans[k])
    return x


def _out_span(blocks: Blocks, k: int, axis: int) -> Span | None:
    """The rows output ``k``'s block holds along ``axis`` when the op computed it in place (ranged, or equal blocks
    read realigned); None when the axis is computed the ordinary way."""
    spans = blocks.out_spans[k] if blocks.out_spans else None
    span = spans[axis] if spans else None
    if span is None and blocks.out_layouts[k][axis] and blocks.in_spans and any(
            s and s[axis] is not None for s in blocks.in_spans):
        return standard_span(blocks.out_global[k][axis], shard_count(blocks.mesh_shape, blocks.out_layouts[k][axis]))
    return span


def _in_place_axes(blocks: Blocks) -> list[int]:
    return [k for k in range(len(blocks.out_global[0])) if _out_span(blocks, 0, k) is not None]


def slice_block(node, invals, blocks: Blocks) -> list:
    """Along an axis kept in place (ranged, or read realigned to the output's blocks) the block is the output's
    block; an axis taken whole or strided in blocks is sliced on the block; any other axis as the op says. An axis
    laid out in equal blocks that arrived whole is computed whole and cut (the operand was gathered)."""
    (x,) = invals
    placed = set(_in_place_axes(blocks))
    params = node.params
    strides = params["strides"] or (1,) * x.ndim
    start, limit, step = [], [], []
    for k, (s, lim, stride) in enumerate(zip(params["start_indices"], params["limit_indices"], strides, strict=True)):
        b, g, have = blocks.out_blocks[0][k], blocks.out_global[0][k], blocks.in_blocks[0][k]
        if blocks.out_global[0][k] == 0:  # an empty slice
            start.append(0), limit.append(0), step.append(1)
        elif stride > 1 and (k in placed or have != blocks.in_global[0][k]):  # the rows its block picks
            x, first = _picked(x, k, int(s), int(stride), blocks)
            start.append(first), limit.append(first + (b - 1) * stride + 1), step.append(stride)
        elif k in placed:
            start.append(0), limit.append(b), step.append(1)
        elif have == blocks.in_global[0][k]:  # whole: as the op says, cut below where it holds a block
            start.append(s), limit.append(lim), step.append(stride)
        else:  # taken whole or strided in blocks: the block's own elements
            start.append(s), limit.append(lim if b == g else s + (b - 1) * stride + 1), step.append(stride)
    out = lax.slice(x, start, limit, step)
    return _cut_whole(out, blocks)


def _picked(x, k: int, start: int, stride: int, blocks: Blocks):
    """``(x, first)``: the block ``x`` and the position along ``k`` its first pick of a strided slice lies at — the
    same on every device that picks (in place, or read realigned: a constant), else this device's own (read in its
    operand's blocks, a ``route`` to follow: ``x`` moved to start at it)."""
    spans = blocks.in_spans[0] if blocks.in_spans else ()
    length, size, b = blocks.in_global[0][k], blocks.out_global[0][k], blocks.out_blocks[0][k]
    count = shard_count(blocks.mesh_shape, blocks.in_layouts[0][k])
    held = spans[k] if spans and spans[k] is not None else standard_span(length, count)
    picks = strided_layout(held, length, start, stride, size, count).picks
    firsts = {position for position, _, picked in picks if picked}
    reach = (b - 1) * stride + 1
    if len(firsts) <= 1:  # (padded where the result's block reaches past this one: picks from a pad's fill rows too)
        first = min(firsts, default=0)
        short = first + reach - x.shape[k]
        return (x if short <= 0 else lax.pad(x, lax.full((), 0, x.dtype),
                                             [(0, short, 0) if a == k else (0, 0, 0) for a in range(x.ndim)])), first
    padded = lax.pad(x, lax.full((), 0, x.dtype), [(0, reach, 0) if a == k else (0, 0, 0) for a in range(x.ndim)])
    here = block_index(blocks.in_layouts[0][k], blocks.mesh_shape)
    at = jnp.asarray(np.array([min(position, x.shape[k]) for position, _, _ in picks], np.int32))[here]
    return lax.dynamic_slice_in_dim(padded, at, reach, k), 0


def _cut_whole(out, blocks: Blocks) -> list:
    """``out`` cut to this device's block along the axes it came out whole but is held in equal blocks."""
    return cut_outputs([out], blocks)


def pad_block(node, invals, blocks: Blocks) -> list:
    """Along an axis kept in place, each row is the operand's row it lands on, or the padding value where that is
    not a row of the operand; the other axes are padded as the op says (interior padding spreads a block in place)."""
    x, value = invals
    placed = _in_place_axes(blocks)
    spread = [k for k in placed if node.params["padding_config"][k][2]]  # each block spread in place, ranged
    if spread:  # an operand's padding rows (past its ends) spread onto rows of the result: the pad's value there
        x = masked_rows(x, blocks, 0, spread, value.astype(x.dtype))
    config = [(0, c[2], c[2]) if k in spread else (0, 0, 0) if k in placed else tuple(c)
              for k, c in enumerate(node.params["padding_config"])]
    out = lax.pad(x, value.astype(x.dtype), config)
    placed = [k for k in placed if k not in spread]
    if not placed:
        return _cut_whole(out, blocks)
    keep = None
    for k in placed:
        lo = node.params["padding_config"][k][0]
        row = row_index(blocks, _out_span(blocks, 0, k), blocks.out_layouts[0][k], out.shape, k) - lo
        inside = (row >= 0) & (row < blocks.in_global[0][k])
        keep = inside if keep is None else keep & inside
    return _cut_whole(jnp.where(keep, out, value.astype(x.dtype)), blocks)


def concatenate_block(node, invals, blocks: Blocks) -> list:
    """Along the joined axis kept in blocks, each device's rows are those of the operand each lands in (every operand
    arrived realigned to the output's blocks, or — a ``rotate`` step to follow — in place, the rows rotated);
    else the operands joined as they are."""
    axis = node.params["dimension"]
    span = _out_span(blocks, 0, axis)
    if span is None:
        return _cut_whole(lax.concatenate(invals, axis), blocks)
    row = row_index(blocks, span, blocks.out_layouts[0][axis], invals[0].shape, axis)
    first = blocks.in_spans[0][axis] if blocks.in_spans and blocks.in_spans[0] else None
    if first is not None and first.offset % blocks.out_global[0][axis]:  # joined in place, rotated: a roll
        size = blocks.out_global[0][axis]
        row = (row - first.offset) % size
    out, offset = invals[0], 0
    for k, (x, shape) in enumerate(zip(invals, blocks.in_global, strict=True)):
        n = shape[axis]
        if k:  # (the first is where the others are not: an empty first operand leaves the second at offset 0)
            out = jnp.where((row >= offset) & (row < offset + n), x, out)
        offset += n
    return [out]
