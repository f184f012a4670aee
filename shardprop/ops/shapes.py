"""Shape ops: broadcast_in_dim, squeeze, transpose, stack, unstack, tile, iota, empty (reshape has its own
module).

Sharding: mapped axes keep their operand's sharding; axes an op creates (a broadcast's new axes, a stack's
new axis, a tiled axis) start unannotated and adopt what they meet. Lineage: shape ops move elements without
combining them. On blocks: a broadcast's and an iota's ``shape`` param becomes the block shape, an iota's
values on a sharded axis start at the block's offset, and a created axis the op computes whole is cut to the
device's block.
"""

from __future__ import annotations

from ..core.blocks import Blocks, bind_as_is, bind_with, block_index, cut_to_blocks
from ..expr import jax_adapter as jx
from ..expr.graph import Graph, Node
from ..core.boxes import Box, LineageContext, product
from ..core.rules import CREATED, RuleContext, RuleOutput
from ..core.layouts import Layout, TensorSharding
from .opdef import Family, Linearity, OpDef, Trait
from .ranges import keep_ranges


def broadcast_in_dim(ctx: RuleContext, operand: TensorSharding, *dynamic_shape, shape, broadcast_dimensions,
                     **params) -> RuleOutput:
    """Mapped axes keep the operand's sharding; new axes and size-1 axes broadcast to a larger size are
    *created*: they start unannotated and adopt the sharding of what they meet (each device then builds only
    its block). A ranged mapped axis stays ranged."""
    if operand.spans:
        plain = broadcast_in_dim(ctx, operand.without_ranges(), *dynamic_shape, shape=shape,
                                 broadcast_dimensions=broadcast_dimensions, **params)
        return keep_ranges(ctx, plain, (operand, *dynamic_shape), [
            (0, k, d) for k, d in enumerate(broadcast_dimensions) if operand.shape[k] == shape[d]])
    source_of = {d: k for k, d in enumerate(broadcast_dimensions)}
    axes = []
    for d, size in enumerate(shape):
        k = source_of.get(d)
        if k is not None and operand.shape[k] == size:
            axes.append(ctx.carry(d, size, operand.axes[k]))
        else:
            axes.append(CREATED if size > 1 else None)
    return RuleOutput((TensorSharding(tuple(shape), tuple(axes)),), (operand.layout,) + tuple(
        ((),) * len(t.shape) for t in dynamic_shape))


def pull_broadcast(graph: Graph, node: Node, target: Layout) -> tuple[Layout, ...] | None:
    """The operand layout that gives the broadcast in ``target`` (mapped axes take the target's layout)."""
    if len(node.operands) != 1:  # a dynamic shape: leave the gather where it is
        return None
    (u,) = node.operands
    shape, out_shape = graph.avals[u].shape, graph.avals[node.outputs[0]].shape
    dims = node.params["broadcast_dimensions"]
    return (tuple(target[d] if shape[k] == out_shape[d] else () for k, d in enumerate(dims)),)


def broadcast_in_dim_lineage(ctx: LineageContext, box: Box, output: int, *, broadcast_dimensions, **params):
    shape, out_shape = ctx.in_shapes[0], ctx.out_shapes[0]
    box_in = tuple((0, 1) if n == 1 and out_shape[d] != 1 else box[d]
                   for n, d in zip(shape, broadcast_dimensions, strict=True))
    return [[box_in]] + [[()] for _ in ctx.in_shapes[1:]]  # dynamic shape operands are scalars


def _broadcast_block_params(params, blocks: Blocks) -> dict:
    """``shape`` becomes the output's block shape."""
    return {**params, "shape": blocks.out_blocks[0], "sharding": None}


def squeeze(ctx: RuleContext, operand: TensorSharding, *, dimensions, **params) -> RuleOutput:
    """The kept axes keep their sharding (a ranged one stays ranged)."""
    dropped = {d % len(operand.shape) for d in dimensions}
    kept = [k for k in range(len(operand.shape)) if k not in dropped]
    if operand.spans:
        plain = squeeze(ctx, operand.without_ranges(), dimensions=dimensions)
        return keep_ranges(ctx, plain, (operand,), [(0, k, i) for i, k in enumerate(kept)])
    out = TensorSharding(tuple(operand.shape[k] for k in kept), tuple(
        ctx.carry(i, operand.shape[k], operand.axes[k]) for i, k in enumerate(kept)))
    return RuleOutput((out,), (operand.layout,))


