"""Slicing ops at an offset or by pieces: rev, split, dynamic_slice, dynamic_update_slice (slice, pad and
concatenate, which keep a sharded axis as ranges, are ``.ranges``).

An axis the op takes whole and unchanged keeps its sharding; a reversed axis too (each device reverses its block
and sends it to its mirror device); the pieces of a ``split`` are cut by each device from the whole axis (it starts
unannotated and adopts what it meets); a ``dynamic_slice`` along a sharded axis is cut by each device from its own
block and summed; the operand of a ``dynamic_update_slice`` is written by each device in its own rows.

Lineage: each output element reads the operand element it was cut from (the data-dependent slices: any
element of a sliced axis, so not exact). On blocks: ``dynamic_slice``'s sizes of sharded axes become block sizes.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from ..core.blocks import Blocks, bind_as_is, bind_with, block_index
from ..core.boxes import Box, LineageContext, full_box
from ..core.rules import CREATED, RuleContext, RuleOutput
from ..core.layouts import Sharded, TensorSharding
from ..core.collectives import Collective, CollectiveKind
from ..core.types import Placement, PlacementKind, ValueType
from .opdef import Family, Linearity, OpDef, Trait
from .range_blocks import split_block
from .ranges import split_in_place


def _keep_axes(ctx: RuleContext, operand: TensorSharding, keep: list[bool], out_shape) -> RuleOutput:
    axes = tuple(ctx.carry(k, out_shape[k], operand.axes[k]) if kept else None for k, kept in enumerate(keep))
    need = tuple(m if kept else () for m, kept in zip(operand.layout, keep, strict=True))
    return RuleOutput((TensorSharding(tuple(out_shape), axes),), (need,))


def _scalar_needs(operands) -> tuple:
    return tuple(((),) * len(op.shape) for op in operands)


def rev(ctx: RuleContext, operand: TensorSharding, *, dimensions, **params):
    """Axes not reversed keep their sharding; so does a reversed one: each device reverses its block, which its
    mirror device should hold, and a permute sends it there (``finish_rev``, under every strategy)."""
    axes = tuple(ctx.carry_reversed(k, n, a) if k in dimensions and isinstance(a, Sharded) else
                 (None if k in dimensions else ctx.carry(k, n, a))
                 for k, (n, a) in enumerate(zip(operand.shape, operand.axes, strict=True)))
    out = TensorSharding(operand.shape, axes)
    return RuleOutput((out,), (out.layout,))


def finish_rev(decisions, node):
    """A reversal along sharded axes: each device's reversed block sent to its mirror device (the block ``n - 1 - i``
    along each reversed axis), one collective-permute over those axes' mesh axes."""
    (need,) = decisions.needs(node.id)
    sizes = decisions.mesh_shape
    # a mesh axis of size 1 holds the whole axis on every device: its block reversed is the result
    names = tuple(name for k in node.params["dimensions"] for name in need.layout[k] if sizes[name] > 1)
    if not names:
        return None
    return (need,), Collective(CollectiveKind.MIRROR, names)


def mirror_placement(graph, node, operand_type, collective, mesh_shape) -> Placement:
    """A reversal done block by block leaves each device the block of its mirror device along the collective's mesh
    axes."""
    return Placement(PlacementKind.MIRRORED, collective.mesh_axes)


def dynamic_slice(ctx: RuleContext, operand: TensorSharding, *indices: TensorSharding, slice_sizes, **params):
    # A slice as long as its axis starts at 0 whatever the index (indices are clamped), so it stays whole.
    keep = [s == n for s, n in zip(slice_sizes, operand.shape, strict=True)]
    out = _keep_axes(ctx, operand, keep, ctx.out_avals[0].shape)
    return RuleOutput(out.outputs, out.needs + _scalar_needs(indices))


def finish_dynamic_slice(decisions, node):
    """A slice at an offset along a sharded axis: each device cuts the rows of the slice that lie in its block (zeros
    elsewhere, ``dynamic_slice_block``) and a ``psum`` over the axis's mesh axes adds them up — the slice, not
    the operand, moves. Not for booleans (no sum)."""
    graph = decisions.graph
    operand = node.operands[0]
    aval = graph.avals[operand]
    if jnp.dtype(aval.dtype) == jnp.bool_:
        return None
    have = decisions.layout(operand)
    need, *rest = decisions.needs(node.id)
    layout = list(need.layout)
    summed: list[str] = []
    for k, (n, size) in enumerate(zip(aval.shape, node.params["slice_sizes"], strict=True)):
        if have[k] and size < n:
            layout[k] = have[k]
            summed += have[k]
    others = {name for k, m in enumerate(layout) if not (have[k] and m == have[k] and m and
                                                          node.params["slice_sizes"][k] < aval.shape[k]) for name in m}
    if not summed or others & set(summed):
        return None
    in_mesh_order = tuple(name for name in decisions.mesh_shape if name in summed)
    return (ValueType(tuple(layout)), *rest), Collective(CollectiveKind.PSUM, in_mesh_order)


