"""``dot_general``: batch axes merge like elementwise axes, free axes keep their operand's sharding, and
contracting axes are a reduction — the op needs them whole, so their sharding is dropped.

When a free axis would reuse a mesh axis already sharding another output axis (``a @ b.T`` with both
sharded on rows), that free axis is consumed whole instead (its operand is gathered along it): one mesh
axis can shard only one axis of the result, and gathering is always correct.

``ragged_dot_general`` (a grouped matmul: which group of ``rhs`` a row of ``lhs`` meets depends on the group
sizes) keeps only the sharding of the ``rhs`` free axes; everything else is needed whole.

Lineage: an output element reads whole contracted axes. Finish: contracting axes sharded alike on both sides
(or on one side, the other replicated there and cut locally) can be multiplied per block and finished by a
``psum``, as in the shard_map design doc's ``matmul_basic`` — a free axis propagation takes whole is still gathered
(``h.T @ c``, the weight gradient of a tensor-parallel layer over a sharded batch: one operand gathered over the
tensor axis, the batch summed by the ``psum``).
"""

from __future__ import annotations

import math

from ..core.blocks import bind_as_is
from ..expr.graph import Node
from ..core.boxes import Box, LineageContext
from ..core.rules import RuleContext, RuleOutput
from ..core.layouts import Sharded, Span, TensorSharding, shard_count, spelled, uses_mesh_axes_once
from ..core.types import ValueType
from ..core.collectives import Collective, CollectiveKind
from .fallback import conservative, whole_operands
from .opdef import Family, Linearity, OpDef
from .range_blocks import masked_rows
from .ranges import keep_ranges


def dot_general(ctx: RuleContext, lhs: TensorSharding, rhs: TensorSharding, *, dimension_numbers,
                **params) -> RuleOutput:
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
    out_shape = ctx.out_avals[0].shape
    lhs_free = [k for k in range(len(lhs.shape)) if k not in lhs_contract and k not in lhs_batch]
    rhs_free = [k for k in range(len(rhs.shape)) if k not in rhs_contract and k not in rhs_batch]
    if lhs.spans or rhs.spans:  # ranged batch and free axes are read row by row: they stay ranged
        plain = dot_general(ctx, lhs.without_ranges(), rhs.without_ranges(), dimension_numbers=dimension_numbers,
                            **params)
        nb, nl = len(lhs_batch), len(lhs_free)
        rows = [(0, lb, i) for i, lb in enumerate(lhs_batch)] + [(1, rb, i) for i, rb in enumerate(rhs_batch)]
        rows += [(0, k, nb + i) for i, k in enumerate(lhs_free)] + [(1, k, nb + nl + i) for i, k in enumerate(rhs_free)]
        return keep_ranges(ctx, plain, (lhs, rhs), rows)
    axes = []
    for lb, rb in zip(lhs_batch, rhs_batch, strict=True):
        axes.append(ctx.merge(len(axes), lhs.shape[lb], [lhs.axes[lb], rhs.axes[rb]]))
    used = {name for a in axes if isinstance(a, Sharded) for name in a.mesh_axes}
    for operand, free in ((lhs, lhs_free), (rhs, rhs_free)):
        for k in free:
            axes.append(ctx.carry_unused(len(axes), operand.shape[k], operand.axes[k], used))
    out = TensorSharding(out_shape, tuple(axes))
    layout = out.layout
    nb = len(lhs_batch)
    lhs_need = [()] * len(lhs.shape)
    rhs_need = [()] * len(rhs.shape)
    for i, (lb, rb) in enumerate(zip(lhs_batch, rhs_batch, strict=True)):
        lhs_need[lb] = rhs_need[rb] = layout[i]
    for i, k in enumerate(lhs_free):
        lhs_need[k] = layout[nb + i]
    for i, k in enumerate(rhs_free):
        rhs_need[k] = layout[nb + len(lhs_free) + i]
    return RuleOutput((out,), (tuple(lhs_need), tuple(rhs_need)))


