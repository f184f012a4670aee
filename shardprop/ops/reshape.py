"""``reshape``: within each group of axes that reshape merges or splits, the sharding of the group's major
input axis survives on the group's major output axis when the shard count divides that axis: every block is
then one contiguous run of the flattened group. Every other axis of the group is needed whole — unless the
group's mesh axes, major to minor, deal out onto the output axes with every block still one contiguous run
(``_compound``: ``(2, 4)`` over ``P('x', 'y')`` is ``(8,)`` over ``P(('x', 'y'))``, and back).

Lineage: each axis group maps its rows of the output box onto rows of the operand. On blocks:
``new_sizes`` becomes the output's block shape.
"""

from __future__ import annotations

import itertools
import math

from ..core.blocks import Blocks, bind_with
from ..core.boxes import Box, LineageContext, bounded_product, full_box, hull
from ..core.rules import RuleContext, RuleOutput
from ..core.layouts import Shard, Sharded, Span, TensorSharding, shard_count
from .fallback import conservative
from .opdef import Family, Linearity, OpDef, Trait

# A reshape box that crosses more rows than this is widened to its bounding box (sound, not exact).
MAX_RUNS = 4096


def reshape_groups(in_shape, out_shape) -> list[tuple[list[int], list[int]]]:
    """Pair up contiguous groups of input and output axes with equal element counts (size-1 axes aside).

    >>> reshape_groups((16, 8), (128,))
    [([0, 1], [0])]
    >>> reshape_groups((6, 4), (2, 3, 4))
    [([0], [0, 1]), ([1], [2])]

    An empty array (a zero-length axis) has no groups: it holds nothing to keep in place.
    """
    if not math.prod(in_shape):
        return []
    ins = [k for k, n in enumerate(in_shape) if n != 1]
    outs = [k for k, n in enumerate(out_shape) if n != 1]
    groups, i, j = [], 0, 0
    while i < len(ins) and j < len(outs):
        group_in, group_out = [ins[i]], [outs[j]]
        size_in, size_out = in_shape[ins[i]], out_shape[outs[j]]
        i, j = i + 1, j + 1
        while size_in != size_out:
            if size_in < size_out:
                group_in.append(ins[i])
                size_in *= in_shape[ins[i]]
                i += 1
            else:
                group_out.append(outs[j])
                size_out *= out_shape[outs[j]]
                j += 1
        groups.append((group_in, group_out))
    return groups


def reshape(ctx: RuleContext, operand: TensorSharding, *dynamic, new_sizes, dimensions, **params) -> RuleOutput:
    """Within each group of axes that reshape merges or splits, the sharding of the group's major input
    axis survives on the group's major output axis when the shard count divides that axis: every block is
    then one contiguous run of the flattened group. Every other axis of the group is needed whole."""
    if dimensions is not None or dynamic:
        return conservative(ctx, operand.without_ranges(), *dynamic)
    out_shape = tuple(new_sizes)
    if operand.spans:
        return _ranged_reshape(ctx, operand, out_shape)
    axes: list = [None] * len(out_shape)
    need = [()] * len(operand.shape)
    for group_in, group_out in reshape_groups(operand.shape, out_shape):
        placed = _compound(operand.layout, operand.shape, out_shape, group_in, group_out, ctx.mesh_shape)
        if placed is not None:  # every block is one contiguous run of the group: nothing moves
            for k in group_in:
                need[k] = operand.layout[k]
            sources = [(operand.layout[k], operand.axes[k]) for k in group_in if operand.layout[k]]
            for t, mesh_axes in placed.items():
                axes[t] = ctx.regroup(t, out_shape[t], mesh_axes, sources)
            continue
        major, target = operand.axes[group_in[0]], group_out[0]
        if isinstance(major, Sharded) and out_shape[target] % shard_count(ctx.mesh_shape, major.mesh_axes):
            continue  # blocks would not line up with the output axis: gather it
        if major is not None:
            axes[target] = ctx.carry(target, out_shape[target], major)
            need[group_in[0]] = operand.layout[group_in[0]]
    return RuleOutput((TensorSharding(out_shape, tuple(axes)),), (tuple(need),))