def dynamic_slice_block(node, invals, blocks: Blocks) -> list:
    """The slice on this device's block. An axis sliced whole is cut to the block. Along an axis the slice takes
    part of and the operand is sharded on (a partial sum, ``finish_dynamic_slice``), the block is padded by the
    slice's length on either side and the slice cut where it lands relative to the block: the rows of other
    devices' blocks come out as zeros (the psum turns a -0.0 of the slice into +0.0). The start is clamped over the
    whole axis, as ``lax.dynamic_slice`` does."""
    operand, *indices = invals
    layout, sizes = blocks.in_layouts[0], node.params["slice_sizes"]
    spans = [k for k, (n, size) in enumerate(zip(blocks.in_global[0], sizes, strict=True)) if layout[k] and size < n]
    if not spans:
        return bind_with(_dynamic_slice_block_params)(node, invals, blocks)
    starts = list(indices)
    for k in spans:
        operand, starts[k] = _placed(operand, k, indices[k], blocks.in_global[0][k], sizes[k], layout[k],
                                     blocks.mesh_shape)
    block_sizes = _dynamic_slice_block_params(node.params, blocks)["slice_sizes"]
    return [lax.dynamic_slice(operand, [jnp.asarray(i, jnp.int32) for i in starts], block_sizes)]


def _placed(block, axis: int, index, n: int, length: int, mesh_axes, mesh_shape):
    """``(block padded by length zeros on either side of axis, where a window of length starting at global index
    lands in it)``: the start clamped over the whole axis (as ``lax.dynamic_slice`` does), made relative to this
    device's block, and clamped into the padding where the window misses the block — one home for the reads and
    writes at an offset."""
    rows = block.shape[axis]
    start = _clamped_start(index, n, length) - block_index(mesh_axes, mesh_shape) * rows
    padded = lax.pad(block, jnp.zeros((), block.dtype),
                     [(length, length, 0) if j == axis else (0, 0, 0) for j in range(block.ndim)])
    return padded, jnp.clip(start, -length, rows) + length


def _clamped_start(index, n: int, size: int):
    """A slice's start clamped into ``[0, n - size]`` as ``lax.dynamic_slice`` clamps it, as int32: an unsigned index
    is clamped before it is converted (a uint32 of 3e9 must clamp to the end, not wrap negative)."""
    index = jnp.asarray(index)
    if jnp.issubdtype(index.dtype, jnp.unsignedinteger) and n - size <= jnp.iinfo(index.dtype).max:
        index = jnp.minimum(index, jnp.asarray(n - size, index.dtype))
    return jnp.clip(index.astype(jnp.int32), 0, n - size)


def dynamic_update_slice(ctx: RuleContext, operand: TensorSharding, update: TensorSharding,
                         *indices: TensorSharding, **params):
    """An axis the update covers merges operand and update (their blocks line up); an axis it writes part of keeps
    the operand's sharding, the update taken whole along it: each device writes the rows that land in its block
    (none, for most: a KV-cache write moves nothing)."""
    axes = []
    update_need = []
    for k, n in enumerate(operand.shape):
        if update.shape[k] == n:
            axes.append(ctx.merge(k, n, [operand.axes[k], update.axes[k]]))
            update_need.append(None)
        else:
            axes.append(ctx.carry(k, n, operand.axes[k]))
            update_need.append(())
    out = TensorSharding(operand.shape, tuple(axes))
    update_layout = tuple(m if need is None else need for m, need in zip(out.layout, update_need, strict=True))
    return RuleOutput((out,), (out.layout, update_layout) + _scalar_needs(indices))


def dynamic_update_slice_factors(node, in_shapes) -> tuple[tuple[int | None, ...], ...]:
    """Axis ``k`` of the operand carries factor ``k``, and so does the update's where it covers the axis (the rule
    merges them); an axis the update writes part of it takes whole (none), as it does the indices.

    >>> dynamic_update_slice_factors(None, [(8, 128, 4), (8, 1, 4), (), (), ()])
    ((0, 1, 2), (0, None, 2), (), (), ())
    """
    operand, update, *indices = in_shapes
    return (tuple(range(len(operand))), tuple(k if u == n else None for k, (u, n) in enumerate(zip(update, operand,
                                                                                                  strict=True))),
            *(() for _ in indices))


