"""Scatters: the ``scatter`` family. Axes the op does not index keep their sharding; an indexed axis that each
update touches one element of keeps its sharding: each device applies the updates landing in its block (shifted to
it; the others dropped), so ``x.at[i].set(v)`` on a sharded ``x`` moves nothing.

Lineage: an output element reads its own position of the operand and any update (so not exact).

Finish: a scatter-add of sharded rows scatters each device's rows and a ``psum`` adds the results (an embedding
gradient); a scatter-mul, -max or -min of integers combines them by ``pprod``, ``pmax`` or ``pmin``.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax.numpy as jnp
from jax import lax

from ..core.blocks import Blocks, bind_as_is, block_index
from ..expr import jax_adapter as jx
from ..core.boxes import Box, LineageContext, full_box
from ..core.rules import RuleContext, RuleOutput
from ..core.layouts import Sharded, TensorSharding
from ..core.types import ValueType, whole
from ..core.collectives import Collective, CollectiveKind, FinishGeometry
from .lookups import wide_index
from .opdef import Family, Linearity, OpDef, defs

SCATTERS = ("scatter", "scatter-add", "scatter-sub", "scatter-mul", "scatter-min", "scatter-max")


def scatter(ctx: RuleContext, operand: TensorSharding, indices: TensorSharding, updates: TensorSharding, *,
            dimension_numbers, **params) -> RuleOutput:
    """An operand axis that the update windows cover whole (indexed or not) keeps its sharding, merged with the
    matching update window axis; so does an indexed axis each update touches one element of (each device
    applies the updates landing in its block). Operand batching axes pair with the indices' batching axes and the
    updates' matching scatter axes, as ``gather``'s do: batch ``b`` of the updates lands only in batch ``b`` of
    the operand, so each device scatters its batch rows into its own (the gradient of ``take_along_axis``, of an
    integer-label cross-entropy). Every other axis, the other index axes and the index vectors are needed whole."""
    dn = dimension_numbers
    if operand.spans or indices.spans or updates.spans:
        return _ranged_scatter(ctx, operand, indices, updates, dimension_numbers=dn, **params)
    axes: list = [None] * len(operand.shape)
    updates_need = [()] * len(updates.shape)
    indices_need = [()] * len(indices.shape)
    # The updates' scatter axes (those not in a window) follow the indices' axes but the index vector (last).
    update_scatter = [u for u in range(len(updates.shape)) if u not in dn.update_window_dims]
    pairs = [(o, i, update_scatter[i]) for o, i in
             zip(dn.operand_batching_dims, dn.scatter_indices_batching_dims, strict=True)
             if i < len(update_scatter)]
    for o, i, u in pairs:
        axes[o] = ctx.merge(o, operand.shape[o], [operand.axes[o], indices.axes[i], updates.axes[u]])
    used = {name for a in axes if isinstance(a, Sharded) for name in a.mesh_axes}
    # An indexed axis each update touches one element of keeps its sharding: each device applies the updates that
    # land in its block (``scatter_on_blocks``), so ``x.at[i].set(v)`` on a sharded x moves nothing.
    for k in dn.scatter_dims_to_operand_dims:
        if k in dn.inserted_window_dims and k not in dn.operand_batching_dims:
            axes[k] = ctx.carry_unused(k, operand.shape[k], operand.axes[k], used)
            if isinstance(axes[k], Sharded):
                used.update(axes[k].mesh_axes)
    window = [k for k in range(len(operand.shape))
              if k not in dn.inserted_window_dims and k not in dn.operand_batching_dims]
    # An indexed axis whose windows cover part of it (``x.at[2:10].set(v)``) keeps its sharding too: each device
    # writes the rows of each window that land in its block, the updates whole along it.
    for k, u in zip(window, dn.update_window_dims, strict=True):
        if k in dn.scatter_dims_to_operand_dims and updates.shape[u] < operand.shape[k]:
            axes[k] = ctx.carry_unused(k, operand.shape[k], operand.axes[k], used)
            if isinstance(axes[k], Sharded):
                used.update(axes[k].mesh_axes)
    # A window covering an axis whole, indexed or not (a vmapped dynamic_update_slice of a whole row): its only start
    # is 0 (clamped there, or the window dropped): each device writes its block of it, the updates sliced alike.
    for k, u in zip(window, dn.update_window_dims, strict=True):
        if updates.shape[u] == operand.shape[k]:
            merged = ctx.merge(k, operand.shape[k], [operand.axes[k], updates.axes[u]])
            if not (isinstance(merged, Sharded) and used & set(merged.mesh_axes)):
                axes[k] = merged
    out = TensorSharding(operand.shape, tuple(axes))
    for k, u in zip(window, dn.update_window_dims, strict=True):
        partial_window = k in dn.scatter_dims_to_operand_dims and updates.shape[u] < operand.shape[k]
        updates_need[u] = () if partial_window else out.layout[k]
    for o, i, u in pairs:
        indices_need[i] = updates_need[u] = out.layout[o]
    return RuleOutput((out,), (out.layout, tuple(indices_need), tuple(updates_need)))


def _ranged_scatter(ctx: RuleContext, operand: TensorSharding, indices: TensorSharding, updates: TensorSharding, *,
                    dimension_numbers, **params) -> RuleOutput:
    """A scatter into a ranged operand axis it indexes (``x[:, :63].at[:, 5].set(0.)``) writes each device's rows in
    place, as into equal blocks, where every row of the axis is held by some device (a write into a row no device
    holds would be lost); any other ranged axis is read whole."""
    dn = dimension_numbers
    plain = scatter(ctx, operand.without_ranges(), indices.without_ranges(), updates.without_ranges(),
                    dimension_numbers=dn, **params)
    out = list(plain.outputs[0].axes)
    need = list(plain.needs[0])
    reads: list = [None] * len(operand.shape)
    used = {name for a in out if isinstance(a, Sharded) for name in a.mesh_axes}
    window = [k for k in range(len(operand.shape)) if k not in dn.inserted_window_dims and
              k not in dn.operand_batching_dims]
    partial = {k for k, u in zip(window, dn.update_window_dims, strict=True) if updates.shape[u] < operand.shape[k]}
    for k in dn.scatter_dims_to_operand_dims:
        a = operand.axes[k]
        indexed = (k in dn.inserted_window_dims and k not in dn.operand_batching_dims) or k in partial
        if (not indexed or not isinstance(a, Sharded) or a.span is None or a.span.fill is not None
                or used & set(a.mesh_axes)):
            continue
        out[k] = ctx.ranged(k, operand.shape[k], a.mesh_axes, a.span, [(a, 0)])
        need[k] = ()
        reads[k] = (a.mesh_axes, a.span)
        used.update(a.mesh_axes)
    if not any(reads):
        return plain
    spans = (tuple(reads), (None,) * len(indices.shape), (None,) * len(updates.shape))
    return RuleOutput((TensorSharding(operand.shape, tuple(out)),), (tuple(need), *plain.needs[1:]),
                      need_spans=spans)


@dataclass(frozen=True)
class FinishScatter:
    """Finish a scatter of sharded update rows by ``kind``: each device scatters its rows (and their index vectors)
    into the operand and one all-reduce combines the results — the gradient of an embedding lookup over a sharded
    batch all-reduced (``psum``) instead of its rows gathered; a ``segment_max`` / ``segment_prod`` of sharded data
    combined by a ``pmax`` / a product, as ``jax.jit`` does. For operand dtypes of the numpy kinds in ``exact_for``.
    The operand is counted once: taken as a partial sum (zero on the other devices of a group), or — for a product
    — multiplied in by each group's first device only (``scatter_on_blocks``); a maximum or a minimum takes it
    in on every device. Not where a mesh axis would then shard two axes."""

    kind: CollectiveKind
    exact_for: str

    def __call__(self, decisions, node):
        kind = jx.dtype_kind(decisions.graph.avals[node.outputs[0]].dtype)
        if not kind or kind not in self.exact_for:  # "" (a PRNG key) is in every string
            return None
        if self.kind is not CollectiveKind.PSUM and decisions.sharded.is_body:
            # (in a loop's body it would all-reduce every iteration, where the rows it reads, gathered, are often the
            # loop's invariants, gathered once before it; a sum's psum is deferred past the loop instead)
            return None
        dn = node.params["dimension_numbers"]
        _, indices, updates = node.operands
        indices_have, updates_have = decisions.layout(indices), decisions.layout(updates)
        operand_need, indices_need, updates_need = (list(n) for n in decisions.need_layouts(node.id))
        mesh_axes = _finished_rows(dn, indices_have, updates_have, indices_need, updates_need)
        if not mesh_axes or len(set(mesh_axes)) != len(mesh_axes):
            return None  # nothing to combine, or one mesh axis on two scattered axes (they would need it twice)
        summed = set(mesh_axes)
        update_scatter = [u for u in range(len(updates_have)) if u not in dn.update_window_dims]
        for need, own in ((operand_need, ()), (indices_need, range(len(update_scatter))),
                          (updates_need, update_scatter)):
            if summed & {name for k, m in enumerate(need) if k not in own for name in m}:
                return None  # a mesh axis would shard two axes of one operand, or the output
        operand = ValueType(tuple(operand_need), tuple(mesh_axes) if self.kind is CollectiveKind.PSUM else ())
        return (operand, *whole((tuple(indices_need), tuple(updates_need)))), Collective(self.kind, tuple(mesh_axes))


def _finished_rows(dn, indices_have, updates_have, indices_need=None, updates_need=None) -> list[str] | None:
    """The mesh axes the updates' scattered rows (and their index vectors) are held over, each device scattering its
    own: a finish combines the results over them (``indices_need``/``updates_need``, when given, take them so).
    None where the indices and the updates are held over different ones."""
    update_scatter = [u for u in range(len(updates_have)) if u not in dn.update_window_dims]
    mesh_axes: list[str] = []
    for i, u in enumerate(update_scatter):
        if i in dn.scatter_indices_batching_dims:
            continue  # paired with the operand's batch: local already
        have_i, have_u = indices_have[i], updates_have[u]
        if have_i and have_u and have_i != have_u:
            return None
        names = have_i or have_u
        if indices_need is not None:
            indices_need[i] = updates_need[u] = names
        mesh_axes.extend(names)
    return mesh_axes


def scatter_on_blocks(node, invals: list, blocks: Blocks) -> list:
    """The scatter on this device's operand block. Along an indexed axis that is sharded each index is shifted to
    the block's start (after clamping it into the whole axis, for ``clip`` and ``promise_in_bounds``) and the
    updates landing in other devices' blocks are dropped — as out-of-bounds ones already are under ``fill``. Along a
    sharded indexed axis whose windows cover part of it (``x.at[2:10].set(v)``) the block is padded by a window's
    length on either side, each window placed where it lands relative to the block (a window the whole axis would
    drop, past the padding), and the block cut back out. An indexed axis a window covers whole is written block by
    block, the index set to 0 (``_whole_windows_written_at_zero``)."""
    operand, indices, *rest = invals
    dn = node.params["dimension_numbers"]
    if node.op == "scatter-mul":  # each device's rows multiplied in, a product to finish: the operand counted once
        rows = _finished_rows(dn, blocks.in_layouts[1], blocks.in_layouts[2])
        if rows:
            operand = jnp.where(block_index(tuple(rows), blocks.mesh_shape) == 0, operand,
                                jnp.ones((), operand.dtype))
            invals = [operand, indices, *rest]
    (operand_global, *_), (operand_block, *_) = blocks.in_global, blocks.in_blocks
    updates_shape = blocks.in_global[2]
    window = [k for k in range(len(operand_global))
              if k not in dn.inserted_window_dims and k not in dn.operand_batching_dims]
    covers = {k for k, u in zip(window, dn.update_window_dims, strict=True) if updates_shape[u] == operand_global[k]}
    # an indexed axis a window covers whole starts at 0 (clamped there, or dropped under ``fill``): each device
    # writes its block of each window, as along an axis no index moves
    whole = [p for p, k in enumerate(dn.scatter_dims_to_operand_dims)
             if k in covers and operand_block[k] != operand_global[k]]
    if whole:
        indices = _whole_windows_written_at_zero(node, indices, whole,
                                                 [operand_block[k] for k in dn.scatter_dims_to_operand_dims])
        invals = [operand, indices, *rest]
    sharded = [p for p, k in enumerate(dn.scatter_dims_to_operand_dims)
               if operand_block[k] != operand_global[k] and p not in whole]
    if not sharded:
        return bind_as_is(node, invals, blocks)
    clip = node.params["mode"] != lax.GatherScatterMode.FILL_OR_DROP
    spans = {k: updates_shape[u] for k, u in zip(window, dn.update_window_dims, strict=True)
             if k in dn.scatter_dims_to_operand_dims}  # indexed axes with a window: its length
    columns, pads = [], {}
    for p, k in enumerate(dn.scatter_dims_to_operand_dims):
        index = wide_index(indices[..., p])
        n, length = operand_global[k], spans.get(k, 1)
        if clip:  # into the whole axis, as the unsharded scatter clamps (every column: the mode becomes fill)
            index = jnp.clip(index, 0, n - length)
        if p in sharded:
            block = operand_block[k]
            span = blocks.in_spans[0][k] if blocks.in_spans and blocks.in_spans[0] else None
            first = block_index(blocks.in_layouts[0][k], blocks.mesh_shape) * block - (span.offset if span else 0)
            offset = first.astype(index.dtype)
            if k in spans:
                fits = (index >= 0) & (index <= n - length)  # else the unsharded scatter drops the window
                index = jnp.where(fits, jnp.clip(index - offset, -length, block) + length, block + 2 * length)
                pads[k] = length
            else:
                index = index - offset
        columns.append(index)
    if pads:
        operand = lax.pad(operand, jnp.zeros((), operand.dtype),
                          [(pads[k], pads[k], 0) if k in pads else (0, 0, 0) for k in range(operand.ndim)])
    params = {**node.params, "mode": lax.GatherScatterMode.FILL_OR_DROP}
    out = jx.bind(node.primitive, [operand, jnp.stack(columns, axis=-1), *rest], params)
    for k, length in pads.items():
        out = [lax.slice_in_dim(o, length, length + operand_block[k], axis=k) for o in out]
    return out


def scatter_lineage(ctx: LineageContext, box: Box, output: int, *, dimension_numbers, **params):
    """An output element reads the operand element at its position and whichever updates land there: where
    they land depends on index values on the indexed axes, so every update (and index) may, except along
    window axes the indices do not move, where update offset j lands on element j."""
    operand_shape, indices_shape, updates_shape = ctx.in_shapes[:3]
    dn = dimension_numbers
    window_axes = [d for d in range(len(operand_shape))
                   if d not in dn.inserted_window_dims and d not in dn.operand_batching_dims]
    updates_box = list(full_box(updates_shape))
    for k, u in enumerate(dn.update_window_dims):
        d = window_axes[k]
        if d not in dn.scatter_dims_to_operand_dims:
            updates_box[u] = box[d]
    return [[box], [full_box(indices_shape)], [tuple(updates_box)]] + [[()] for _ in ctx.in_shapes[3:]]


def _whole_windows_written_at_zero(node, indices, whole: list[int], block_sizes: list[int]):
    """A scatter's indices with each whole-window component set to 0 — or, under ``fill`` where it is not 0 (the
    unsharded scatter drops that window), past the block, so that the block's scatter drops it too."""
    columns = wide_index(indices[..., jnp.array(whole)])
    if node.params["mode"] == lax.GatherScatterMode.FILL_OR_DROP:
        past = jnp.asarray([block_sizes[p] for p in whole], columns.dtype)
        moved = jnp.where(jnp.any(columns != 0, axis=-1, keepdims=True), past, 0)
    else:
        moved = jnp.zeros_like(columns)
    return wide_index(indices).at[..., jnp.array(whole)].set(moved)


