"""Lookups: ``gather``. Axes the op does not index keep their sharding; the indexed axes (and the index vectors
themselves) are needed whole, since any index may point anywhere.

Lineage: an output element reads its own index vector and, on the axes the indices choose a start on, any
operand element (so not exact); along axes the indices do not move it reads its own position. On blocks: a
pass-through axis that is sharded is sliced whole within the block.

Finish: a lookup along a sharded axis looks up each device's block and a ``psum`` adds the lookups (the
vocabulary-parallel cross-entropy's label lookup, an embedding table sharded by vocabulary). The other way to take
it (``indices_gathered``): the indices gathered where they share a mesh axis with the table's whole window.
"""

from __future__ import annotations


import jax.numpy as jnp
from jax import lax

from ..core.blocks import Blocks, block_index
from ..expr import jax_adapter as jx
from ..core.boxes import Box, LineageContext, full_box
from ..core.rules import RuleContext, RuleOutput
from ..core.layouts import Sharded, TensorSharding
from ..core.types import ValueType
from ..core.collectives import Collective, CollectiveKind
from .opdef import Family, Linearity, OpDef

def gather(ctx: RuleContext, operand: TensorSharding, indices: TensorSharding, *, dimension_numbers, slice_sizes,
           **params) -> RuleOutput:
    """Output axes are the indices' batch axes (in order, at the positions not in ``offset_dims``) and the
    operand's sliced axes (at ``offset_dims``). A sliced operand axis sliced whole passes through with its sharding
    (indexed or not: a whole window starts at 0, clamped there, or is out of bounds altogether); operand batching
    axes pair with the indices' batching axes like the batch axes of ``dot_general``."""
    dn = dimension_numbers
    out_shape = ctx.out_avals[0].shape
    axes: list = [None] * len(out_shape)
    operand_need = [()] * len(operand.shape)
    indices_need = [()] * len(indices.shape)
    batch_out = [d for d in range(len(out_shape)) if d not in dn.offset_dims]
    index_batch_dims = list(range(len(indices.shape) - 1))  # the last indices axis is the index vector
    out_of_index_dim = dict(zip(index_batch_dims, batch_out, strict=True))
    paired = dict(zip(dn.start_indices_batching_dims, dn.operand_batching_dims, strict=True))
    for j in index_batch_dims:
        d = out_of_index_dim[j]
        candidates = [indices.axes[j]] + ([operand.axes[paired[j]]] if j in paired else [])
        axes[d] = ctx.merge(d, out_shape[d], candidates)
    sliced = [k for k in range(len(operand.shape))
              if k not in dn.collapsed_slice_dims and k not in dn.operand_batching_dims]
    used = {name for a in axes if isinstance(a, Sharded) for name in a.mesh_axes}
    for k, d in zip(sliced, dn.offset_dims, strict=True):
        # sliced whole: a window the indices start at 0 (the only start that fits it), indexed or not
        if slice_sizes[k] == operand.shape[k]:
            axes[d] = ctx.carry_unused(d, out_shape[d], operand.axes[k], used)
    out = TensorSharding(out_shape, tuple(axes))
    layout = out.layout
    for j in index_batch_dims:
        indices_need[j] = layout[out_of_index_dim[j]]
        if j in paired:
            operand_need[paired[j]] = layout[out_of_index_dim[j]]
    for k, d in zip(sliced, dn.offset_dims, strict=True):
        operand_need[k] = layout[d]
    return RuleOutput((out,), (tuple(operand_need), tuple(indices_need)))


def gather_lineage(ctx: LineageContext, box: Box, output: int, *, dimension_numbers, slice_sizes, **params):
    """Each output batch element reads its own index vector; the operand axes the indices choose a start on
    may be read anywhere, the others are read where the output box says (a window that starts at 0, or a
    batching axis matched with the indices')."""
    operand_shape, indices_shape = ctx.in_shapes
    dn = dimension_numbers
    batch_positions = [d for d in range(len(box)) if d not in dn.offset_dims]  # ↔ indices axes but the last
    if len(indices_shape) != len(batch_positions) + 1:
        return [[full_box(operand_shape)], [full_box(indices_shape)]]
    indices_box = tuple(box[p] for p in batch_positions) + ((0, indices_shape[-1]),)
    window_axes = [d for d in range(len(operand_shape))
                   if d not in dn.collapsed_slice_dims and d not in dn.operand_batching_dims]
    operand_box = []
    for d, n in enumerate(operand_shape):
        if d in dn.start_index_map and (d in dn.collapsed_slice_dims or slice_sizes[d] < n):
            operand_box.append((0, n))  # where the slice starts depends on index values
        elif d in dn.operand_batching_dims:
            t = dn.start_indices_batching_dims[list(dn.operand_batching_dims).index(d)]
            operand_box.append(box[batch_positions[t]])
        elif d in dn.collapsed_slice_dims:  # not indexed: the size-1 slice starts at 0
            operand_box.append((0, 1))
        else:  # a window axis starting at 0: output offset j reads element j
            operand_box.append(box[dn.offset_dims[window_axes.index(d)]])
    return [[tuple(operand_box)], [indices_box]]


