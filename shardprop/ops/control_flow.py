"""``scan``: sharded through when the body provably needs no communication.

The body is traced into its own graph and propagated with the carry, the constants and one slice of the
scanned inputs (axis 0 needed whole) as its inputs. The carry must come out laid out as it went in; when it
does not, the carry layout is coarsened (or refined, if the initial carry can be sliced locally) and the body
propagated again, a few times at most. If the body then needs no gather anywhere, the scan runs per block
inside its stage with those layouts; otherwise it falls back to the conservative rule, with a warning.
``cond`` (and ``lax.switch``) likewise: every branch is propagated with the operands' layouts; when all branches
need no gather and lay their outputs out alike, the ``cond`` runs per block — each device takes the branch its
(scalar, so replicated) index selects, on its blocks; otherwise the conservative fallback. ``while`` has no rule
yet (issue #15).

Lineage looks inside the body: a block of ``ys`` reads the same iterations of ``xs`` (and, through the carry,
every earlier iteration). The body is walked with the same rules, seeded with what the output block asks of
one iteration. Whatever that needs of the incoming carry is asked of the previous iteration's outgoing
carry, and so on until the carry regions stop growing: the union of everything asked on the way is sound
for every iteration. A scan whose ``ys`` block needs nothing of the carry (a ``map``) is exact: iterations
``[s, e)`` of ``xs`` only.

On blocks, a sharded scan is a ``lax.scan`` over the per-block evaluation of its body graph.
"""

from __future__ import annotations

import functools

from jax import lax

from ..backends.blocks import Blocks
from ..backends.evaluate import run_graph
from ..errors import ShardingError
from ..expr import Graph, trace_jaxpr
from ..expr import jax_adapter as jx
from ..expr.graph import Node
from ..inspect.lineage.boxes import Box, LineageContext, contains, full_box, normalize
from ..inspect.lineage.walk import seeded_dependencies
from ..propagation.context import RuleContext, RuleOutput
from ..propagation.sharding import Sharded, TensorSharding, common_layout, layout_refines
from .fallback import conservative, whole_operands
from .opdef import Family, OpDef


def _needs_no_gather(body) -> bool:
    return all(layout_refines(body.layout(v), need) for node in body.graph.nodes
               for v, need in zip(node.operands, body.needs[node.id], strict=True))


def _sharded_like(ctx: RuleContext, shape, layout, operands) -> TensorSharding:
    """Shards for ``layout`` whose parents are the same-numbered blocks of every operand axis laid out over
    the same mesh axes (what a communication-free body computes each block from)."""
    axes = []
    for k, (n, mesh_axes) in enumerate(zip(shape, layout, strict=True)):
        if not mesh_axes:
            axes.append(None)
            continue
        sources = [a for op in operands for a in op.axes if isinstance(a, Sharded) and a.mesh_axes == mesh_axes]
        axes.append(ctx.derive(k, n, sources) if sources else ctx.root(k, n, mesh_axes))
    return TensorSharding(tuple(shape), tuple(axes))


def scan(ctx: RuleContext, *operands: TensorSharding, jaxpr, num_consts, num_carry, **params) -> RuleOutput:
    consts, init, xs = operands[:num_consts], operands[num_consts:num_consts + num_carry], \
        operands[num_consts + num_carry:]
    graph = trace_jaxpr(jaxpr)
    carry = [op.layout for op in init]
    body = None
    for _ in range(2 * sum(len(op.shape) for op in init) + 2):
        try:
            body = ctx.propagate_body(graph, [op.layout for op in consts] + carry + [op.layout[1:] for op in xs])
        except ShardingError:
            body = None
            break
        out = [body.layout(v) for v in graph.outputs[:num_carry]]
        if out == carry:
            break
        # Refine where the initial carry can be sliced locally; otherwise keep only what both agree on.
        carry = [o if layout_refines(c_in, o) else common_layout(c_in, o)
                 for c_in, o in zip(carry, out, strict=True)]
    else:
        body = None
    if body is None or not _needs_no_gather(body) or any(
            body.layout(v) != c for v, c in zip(graph.outputs[:num_carry], carry, strict=True)):
        return conservative(ctx, *operands)._replace(fallback=True)
    out_avals = ctx.out_avals
    carry_out = [_sharded_like(ctx, a.shape, layout, operands)
                 for a, layout in zip(out_avals[:num_carry], carry, strict=True)]
    ys = [_sharded_like(ctx, a.shape, ((),) + body.layout(v), operands)
          for a, v in zip(out_avals[num_carry:], graph.outputs[num_carry:], strict=True)]
    needs = tuple(op.layout for op in consts) + tuple(carry) + tuple(((),) + op.layout[1:] for op in xs)
    return RuleOutput(tuple(carry_out + ys), needs, body=body)


# Rounds of carry growth before giving up and asking for the whole carry (always a fixed point).
MAX_CARRY_ROUNDS = 16


@functools.lru_cache(maxsize=128)
def _body_graph(jaxpr) -> Graph:
    return trace_jaxpr(jaxpr)


def _covered(boxes: list[Box], by: list[Box]) -> bool:
    return all(any(contains(outer, box) for outer in by) for box in boxes)


def _seeds(body: Graph, num_consts: int, carry_boxes: dict[int, list[Box]]) -> dict[int, list[Box]]:
    """``{body value: boxes}`` asking each outgoing carry for the boxes asked of the matching incoming carry
    (two carries may be the same value: their boxes are pooled)."""
    seeds: dict[int, list[Box]] = {}
    for c, boxes in carry_boxes.items():
        if boxes:
            seeds.setdefault(body.outputs[c - num_consts], []).extend(boxes)
    return seeds


