"""Communication strategies: how the split pass pays for data an op needs whole.

Under ``"gather"`` (the Nx design) a reduction over a sharded axis cuts the graph: the next stage gathers the
operand first thing. Under ``"collective"`` each device reduces its own block and a collective over the mesh
axes of the reduced axes (``psum`` for sums and contractions, ``pmax``/``pmin`` for maxima/minima and for
``any``/``all`` over bools, index combining for ``argmax``/``argmin``) finishes the result, as in the
shard_map design doc's ``matmul_basic``; the operand is consumed as it is, so no cut
(``finish_with_collectives``). A sum whose consumers slice it anyway becomes a reduce-scatter
(``scatter_where_consumers_slice``). ``"auto"`` uses the cost model to choose per node and to place the
remaining gathers where they move the fewest bytes (``pull_gathers_back``).

Each strategy step takes one ``Decisions`` and returns the next; the primitive-specific knowledge (which
collective finishes a primitive, which operand layouts give an output layout) is the primitive's record in
``shardprop.ops``.
"""

from __future__ import annotations

from ..core.collectives import Collective, CollectiveKind
from ..core.layouts import Layout, layout_refines, shard_count
from ..core.types import ValueType, carried_type, held_whole
from ..ops import lookup
from ..ops.opdef import Family
from .cost import collective_bytes, compute_bytes, finishing_types, move_bytes, node_move_bytes
from .decisions import Decisions, Draft
from .partial_sums import carries_partial


def finish_in_blocks(decisions: Decisions) -> Decisions:
    """Every op whose rule keeps an axis sharded that its blocks alone do not finish, finished under every strategy
    (``CollectiveKind.required``): a cumulative op by the prefix of its block totals, a reversal by sending each
    reversed block to its mirror device."""
    needs: dict[int, tuple[ValueType, ...]] = {}
    collectives: dict[int, Collective] = {}
    computed: dict[int, ValueType] = {}
    held: dict[int, ValueType] = {}
    for node in decisions.graph.nodes:
        op = lookup(node.op)
        if op.family not in (Family.SCAN, Family.SLICING) or op.finish is None:
            continue
        found = op.finish(as_handed(decisions, node), node)
        if found is not None and found[1].kind.required:
            needs[node.id], collectives[node.id] = found
            _finished(decisions, node, *found, computed, held)
    if not collectives:
        return decisions
    return decisions.revised(needs=needs, collectives=collectives, computed=computed, held=held)


def as_handed(decisions: Decisions, node) -> Decisions | _Handed:
    """``decisions`` as ``node``'s finish reads them: its operands held as it is handed them where the layout search
    decided that (an exact view, ``propagation.uses.View``) — in the layouts it consumes, moved there from where they
    are held (the move is the node's, as a gather's is), as the search priced it. Elsewhere, or where one value is
    handed in two layouts, ``decisions`` itself."""
    views = decisions.sharded.views
    handed: dict[int, Layout] = {}
    for k, v in enumerate(node.operands):
        view = views.get((node.id, k))
        layout = view.layout if view is not None and view.exact else decisions.layout(v)
        if handed.setdefault(v, layout) != layout:
            return decisions
    held = {v: held_whole(layout) for v, layout in handed.items() if layout != decisions.layout(v)}
    return _Handed(decisions, held) if held else decisions


class _Handed:
    """What a finish reads of ``decisions`` (``shardprop.ops.opdef``'s ``finish``), some values' types replaced: a
    view, not a revision (which would rebuild every table of the graph for one node's finish)."""

    def __init__(self, decisions: Decisions, held: dict[int, ValueType]):
        self._decisions, self._held = decisions, held
        self.graph, self.sharded, self.mesh_shape = decisions.graph, decisions.sharded, decisions.mesh_shape
        self.needs, self.need_layouts, self.rule_needs = decisions.needs, decisions.need_layouts, decisions.rule_needs

    def type(self, value: int) -> ValueType:
        return self._held.get(value) or self._decisions.type(value)

    def layout(self, value: int) -> Layout:
        return self.type(value).even_layout


def finish_with_collectives(decisions: Decisions, *, only_if_cheaper: bool) -> Decisions:
    """Every node whose primitive can be finished with a collective consumes its operands as they are and is
    finished by it. With ``only_if_cheaper`` (the ``"auto"`` strategy) a node takes the collective only when
    the cost model says it costs no more than gathering: the bytes moved, and the work a gather makes every
    device repeat (a contraction over a gathered batch: each device computes the whole product), in bytes' worth
    (on a tie the collective wins: it needs no cut, so the stage keeps its data where it is). The node's outputs
    are then computed partial and held whole."""
    needs: dict[int, tuple[ValueType, ...]] = {}
    collectives: dict[int, Collective] = {}
    computed: dict[int, ValueType] = {}
    held: dict[int, ValueType] = {}
    for node in decisions.graph.nodes:
        op = lookup(node.op)
        if node.id in decisions.collectives:  # finished already (a cumulative op)
            continue
        found = op.finish(as_handed(decisions, node), node) if op.finish is not None else None
        # A finish may still move an operand along an axis it does not sum over (a free axis taken whole); its psum
        # may wait for a smaller value further on (the cheapest point of its linear chain).
        if found is None:
            continue
        finishing = (cheapest_point(decisions, node.id, found[1], needs=found[0])[2]
                     + node_move_bytes(decisions, node, found[0]) + compute_bytes(decisions, node, found[0]))
        if not only_if_cheaper or finishing <= node_move_bytes(decisions, node) + compute_bytes(decisions, node):
            needs[node.id], collectives[node.id] = found
            _finished(decisions, node, *found, computed, held)
    return decisions.revised(needs=needs, collectives=collectives, computed=computed, held=held)