def finish_gather(decisions, node):
    """A lookup along an operand axis that is sharded (the class axis of vocabulary-parallel logits, the rows of
    an embedding table sharded by vocabulary): each device looks up the indices that fall in its block, zero for
    the others, and a ``psum`` over that axis's mesh axes combines them — the operand is never gathered, only the
    (small) looked-up result is summed. For indexed axes sliced one element at a time or in windows shorter than
    the axis (the gradient of ``x.at[2:10].set(v)`` with respect to ``v``); for numbers (no sum of bools or PRNG
    keys)."""
    kind = jx.dtype_kind(decisions.graph.avals[node.outputs[0]].dtype)
    if not kind or kind not in "fiuc":  # "" (a PRNG key) is in every string
        return None
    dn, slice_sizes = node.params["dimension_numbers"], node.params["slice_sizes"]
    operand, _ = node.operands
    held = decisions.type(operand)
    have = held.layout  # a ranged indexed axis is looked up in place too (each row lies in one device's rows)
    operand_need, indices_need = (list(n) for n in decisions.need_layouts(node.id))
    spans = [None] * len(have)
    mesh_axes: list[str] = []
    for k in dn.start_index_map:
        span = held.span_of(k)
        if span is not None and span.fill is not None:
            continue  # rows no device holds: read whole
        if have[k] and slice_sizes[k] < decisions.graph.avals[operand].shape[k]:
            operand_need[k] = have[k]
            spans[k] = span
            mesh_axes.extend(have[k])
    if not mesh_axes or len(set(mesh_axes)) != len(mesh_axes):
        return None
    summed = set(mesh_axes)
    others = [m for k, m in enumerate(operand_need) if k not in dn.start_index_map] + indices_need + list(
        decisions.layout(node.outputs[0]))
    if summed & {name for m in others for name in m}:
        return None  # a mesh axis would shard two axes of an operand, or the output
    return ((ValueType(tuple(operand_need), span=tuple(spans)), ValueType(tuple(indices_need))),
            Collective(CollectiveKind.PSUM, tuple(mesh_axes)))


def gather_on_blocks(node, invals: list, blocks: Blocks) -> list:
    """The gather on this device's blocks. A pass-through operand axis (sliced whole) that is sharded is sliced
    whole *within the block*. An indexed axis that is sharded (``finish_gather``) is looked up locally: each
    index is shifted to the block's start, and the rows whose index falls in another device's block are zero (so
    the sum is exact, but a looked-up -0.0 comes back +0.0, as from jax.jit's lookup: XLA's all-reduce adds from
    +0.0); an index outside the whole axis is clamped (``clip``,
    ``promise_in_bounds``) or gives the fill value on the group's first device only (``fill``), as the
    unsharded gather would, once the ``psum`` adds the devices' results."""
    params = dict(node.params)
    operand, indices = invals
    dn, slice_sizes = params["dimension_numbers"], params["slice_sizes"]
    (operand_global, _), (operand_block, _) = blocks.in_global, blocks.in_blocks
    params["slice_sizes"] = tuple(b if s == g else s for s, b, g in
                                  zip(slice_sizes, operand_block, operand_global, strict=True))
    # an indexed axis sliced whole starts at 0 (clamped there; out of bounds for any other start under ``fill``):
    # each device's window is its whole block, as for an axis no index moves
    whole = [p for p, k in enumerate(dn.start_index_map)
             if slice_sizes[k] == operand_global[k] and operand_block[k] != operand_global[k]]
    sharded = [p for p, k in enumerate(dn.start_index_map)
               if operand_block[k] != operand_global[k] and p not in whole]
    if whole:
        operand, indices, invals = _whole_windows_at_zero(node, operand, indices, whole)
    if not sharded:
        (out,) = jx.bind(node.primitive, invals, params)
        return [_filled_where_outside(node, out, indices, whole)] if whole else [out]
    fill = params["mode"] == lax.GatherScatterMode.FILL_OR_DROP
    batch_shape = indices.shape[:-1]
    outside = jnp.zeros(batch_shape, bool)  # out of bounds of the whole operand
    elsewhere = jnp.zeros(batch_shape, bool)  # in another device's block
    vectors, mesh_axes, pads = [], [], {}
    for p, k in enumerate(dn.start_index_map):
        index = wide_index(indices[..., p])
        upper = operand_global[k] - slice_sizes[k]
        outside = outside | (index < 0) | (index > upper)
        index = jnp.clip(index, 0, upper)
        if p in sharded:
            layout = blocks.in_layouts[0][k]
            span = blocks.in_spans[0][k] if blocks.in_spans and blocks.in_spans[0] else None
            start = block_index(layout, blocks.mesh_shape) * operand_block[k] - (span.offset if span else 0)
            index = index - start.astype(index.dtype)
            if slice_sizes[k] == 1:
                elsewhere = elsewhere | (index < 0) | (index >= operand_block[k])
                index = jnp.clip(index, 0, operand_block[k] - 1)
            else:  # a window: the block padded by its length with zeros, the window placed where it lands
                size = slice_sizes[k]
                index = jnp.clip(index, -size, operand_block[k]) + size
                pads[k] = size
            mesh_axes.extend(layout)
        vectors.append(index)
    if pads:
        operand = lax.pad(operand, jnp.zeros((), operand.dtype),
                          [(pads[k], pads[k], 0) if k in pads else (0, 0, 0) for k in range(operand.ndim)])
    params["mode"] = lax.GatherScatterMode.CLIP
    params["fill_value"] = None
    (out,) = jx.bind(node.primitive, [operand, jnp.stack(vectors, axis=-1)], params)
    batch_dims = [d for d in range(out.ndim) if d not in dn.offset_dims]

    def spread(mask):  # a batch-shaped mask over the output's axes
        return lax.broadcast_in_dim(mask, out.shape, batch_dims)

    zero = lax.full_like(out, 0)
    out = lax.select(spread(elsewhere), zero, out)
    if fill:
        first = block_index(tuple(mesh_axes), blocks.mesh_shape) == 0
        out = lax.select(spread(outside), lax.select(lax.broadcast(first, out.shape), lax.full_like(
            out, params_fill(node.params, out.dtype)), zero), out)
    return [out]


