"""Indexing: gather and the scatter family. Axes the op does not index keep their sharding; the indexed
axes (and the index vectors themselves) are needed whole, since any index may point anywhere."""

from __future__ import annotations

from ..sharding import TensorSharding
from .registry import RuleContext, RuleOutput, register


@register("gather")
def gather(ctx: RuleContext, operand: TensorSharding, indices: TensorSharding, *, dimension_numbers, slice_sizes,
           **params) -> RuleOutput:
    """Output axes are the indices' batch axes (in order, at the positions not in ``offset_dims``) and the
    operand's sliced axes (at ``offset_dims``). A sliced operand axis that is not indexed and is sliced
    whole passes through with its sharding; operand batching axes pair with the indices' batching axes
    like the batch axes of ``dot_general``."""
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
    for k, d in zip(sliced, dn.offset_dims, strict=True):
        if k not in dn.start_index_map and slice_sizes[k] == operand.shape[k]:
            axes[d] = ctx.carry(d, out_shape[d], operand.axes[k])
    out = TensorSharding(out_shape, tuple(axes))
    layout = out.layout
    for j in index_batch_dims:
        indices_need[j] = layout[out_of_index_dim[j]]
        if j in paired:
            operand_need[paired[j]] = layout[out_of_index_dim[j]]
    for k, d in zip(sliced, dn.offset_dims, strict=True):
        operand_need[k] = layout[d]
    return RuleOutput((out,), (tuple(operand_need), tuple(indices_need)))


@register("scatter", "scatter-add", "scatter_add", "scatter-mul", "scatter_mul", "scatter-min", "scatter_min",
          "scatter-max", "scatter_max")
def scatter(ctx: RuleContext, operand: TensorSharding, indices: TensorSharding, updates: TensorSharding, *,
            dimension_numbers, **params) -> RuleOutput:
    """An operand axis that is not indexed and that the update windows cover whole keeps its sharding,
    merged with the matching update window axis; every other axis, the updates' scatter axes and the
    indices are needed whole."""
    dn = dimension_numbers
    axes: list = [None] * len(operand.shape)
    updates_need = [()] * len(updates.shape)
    window = [k for k in range(len(operand.shape))
              if k not in dn.inserted_window_dims and k not in dn.operand_batching_dims]
    for k, u in zip(window, dn.update_window_dims, strict=True):
        if k not in dn.scatter_dims_to_operand_dims and updates.shape[u] == operand.shape[k]:
            axes[k] = ctx.merge(k, operand.shape[k], [operand.axes[k], updates.axes[u]])
    out = TensorSharding(operand.shape, tuple(axes))
    for k, u in zip(window, dn.update_window_dims, strict=True):
        updates_need[u] = out.layout[k]
    return RuleOutput((out,), (out.layout, ((),) * len(indices.shape), tuple(updates_need)))
