"""Communication strategies: how the split pass pays for data an op needs whole.

Under ``"gather"`` (the Nx design) a reduction over a sharded axis cuts the graph: the next stage receives the
operand gathered. Under ``"collective"`` each device reduces its own block and a collective over the mesh
axes of the reduced axes (``psum`` for sums and contractions, ``pmax``/``pmin`` for maxima/minima and for
``any``/``all`` over bools, index combining for ``argmax``/``argmin``) finishes the result, as in the
shard_map design doc's ``matmul_basic``; the operand is consumed as it is, so no cut
(:func:`finish_with_collectives`). A sum whose consumers slice it anyway becomes a reduce-scatter
(:func:`scatter_where_consumers_slice`). ``"auto"`` uses the cost model to choose per node and to place the
remaining gathers where they move the fewest bytes (:func:`pull_gathers_back`).

Each strategy step takes one :class:`Decisions` and returns the next; the primitive-specific knowledge (which
collective finishes a primitive, which operand layouts give an output layout) is the primitive's record in
:mod:`shardprop.ops`.
"""

from __future__ import annotations

from ..ops import lookup
from ..propagation.sharding import Layout, layout_refines, received_layout, shard_count
from .collectives import Collective, CollectiveKind
from .cost import collective_bytes, move_bytes, node_move_bytes
from .decisions import Decisions, Draft


def finish_with_collectives(decisions: Decisions, *, only_if_cheaper: bool) -> Decisions:
    """Every node whose primitive can be finished with a collective consumes its operands as they are and is
    finished by it. With ``only_if_cheaper`` (the ``"auto"`` strategy) a node takes the collective only when
    the cost model says it moves no more bytes than gathering (on a tie the collective wins: it needs no cut,
    so the stage keeps its data where it is)."""
    needs: dict[int, tuple[Layout, ...]] = {}
    collectives: dict[int, Collective] = {}
    for node in decisions.graph.nodes:
        op = lookup(node.op)
        found = op.finish(decisions, node) if op.finish is not None else None
        # A finish may still move an operand along an axis it does not sum over (a free axis taken whole).
        if found is not None and (not only_if_cheaper or collective_bytes(decisions, node, found[1])
                                  + node_move_bytes(decisions, node, found[0]) <= node_move_bytes(decisions, node)):
            needs[node.id], collectives[node.id] = found
    return decisions.revised(needs=needs, collectives=collectives)


def scatter_where_consumers_slice(decisions: Decisions) -> Decisions:
    """Turn a ``psum`` into a ``psum_scatter`` (reduce-scatter: half the bytes of an all-reduce) when every
    consumer of the summed value takes it sliced over the same mesh axes along one axis anyway, as in the
    shard_map doc's ``matmul_reduce_scatter``; the plan then holds the value in that finer layout. Program
    outputs keep their propagated layout."""
    graph = decisions.graph
    outputs = set(graph.outputs)
    held: dict[int, Layout] = {}
    scattered: dict[int, Collective] = {}
    for node_id, collective in decisions.collectives.items():
        outs = graph.nodes[node_id].outputs
        if collective.kind is not CollectiveKind.PSUM or len(outs) != 1 or outs[0] in outputs:
            continue
        (v,) = outs
        layout, shape = decisions.layout(v), graph.avals[v].shape
        wants = [need for c in graph.consumers[v] for u, need in decisions.edges(graph.nodes[c]) if u == v]
        for d in range(len(layout)):
            target = layout[:d] + (layout[d] + collective.mesh_axes,) + layout[d + 1:]
            if wants and shape[d] % shard_count(decisions.mesh_shape, target[d]) == 0 and all(
                    layout_refines(target, want) for want in wants):
                held[v] = target
                scattered[node_id] = Collective(CollectiveKind.PSUM_SCATTER, collective.mesh_axes, d)
                break
    return decisions.revised(collectives=scattered, held=held)


def pull_gathers_back(decisions: Decisions) -> Decisions:
    """Place each remaining gather where it moves the fewest bytes: when a gathered value is made by an op
    whose record can say which operand layouts give its output in a layout (elementwise ops, broadcasts)
    and nothing else reads it, gathering that op's operands instead and running it on the gathered blocks can
    be cheaper (a broadcast row is smaller than the matrix it becomes). The search follows such chains
    upwards and keeps the cheapest place."""
    draft = Draft.of(decisions)
    graph = draft.graph
    nodes, producer, consumers = graph.nodes, graph.producer, graph.consumers
    outputs = set(graph.outputs)

    def cheapest(v: int, target: Layout) -> tuple[float, list]:
        """Bytes to have ``v`` in ``target``, and the pulls (node, operand needs, value, layout) to get there."""
        direct = move_bytes(draft, v, draft.layout(v), target)
        p = nodes[producer[v]]
        op = lookup(p.op)
        if (v in outputs or len(consumers[v]) != 1 or len(p.outputs) != 1 or p.id in draft.need_overrides
                or op.pull is None):
            return direct, []
        pulled = op.pull(graph, p, target)
        if pulled is None:
            return direct, []
        total, steps = 0.0, [(p.id, pulled, v, target)]
        for u, need in zip(p.operands, pulled, strict=True):
            if not layout_refines(draft.layout(u), need):
                cost, more = cheapest(u, received_layout(draft.layout(u), need))
                total += cost
                steps += more
        return (total, steps) if total < direct else (direct, [])

    for consumer in reversed(nodes):
        for v, need in draft.edges(consumer):
            if not layout_refines(draft.layout(v), need):
                for node_id, pulled, value, target in cheapest(v, received_layout(draft.layout(v), need))[1]:
                    draft.set_needs(node_id, pulled)
                    draft.hold(value, target)
    return draft.frozen()
