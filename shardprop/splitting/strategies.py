"""Communication strategies: how the split pass pays for data an op needs whole.

Under ``"gather"`` (the Nx design) a reduction over a sharded axis cuts the graph: the next stage receives the
operand gathered. Under ``"collective"`` each device reduces its own block and a collective over the mesh
axes of the reduced axes (``psum`` for sums and contractions, ``pmax``/``pmin`` for maxima/minima and for
``any``/``all`` over bools, index
combining for ``argmax``/``argmin``) finishes the result, as in the shard_map design doc's ``matmul_basic``;
the operand is consumed as it is, so no cut (:func:`plan_collectives`). A sum whose consumers slice it
anyway becomes a reduce-scatter (:func:`scatter_where_consumers_slice`). ``"auto"`` uses the cost model to
choose per node and to place the remaining gathers where they move the fewest bytes
(:func:`pull_gathers_back`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..propagation import ShardedGraph
from ..propagation.sharding import Layout, block_shape, common_layout, layout_refines, shard_count

COMBINE = {"reduce_sum": "psum", "reduce_max": "pmax", "reduce_min": "pmin", "reduce_or": "pmax", "reduce_and": "pmin",
           "argmax": "argmax", "argmin": "argmin"}
# The operand dtype kinds each reduction's collective is exact for: no max over complex numbers, and `and`/`or`
# are a min/max only over bools (over integers they are bitwise).
COMBINABLE_KINDS = {"reduce_sum": "fiuc", "reduce_max": "fiub", "reduce_min": "fiub", "reduce_or": "b",
                    "reduce_and": "b", "argmax": "fiu", "argmin": "fiu"}


@dataclass(frozen=True, slots=True)
class Collective:
    """Node output finished by ``kind`` (``psum``/``pmax``/``pmin``, or ``psum_scatter`` along
    ``dimension``) over ``mesh_axes``."""

    kind: str
    mesh_axes: tuple[str, ...]
    dimension: int | None = None

    def __str__(self) -> str:
        along = "" if self.dimension is None else f" along axis {self.dimension}"
        return f"{self.kind} over {'*'.join(self.mesh_axes)}{along}"


def plan_collectives(sharded: ShardedGraph, *, only_if_cheaper: bool = False
                     ) -> tuple[dict[int, tuple[Layout, ...]], dict[int, Collective]]:
    """For every node that can be finished with a collective: the layouts it then consumes its operands in
    (replacing ``sharded.needs``) and the collective. With ``only_if_cheaper`` (the ``"auto"`` strategy), a
    node takes the collective only when the cost model says it moves no more bytes than gathering."""
    needs: dict[int, tuple[Layout, ...]] = {}
    collectives: dict[int, Collective] = {}
    for node in sharded.graph.nodes:
        found = None
        if node.op in COMBINE:
            (v,) = node.operands
            produced = sharded.layout(v)
            mesh_axes = tuple(name for k in sorted(node.params["axes"]) for name in produced[k])
            kind = COMBINE[node.op]
            if mesh_axes and np.dtype(sharded.graph.avals[v].dtype).kind in COMBINABLE_KINDS[node.op]:
                found = (produced,), Collective(kind, mesh_axes)
        elif node.op == "dot_general":
            found = _contraction(sharded, node)
        # On a tie the collective wins: it needs no cut, so the stage keeps its data where it is.
        if found is not None and (not only_if_cheaper or collective_bytes(sharded, node, found[1])
                                  <= _node_gather_bytes(sharded, node)):
            needs[node.id], collectives[node.id] = found
    return needs, collectives


def _block_bytes(sharded: ShardedGraph, value: int, layout: Layout) -> int:
    aval = sharded.graph.avals[value]
    return np.dtype(aval.dtype).itemsize * math.prod(block_shape(aval.shape, layout, sharded.mesh_shape))


def _node_gather_bytes(sharded: ShardedGraph, node) -> float:
    """Bytes one device receives when the operands are gathered into the layouts the node needs."""
    return sum(gather_bytes(sharded, v, sharded.layout(v), need)
               for v, need in zip(node.operands, sharded.needs[node.id], strict=True))


def collective_bytes(sharded: ShardedGraph, node, collective: Collective) -> float:
    """Bytes one device moves in the ring all-reduce of the node's output blocks (a reduce-scatter moves
    half of that)."""
    n = shard_count(sharded.mesh_shape, collective.mesh_axes)
    # argmax/argmin all-reduce the values, a NaN flag and the indices: about three times the output
    rounds = {"argmax": 3, "argmin": 3, "psum_scatter": 0.5}.get(collective.kind, 1)
    return rounds * sum(2 * (n - 1) / n * _block_bytes(sharded, v, sharded.layout(v)) for v in node.outputs)



def _contraction(sharded: ShardedGraph, node):
    """Contracting axes sharded alike on both sides (or on one side, the other replicated there and cut
    locally): each device multiplies its blocks and a ``psum`` adds the partial products."""
    (lhs_c, rhs_c), _ = node.params["dimension_numbers"]
    lhs, rhs = node.operands
    lhs_have, rhs_have = sharded.layout(lhs), sharded.layout(rhs)
    lhs_need, rhs_need = (list(n) for n in sharded.needs[node.id])
    mesh_axes: list[str] = []
    for a, b in zip(lhs_c, rhs_c, strict=True):
        if lhs_have[a] and rhs_have[b] and lhs_have[a] != rhs_have[b]:
            return None
        names = lhs_have[a] or rhs_have[b]
        lhs_need[a] = rhs_need[b] = names
        mesh_axes.extend(names)
    if not mesh_axes:
        return None
    contracted = set(mesh_axes)
    out_names = {name for m in sharded.layout(node.output) for name in m}
    for need, axes in ((lhs_need, lhs_c), (rhs_need, rhs_c)):
        others = [name for k, m in enumerate(need) if k not in axes for name in m]
        if contracted & set(others):
            return None  # a mesh axis would shard two axes of one operand
    if contracted & out_names or not (layout_refines(lhs_have, tuple(lhs_need))
                                      and layout_refines(rhs_have, tuple(rhs_need))):
        return None
    return (tuple(lhs_need), tuple(rhs_need)), Collective("psum", tuple(mesh_axes))


def scatter_where_consumers_slice(sharded: ShardedGraph, needs, collectives: dict[int, Collective]
                                  ) -> dict[int, Layout]:
    """Turn a ``psum`` into a ``psum_scatter`` (reduce-scatter: half the bytes of an all-reduce) when every
    consumer of the summed value takes it sliced over the same mesh axes along one axis anyway, as in the
    shard_map doc's ``matmul_reduce_scatter``. Returns the layouts such values are then held in; updates
    ``collectives`` in place. Program outputs keep their propagated layout."""
    graph = sharded.graph
    held: dict[int, Layout] = {}
    outputs = set(graph.outputs)
    for node_id, collective in list(collectives.items()):
        outs = graph.nodes[node_id].outputs
        if collective.kind != "psum" or len(outs) != 1 or outs[0] in outputs:
            continue
        (v,) = outs
        layout, shape = sharded.layout(v), graph.avals[v].shape
        wants = [need for c in graph.consumers[v]
                 for u, need in zip(graph.nodes[c].operands, needs(c), strict=True) if u == v]
        for d in range(len(layout)):
            target = layout[:d] + (layout[d] + collective.mesh_axes,) + layout[d + 1:]
            if wants and shape[d] % shard_count(sharded.mesh_shape, target[d]) == 0 and all(
                    layout_refines(target, want) for want in wants):
                held[v] = target
                collectives[node_id] = Collective("psum_scatter", collective.mesh_axes, d)
                break
    return held


def pull_gathers_back(sharded: ShardedGraph, needs, overrides: dict[int, tuple[Layout, ...]],
                      held: dict[int, Layout]) -> None:
    """Place each remaining gather where it moves the fewest bytes: when a gathered value is made by an
    elementwise op or a broadcast that nothing else reads, gathering that op's operands instead and running
    it on the gathered blocks can be cheaper (a broadcast row is smaller than the matrix it becomes). The
    search follows such chains upwards and keeps the cheapest place. Updates ``overrides`` and ``held``."""
    graph = sharded.graph
    nodes, producer, consumers = graph.nodes, graph.producer, graph.consumers
    outputs = set(graph.outputs)

    def layout(v):
        return held.get(v) or sharded.layout(v)

    def cheapest(v: int, target: Layout) -> tuple[float, list]:
        """Bytes to have ``v`` in ``target``, and the pulls (node, operand needs, value, layout) to get there."""
        direct = gather_bytes(sharded, v, layout(v), target)
        p = nodes[producer[v]]
        if v in outputs or len(consumers[v]) != 1 or len(p.outputs) != 1 or p.id in overrides:
            return direct, []
        pulled = _operand_needs(sharded, p, target)
        if pulled is None:
            return direct, []
        total, steps = 0.0, [(p.id, pulled, v, target)]
        for u, need in zip(p.operands, pulled, strict=True):
            if not layout_refines(layout(u), need):
                cost, more = cheapest(u, common_layout(layout(u), need))
                total += cost
                steps += more
        return (total, steps) if total < direct else (direct, [])

    for consumer in reversed(nodes):
        for v, need in zip(consumer.operands, needs(consumer.id), strict=True):
            if not layout_refines(layout(v), need):
                for node_id, pulled, value, target in cheapest(v, common_layout(layout(v), need))[1]:
                    overrides[node_id], held[value] = pulled, target


def _operand_needs(sharded: ShardedGraph, node, target: Layout):
    """The operand layouts that give ``node``'s output in ``target``, for elementwise ops and broadcasts."""
    from ..propagation.rules import RULES
    from ..propagation.rules.elementwise import elementwise

    avals = sharded.graph.avals
    out_shape = avals[node.output].shape
    if RULES.get(node.op) is elementwise:
        needs = []
        for u in node.operands:
            shape = avals[u].shape
            offset = len(out_shape) - len(shape)
            needs.append(tuple(target[j + offset] if shape[j] == out_shape[j + offset] else ()
                               for j in range(len(shape))))
        return tuple(needs)
    if node.op == "broadcast_in_dim" and len(node.operands) == 1:
        (u,) = node.operands
        shape = avals[u].shape
        dims = node.params["broadcast_dimensions"]
        return (tuple(target[d] if shape[k] == out_shape[d] else () for k, d in enumerate(dims)),)
    return None


def gather_bytes(sharded: ShardedGraph, value: int, have: Layout, want: Layout) -> float:
    """Bytes one device receives when ``value``, held as ``have``, is gathered so that ``want`` is a local
    slice of it (ring all-gather: ``(n-1)/n`` of the gathered block)."""
    moved_to = common_layout(have, want)
    gathered = tuple(name for h, t in zip(have, moved_to, strict=True) for name in h[len(t):])
    if not gathered:
        return 0.0
    n = shard_count(sharded.mesh_shape, gathered)
    return (n - 1) / n * _block_bytes(sharded, value, moved_to)