def elementwise_geometry(graph, node, operand_type, mesh_shape) -> FinishGeometry:
    """A scatter's partial results combine element by element (each device scattered its rows into the whole
    result): no operand block to read, no derivative (a maximum of floats is given its rows whole)."""
    return FinishGeometry(elementwise=True)


OPS = [
    *defs(("scatter-add", "scatter-sub"), Family.INDEXING, propagate=scatter, lineage=scatter_lineage,
          lineage_exact=False, per_block=scatter_on_blocks, finish=FinishScatter(CollectiveKind.PSUM, "fiuc"),
          pull=None, linear=Linearity.NONE, reads_ranges=True),
    # a maximum's or a minimum's derivative averages the tangents of every tie, across devices too: integers only
    # (no derivative); a float one is given its rows whole
    *(OpDef(name, Family.INDEXING, propagate=scatter, lineage=scatter_lineage, lineage_exact=False,
            per_block=scatter_on_blocks, finish=finish, pull=None, linear=Linearity.NONE, reads_ranges=True,
            geometry=elementwise_geometry)
      for name, finish in (("scatter-mul", FinishScatter(CollectiveKind.PPROD, "fiuc")),
                           ("scatter-max", FinishScatter(CollectiveKind.PMAX, "iub")),
                           ("scatter-min", FinishScatter(CollectiveKind.PMIN, "iub")),
                           ("scatter", None))),
]
