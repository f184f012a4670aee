"""``scan``, ``while`` and ``cond``: the loop or branch stays one node of its stage, sharded, and its body may
communicate.

A body (a loop body, a while loop's condition, each branch of a ``cond``) is traced into its own graph and
propagated with the layouts its inputs arrive in; whatever it needs — a sum over a sharded axis finished by a
``psum``, an operand gathered — happens *inside* the body, on every iteration, as it would in a stage
(the split pass decides the body's collectives with the program's strategy). The carry layout is found by a
fixed point: the body is propagated with the carry laid out as it goes in; where it comes out otherwise the
carry is refined (when the initial carry can be sliced locally) or coarsened to what both agree on, and the body
propagated again, a few times at most. Where it still comes out otherwise, the body's output is moved into the
carry layout at the end of each iteration. A ``cond``'s branches are propagated with the operands' layouts and
their outputs brought to the layout they have in common. Only a body containing a primitive without a rule makes
the op fall back (gathered, replicated, run on whole arrays), and the warning names that primitive.

On blocks, a sharded scan is a ``lax.scan`` (a while loop a ``lax.while_loop``, a cond a ``lax.switch`` on its
replicated index) over its bodies, each a function of its input blocks (``Blocks.bodies``).
"""

from __future__ import annotations

import functools
from typing import Any  # a body's ShardedGraph (propagation's product), as ctx.propagate_body hands it back

from jax import lax

from ..core.blocks import Blocks
from ..errors import ShardingConflictError, ShardingError, SpecError
from ..expr import Graph
from ..expr import jax_adapter as jx
from ..expr.graph import Node, where
from ..core.rules import RuleContext, RuleOutput
from ..core.rules import Body, Carry
from ..core.layouts import (Layout, Sharded, TensorSharding, common_layout, layout_refines, shard_count,
                             uneven_span)
from ..core.moves import move_bytes
from ..core.types import carried_type
from .control_flow_lineage import body_graph, cond_lineage, scan_lineage, while_lineage
from .fallback import conservative
from .opdef import Family, Linearity, OpDef


class _NoBody(Exception):
    """A body that cannot be sharded (a primitive without a rule inside it): the op falls back, saying why."""


def _sharded_body(ctx: RuleContext, graph: Graph, layouts: list[Layout]) -> Any:
    try:
        body = ctx.propagate_body(graph, layouts)
    except (ShardingConflictError, SpecError):
        raise  # the user's own input, refused as it would be outside the body
    except ShardingError as err:
        raise _NoBody(f"its body could not be sharded: {str(err).splitlines()[0]}") from None
    if body.fallbacks:
        first = min(body.fallbacks)
        node = graph.nodes[first]
        inner = body.fallback_causes.get(first)
        raise _NoBody(f"`{node.op}` at {where(node)} inside its body has no rule"
                      + (f": {inner}" if inner else ""))
    return body


def _fallback(ctx: RuleContext, operands, why: _NoBody) -> RuleOutput:
    return conservative(ctx, *operands)._replace(fallback=True, fallback_cause=str(why))


def _sharded_like(ctx: RuleContext, shape, layout, operands) -> TensorSharding:
    """Shards for ``layout`` whose parents are the same-numbered blocks of every operand axis laid out over
    the same mesh axes (what a body computes each block from); an axis its mesh axes do not divide is ranged, in
    blocks of ``ceil(n / count)`` rows (a carry held so)."""
    axes = []
    for k, (n, mesh_axes) in enumerate(zip(shape, layout, strict=True)):
        if not mesh_axes:
            axes.append(None)
            continue
        sources = [a for op in operands for a in op.axes if isinstance(a, Sharded) and a.mesh_axes == mesh_axes]
        span = uneven_span(n, shard_count(ctx.mesh_shape, mesh_axes))
        if span is not None:
            axes.append(ctx.ranged(k, n, mesh_axes, span, [(a, 0) for a in sources]))
        else:
            axes.append(ctx.derive(k, n, sources) if sources else ctx.root(k, n, mesh_axes))
    return TensorSharding(tuple(shape), tuple(axes))