def _finished(decisions: Decisions, node, needs, collective: Collective, computed: dict, held: dict) -> None:
    """Record how ``node``'s outputs are computed before ``collective`` combines them, and held after (where that is
    not propagation's layout: a ranged result kept ranged)."""
    for v, partial, whole_type in decisions.finished_types(node, needs, collective):
        computed[v] = partial
        if whole_type.span:
            held[v] = whole_type


def defer_sums_past_linear_consumers(decisions: Decisions) -> Decisions:
    """Move a ``psum`` down a chain of ops linear in its value to where the cost model says it moves the fewest
    bytes: each device carries its partial result through the chain (a scale, a sum over an axis, a contraction
    with a whole operand) and one ``psum`` of the smaller value finishes it — ``jnp.sum(x @ w)`` with the
    contraction sharded all-reduces a scalar, not the product (DTensor's ``Partial``; ``jax.jit`` sums the
    product). The chain follows values used once, not program outputs, consumed in place (no gather of a
    partial value) and sharded over none of the summed mesh axes; a sum on it with a psum of its own over other
    mesh axes ends it, with one psum over both. The values on the chain are held partial and consumed partial;
    the nodes on it run in the finisher's stage (a partial value never crosses a stage boundary)."""
    moved: dict[int, Collective] = {}
    held: dict[int, ValueType] = {}
    needs: dict[int, tuple[ValueType, ...]] = {}
    computed: dict[int, ValueType] = {}
    waiting: set[int] = set()
    graph = decisions.graph
    for node_id, collective in decisions.collectives.items():
        if node_id in moved or node_id in waiting:
            continue
        chain, best, _ = cheapest_point(decisions, node_id, collective, taken=waiting | moved.keys())
        if best is None:
            continue
        finisher = chain[-1]
        moved[finisher] = best
        for n in [node_id, *chain[:-1]]:
            waiting.add(n)
            (out,) = graph.nodes[n].outputs
            held[out] = computed[out] = ValueType(decisions.layout(out), collective.mesh_axes)
        for c in chain:  # each consumes its predecessor's partial value partial
            node = graph.nodes[c]
            needs[c] = tuple(ValueType(need.layout, held[v].partial) if v in held else need
                             for v, need in decisions.edges(node))
        _finished(decisions, graph.nodes[finisher], decisions.needs(finisher) if finisher not in needs else
                  needs[finisher], best, computed, held)
    if not moved:
        return decisions
    return decisions.revised(collectives=moved, unfinished=frozenset(waiting), held=held, needs=needs,
                             computed=computed)


def cheapest_point(decisions: Decisions, node_id: int, collective: Collective, taken=frozenset(), needs=None
                   ) -> tuple[list[int], Collective | None, float]:
    """Where along the linear chain from node ``node_id`` (finished by ``collective``) its psum moves the fewest
    bytes: ``(the chain up to that node, the collective there, its bytes)``, or ``([], None, bytes at the node)``
    when that is the node itself (see ``defer_sums_past_linear_consumers``). ``taken``: nodes already on
    another chain; ``needs``: the operand types a finish being weighed reads (else the node's own)."""
    graph = decisions.graph
    node = graph.nodes[node_id]
    cost_here = collective_bytes(decisions, node, collective, needs=needs)
    if (collective.kind is not CollectiveKind.PSUM or len(node.outputs) != 1 or _counts_once(decisions, node)
            or any(computed.span for _, computed, _ in finishing_types(decisions, node, collective, needs=needs))):
        # (a sum computed ranged is summed where it is made)
        return [], None, cost_here
    outputs = graph.outputs
    summed = set(collective.mesh_axes)
    chain: list[int] = []
    best: tuple[int, Collective | None, float] = (0, None, cost_here)
    v = node.outputs[0]
    while v not in outputs and len(graph.consumers[v]) == 1:
        c = graph.nodes[graph.consumers[v][0]]
        op = lookup(c.op)
        own = decisions.collectives.get(c.id)
        if (c.id in taken or len(c.outputs) != 1 or op.runs_outside_shard_map
                or (own is not None and not (own.kind is CollectiveKind.PSUM and not _counts_once(decisions, c)
                                             and summed.isdisjoint(own.mesh_axes)))
                or not carries_partial(graph, c, [u == v for u in c.operands])):
            break
        out = c.outputs[0]
        if (own is None and decisions.type(out) != decisions.computed_type(out)) or any(
                u == v and (need.span or need.halo or not layout_refines(decisions.layout(v), need.layout))
                for u, need in decisions.edges(c)):
            break  # held otherwise, or the partial value would be gathered, realigned or read past its block
        if summed & {name for layout in (*decisions.need_layouts(c.id), decisions.sharded.layout(out))
                     for m in layout for name in m} or decisions.type(out).span:
            # a block over a summed mesh axis: the devices' partial values would not line up (nor would a ranged
            # one's: a sum computed ranged is summed where it is made)
            break
        chain.append(c.id)
        v = out
        if own is not None:  # a sum finished by a psum of its own: one psum over both sets of mesh axes
            both = set(own.mesh_axes) | set(collective.mesh_axes)  # in mesh order: one type, one spelling
            merged = Collective(CollectiveKind.PSUM, tuple(n for n in decisions.mesh_shape if n in both))
            cost = collective_bytes(decisions, c, merged) - collective_bytes(decisions, c, own)
            if cost < best[2]:
                best = (len(chain), merged, cost)
            break
        cost = collective_bytes(decisions, c, collective)
        if cost < best[2]:
            best = (len(chain), collective, cost)
    return chain[:best[0]], best[1], best[2]