def dot_general_lineage(ctx: LineageContext, box: Box, output: int, *, dimension_numbers, **params):
    """Output axes are the batch axes, then the lhs free axes, then the rhs free axes (``lax.dot_general``)."""
    (lhs_c, rhs_c), (lhs_b, rhs_b) = dimension_numbers
    lhs_shape, rhs_shape = ctx.in_shapes
    n_batch = len(lhs_b)
    lhs_free = [k for k in range(len(lhs_shape)) if k not in lhs_c and k not in lhs_b]
    rhs_free = [k for k in range(len(rhs_shape)) if k not in rhs_c and k not in rhs_b]

    def operand_box(shape, contracting, batch, free, first_free):
        out = []
        for k, n in enumerate(shape):
            if k in contracting:
                out.append((0, n))
            elif k in batch:
                out.append(box[list(batch).index(k)])
            else:
                out.append(box[first_free + free.index(k)])
        return tuple(out)

    return [[operand_box(lhs_shape, lhs_c, lhs_b, lhs_free, n_batch)],
            [operand_box(rhs_shape, rhs_c, rhs_b, rhs_free, n_batch + len(lhs_free))]]


def finish_contraction(decisions, node: Node):
    """Contracting axes sharded alike on both sides (or on one side, the other replicated there and cut
    locally): each device multiplies its blocks and a ``psum`` adds the partial products. A ranged contracting axis
    (``h @ w[:, :1001]``'s gradient contracts over the sliced vocabulary) is read in place, its padding masked to
    zeros (``contraction_block``)."""
    (lhs_c, rhs_c), _ = node.params["dimension_numbers"]
    return finish_summed_pairs(decisions, node, lhs_c, rhs_c, reads_ranges=True)


def _ranged_pair(lhs: ValueType, rhs: ValueType, a: int, b: int) -> tuple[tuple[str, ...], Span] | None:
    """``(mesh axes, span)`` both operands are read in along contracting axes ``a`` and ``b`` when either is held
    ranged: the first range (the other operand realigned to it, or cut locally where it is whole). None where they
    are laid out over other mesh axes, or where rows no device holds (a pad's) would be left out of the sum."""
    sa, sb = lhs.span_of(a), rhs.span_of(b)
    if sa is None and sb is None:
        return None
    names, span, other = (lhs.layout[a], sa, rhs.layout[b]) if sa is not None else (rhs.layout[b], sb, lhs.layout[a])
    if (other and other != names) or span.fill is not None:
        return None
    return names, span


def finish_summed_pairs(decisions, node: Node, lhs_c, rhs_c, *, reads_ranges: bool = False, own_rows=frozenset()):
    """The finish of a bilinear op that sums over paired axes of its two operands (``lhs_c[k]`` with
    ``rhs_c[k]``: a contraction's contracting axes, a convolution's input features): where they are sharded
    alike (or on one side only), each device computes on its blocks and a ``psum`` over those mesh axes adds
    the partial results. None where a mesh axis would shard two axes of an operand or one of the output. With
    ``reads_ranges`` (the op masks the padding of ranged rows it sums over), a ranged pair is read in place — row
    by row, or, for the pairs in ``own_rows`` (a convolution's window and the input it slides over, laid out over the
    same mesh axes), each operand in the rows it holds."""
    lhs, rhs = node.operands
    lhs_have, rhs_have = decisions.layout(lhs), decisions.layout(rhs)
    lhs_need, rhs_need = (list(n) for n in decisions.need_layouts(node.id))
    lhs_spans, rhs_spans = [None] * len(lhs_need), [None] * len(rhs_need)
    mesh_axes: list[str] = []
    for a, b in zip(lhs_c, rhs_c, strict=True):
        if (a, b) in own_rows:
            lhs_type, rhs_type = decisions.type(lhs), decisions.type(rhs)
            lhs_need[a] = rhs_need[b] = lhs_type.layout[a]
            lhs_spans[a], rhs_spans[b] = lhs_type.span_of(a), rhs_type.span_of(b)
            mesh_axes.extend(lhs_type.layout[a])
            continue
        ranged = _ranged_pair(decisions.type(lhs), decisions.type(rhs), a, b) if reads_ranges else None
        if ranged is not None:
            names, span = ranged
            lhs_need[a] = rhs_need[b] = names
            lhs_spans[a] = rhs_spans[b] = span
            mesh_axes.extend(names)
            continue
        if lhs_have[a] and rhs_have[b] and lhs_have[a] != rhs_have[b]:
            return None
        names = lhs_have[a] or rhs_have[b]
        lhs_need[a] = rhs_need[b] = names
        mesh_axes.extend(names)
    if not mesh_axes:
        return None
    if len(set(mesh_axes)) < len(mesh_axes):
        return None  # one mesh axis over two contracting pairs (one operand's, the other's): no one sum finishes it
    contracted = set(mesh_axes)
    out_names = {name for m in decisions.layout(node.outputs[0]) for name in m}
    for need, axes in ((lhs_need, lhs_c), (rhs_need, rhs_c)):
        others = [name for k, m in enumerate(need) if k not in axes for name in m]
        if contracted & set(others):
            return None  # a mesh axis would shard two axes of one operand
    if contracted & out_names:
        return None
    if reads_ranges:
        _keep_rule_ranges(decisions, node, (lhs_need, rhs_need), (lhs_spans, rhs_spans), (lhs_c, rhs_c), contracted)
    # A free axis propagation takes whole (``h.T @ c`` with both free axes over one mesh axis) is still gathered;
    # the contracting axes no longer are.
    shapes = [decisions.graph.avals[v].shape for v in node.operands]
    needs = tuple(ValueType(tuple(need), span=tuple(
        span and spelled(span, n, shard_count(decisions.mesh_shape, m)) for span, n, m in zip(spans, shape, need,
                                                                                             strict=True)))
        for need, spans, shape in zip((lhs_need, rhs_need), (lhs_spans, rhs_spans), shapes, strict=True))
    return needs, Collective(CollectiveKind.PSUM, tuple(mesh_axes))