def _compound(layout, in_shape, out_shape, group_in, group_out, mesh_shape) -> dict[int, tuple[str, ...]] | None:
    """The mesh axes of each output axis of a group when every device's block of the group's input is one contiguous
    run of the flattened group that is also a block of its output, else None: the input's mesh axes, major to minor,
    are those of its sharded axes where each one before the last holds one index per device (``(2, 4)`` over
    ``P('x', 'y')`` flattens to ``(8,)`` over ``('x', 'y')``), and they are dealt to the output axes in order, each
    taking mesh axes whose product divides it until it is one index per device (``(8,)`` over ``('x', 'y', 'z')``
    splits into ``(2, 2, 2)`` over ``P('x', 'y', 'z')``). Both as ``jax.jit`` lays them out, moving nothing.

    >>> _compound(((), ("x", "y", "z")), (1, 8), (2, 2, 2), [1], [0, 1, 2], {"x": 2, "y": 2, "z": 2})
    {0: ('x',), 1: ('y',), 2: ('z',)}
    """
    sharded = [k for k in group_in if layout[k]]
    if not sharded or (len(sharded) == 1 and len(layout[sharded[0]]) == 1):
        return None  # one mesh axis on one axis: the major axis's rule below
    names: list[str] = []
    for k in group_in[:group_in.index(sharded[-1])]:
        if in_shape[k] != shard_count(mesh_shape, layout[k]):
            return None  # a block of this axis spans several rows of the axes after it: not contiguous
        names += layout[k]
    names += layout[sharded[-1]]
    placed: dict[int, tuple[str, ...]] = {}
    for t in group_out:
        taken: list[str] = []
        while names and out_shape[t] % (shard_count(mesh_shape, tuple(taken)) * mesh_shape[names[0]]) == 0:
            taken.append(names.pop(0))
            if shard_count(mesh_shape, tuple(taken)) == out_shape[t]:
                break
        if taken:
            placed[t] = tuple(taken)
        if names and shard_count(mesh_shape, tuple(taken)) != out_shape[t]:
            return None  # the next mesh axis would cut this output axis's rows: blocks would not line up
        if not names:
            break
    return placed if not names else None


