"""Axis-wise scans and sorts need the scanned axis whole; the other axes keep their sharding — except a cumulative
op (``cumsum``, ``cumprod``, ``cummax``, ``cummin``, ``cumlogsumexp``) under a communication strategy: each device
scans its own block and one all-gather of the block totals (one row per device) finishes it, each device combining
the totals of the blocks before it (after it, reversed) into its scan (``finish_cumulative``); the axis stays
sharded. ``jax.jit`` gathers the axis. A ``top_k`` along a sharded axis whose blocks hold at least ``k`` is, where
it moves less than the gather, each block's top-k and an all-gather of the ``k`` candidates per device
(``finish_top_k``); its output is whole along that axis.

Lineage: a cumulative op reads the prefix (or, reversed, the suffix) of the scanned axis; a sort reads its
keys and itself whole along the sorted axis; ``top_k`` reads the whole axis it picks from.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..core.blocks import bind_as_is, block_index
from ..core.collectives import Collective, CollectiveKind, FinishGeometry
from ..core.boxes import Box, LineageContext
from ..core.rules import RuleContext, RuleOutput
from ..core.layouts import Sharded, TensorSharding, shard_count, standard_span, uneven_span
from ..core.types import ValueType
from ..expr import jax_adapter as jx
from .opdef import Family, Linearity, OpDef, Trait, defs
from .range_blocks import masked_rows
from .windows import extreme


def cumulative(ctx: RuleContext, operand: TensorSharding, *, axis, **params) -> RuleOutput:
    """Every axis keeps its sharding, the scanned one too: its blocks are scanned alone, and the split pass always
    finishes them (``finish_cumulative``). A ranged scanned axis (``x[:, 2:50:7]``) stays ranged, each device
    scanning the rows it holds (the padding masked with the op's identity, ``cumulative_block``); another ranged
    axis is read whole."""
    plain = operand.without_ranges()
    axes = [ctx.carry(k, n, a) for k, (n, a) in enumerate(zip(plain.shape, plain.axes, strict=True))]
    scanned = operand.axes[axis]
    if not (isinstance(scanned, Sharded) and scanned.span is not None
            and not jx.is_extended_dtype(ctx.out_avals[0].dtype)) or any(
                set(scanned.mesh_axes) & set(a.mesh_axes) for a in axes if isinstance(a, Sharded)):
        out = TensorSharding(operand.shape, tuple(axes))
        return RuleOutput((out,), (out.layout,))
    span, size = scanned.span, operand.shape[axis]
    if span.fill is not None:  # a pad's rows no device holds have scanned values of their own: realigned into blocks
        # that hold every row (each device receives the few rows it lacks, the fill where no device holds them)
        count = shard_count(ctx.mesh_shape, scanned.mesh_axes)
        span = uneven_span(size, count) or standard_span(size, count)
    axes[axis] = ctx.ranged(axis, size, scanned.mesh_axes, span, [(scanned, 0)])
    out = TensorSharding(operand.shape, tuple(axes))
    reads = tuple((scanned.mesh_axes, span) if k == axis else None for k in range(len(axes)))
    return RuleOutput((out,), (out.layout,), need_spans=(reads,))


def cumulative_block(node, invals, blocks) -> list:
    """This device's block scanned; along a ranged scanned axis its padding (past the axis's ends) first set to the
    op's identity, so the block's total — what the prefix finish combines — counts only its rows."""
    (x,) = invals
    axis = node.params["axis"]
    spans = blocks.in_spans[0] if blocks.in_spans else ()
    if spans and spans[axis] is not None:
        x = masked_rows(x, blocks, 0, (axis,), _IDENTITY[node.op](x.dtype))
    return bind_as_is(node, [x], blocks)


# The identity of each cumulative op, given the dtype: what a ranged block's padding is set to before its scan.
_IDENTITY = {"cumsum": lambda dtype: 0, "cumprod": lambda dtype: 1,
             "cummax": lambda dtype: extreme(dtype, lowest=True), "cummin": lambda dtype: extreme(dtype, lowest=False),
             "cumlogsumexp": lambda dtype: extreme(dtype, lowest=True)}


def finish_cumulative(decisions, node):
    """A cumulative op whose scanned axis its rule keeps sharded: each device scans its block, and the prefix of the
    block totals (``shardprop.core.collectives.CollectiveKind`` ``PREFIX``) finishes it — under every
    strategy (the rule relies on it)."""
    axis = node.params["axis"]
    (need,) = decisions.needs(node.id)
    if not need.layout[axis]:
        return None
    return (need,), Collective(CollectiveKind.PREFIX, need.layout[axis])


def cumulative_lineage(ctx: LineageContext, box: Box, output: int, *, axis, reverse=False, **params):
    (shape,) = ctx.in_shapes
    start, stop = box[axis]
    scanned = (start, shape[axis]) if reverse else (0, stop)
    return [[box[:axis] + (scanned,) + box[axis + 1:]]]


def sort(ctx: RuleContext, *operands: TensorSharding, dimension, **params) -> RuleOutput:
    """All operands are sorted together along ``dimension``: their other axes merge like elementwise axes."""
    shape = operands[0].shape
    outputs = tuple(
        TensorSharding(shape, tuple(None if k == dimension else ctx.merge(k, n, [op.axes[k] for op in operands])
                                    for k, n in enumerate(shape)))
        for _ in operands
    )
    return RuleOutput(outputs, (outputs[0].layout,) * len(operands))


def sort_lineage(ctx: LineageContext, box: Box, output: int, *, dimension, num_keys=1, **params):
    """Output ``k`` is operand ``k`` permuted along ``dimension`` by the order of the first ``num_keys``
    operands: it reads those keys and itself, whole along ``dimension``."""
    n = ctx.in_shapes[0][dimension]
    whole = box[:dimension] + ((0, n),) + box[dimension + 1:]
    return [[whole] if k < num_keys or k == output else [] for k in range(len(ctx.in_shapes))]


def top_k(ctx: RuleContext, operand: TensorSharding, *, k, axis=-1, **params) -> RuleOutput:
    axis %= len(operand.shape)
    out_shape = ctx.out_avals[0].shape
    outputs = tuple(
        TensorSharding(out_shape, tuple(None if d == axis else ctx.carry(d, n, operand.axes[d])
                                        for d, n in enumerate(out_shape)))
        for _ in ctx.out_avals
    )
    return RuleOutput(outputs, (outputs[0].layout,))


def finish_top_k(decisions, node):
    """A top-k along a sharded axis, each block holding at least ``k``: each device takes its block's ``k`` best (the
    indices offset to the whole axis, ``top_k_block``) and a ``top_k`` finish all-gathers those candidates and
    takes the ``k`` best of them — ``count * k`` values and indices move, not the axis."""
    (x,) = node.operands
    (need,) = decisions.needs(node.id)
    shape = decisions.graph.avals[x].shape
    axis = node.params["axis"] % len(shape)
    names = decisions.type(x).even_layout[axis]
    used = {name for k, m in enumerate(need.layout) if k != axis for name in m}
    if not names or used & set(names) or shape[axis] // shard_count(decisions.mesh_shape, names) < node.params["k"]:
        return None
    layout = tuple(names if k == axis else m for k, m in enumerate(need.layout))
    return (ValueType(layout),), Collective(CollectiveKind.TOP_K, names)


def top_k_block(node, invals, blocks):
    """The top-k of this device's block; where the axis arrived sharded (a ``top_k`` finish combines the devices'),
    its indices offset by the block's start."""
    values, indices = bind_as_is(node, invals, blocks)
    axis = node.params["axis"] % values.ndim
    names = blocks.in_layouts[0][axis]
    if not names:
        return [values, indices]
    start = block_index(names, blocks.mesh_shape) * blocks.in_blocks[0][axis]
    return [values, indices + start.astype(indices.dtype)]


