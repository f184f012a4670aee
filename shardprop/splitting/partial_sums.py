"""Sums deferred out of loops: a carry that only accumulates partial sums stays unreduced through the loop.

The weight gradient of a backward scan over a sharded batch is the textbook case: every iteration contracts over
the batch (a ``psum`` finishes it) and adds the result to a carry. Summing is linear, so each device may instead
add its *partial* result to its own copy of the carry, and one ``psum`` after the loop finishes the carry —
one all-reduce instead of one per iteration (DTensor calls such a value ``Partial``; ``jax.jit`` does the same).

A carry is kept partial when, inside the body, its value flows only through ops linear in it (sums of partial
values, a partial value scaled by a replicated one, reshapes, transposes, sums over axes) into its own outgoing
carry, and at least one of the values summed into it comes from a node finished by a ``psum`` (whose ``psum`` is
then dropped). All partial values of one loop must be partial over the same mesh axes. The initial carry starts
on the first device of each group (zero on the others), so the group's sum is the value the loop starts from.
A scatter-add's psum, which counts its operand once, is deferred too (an embedding gradient accumulated over the
steps of a scan): into the partial carry, each device adds its rows to its own copy; into a value that is not
partial (zeros), that value is still taken on each group's first device only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..expr.graph import PARAMETER, Graph, Node, constant_behind
from ..ops import lookup
from ..ops.opdef import Linearity
from ..core.collectives import Collective, CollectiveKind
from ..core.types import ValueType
from .decisions import BodyPlan, Decisions

def carries_partial(graph: Graph, node: Node, partial_operands: list[bool]) -> bool:
    """True when ``node``, its operands partial sums where ``partial_operands`` says, gives a partial sum of its
    result: its record's ``shardprop.ops.opdef.Linearity`` for the dtype of its result — and, where it
    multiplies (``mul``, ``div``, a contraction), the factor that is not partial is a constant of finite numbers
    (non-zero, for a divisor). A share times an infinity, or over zero, is NaN where the sum's product is not (a
    lookup's other devices hold zeros)."""
    op = lookup(node.op)
    if not op.linear.passes(partial_operands, graph.avals[node.outputs[0]].dtype):
        return False
    if op.linear in (Linearity.EITHER, Linearity.FIRST_IF_FLOAT):
        divisor = op.linear is Linearity.FIRST_IF_FLOAT
        return all(p or _finite_constant(graph, v, nonzero=divisor)
                   for v, p in zip(node.operands, partial_operands, strict=True))
    return True


def _finite_constant(graph: Graph, value: int, *, nonzero: bool) -> bool:
    """``value`` is a constant (or a broadcast, reshape, conversion or placement of one) of finite numbers
    (non-zero)."""
    node = constant_behind(graph, value)
    if node is None:
        return False
    x = np.asarray(node.params["value"])
    return bool(np.all(np.isfinite(x)) and (not nonzero or np.all(x != 0)))



def _summed_here(view: Decisions, graph: Graph) -> dict[int, Collective]:
    """The nodes of a body whose own psum finishes them (not a nested loop's, which finishes its carries)."""
    return {n: c for n, c in view.collectives.items()
            if c.kind is CollectiveKind.PSUM and view.sharded.bodies.get(n) is None}


def _counted_once(view: Decisions, node: Node) -> set[int]:
    """The operands (by position) ``node``'s sum counts once: consumed partial though held whole (a scatter-add's
    operand, taken on each group's first device)."""
    return {k for k, (v, need) in enumerate(view.edges(node)) if need.partial and not view.type(v).partial}


def _partial_values(view: Decisions, graph: Graph, carried: dict[int, int]) -> tuple[set[int], set[int]]:
    """The values that can be held partial (a greatest fixed point) given the candidate carries ``carried``
    (``{body input value: body output position}``), and the psum-finished nodes that feed them."""
    psums = _summed_here(view, graph)
    outputs_at: dict[int, set[int]] = {}
    for position, v in enumerate(graph.outputs):
        outputs_at.setdefault(v, set()).add(position)
    wanted = set(carried.values())
    partial = set(carried)

    def finished_partially(node: Node) -> bool:
        """A psum-finished node whose psum can wait: none of its summed operands is partial already. An operand
        its sum counts once (a scatter-add's) may be partial — the node is then linear in it — or not, and is
        then taken on each group's first device."""
        once = _counted_once(view, node)
        return not any(v in partial for k, v in enumerate(node.operands) if k not in once)

    # a node finished by another collective (a concatenate's route, a roll's rotation) holds one pending finish at a
    # time: it cannot also carry a sum — summed first, its route then runs on whole values
    finished_otherwise = {n for n, c in view.collectives.items() if c.kind is not CollectiveKind.PSUM}
    for node in graph.nodes:  # forward: everything that could be partial
        if node.op == PARAMETER or len(node.outputs) != 1 or node.id in finished_otherwise:
            continue
        if node.id in psums:
            if finished_partially(node):
                partial.add(node.outputs[0])
        elif carries_partial(graph, node, [v in partial for v in node.operands]):
            partial.add(node.outputs[0])
    changed = True
    while changed:  # backward: drop values whose uses are not all linear into partial values or own carries
        changed = False
        for v in sorted(partial):
            ok = outputs_at.get(v, set()) <= wanted and all(
                graph.nodes[c].outputs[0] in partial and (
                    finished_partially(graph.nodes[c]) if c in psums else
                    carries_partial(graph, graph.nodes[c], [u in partial for u in graph.nodes[c].operands]))
                for c in graph.consumers[v])
            producer = graph.nodes[graph.producer[v]]
            if producer.op == PARAMETER:
                ok = ok and v in carried and graph.outputs[carried[v]] in partial
            elif producer.id in psums:
                ok = ok and finished_partially(producer)
            else:
                ok = ok and carries_partial(graph, producer, [u in partial for u in producer.operands])
            if not ok:
                partial.discard(v)
                changed = True
    return partial, {n for n in psums if graph.nodes[n].outputs[0] in partial}