def squeeze_lineage(ctx: LineageContext, box: Box, output: int, *, dimensions, **params):
    (shape,) = ctx.in_shapes
    dropped = {d % len(shape) for d in dimensions}
    kept = iter(box)
    return [[tuple((0, 1) if k in dropped else next(kept) for k in range(len(shape)))]]


def transpose(ctx: RuleContext, operand: TensorSharding, *, permutation, **params) -> RuleOutput:
    """Every axis keeps its sharding, in its new place (a ranged one stays ranged)."""
    if operand.spans:
        plain = transpose(ctx, operand.without_ranges(), permutation=permutation)
        return keep_ranges(ctx, plain, (operand,), [(0, k, d) for d, k in enumerate(permutation)])
    out = TensorSharding(tuple(operand.shape[k] for k in permutation), tuple(
        ctx.carry(d, operand.shape[k], operand.axes[k]) for d, k in enumerate(permutation)))
    return RuleOutput((out,), (operand.layout,))


def transpose_lineage(ctx: LineageContext, box: Box, output: int, *, permutation, **params):
    box_in = [None] * len(permutation)
    for out_axis, in_axis in enumerate(permutation):
        box_in[in_axis] = box[out_axis]
    return [[tuple(box_in)]]


def iota(ctx: RuleContext, *, shape, **params) -> RuleOutput:
    """Every axis is created: it adopts what it meets and each device builds its own block (values on a
    sharded axis are offset by the block's start)."""
    return RuleOutput((TensorSharding(tuple(shape), tuple(CREATED if n > 1 else None for n in shape)),), ())


def no_operands(ctx: LineageContext, box: Box, output: int, **params):
    """An op without operands reads nothing."""
    return [[()] for _ in ctx.in_shapes]


def iota_on_blocks(node: Node, invals: list, blocks: Blocks) -> list:
    """The block's own iota: the block shape, values offset by the block's start along a sharded axis."""
    params = node.params
    dimension = params["dimension"]
    block = blocks.out_blocks[0]
    (out,) = jx.bind(node.primitive, [], {**params, "shape": block, "sharding": None})
    mesh_axes = blocks.out_layouts[0][dimension]
    if mesh_axes:  # values along a sharded axis start at this block's offset
        index = block_index(mesh_axes, blocks.mesh_shape)
        out = out + (index * block[dimension]).astype(out.dtype)
    return [out]


def stack(ctx: RuleContext, *operands: TensorSharding, axis, **params) -> RuleOutput:
    """The operands' axes merge like elementwise axes; the new axis is *created*: each device stacks all
    operands and keeps its block of them."""
    out_shape = ctx.out_avals[0].shape
    others = [k for k in range(len(out_shape)) if k != axis]
    axes: list = [CREATED if out_shape[axis] > 1 else None] * len(out_shape)
    for j, k in enumerate(others):
        axes[k] = ctx.merge(k, out_shape[k], [op.axes[j] for op in operands])
    out = TensorSharding(out_shape, tuple(axes))
    need = tuple(m for k, m in enumerate(out.layout) if k != axis) if operands else ()
    return RuleOutput((out,), (need,) * len(operands))


def stack_lineage(ctx: LineageContext, box: Box, output: int, *, axis, **params):
    start, stop = box[axis]
    rest = box[:axis] + box[axis + 1:]
    return [[rest] if start <= k < stop else [] for k in range(len(ctx.in_shapes))]


def unstack(ctx: RuleContext, operand: TensorSharding, *, axis, **params) -> RuleOutput:
    """Each output is one index of ``axis``, which is needed whole; the other axes keep their sharding."""
    kept = [k for k in range(len(operand.shape)) if k != axis]
    outputs = tuple(TensorSharding(tuple(operand.shape[k] for k in kept), tuple(
        ctx.carry(i, operand.shape[k], operand.axes[k]) for i, k in enumerate(kept))) for _ in ctx.out_avals)
    need = tuple(() if k == axis else m for k, m in enumerate(operand.layout))
    return RuleOutput(outputs, (need,))


def unstack_lineage(ctx: LineageContext, box: Box, output: int, *, axis, **params):
    return [[box[:axis] + ((output, output + 1),) + box[axis:]]]