def _carried(operand: TensorSharding) -> Layout:
    """The layout a loop carries ``operand`` in: its layout, each ranged axis (no fill) over its mesh axes — in
    blocks of ``ceil(n / count)`` rows where they do not divide it (an uneven argument's blocks; realigned there
    first where it is held in other rows)."""
    if not operand.spans:
        return operand.layout
    return tuple(r[0] if r is not None and r[1].fill is None else m
                 for m, r in zip(operand.layout, operand.spans, strict=True))


def _out_carried(body: Any, value: int, mesh_shape) -> Layout:
    """The layout a body's output ``value`` comes out in, for the carry's fixed point: a ranged axis counts as its
    mesh axes where it is in the blocks a carry is held in (``uneven_span``), else as whole."""
    sharding = body.shardings[value]
    if not sharding.spans:
        return sharding.layout
    return tuple(r[0] if r is not None and r[1] == uneven_span(n, shard_count(mesh_shape, r[0])) else m
                 for n, m, r in zip(sharding.shape, sharding.layout, sharding.spans, strict=True))


def _carry_needs(ctx: RuleContext, shapes, layouts: list[Layout]) -> tuple[list[Layout], list]:
    """The need layouts of carried operands laid out as ``layouts`` and, per operand, the ranged rows each axis is
    read in (None where none): an axis its mesh axes do not divide is read ranged, in blocks of ``ceil(n / count)``
    rows."""
    needs, spans = [], []
    for shape, layout in zip(shapes, layouts, strict=True):
        rows = [None if not m else uneven_span(n, shard_count(ctx.mesh_shape, m)) for n, m in zip(shape, layout,
                                                                                                    strict=True)]
        needs.append(tuple(() if r is not None else m for m, r in zip(layout, rows, strict=True)))
        spans.append(tuple((m, r) if r is not None else None for m, r in zip(layout, rows, strict=True)))
    return needs, spans


def _carry_fixed_point(ctx: RuleContext, graph: Graph, init: list[Layout], inputs) -> tuple[list[Layout], Any]:
    """The carry layouts and the body propagated with them: ``inputs(carry)`` are the body's input layouts, the
    carry its first ``len(init)`` outputs. Where the carry comes out otherwise than it went in, the next round
    refines it (the initial carry can be sliced locally) or keeps what both agree on; a carry that has not settled
    after a few rounds is whatever the last round said, and the body's output is moved into it per iteration."""
    carry = list(init)
    for _ in range(2 * sum(len(c) for c in init) + 2):
        body = _sharded_body(ctx, graph, inputs(carry))
        out = [_out_carried(body, v, ctx.mesh_shape) for v in graph.outputs[:len(carry)]]
        settled = [o if layout_refines(c, o) else common_layout(c, o) for c, o in zip(carry, out, strict=True)]
        if settled == carry:
            return carry, body
        carry = settled
    return carry, _sharded_body(ctx, graph, inputs(carry))


def scan(ctx: RuleContext, *operands: TensorSharding, jaxpr, num_consts, num_carry, length, **params) -> RuleOutput:
    consts, init, xs = operands[:num_consts], operands[num_consts:num_consts + num_carry], \
        operands[num_consts + num_carry:]
    graph = body_graph(jaxpr)
    # a slice of xs per iteration: its ranged axes (not the scanned one) in the blocks a carry is held in
    const_layouts, xs_layouts = [op.layout for op in consts], [_carried(op)[1:] for op in xs]
    try:
        carry, body = _carry_fixed_point(ctx, graph, [_carried(op) for op in init],
                                         lambda carry: const_layouts + carry + xs_layouts)
    except _NoBody as why:
        return _fallback(ctx, operands, why)
    ys = [_out_carried(body, v, ctx.mesh_shape) for v in graph.outputs[num_carry:]]
    out_avals = ctx.out_avals
    outputs = [_sharded_like(ctx, a.shape, layout, operands)
               for a, layout in zip(out_avals, carry + [((),) + y for y in ys], strict=True)]
    carries = tuple(Carry(num_consts + k, k, num_consts + k, k) for k in range(num_carry))
    carry_needs, carry_spans = _carry_needs(ctx, [op.shape for op in init], carry)
    xs_needs, xs_spans = _carry_needs(ctx, [op.shape[1:] for op in xs], xs_layouts)
    needs = tuple(const_layouts) + tuple(carry_needs) + tuple(((),) + x for x in xs_needs)
    spans = [(None,) * len(op.shape) for op in consts] + carry_spans + [(None,) + x for x in xs_spans]
    return RuleOutput(tuple(outputs), needs, body=(Body(body, tuple(carry + ys), length, carries, "body",
                                                        tuple(range(len(operands))),
                                                        frozenset(range(num_consts + num_carry, len(operands)))),),
                      need_spans=_read(spans))