def _keep_rule_ranges(decisions, node: Node, needs, spans, summed, contracted: set[str]) -> None:
    """The batch and free axes the rule reads ranged (``.ranges.keep_ranges``), read alike by the finish — its
    result then stays ranged (``shardprop.splitting.decisions.Decisions.finished_types``): the weight gradient
    of a sliced vocabulary keeps its rows in place. Not where their mesh axes are the summed ones (those axes would
    both lay out and sum the result): then they are read whole."""
    reads = decisions.sharded.need_spans.get(node.id)
    if reads is None:
        return
    rule = decisions.rule_needs(node.id)
    kept = [(i, k) for i, per in enumerate(reads) if per for k, r in enumerate(per)
            if r is not None and k not in summed[i]]
    if not kept or any(contracted & set(rule[i].layout[k]) for i, k in kept):
        return
    for i, k in kept:
        needs[i][k] = rule[i].layout[k]
        spans[i][k] = rule[i].span_of(k)


def contraction_block(node: Node, invals: list, blocks) -> list:
    """The product of this device's blocks; along every ranged axis both operands' padding rows are zeroed first:
    along a contracting axis (read in place, a ``psum`` to follow) so that they add nothing (whatever they held:
    ``0 * inf`` is NaN), along a free or batch axis so that they add nothing to the other operand's derivative (its
    cotangent sums this operand's rows times the product's: a padding row's NaN times its zero cotangent is NaN)."""
    if blocks.in_spans:
        invals = [masked_rows(x, blocks, i, range(x.ndim)) for i, x in enumerate(invals)]
    return bind_as_is(node, invals, blocks)


def contraction_work(node: Node, operand_blocks, out_block) -> float:
    """Multiply-adds on blocks: every output element sums over the (per-device) contracted length."""
    (lhs_c, _), _ = node.params["dimension_numbers"]
    lhs_block = operand_blocks[0]
    return float(math.prod(out_block) * math.prod(lhs_block[k] for k in lhs_c))