def _counts_once(decisions: Decisions, node) -> bool:
    """The node consumes an operand held whole as a partial sum (a scatter-add's operand, taken on each group's
    first device): its psum cannot wait for a later value (the chain would count that operand on every device)."""
    return any(need.partial and not decisions.type(v).partial for v, need in decisions.edges(node))


def scatter_where_consumers_slice(decisions: Decisions) -> Decisions:
    """Hold a ``psum``'s result finer — a reduce-scatter, half the bytes of an all-reduce — when every consumer of
    the summed value takes it sliced over the same mesh axes along one axis anyway, as in the shard_map doc's
    ``matmul_reduce_scatter``. Program outputs keep their propagated layout."""
    graph = decisions.graph
    outputs = set(graph.outputs)
    held: dict[int, ValueType] = {}
    for node_id, collective in decisions.collectives.items():
        outs = graph.nodes[node_id].outputs
        if collective.kind is not CollectiveKind.PSUM or len(outs) != 1 or outs[0] in outputs:
            continue
        (v,) = outs
        if decisions.type(v).partial:
            continue
        layout, shape = decisions.layout(v), graph.avals[v].shape
        wants = [need.layout for c in graph.consumers[v] for u, need in decisions.edges(graph.nodes[c]) if u == v]
        for d in range(len(layout)):
            target = layout[:d] + (layout[d] + collective.mesh_axes,) + layout[d + 1:]
            if wants and shape[d] % shard_count(decisions.mesh_shape, target[d]) == 0 and all(
                    layout_refines(target, want) for want in wants):
                held[v] = ValueType(target)
                break
    return decisions.revised(held=held)


def pull_gathers_back(decisions: Decisions) -> Decisions:
    """Place each remaining gather where it moves the fewest bytes: when a gathered value is made by an op
    whose record can say which operand layouts give its output in a layout (elementwise ops, broadcasts)
    and nothing else reads it, gathering that op's operands instead and running it on the gathered blocks can
    be cheaper (a broadcast row is smaller than the matrix it becomes). The search follows such chains
    upwards and keeps the cheapest place. Partial values never move here."""
    draft = Draft.of(decisions)
    graph = draft.graph
    nodes, producer, consumers = graph.nodes, graph.producer, graph.consumers
    outputs = set(graph.outputs)

    def cheapest(v: int, target: ValueType) -> tuple[float, list]:
        """Bytes to have ``v`` in ``target``, and the pulls (node, operand types, value, type) to get there."""
        direct = move_bytes(draft, v, draft.type(v), target)
        p = nodes[producer[v]]
        op = lookup(p.op)
        if (v in outputs or len(consumers[v]) != 1 or len(p.outputs) != 1 or p.id in draft.need_overrides
                or p.id in draft.collectives or draft.type(v).partial or op.pull is None
                or target != carried(v, target.layout)):  # a range other than uneven blocks: moved as it is
            return direct, []
        pulled = op.pull(graph, p, target.layout)
        if pulled is None:
            return direct, []
        pulled = tuple(carried(u, need) for u, need in zip(p.operands, pulled, strict=True))
        total, steps = 0.0, [(p.id, pulled, v, target)]
        for u, need in zip(p.operands, pulled, strict=True):
            if not layout_refines(draft.layout(u), need.layout):
                cost, more = cheapest(u, need)
                total += cost
                steps += more
        return (total, steps) if total < direct else (direct, [])

    def carried(v: int, layout: Layout) -> ValueType:  # equal blocks, or ceil(n / count) rows where they do not divide
        return carried_type(graph.avals[v].shape, layout, draft.mesh_shape)

    for consumer in reversed(nodes):
        for v, need in draft.edges(consumer):
            if not need.partial and not layout_refines(draft.layout(v), need.layout):
                for node_id, pulled, value, target in cheapest(v, ValueType(need.layout, span=need.span))[1]:
                    draft.set_needs(node_id, pulled)
                    draft.hold(value, target)
    return draft.frozen()