def dynamic_update_slice_block(node, invals, blocks: Blocks) -> list:
    """The write on this device's block: along an axis the update writes part of and the operand is sharded on,
    the block is padded by the update's length on either side, the update written where it lands relative to the
    block (clamped into the padding where it misses it), and the block cut back out — the update's rows outside the
    block fall into the padding. The start is clamped over the whole axis, as ``lax.dynamic_update_slice`` does."""
    operand, update, *indices = invals
    layout = blocks.in_layouts[0]
    spans = [k for k, (n, u) in enumerate(zip(blocks.in_global[0], blocks.in_global[1], strict=True))
             if layout[k] and u < n]
    if not spans:
        return bind_as_is(node, invals, blocks)
    starts = list(indices)
    for k in spans:
        operand, starts[k] = _placed(operand, k, indices[k], blocks.in_global[0][k], update.shape[k], layout[k],
                                     blocks.mesh_shape)
    out = lax.dynamic_update_slice(operand, update, [jnp.asarray(i, jnp.int32) for i in starts])
    for k in spans:
        out = lax.slice_in_dim(out, update.shape[k], update.shape[k] + blocks.in_blocks[0][k], axis=k)
    return [out]


def split(ctx: RuleContext, operand: TensorSharding, *, sizes, axis, **params):
    """Along a sharded axis each piece stays in place, ranged (``.ranges.split_in_place``: the transpose of a
    concatenation, such as a roll's gradient). Along a whole axis each piece's split axis is *created*: it adopts
    what it meets, and each device cuts its own block of the piece out of the whole axis. The other axes keep their
    sharding."""
    in_place = split_in_place(ctx, operand, axis)
    if in_place is not None:
        return in_place
    operand = operand.without_ranges()
    out_avals = ctx.out_avals
    outputs = tuple(TensorSharding(a.shape, tuple(
        (CREATED if n > 1 else None) if k == axis else ctx.carry(k, n, operand.axes[k])
        for k, n in enumerate(a.shape))) for a in out_avals)
    need = tuple(() if k == axis else m for k, m in enumerate(operand.layout))
    return RuleOutput(outputs, (need,))


def rev_lineage(ctx: LineageContext, box: Box, output: int, *, dimensions, **params):
    (shape,) = ctx.in_shapes
    return [[tuple((n - e, n - s) if k in dimensions else (s, e) for k, (n, (s, e)) in enumerate(zip(shape, box,
                                                                                                    strict=True)))]]


def split_lineage(ctx: LineageContext, box: Box, output: int, *, sizes, axis, **params):
    offset = sum(int(n) for n in sizes[:output])
    s, e = box[axis]
    return [[box[:axis] + ((s + offset, e + offset),) + box[axis + 1:]]]


def dynamic_slice_lineage(ctx: LineageContext, box: Box, output: int, *, slice_sizes, **params):
    """Where the slice starts depends on index values: a sliced axis may read any of its elements."""
    shape = ctx.in_shapes[0]
    box_in = tuple((0, n) if size != n else b for n, size, b in zip(shape, slice_sizes, box, strict=True))
    return [[box_in]] + [[()] for _ in ctx.in_shapes[1:]]


def dynamic_update_slice_lineage(ctx: LineageContext, box: Box, output: int, **params):
    """An element is the operand's or, wherever the update landed, the update's."""
    operand, update = ctx.in_shapes[:2]
    return [[box], [full_box(update)]] + [[()] for _ in ctx.in_shapes[2:]]


def _dynamic_slice_block_params(params, blocks: Blocks) -> dict:
    """A sharded axis is sliced whole: its slice size is the block size."""
    return {**params, "slice_sizes": tuple(
        b if b != g else s for s, b, g in
        zip(params["slice_sizes"], blocks.out_blocks[0], blocks.out_global[0], strict=True))}


OPS = [
    OpDef("rev", Family.SLICING, propagate=rev, lineage=rev_lineage, lineage_exact=True, per_block=bind_as_is,
          finish=finish_rev, pull=None, linear=Linearity.FIRST, placement=mirror_placement),
    OpDef("split", Family.SLICING, propagate=split, lineage=split_lineage, lineage_exact=True, per_block=split_block,
          finish=None, pull=None, linear=Linearity.NONE, reads_ranges=True),
    # Where these slices start depends on index values: any element of a sliced axis may be read.
    OpDef("dynamic_slice", Family.SLICING, propagate=dynamic_slice, lineage=dynamic_slice_lineage, lineage_exact=False,
          per_block=dynamic_slice_block, finish=finish_dynamic_slice, pull=None, linear=Linearity.FIRST),
    OpDef("dynamic_update_slice", Family.SLICING, propagate=dynamic_update_slice, lineage=dynamic_update_slice_lineage,
          lineage_exact=False, per_block=dynamic_update_slice_block, finish=None, pull=None, linear=Linearity.NONE,
          traits=frozenset({Trait.PIECEWISE, Trait.WRITES}), factors=dynamic_update_slice_factors),
]