def _ranged_reshape(ctx: RuleContext, operand: TensorSharding, out_shape) -> RuleOutput:
    """A group whose major input axis is ranged keeps its rows in place on the group's major output axis where each
    device's rows are whole output rows: ``x[:, 3:61].reshape(4, 464)`` merges the 8 features into each ranged row
    (``Span(3, 8)`` becomes ``Span(24, 64)``). Any other ranged axis is read whole."""
    plain = reshape(ctx, operand.without_ranges(), new_sizes=out_shape, dimensions=None)
    axes, need = list(plain.outputs[0].axes), list(plain.needs[0])
    reads: list = [None] * len(operand.shape)
    for group_in, group_out in reshape_groups(operand.shape, out_shape):
        major = operand.axes[group_in[0]]
        if not isinstance(major, Sharded) or major.span is None:
            continue
        inner_in = math.prod(operand.shape[k] for k in group_in[1:])
        inner_out = math.prod(out_shape[t] for t in group_out[1:])
        span = major.span
        if (span.offset * inner_in) % inner_out or (span.block * inner_in) % inner_out:
            continue
        out = Span(span.offset * inner_in // inner_out, span.block * inner_in // inner_out, span.fill)
        axis = ctx.ranged(group_out[0], out_shape[group_out[0]], major.mesh_axes, out, [])
        if axis.shards:  # each device's rows are the rows it held, regrouped
            axis = Sharded(axis.mesh_axes, tuple(Shard(s.id, s.axis, s.start, s.length, (p,) if s.length and p.length
                                                       else ()) for s, p in zip(axis.shards, major.shards,
                                                                                strict=True)), axis.span)
        axes[group_out[0]] = axis
        need[group_in[0]] = ()
        reads[group_in[0]] = (major.mesh_axes, span)
    if not any(reads):
        return plain
    return RuleOutput((TensorSharding(out_shape, tuple(axes)),), (tuple(need), *plain.needs[1:]),
                      need_spans=(tuple(reads),))


def _element_groups(in_shape, out_shape) -> list[tuple[list[int], list[int]]]:
    """Consecutive axis groups with equal element counts, size-1 axes included (unlike ``reshape_groups``,
    which only needs the axes that can carry a sharding): ``(8, 6) → (2, 4, 3, 2)`` gives
    ``[([0], [0, 1]), ([1], [2, 3])]``. Within a group, elements keep their row-major order (an empty array has
    no elements: its lineage is asked for none)."""
    groups, i, j = [], 0, 0
    while i < len(in_shape) or j < len(out_shape):
        ins, outs, p, q = [], [], 1, 1
        if i < len(in_shape):
            ins.append(i)
            p *= in_shape[i]
            i += 1
        if j < len(out_shape):
            outs.append(j)
            q *= out_shape[j]
            j += 1
        while p != q:
            if p < q:
                ins.append(i)
                p *= in_shape[i]
                i += 1
            else:
                outs.append(j)
                q *= out_shape[j]
                j += 1
        groups.append((ins, outs))
    return groups


def run_boxes(lo: int, hi: int, shape: tuple[int, ...]) -> list[Box]:
    """The row-major elements ``[lo, hi)`` of a tensor of ``shape`` as a few boxes."""
    if lo >= hi:
        return []
    if not shape:
        return [()]
    inner = math.prod(shape[1:])
    a, a_rest = divmod(lo, inner)
    b, b_rest = divmod(hi, inner)
    rest = shape[1:]
    if a == b:
        return [((a, a + 1),) + sub for sub in run_boxes(a_rest, b_rest, rest)]
    out = []
    if a_rest:
        out += [((a, a + 1),) + sub for sub in run_boxes(a_rest, inner, rest)]
        a += 1
    if a < b:
        out.append(((a, b),) + full_box(rest))
    if b_rest:
        out += [((b, b + 1),) + sub for sub in run_boxes(0, b_rest, rest)]
    return out


def _runs(box: Box, shape: tuple[int, ...]) -> list[tuple[int, int]] | None:
    """The row-major element ranges a box covers, merged; None when there are more than MAX_RUNS."""
    if not shape:
        return [(0, 1)]
    strides = [math.prod(shape[k + 1:]) for k in range(len(shape))]
    # the innermost axes the box covers whole, plus the first partial one, form one contiguous run
    k = len(shape) - 1
    while k > 0 and box[k] == (0, shape[k]):
        k -= 1
    outer = box[:k]
    if math.prod(e - s for s, e in outer) > MAX_RUNS:
        return None
    runs: list[tuple[int, int]] = []
    for index in itertools.product(*(range(s, e) for s, e in outer)):
        base = sum(i * st for i, st in zip(index, strides, strict=False))
        lo, hi = base + box[k][0] * strides[k], base + box[k][1] * strides[k]
        if runs and runs[-1][1] == lo:
            runs[-1] = (runs[-1][0], hi)
        else:
            runs.append((lo, hi))
    return runs


def reshape_lineage(ctx: LineageContext, box: Box, output: int, *, dimensions=None, **params):
    """Each axis group of the reshape maps its rows of the output box onto rows of the operand; groups are
    independent, so the operand boxes are the product of the groups' boxes. With ``dimensions`` (an
    ``order="F"`` reshape) the operand is transposed first, so the boxes are transposed back."""
    shape, out_shape = ctx.in_shapes[0], ctx.out_shapes[0]
    if 0 in shape:
        return [[]]
    if dimensions is None:
        boxes = _reshape_boxes(ctx, box, shape, out_shape)
    else:
        inverse = [list(dimensions).index(k) for k in range(len(shape))]
        transposed = _reshape_boxes(ctx, box, tuple(shape[d] for d in dimensions), out_shape)
        boxes = [tuple(b[inverse[k]] for k in range(len(shape))) for b in transposed]
    return [boxes] + [[()] for _ in ctx.in_shapes[1:]]


def _reshape_boxes(ctx: LineageContext, box: Box, shape: tuple[int, ...], out_shape: tuple[int, ...]) -> list[Box]:
    per_group = []
    for ins, outs in _element_groups(shape, out_shape):
        in_sub = tuple(shape[k] for k in ins)
        sub_box, sub_shape = tuple(box[k] for k in outs), tuple(out_shape[k] for k in outs)
        runs = _runs(sub_box, sub_shape)
        if runs is None:  # too many rows: the bounding box of the first and last element
            ctx.exact = False
            runs = [(_row_major(tuple(s for s, _ in sub_box), sub_shape),
                     _row_major(tuple(e - 1 for _, e in sub_box), sub_shape) + 1)]
            per_group.append([hull(run_boxes(*runs[0], in_sub))])
        else:
            per_group.append([b for lo, hi in runs for b in run_boxes(lo, hi, in_sub)])
    boxes, exact = bounded_product(per_group)
    ctx.exact = ctx.exact and exact
    return boxes


def _row_major(index: tuple[int, ...], shape: tuple[int, ...]) -> int:
    return sum(i * math.prod(shape[k + 1:]) for k, i in enumerate(index))


def _reshape_block_params(params, blocks: Blocks) -> dict:
    """``new_sizes`` becomes the output's block shape."""
    return {**params, "new_sizes": blocks.out_blocks[0], "sharding": None}


OPS = [
    OpDef("reshape", Family.SHAPE, propagate=reshape, lineage=reshape_lineage, lineage_exact=True,
          per_block=bind_with(_reshape_block_params), finish=None, pull=None, linear=Linearity.FIRST,
          reads_ranges=True, traits=frozenset({Trait.VIEW})),
]