@dataclass(frozen=True)
class DeferredSums:
    """A loop whose body keeps carries partial sums: its body plans, the ``psum`` that finishes those carries
    after the loop, the loop outputs it finishes and the loop operands (their initial values) consumed partial —
    each taken on the first device of its group, zero on the others, so that the group's sum is the value."""

    plans: tuple[BodyPlan, ...]
    collective: Collective
    outputs: tuple[int, ...]
    operands: tuple[int, ...]


def deferred_sums(plans: tuple[BodyPlan, ...]) -> DeferredSums | None:
    """A loop's body plans with every carry that only accumulates sums kept partial (see the module docstring),
    and the ``psum`` of those loop outputs that finishes them after the loop; None when there is none."""
    loops = [k for k, p in enumerate(plans) if any(c.body_output is not None for c in p.body.carries)]
    if len(loops) != 1:
        return None
    (k,) = loops
    plan = plans[k]
    view, graph = plan.decisions, plan.body.sharded.graph
    # A carry another body reads (a while loop's condition) must be whole there: not a candidate.
    read_elsewhere = {c.operand for other in plans if other is not plan for c in other.body.carries
                      if other.body.sharded.graph.consumers[other.body.sharded.graph.inputs[c.body_input]]}
    carried = {graph.inputs[c.body_input]: c.body_output for c in plan.body.carries
               if c.operand not in read_elsewhere and c.body_output is not None}
    while carried:
        partial, psums = _partial_values(view, graph, carried)
        axes = {view.collectives[n].mesh_axes for n in psums}
        # every kept carry must come back partial, and be fed by some psum (else deferring only adds one)
        fed = _fed_by(graph, psums, partial)
        keep = {v: out for v, out in carried.items() if v in partial and graph.outputs[out] in fed}
        if keep == carried:
            break
        carried = keep
    if not carried or len(axes) != 1:
        return None
    (mesh_axes,) = axes
    summed = set(mesh_axes)
    out_layouts = dict(zip(graph.outputs, plan.body.out_layouts, strict=True))
    consumed = [need.layout for node in graph.nodes for v, need in view.edges(node) if v in partial]
    layouts = [view.layout(v) for v in partial] + consumed + [out_layouts[v] for v in partial if v in out_layouts]
    if any(summed & set(name for m in layout for name in m) for layout in layouts):
        return None  # a value sharded over the axes it would be partial over: not a sum of whole copies
    if any(view.computed_type(v).span for v in partial):
        return None  # a sum finished in ranged rows: its finish moves it into the carry's blocks, in the body
    if any(need.span or need.halo for node in graph.nodes for v, need in view.edges(node) if v in partial):
        return None  # a partial value read in ranged rows or past its blocks: summed where it is made
    types = {v: ValueType(view.layout(v), mesh_axes) for v in partial}
    needs = {node.id: tuple(ValueType(need.layout, mesh_axes) if v in partial else need
                            for v, need in view.edges(node))
             for node in graph.nodes if any(v in partial for v in node.operands)}
    body_view = view.revised(unfinished=frozenset(psums), held=types, computed=types, needs=needs)
    inputs = {graph.inputs.index(v) for v in carried}
    kept = [c for c in plan.body.carries if c.body_input in inputs]
    new = plans[:k] + (BodyPlan(plan.body, body_view),) + plans[k + 1:]
    return DeferredSums(new, Collective(CollectiveKind.PSUM, mesh_axes), tuple(sorted(c.output for c in kept)),
                        tuple(sorted(c.operand for c in kept)))


def _fed_by(graph: Graph, psums: set[int], partial: set[int]) -> set[int]:
    """The partial values some psum-finished node's result flows into."""
    fed = {graph.nodes[n].outputs[0] for n in psums}
    for node in graph.nodes:
        if node.outputs and node.outputs[0] in partial and any(v in fed for v in node.operands):
            fed.add(node.outputs[0])
    return fed
