"""Reductions drop sharding on the reduced axes: the op needs those axes whole (the split pass cuts there)
and the other axes keep their sharding.

Lineage: an output element reads the whole reduced axes. Finish: a sum, maximum or minimum over sharded
axes can instead be computed per block and finished by ``psum``/``pmax``/``pmin`` over their mesh axes
(``any``/``all`` over bools are a max/min; ``argmax``/``argmin`` combine offset indices), for the dtypes the
collective is exact for; a product or an ``xor`` has no collective, so it is given its axes whole.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax.numpy as jnp

from ..core.blocks import bind_as_is, block_index
from ..expr import jax_adapter as jx
from ..expr.graph import Node
from ..core.boxes import Box, LineageContext
from ..core.rules import RuleContext, RuleOutput
from ..core.layouts import TensorSharding, shard_count
from ..core.types import ValueType
from ..core.collectives import Collective, CollectiveKind, FinishGeometry
from .opdef import Family, Linearity, OpDef, Trait
from .range_blocks import masked_rows
from .ranges import keep_ranges
from .windows import extreme


def reduction(ctx: RuleContext, operand: TensorSharding, *, axes, **params) -> RuleOutput:
    """The reduced axes are needed whole (or finished by a collective), the kept axes keep their sharding — a ranged
    one stays ranged when no reduced axis is laid out over mesh axes (a reduction over ranged rows reads them in
    place when a collective finishes it: ``FinishReduction``)."""
    if operand.spans:
        plain = reduction(ctx, operand.without_ranges(), axes=axes)
        kept = [k for k in range(len(operand.shape)) if k not in set(axes)]
        return keep_ranges(ctx, plain, (operand,), [(0, k, i) for i, k in enumerate(kept)])
    reduced = set(axes)
    kept = [k for k in range(len(operand.shape)) if k not in reduced]
    out_shape = ctx.out_avals[0].shape
    out = TensorSharding(out_shape, tuple(
        ctx.carry(i, out_shape[i], operand.axes[k]) for i, k in enumerate(kept)
    ))
    need = tuple(() if k in reduced else m for k, m in enumerate(operand.layout))
    return RuleOutput((out,), (need,))


def reduction_lineage(ctx: LineageContext, box: Box, output: int, *, axes, **params):
    (shape,) = ctx.in_shapes
    kept = iter(box)
    return [[tuple((0, n) if k in axes else next(kept) for k, n in enumerate(shape))]]


def reduce(ctx: RuleContext, *operands: TensorSharding, dimensions, **params) -> RuleOutput:
    """``lax.reduce`` with a computation of its own, over several operands at once: their kept axes merge like
    elementwise axes, the reduced ones are needed whole; the init values are scalars."""
    n_arrays = len(ctx.out_avals)  # operands, then as many init values
    arrays = operands[:n_arrays]
    reduced = set(dimensions)
    kept = [k for k in range(len(arrays[0].shape)) if k not in reduced]
    out_shape = ctx.out_avals[0].shape
    outputs = tuple(TensorSharding(aval.shape, tuple(ctx.merge(i, out_shape[i], [a.axes[k] for a in arrays])
                                                     for i, k in enumerate(kept))) for aval in ctx.out_avals)
    need = [()] * len(arrays[0].shape)
    for i, k in enumerate(kept):
        need[k] = outputs[0].layout[i]
    return RuleOutput(outputs, (tuple(need),) * n_arrays + tuple(() for _ in operands[n_arrays:]))


def reduce_lineage(ctx: LineageContext, box: Box, output: int, *, dimensions, **params):
    """Every operand, whole along the reduced axes (the computation may combine them any way: not exact
    with more than one)."""
    n_arrays = len(ctx.out_shapes)
    if n_arrays > 1:
        ctx.exact = False
    kept = list(box)
    operand_box = []
    for k, n in enumerate(ctx.in_shapes[0]):
        operand_box.append((0, n) if k in dimensions else kept.pop(0))
    return [[tuple(operand_box)] for _ in range(n_arrays)] + [[()] for _ in ctx.in_shapes[n_arrays:]]


@dataclass(frozen=True)
class FinishReduction:
    """Finish a reduction over sharded axes with ``kind`` over their mesh axes, for operand dtypes of the
    numpy kinds in ``exact_for`` (no max over complex numbers; ``and``/``or`` are a min/max only over bools)."""

    kind: CollectiveKind
    exact_for: str

    def __call__(self, decisions, node: Node):
        (v,) = node.operands
        dtype = decisions.graph.avals[v].dtype
        kind = jx.dtype_kind(dtype)  # bfloat16 is a float too; "" (a PRNG key) is in every string
        if not kind or kind not in self.exact_for:
            return None
        held = decisions.type(v)
        axes = node.params["axes"]
        spans = [held.span_of(k) if k in axes and self.kind in _MASKED else None for k in range(len(held.layout))]
        # rows no device holds (a pad's) are counted in by one device for a sum (a product) over that one axis; a
        # maximum or a minimum takes them in on every device; an arg-extreme would have to name one of them: read
        # whole
        spans = [s if s is not None and (s.fill is None or self.kind in _FILLS_TAKEN_IN or len(axes) == 1
                                         and self.kind in _FILLS_COUNTED_ONCE) else None for s in spans]
        filled = [k for k, s in enumerate(spans) if s is not None and s.fill is not None]
        for k in filled[1:]:  # the finish takes in one filled axis's rows no device holds: the others read whole
            spans[k] = None
        # a kept axis is read as the rule reads it, the layout its result is computed in: sliced further where the
        # rule takes it so (a value laid out by its use: propagation/uses.py), moved where the rule lays it out over
        # other mesh axes (an out_specs of ('k', 'i') for a kept axis held over 'i')
        rule_layout = decisions.sharded.needs[node.id][0]
        produced = list(r if k not in axes else m if spans[k] is not None else e
                        for k, (m, e, r) in enumerate(zip(held.layout, held.even_layout, rule_layout, strict=True)))
        mesh_axes = tuple(name for k in sorted(axes) for name in produced[k])
        result = decisions.sharded.layout(node.outputs[0])
        if not mesh_axes or any(set(mesh_axes) & set(m) for m in result):
            return None  # (the rule moved a reduced axis's mesh axes onto a kept one: the operand is moved so, first)
        reads = decisions.sharded.need_spans.get(node.id)
        if reads and reads[0]:  # the kept axes the rule reads ranged, read
            # alike: the result stays ranged
            rule = decisions.rule_needs(node.id)[0]
            kept = [k for k, r in enumerate(reads[0]) if r is not None and k not in axes]
            if not any(set(mesh_axes) & set(rule.layout[k]) for k in kept):
                for k in kept:
                    produced[k], spans[k] = rule.layout[k], rule.span_of(k)
        return (ValueType(tuple(produced), span=tuple(spans)),), Collective(self.kind, mesh_axes)


# The identity each reduction masks the padding of ranged rows with, given the dtype.
_MASKED = {CollectiveKind.PSUM: lambda dtype: 0, CollectiveKind.PMAX: lambda dtype: extreme(dtype, lowest=True),
           CollectiveKind.PMIN: lambda dtype: extreme(dtype, lowest=False), CollectiveKind.PPROD: lambda dtype: 1,
           CollectiveKind.ARGMAX: lambda dtype: extreme(dtype, lowest=True),
           CollectiveKind.ARGMIN: lambda dtype: extreme(dtype, lowest=False)}
_FILLS_TAKEN_IN = (CollectiveKind.PMAX, CollectiveKind.PMIN)
_FILLS_COUNTED_ONCE = (CollectiveKind.PSUM, CollectiveKind.PPROD)
_IDENTITY = {"reduce_sum": CollectiveKind.PSUM, "reduce_max": CollectiveKind.PMAX,
             "reduce_min": CollectiveKind.PMIN, "reduce_or": CollectiveKind.PMAX, "reduce_and": CollectiveKind.PMIN,
             "reduce_prod": CollectiveKind.PPROD}


def reduction_block(node: Node, invals: list, blocks) -> list:
    """The reduction of this device's block; ranged rows it reduces (finished by a collective over the devices) are
    first masked past the axis's ends with the reduction's identity (0 for a sum, the lowest value for a maximum),
    so the padding counts for nothing, and the rows no device holds (a pad's value) are counted in once after, by a
    sum or a product — a maximum's or a minimum's finish takes them in (``backends/finish.py``: they tie with the
    devices' results, and its derivative averages over every element attaining the extreme)."""
    (x,) = invals
    spans = blocks.in_spans[0] if blocks.in_spans else ()
    masked = [k for k in node.params["axes"] if spans and spans[k] is not None]
    if not masked:
        return bind_as_is(node, [x], blocks)
    x = masked_rows(x, blocks, 0, masked, _MASKED[_IDENTITY[node.op]](x.dtype))
    (out,) = bind_as_is(node, [x], blocks)
    for k in masked:  # the rows no device holds, all the span's fill
        span, length = spans[k], blocks.in_global[0][k]
        count = shard_count(blocks.mesh_shape, blocks.in_layouts[0][k])
        unheld = length - sum(stop - first for first, stop in (span.held(d, length) for d in range(count)))
        if span.fill is None or unheld == 0:
            continue
        fill = jnp.asarray(span.fill, out.dtype)
        first = block_index(blocks.in_layouts[0][k], blocks.mesh_shape) == 0
        if node.op == "reduce_sum":  # counted in once, by the first device (a sum over this one axis)
            out = out + jnp.where(first, fill * unheld, jnp.zeros((), out.dtype))
        elif node.op == "reduce_prod":  # multiplied in once, by the first device (a product over this one axis)
            out = out * jnp.where(first, fill ** unheld, jnp.ones((), out.dtype))
    return [out]


def arg_extreme_block(node: Node, invals: list, blocks) -> list:
    """This device's block's winner (its position in the block). Along a ranged axis (an arg-extreme finish to
    follow) the padding is masked with the lowest (highest) value first, and a winner that lands on padding before
    the axis's first row — every row the device holds ties with it — is moved to the first row it holds."""
    (x,) = invals
    (axis,) = node.params["axes"]
    span = blocks.in_spans[0][axis] if blocks.in_spans else None
    if span is None:
        return bind_as_is(node, [x], blocks)
    x = masked_rows(x, blocks, 0, (axis,), _MASKED[_ARG[node.op]](x.dtype))
    (local,) = bind_as_is(node, [x], blocks)
    start = block_index(blocks.in_layouts[0][axis], blocks.mesh_shape) * span.block - span.offset
    return [jnp.maximum(local, jnp.clip(-start, 0, span.block - 1).astype(local.dtype))]


_ARG = {"argmax": CollectiveKind.ARGMAX, "argmin": CollectiveKind.ARGMIN}


def reduction_geometry(graph, node, operand_type: ValueType, mesh_shape) -> FinishGeometry:
    """Where a reduction's finish works: the ranged rows it reads (``(axis, mesh axes, span, length)`` per reduced
    axis read ranged) and, for a filled one (a pad's), the fill and how many of its elements no device holds for
    each element of the result."""
    axes = node.params.get("axes") or ()
    shape = graph.avals[node.operands[0]].shape
    rows = tuple((k, operand_type.layout[k], operand_type.span_of(k), shape[k]) for k in axes
                 if operand_type.span_of(k) is not None)
    if not rows:
        return FinishGeometry()
    filled = [(k, span) for k, _, span, _ in rows if span.fill is not None]
    if not filled:
        return FinishGeometry(rows=rows)
    # the rows of the one filled axis no device holds (FinishReduction reads at most one ranged filled), once for
    # every element of the other reduced axes
    (k, span), = filled
    count = shard_count(mesh_shape, operand_type.layout[k])
    unheld = shape[k] - sum(stop - first for first, stop in (span.held(d, shape[k]) for d in range(count)))
    others = math.prod(shape[j] for j in axes if j != k)
    return FinishGeometry(rows=rows, fill=span.fill, fill_count=unheld * others)


# the reductions whose result is one of their operand's elements (its derivative tests which)
_SELECTING = frozenset({"reduce_max", "reduce_min", "argmax", "argmin"})


def _reduction(name: str, finish: FinishReduction | None, linear: Linearity = Linearity.NONE) -> OpDef:
    per_block = reduction_block if name in _IDENTITY else arg_extreme_block if name in _ARG else bind_as_is
    return OpDef(name, Family.REDUCTION, propagate=reduction, lineage=reduction_lineage, lineage_exact=True,
                 per_block=per_block, finish=finish, pull=None, linear=linear, reads_ranges=True,
                 finish_follows_needs=True, geometry=reduction_geometry,
                 traits=frozenset({Trait.SELECTING}) if name in _SELECTING else frozenset())


OPS = [
    _reduction("reduce_sum", FinishReduction(CollectiveKind.PSUM, "fiuc"), Linearity.FIRST),
    _reduction("reduce_max", FinishReduction(CollectiveKind.PMAX, "fiub")),
    _reduction("reduce_min", FinishReduction(CollectiveKind.PMIN, "fiub")),
    _reduction("reduce_or", FinishReduction(CollectiveKind.PMAX, "b")),
    _reduction("reduce_and", FinishReduction(CollectiveKind.PMIN, "b")),
    _reduction("argmax", FinishReduction(CollectiveKind.ARGMAX, "fiu")),
    _reduction("argmin", FinishReduction(CollectiveKind.ARGMIN, "fiu")),
    # JAX has no collective multiplying partial results: one built from its all-reduce (as jax.jit's)
    _reduction("reduce_prod", FinishReduction(CollectiveKind.PPROD, "fiuc")),
    # No collective xors partial results: given its reduced axes whole.
    _reduction("reduce_xor", None),
    # not exact with several operands: the computation may combine them any way
    OpDef("reduce", Family.REDUCTION, propagate=reduce, lineage=reduce_lineage, lineage_exact=False,
          per_block=bind_as_is, finish=None, pull=None, linear=Linearity.NONE),
]