def contraction_factors(node: Node, in_shapes) -> tuple[tuple[int, ...], ...]:
    """Per operand, per axis, the factor it carries: each batch pair one, each contracting pair one, each free axis
    its own (the layouts a contraction may be handed that its rule and finish take as they are).

    >>> contraction_factors(Node(0, "dot_general", (0, 1), (2,), {"dimension_numbers": (((1,), (0,)), ((), ()))},
    ...                          None), [(8, 4), (4, 2)])
    ((1, 0), (0, 2))
    """
    (lhs_c, rhs_c), (lhs_b, rhs_b) = node.params["dimension_numbers"]
    lhs, rhs = [None] * len(in_shapes[0]), [None] * len(in_shapes[1])
    count = 0
    for a, b in (*zip(lhs_b, rhs_b, strict=True), *zip(lhs_c, rhs_c, strict=True)):
        lhs[a] = rhs[b] = count
        count += 1
    for axes in (lhs, rhs):
        for k, f in enumerate(axes):
            if f is None:
                axes[k], count = count, count + 1
    return tuple(lhs), tuple(rhs)


def ragged_dot_general(ctx: RuleContext, lhs: TensorSharding, rhs: TensorSharding, group_sizes: TensorSharding, *,
                       ragged_dot_dimension_numbers, **params) -> RuleOutput:
    """The free axes of ``rhs`` (not contracted, batch or group axes) keep their sharding, as the last axes of
    the output; every other axis is needed whole."""
    dn = ragged_dot_dimension_numbers
    (lhs_c, rhs_c), (lhs_b, rhs_b) = dn.dot_dimension_numbers
    out_shape = ctx.out_avals[0].shape
    lhs_free = [k for k in range(len(lhs.shape)) if k not in lhs_c and k not in lhs_b]
    rhs_free = [k for k in range(len(rhs.shape)) if k not in rhs_c and k not in rhs_b
                and k not in dn.rhs_group_dimensions]
    if len(out_shape) != len(lhs_b) + len(lhs_free) + len(rhs_free):
        return conservative(ctx, lhs, rhs, group_sizes)
    first = len(out_shape) - len(rhs_free)
    axes = [None] * len(out_shape)
    rhs_need = [()] * len(rhs.shape)
    for i, k in enumerate(rhs_free):
        axes[first + i] = ctx.carry(first + i, out_shape[first + i], rhs.axes[k])
    out = TensorSharding(out_shape, tuple(axes))
    for i, k in enumerate(rhs_free):
        rhs_need[k] = out.layout[first + i]
    return RuleOutput((out,), (((),) * len(lhs.shape), tuple(rhs_need), ((),) * len(group_sizes.shape)))


def summed_as_partner_holds(node: Node, j: int, held, needed, in_shapes, mesh_shape):
    """Operand ``j`` of a ``dot_general`` as a psum finish takes it: its free axes (batch and kept) as the rule
    ``needed`` them — no finish spares moving those (a KV cache's sequence axis handed to the query heads' mesh
    axis) — and each contracted axis as held, sliced over the mesh axes the other operand's paired axis is held
    over where it is held whole (each device multiplies its blocks and sums them); all as the rule needs them where
    a free axis needs a mesh axis a contracted one holds (the attention weights' heads meeting the cache's sequence)."""
    (lhs, rhs), _ = node.params["dimension_numbers"]
    own, other = held[j], held[1 - j]
    mine, theirs = (lhs, rhs) if j == 0 else (rhs, lhs)
    taken = [axes if a in mine else needed[a] for a, axes in enumerate(own)]
    if not uses_mesh_axes_once(taken):  # a free axis needs a mesh axis a contracted one holds: as the rule needs it
        taken = list(needed)
    for a, b in zip(mine, theirs, strict=True):
        used = {m for axes in taken for m in axes}
        if not own[a] and other[b] and not used & set(other[b]) \
                and in_shapes[j][a] % shard_count(mesh_shape, other[b]) == 0:
            taken[a] = other[b]
    return tuple(taken)


OPS = [
    OpDef("dot_general", Family.CONTRACTION, propagate=dot_general, lineage=dot_general_lineage, reads_ranges=True,
          lineage_exact=True, per_block=contraction_block, finish=finish_contraction, pull=None,
          linear=Linearity.EITHER, work=contraction_work, finished_operand=summed_as_partner_holds,
          factors=contraction_factors, finish_follows_needs=True),
    OpDef("ragged_dot_general", Family.CONTRACTION, propagate=ragged_dot_general, lineage=whole_operands,
          lineage_exact=False, per_block=bind_as_is, finish=None, pull=None, linear=Linearity.NONE),
]