def scan_lineage(ctx: LineageContext, box: Box, output: int, *, jaxpr, length, reverse=False, num_consts, num_carry,
         **params) -> list[list[Box]]:
    n_xs = len(ctx.in_shapes) - num_consts - num_carry
    if length == 0:
        ctx.exact = False
        return [[full_box(shape)] for shape in ctx.in_shapes]
    body = _body_graph(jaxpr)
    carry_in = list(range(num_consts, num_consts + num_carry))
    is_y = output >= num_carry
    # What one iteration's outputs are asked for: a y block drops its leading (iteration) axis.
    found, exact = seeded_dependencies(body, {body.outputs[output]: [box[1:] if is_y else box]})
    asked_of = {i: list(found[i]) for i in range(len(ctx.in_shapes))}
    carry_asked = {c: normalize(found[c])[0] for c in carry_in}
    uses_carry = any(carry_asked.values())
    frontier = carry_asked
    for _ in range(MAX_CARRY_ROUNDS):
        if not any(frontier.values()):
            break
        # The incoming carry of one iteration is the outgoing carry of the one before.
        found, step_exact = seeded_dependencies(body, _seeds(body, num_consts, frontier))
        exact = exact and step_exact
        for i, boxes in found.items():
            asked_of[i].extend(boxes)
        frontier = {c: [] if _covered(found[c], carry_asked[c]) else found[c] for c in carry_in}
        carry_asked = {c: normalize(carry_asked[c] + found[c])[0] for c in carry_in}
    if any(frontier.values()):  # still growing: the whole carry is a fixed point of the loop, so ask for it
        carry_asked = {c: [full_box(ctx.in_shapes[c])] for c in carry_in}
        found, _ = seeded_dependencies(body, _seeds(body, num_consts, carry_asked))
        for i, boxes in found.items():
            asked_of[i].extend(boxes)
        exact = False

    # Which iterations run code that the block reads.
    if uses_carry:
        exact = False  # the union over iterations is sound but may over-approximate a given iteration
        iterations = (box[0][0], length) if is_y and reverse else (0, box[0][1]) if is_y else (0, length)
    else:
        iterations = box[0] if is_y else ((0, 1) if reverse else (length - 1, length))
    ctx.exact = ctx.exact and exact
    answer: list[list[Box]] = []
    for i in range(len(ctx.in_shapes)):
        if i < num_consts:
            answer.append(asked_of[i])
        elif i < num_consts + num_carry:
            answer.append(carry_asked[i] if uses_carry else [])  # the initial carry feeds iteration 0
        else:
            answer.append([(iterations,) + b for b in asked_of[i]])
    assert len(answer) == num_consts + num_carry + n_xs
    return answer


def scan_on_blocks(node: Node, invals: list, blocks: Blocks) -> list:
    body, params = blocks.body, node.params
    if body is None:  # the conservative rule: everything replicated, the scan as it is (its constraints dropped)
        return jx.bind(node.primitive, invals, jx.without_placements(node.params))
    n_consts, n_carry = params["num_consts"], params["num_carry"]
    consts, init, xs = invals[:n_consts], invals[n_consts:n_consts + n_carry], invals[n_consts + n_carry:]

    def step(carry, x):
        outs = run_graph(body, [*consts, *carry, *x])
        return outs[:n_carry], outs[n_carry:]

    carry, ys = lax.scan(step, list(init), list(xs), length=params["length"], reverse=params["reverse"],
                         unroll=params["unroll"])
    return [*carry, *ys]


def cond(ctx: RuleContext, index: TensorSharding, *operands: TensorSharding, branches, **params) -> RuleOutput:
    """Sharded through when every branch, propagated with the operands' layouts, needs no gather and lays its
    outputs out as the others do (the index is a scalar: every device holds it whole and takes the same branch)."""
    layouts = [op.layout for op in operands]
    bodies = []
    for branch in branches:
        try:
            bodies.append(ctx.propagate_body(_body_graph(branch), layouts))
        except ShardingError:
            return conservative(ctx, index, *operands)._replace(fallback=True)
    outs = {tuple(body.layout(v) for v in body.graph.outputs) for body in bodies}
    if len(outs) != 1 or not all(_needs_no_gather(body) for body in bodies):
        return conservative(ctx, index, *operands)._replace(fallback=True)
    (out,) = outs
    shardings = tuple(_sharded_like(ctx, a.shape, layout, operands)
                      for a, layout in zip(ctx.out_avals, out, strict=True))
    return RuleOutput(shardings, (index.layout, *layouts), body=tuple(bodies))


def cond_on_blocks(node: Node, invals: list, blocks: Blocks) -> list:
    bodies = blocks.body
    if bodies is None:  # the conservative rule: operands whole, the cond as it is (its constraints dropped)
        return jx.bind(node.primitive, invals, jx.without_placements(node.params))
    index, operands = invals[0], invals[1:]
    branches = [functools.partial(lambda body, *xs: run_graph(body, list(xs)), body) for body in bodies]
    return list(lax.switch(index, branches, *operands))


OPS = [
    OpDef("scan", Family.CONTROL_FLOW, propagate=scan, lineage=scan_lineage, lineage_exact=True,
          per_block=scan_on_blocks, finish=None, pull=None),
    # Lineage stays whole-operand (sound; looking into the branches is issue #15).
    OpDef("cond", Family.CONTROL_FLOW, propagate=cond, lineage=whole_operands, lineage_exact=False,
          per_block=cond_on_blocks, finish=None, pull=None),
]