def tile(ctx: RuleContext, operand: TensorSharding, *, reps, **params) -> RuleOutput:
    """An axis repeated once keeps its sharding; a repeated axis is needed whole and *created* in the output:
    each device tiles the whole axis and keeps its block."""
    out_shape = ctx.out_avals[0].shape
    axes = tuple(ctx.carry(k, n, operand.axes[k]) if r == 1 else (CREATED if n > 1 else None)
                 for k, (n, r) in enumerate(zip(out_shape, reps, strict=True)))
    need = tuple(m if r == 1 else () for m, r in zip(operand.layout, reps, strict=True))
    return RuleOutput((TensorSharding(out_shape, axes),), (need,))


def tile_lineage(ctx: LineageContext, box: Box, output: int, *, reps, **params):
    """Output element ``j`` of a tiled axis of length ``n`` reads element ``j % n``: one or two intervals, or
    the whole axis when the range covers a full period."""
    (shape,) = ctx.in_shapes
    per_axis = []
    for n, (s, e) in zip(shape, box, strict=True):
        if e - s >= n:
            per_axis.append([(0, n)])
        elif s // n == (e - 1) // n:
            per_axis.append([(s % n, (e - 1) % n + 1)])
        else:
            per_axis.append([(s % n, n), (0, (e - 1) % n + 1)])
    boxes, exact = product(per_axis)
    ctx.exact = ctx.exact and exact
    return [boxes]


def empty(ctx: RuleContext, *, shape, **params) -> RuleOutput:
    """Uninitialised memory: every axis is created, each device makes its own block."""
    return RuleOutput((TensorSharding(tuple(shape), tuple(CREATED if n > 1 else None for n in shape)),), ())


def empty_scalar(ctx: RuleContext, **params) -> RuleOutput:
    """A scalar placeholder (``empty2``: what a ``cond``'s linearization fills the other branch's residuals with,
    broadcast to their shape): replicated, as a constant is."""
    return RuleOutput((TensorSharding((), ()),), ())


def _empty_block_params(params, blocks: Blocks) -> dict:
    """``shape`` becomes the block shape."""
    return {**params, "shape": blocks.out_blocks[0], "out_sharding": None}


OPS = [
    OpDef("broadcast_in_dim", Family.SHAPE, propagate=broadcast_in_dim, lineage=broadcast_in_dim_lineage,
          lineage_exact=True, per_block=bind_with(_broadcast_block_params), finish=None, pull=pull_broadcast,
          reads_ranges=True, linear=Linearity.FIRST, traits=frozenset({Trait.VIEW, Trait.BROADCAST})),
    OpDef("squeeze", Family.SHAPE, propagate=squeeze, lineage=squeeze_lineage, lineage_exact=True, reads_ranges=True,
          per_block=bind_as_is, finish=None, pull=None, linear=Linearity.FIRST, traits=frozenset({Trait.VIEW})),
    OpDef("transpose", Family.SHAPE, propagate=transpose, lineage=transpose_lineage, lineage_exact=True,
          reads_ranges=True, per_block=bind_as_is, finish=None, pull=None, linear=Linearity.FIRST,
          traits=frozenset({Trait.VIEW})),
    OpDef("iota", Family.SHAPE, propagate=iota, lineage=no_operands, lineage_exact=True,
          per_block=iota_on_blocks, finish=None, pull=None, linear=Linearity.NONE),
    OpDef("empty", Family.SHAPE, propagate=empty, lineage=no_operands, lineage_exact=True,
          per_block=bind_with(_empty_block_params), finish=None, pull=None, linear=Linearity.NONE),
    OpDef("empty2", Family.SHAPE, propagate=empty_scalar, lineage=no_operands, lineage_exact=True,
          per_block=bind_as_is, finish=None, pull=None, linear=Linearity.NONE),
    OpDef("stack", Family.SHAPE, propagate=stack, lineage=stack_lineage, lineage_exact=True,
          per_block=cut_to_blocks, finish=None, pull=None, linear=Linearity.NONE),
    OpDef("unstack", Family.SHAPE, propagate=unstack, lineage=unstack_lineage, lineage_exact=True,
          per_block=bind_as_is, finish=None, pull=None, linear=Linearity.NONE),
    OpDef("tile", Family.SHAPE, propagate=tile, lineage=tile_lineage, lineage_exact=True,
          per_block=cut_to_blocks, finish=None, pull=None, linear=Linearity.NONE),
]