def _whole_windows_at_zero(node, operand, indices, whole: list[int]):
    """The indices with each whole-window component set to 0 (a device's window is its block)."""
    zeroed = indices.at[..., jnp.array(whole)].set(0)
    return operand, indices, [operand, zeroed]


def _filled_where_outside(node, out, indices, whole: list[int]):
    """Under ``fill``, a whole window whose start is not 0 lies out of bounds: its rows are the fill value (elsewhere
    the window was clamped to 0, as the unsharded gather clamps it)."""
    if node.params["mode"] != lax.GatherScatterMode.FILL_OR_DROP:
        return out
    outside = jnp.any(wide_index(indices[..., jnp.array(whole)]) != 0, axis=-1)
    batch_dims = [d for d in range(out.ndim) if d not in node.params["dimension_numbers"].offset_dims]
    spread = lax.broadcast_in_dim(outside, out.shape, batch_dims)
    return lax.select(spread, lax.full_like(out, params_fill(node.params, out.dtype)), out)


def wide_index(index):
    """An index as int32 at least: a block's offset, or the axis's end, may not fit a narrower index type (uint8
    indices into a 512-row table). A uint32 index past int32 saturates (it is out of bounds either way: clamped to
    the end, or dropped), where converting it would wrap it negative."""
    if index.dtype.itemsize >= 4 and jnp.issubdtype(index.dtype, jnp.signedinteger):
        return index
    wide = jnp.promote_types(index.dtype, jnp.int32)
    if jnp.issubdtype(index.dtype, jnp.unsignedinteger) and jnp.iinfo(index.dtype).max > jnp.iinfo(wide).max:
        index = jnp.minimum(index, jnp.asarray(jnp.iinfo(wide).max, index.dtype))
    return index.astype(wide)


def params_fill(params, dtype):
    """The value a ``fill`` gather gives an out-of-bounds index (resolved by ``lax.gather`` when it binds)."""
    return params["fill_value"] if params["fill_value"] is not None else (
        jnp.nan if jnp.issubdtype(dtype, jnp.inexact) else jnp.iinfo(dtype).min
        if jnp.issubdtype(dtype, jnp.signedinteger) else jnp.iinfo(dtype).max)


def indices_gathered(node, in_shapes, held, needs) -> dict:
    """A lookup whose indices' batch and whole window share a mesh axis (tokens over ``x`` looking up a table whose
    features are over ``x``): its rule keeps the axis on the batch and gathers the table; the other way takes the
    indices gathered over it instead, the window keeping it (as ``jax.jit`` looks up a feature-sharded table) — a
    candidate the plan's price decides on, as the result's later uses may need either."""
    dn, sizes = node.params["dimension_numbers"], node.params["slice_sizes"]
    shape, operand_held = in_shapes[0], held[0]
    operand_need, indices_need = needs
    windows = [k for k in range(len(shape)) if k not in dn.collapsed_slice_dims
               and k not in dn.operand_batching_dims and sizes[k] == shape[k]]
    dropped = {m for k in windows for m in operand_held[k] if m not in operand_need[k]}
    taken = tuple(tuple(m for m in axes if m not in dropped) for axes in indices_need)
    return {1: taken} if dropped and taken != tuple(indices_need) else {}


OPS = [
    OpDef("gather", Family.INDEXING, propagate=gather, lineage=gather_lineage, lineage_exact=False,
          per_block=gather_on_blocks, finish=finish_gather, pull=None, linear=Linearity.NONE,
          alternative=indices_gathered),
]