def while_loop(ctx: RuleContext, *operands: TensorSharding, cond_jaxpr, body_jaxpr, cond_nconsts, body_nconsts,
               **params) -> RuleOutput:
    """A ``while_loop`` (and a ``fori_loop`` with traced bounds): the carry's fixed point through the body, then
    the condition propagated with it; its predicate is a scalar, so every device holds it whole and all take the
    same number of iterations."""
    n_fixed = cond_nconsts + body_nconsts
    cond_consts, body_consts, init = operands[:cond_nconsts], operands[cond_nconsts:n_fixed], operands[n_fixed:]
    cond_layouts, body_layouts = [op.layout for op in cond_consts], [op.layout for op in body_consts]
    try:
        carry, body = _carry_fixed_point(ctx, body_graph(body_jaxpr), [_carried(op) for op in init],
                                         lambda carry: body_layouts + carry)
        cond = _sharded_body(ctx, body_graph(cond_jaxpr), cond_layouts + carry)
    except _NoBody as why:
        return _fallback(ctx, operands, why)
    outputs = tuple(_sharded_like(ctx, a.shape, layout, operands)
                    for a, layout in zip(ctx.out_avals, carry, strict=True))
    n = len(carry)
    carried = tuple(range(n_fixed, n_fixed + n))
    bodies = (Body(cond, ((),), None, tuple(Carry(cond_nconsts + k, None, n_fixed + k, k) for k in range(n)), "cond",
                   (*range(cond_nconsts), *carried)),
              Body(body, tuple(carry), None, tuple(Carry(body_nconsts + k, k, n_fixed + k, k) for k in range(n)),
                   "body", (*range(cond_nconsts, n_fixed), *carried)))
    carry_needs, carry_spans = _carry_needs(ctx, [op.shape for op in init], carry)
    spans = [(None,) * len(op.shape) for op in (*cond_consts, *body_consts)] + carry_spans
    return RuleOutput(outputs, (*cond_layouts, *body_layouts, *carry_needs), body=bodies, need_spans=_read(spans))


def _read(spans: list) -> tuple | None:
    """``need_spans`` of a rule's operands (None where no operand is read ranged)."""
    return tuple(spans) if any(r is not None for per in spans for r in per) else None


def _merged(layouts: list[Layout], aval, mesh_shape) -> Layout:
    """The layout the branches' outputs are brought to: of theirs and of what they all have in common, the one the
    branches together move the fewest bytes to reach (a branch that can cut it locally moves nothing); the
    finer on a tie. Independent of the branches' order."""
    common = layouts[0]
    for b in layouts[1:]:
        common = common_layout(common, b)

    def cost(candidate: Layout) -> tuple[float, int]:
        moved = sum(0.0 if layout_refines(b, candidate) else move_bytes(  # (uneven axes: in a carry's blocks)
            aval.shape, aval.dtype, carried_type(aval.shape, b, mesh_shape),
            carried_type(aval.shape, candidate, mesh_shape), mesh_shape) for b in layouts)
        return moved, -sum(map(len, candidate))

    return min(sorted(set(layouts) | {common}), key=cost)