def top_k_lineage(ctx: LineageContext, box: Box, output: int, *, axis=-1, **params):
    (shape,) = ctx.in_shapes
    axis %= len(shape)
    return [[box[:axis] + ((0, shape[axis]),) + box[axis + 1:]]]


def approx_top_k(ctx: RuleContext, operand: TensorSharding, *, reduction_dimension, **params) -> RuleOutput:
    """``top_k`` along ``reduction_dimension``: that axis is needed whole, the others keep their sharding."""
    return top_k(ctx, operand, k=None, axis=reduction_dimension)


def approx_top_k_lineage(ctx: LineageContext, box: Box, output: int, *, reduction_dimension, **params):
    return top_k_lineage(ctx, box, output, axis=reduction_dimension)


def combine_earlier_blocks(node, scanned, totals, earlier):
    """A cumulative op's ``combine`` piece: its block's scan ``scanned`` with the ``totals`` of the blocks before it
    (``earlier``, along the scanned axis; after it, reversed) combined in — added, multiplied, log-added, or the
    maximum (minimum) taken (``shardprop/backends/finish.py`` gathers the totals)."""
    axis, dtype = node.params["axis"], scanned.dtype
    if node.op == "cumsum":
        return scanned + jnp.sum(jnp.where(earlier, totals, 0), axis=axis, keepdims=True, dtype=dtype)
    if node.op == "cumprod":
        return scanned * jnp.prod(jnp.where(earlier, totals, 1), axis=axis, keepdims=True, dtype=dtype)
    if node.op == "cumlogsumexp":
        lowest = jnp.array(-jnp.inf, dtype)
        return jnp.logaddexp(scanned, jax.nn.logsumexp(jnp.where(earlier, totals, lowest), axis=axis, keepdims=True))
    is_max = node.op == "cummax"
    bound = extreme(dtype, lowest=is_max)  # the identity: the blocks after this one count for nothing
    reduce, combine = (jnp.max, jnp.maximum) if is_max else (jnp.min, jnp.minimum)
    return combine(scanned, reduce(jnp.where(earlier, totals, bound), axis=axis, keepdims=True))


def top_k_geometry(graph, node, operand_type, mesh_shape) -> FinishGeometry:
    """A top-k's finish works along its axis (each device's candidates gathered there)."""
    return FinishGeometry(axis=node.params["axis"])


OPS = [
    *defs(("cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp"), Family.SCAN, propagate=cumulative,
          lineage=cumulative_lineage, lineage_exact=True, per_block=cumulative_block, finish=finish_cumulative,
          pull=None, linear={"cumsum": Linearity.FIRST}, reads_ranges=True, combine=combine_earlier_blocks,
          traits=dict.fromkeys(("cummax", "cummin"), (Trait.SELECTING,))),
    OpDef("sort", Family.SCAN, propagate=sort, lineage=sort_lineage, lineage_exact=True, per_block=bind_as_is,
          finish=None, pull=None, linear=Linearity.NONE, traits=frozenset({Trait.SELECTING})),
    OpDef("top_k", Family.SCAN, propagate=top_k, lineage=top_k_lineage, lineage_exact=True, per_block=top_k_block,
          finish=finish_top_k, pull=None, linear=Linearity.NONE, geometry=top_k_geometry,
          traits=frozenset({Trait.SELECTING})),
    OpDef("approx_top_k", Family.SCAN, propagate=approx_top_k, lineage=approx_top_k_lineage, lineage_exact=True,
          per_block=bind_as_is, finish=None, pull=None, linear=Linearity.NONE),
]