def cond(ctx: RuleContext, index: TensorSharding, *operands: TensorSharding, branches, **params) -> RuleOutput:
    """Every branch propagated with the operands' layouts; each output takes the branch layout (or the one all
    have in common) the branches move the fewest elements to reach — one every branch can cut locally when there
    is one (a branch holding it otherwise moves it at its end). The index is a scalar: every device holds it
    whole and takes the same branch. Ranged operands (``x[:, :63]``) are read as a loop reads its carry, in blocks of
    ``ceil(n / count)`` rows, and ranged outputs come out so."""
    layouts = [_carried(op) for op in operands]
    try:
        sharded = [_sharded_body(ctx, body_graph(branch), layouts) for branch in branches]
    except _NoBody as why:
        return _fallback(ctx, (index, *operands), why)
    out = [_merged([_out_carried(body, body.graph.outputs[k], ctx.mesh_shape) for body in sharded], aval,
                   ctx.mesh_shape) for k, aval in enumerate(ctx.out_avals)]
    shardings = tuple(_sharded_like(ctx, a.shape, layout, operands)
                      for a, layout in zip(ctx.out_avals, out, strict=True))
    needs, spans = _carry_needs(ctx, [op.shape for op in operands], layouts)
    return RuleOutput(shardings, (index.layout, *needs), body=tuple(
        Body(b, tuple(out), name=f"branch{k}", operands=tuple(range(1, len(operands) + 1)))
        for k, b in enumerate(sharded)), need_spans=_read([(None,) * len(index.shape), *spans]))


def scan_on_blocks(node: Node, invals: list, blocks: Blocks) -> list:
    params = node.params
    if blocks.bodies is None:  # the conservative rule: all replicated, the scan as it is (its constraints dropped)
        return jx.bind(node.primitive, invals, jx.without_placements(params))
    (run,) = blocks.bodies
    n_consts, n_carry = params["num_consts"], params["num_carry"]
    consts, init, xs = invals[:n_consts], invals[n_consts:n_consts + n_carry], invals[n_consts + n_carry:]

    def step(carry, x):
        outs = run([*consts, *carry, *x])
        return outs[:n_carry], outs[n_carry:]

    carry, ys = lax.scan(step, init, list(xs), length=params["length"], reverse=params["reverse"],
                         unroll=params["unroll"])
    return [*carry, *ys]


def while_on_blocks(node: Node, invals: list, blocks: Blocks) -> list:
    params = node.params
    if blocks.bodies is None:
        return jx.bind(node.primitive, invals, jx.without_placements(params))
    run_cond, run_body = blocks.bodies
    n_cond, n_body = params["cond_nconsts"], params["body_nconsts"]
    cond_consts, body_consts, init = invals[:n_cond], invals[n_cond:n_cond + n_body], invals[n_cond + n_body:]
    return list(lax.while_loop(lambda carry: run_cond([*cond_consts, *carry])[0],
                               lambda carry: run_body([*body_consts, *carry]), init))


def cond_on_blocks(node: Node, invals: list, blocks: Blocks) -> list:
    if blocks.bodies is None:  # the conservative rule: operands whole, the cond as it is (its constraints dropped)
        return jx.bind(node.primitive, invals, jx.without_placements(node.params))
    index, operands = invals[0], invals[1:]
    branches = [functools.partial(lambda run, *xs: run(list(xs)), run) for run in blocks.bodies]
    return list(lax.switch(index, branches, *operands))


OPS = [
    OpDef("scan", Family.CONTROL_FLOW, propagate=scan, lineage=scan_lineage, lineage_exact=True,
          per_block=scan_on_blocks, finish=None, pull=None, linear=Linearity.NONE, reads_ranges=True),
    OpDef("while", Family.CONTROL_FLOW, propagate=while_loop, lineage=while_lineage, lineage_exact=False,
          per_block=while_on_blocks, finish=None, pull=None, linear=Linearity.NONE, reads_ranges=True),
    OpDef("cond", Family.CONTROL_FLOW, propagate=cond, lineage=cond_lineage, lineage_exact=True,
          per_block=cond_on_blocks, finish=None, pull=None, linear=Linearity.NONE, reads_ranges=True),
]
