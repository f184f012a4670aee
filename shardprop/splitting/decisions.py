"""The plan view: for every node, the types it consumes its operands in and the collective that finishes it; for
every value, the type it is computed in and the type it is held in.

A type (``shardprop.core.types.ValueType``) is a layout and the mesh axes over which the value is still an
unreduced partial sum: every fact about partial sums lives there. A sum finished by a ``psum`` is *computed*
partial and *held* whole; a sum whose ``psum`` waits for a later, smaller value (or for the end of a loop) is held
partial, and its consumers consume it partial; an operand a sum must count once is consumed partial although it is
held whole (each group takes it on its first device); a reduce-scatter's result is held finer than it is computed.

Propagation answers first (``ShardedGraph.needs``, ``ShardedGraph.layout``: everything whole); a
communication strategy revises some answers. ``Decisions`` holds propagation's product and the revisions, and
answers with the revised type where there is one — the one place those questions are answered. The strategies
take one ``Decisions`` and return the next; ``shardprop.splitting.plan.Plan`` is the last one, with its
stages::

    plan.needs(node_id)        # operand types, in operand order
    plan.type(value)           # the type the value is held in once computed (and finished)
    plan.computed_type(value)  # the type its producer computes it in
    plan.collective(node_id)   # the Collective that finishes the node, or None
    plan.body_plans(node_id)   # a loop's or a cond's bodies, each with its own decisions (BodyPlan)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from types import MappingProxyType

from ..core.collectives import Collective, CollectiveKind
from ..core.layouts import Layout, shard_count, spelled, uneven_span
from ..core.rules import Body
from ..core.types import ValueType, carried_type, held_whole, whole
from ..expr.graph import PARAMETER, Graph, Node
from ..ops import finish_placement, lookup
from ..propagation import ShardedGraph

_EMPTY: Mapping = MappingProxyType({})


@dataclass(frozen=True, eq=False, kw_only=True)
class Decisions:
    """Propagation's layouts with a strategy's revisions (see the module docstring)."""

    sharded: ShardedGraph
    # node id -> operand types, where they differ from propagation's (whole, ``sharded.needs``)
    need_overrides: Mapping[int, tuple[ValueType, ...]] = field(default_factory=lambda: _EMPTY)
    # value -> the type it is held in, where it differs from propagation's layout, whole
    held: Mapping[int, ValueType] = field(default_factory=lambda: _EMPTY)
    # value -> the type its producer computes it in, where it differs from the held type (a collective finishes it)
    computed: Mapping[int, ValueType] = field(default_factory=lambda: _EMPTY)
    # node id -> the collective that finishes it, right after it
    collectives: Mapping[int, Collective] = field(default_factory=lambda: _EMPTY)
    # node id -> its bodies' plans, where a strategy decided them (else propagation's, see body_plans)
    bodies: Mapping[int, tuple[BodyPlan, ...]] = field(default_factory=lambda: _EMPTY)

    @classmethod
    def propagated(cls, sharded: ShardedGraph) -> Decisions:
        """Propagation's answers, unrevised (the ``"gather"`` strategy, and every scan body)."""
        return cls(sharded=sharded)

    @property
    def graph(self) -> Graph:
        return self.sharded.graph

    @property
    def mesh_shape(self) -> dict[str, int]:
        return self.sharded.mesh_shape

    def needs(self, node_id: int) -> tuple[ValueType, ...]:
        """The types node ``node_id`` consumes its operands in (one per operand)."""
        return self._needs[node_id]

    def need_layouts(self, node_id: int) -> tuple[Layout, ...]:
        """The layouts of ``needs``, their ranged axes whole (as ``layout``: what a revision built from them
        may ask for)."""
        return tuple(need.even_layout for need in self.needs(node_id))

    def type(self, value: int) -> ValueType:
        """The type ``value`` is held in once its producer (and the collective finishing it) has run."""
        return self._types[value]

    def layout(self, value: int) -> Layout:
        """The layout of ``type``, its ranged axes whole: the axes held in equal blocks, which a need built from it
        may ask for (a ranged axis is read whole unless a rule reads its ranges)."""
        return self._types[value].even_layout

    def computed_type(self, value: int) -> ValueType:
        """The type ``value``'s producer computes it in: partial where a collective finishes it; ranged where it is
        a result the program (or a body) returns in equal blocks."""
        found = self.computed.get(value)
        if found is None and value in self.returned and value in self._ranges and self._keeps_ranges(
                self.graph.nodes[self.graph.producer[value]]):
            found = self._ranges[value]
        return self.type(value) if found is None else found

    # Answered from tables built once: the passes ask on every edge of 10^5-node graphs.
    @cached_property
    def _needs(self) -> tuple[tuple[ValueType, ...], ...]:
        table = [whole(needs) for needs in self.sharded.needs]
        for node_id, needs in self.need_overrides.items():
            table[node_id] = needs
        for node_id in self.sharded.need_spans:  # the ranged rows an op reads
            if node_id not in self.need_overrides and self._keeps_ranges(self.graph.nodes[node_id]):
                table[node_id] = self.rule_needs(node_id)
        for node in self.graph.nodes:  # a windowed op reads its neighbours' edges: the halo is part of its need
            halo = lookup(node.op).halo
            if halo is not None:
                shapes = [self.graph.avals[v].shape for v in node.operands]
                table[node.id] = halo(node, shapes, table[node.id], self.mesh_shape)
        return tuple(table)

    def rule_needs(self, node_id: int) -> tuple[ValueType, ...]:
        """The types node ``node_id``'s rule reads its operands in, with the ranged rows it reads: propagation's
        answer, whatever a strategy revised (a finish that reads them alike keeps the node's ranged results:
        ``finished_types``)."""
        needs = whole(self.sharded.needs[node_id])
        per_operand = self.sharded.need_spans.get(node_id)
        if per_operand is None:
            return needs
        node = self.graph.nodes[node_id]
        return tuple(need if reads is None or all(r is None for r in reads) else
                     _ranged(self.graph.avals[v].shape, need.layout, reads, self.mesh_shape)
                     for v, need, reads in zip(node.operands, needs, per_operand, strict=True))

    def finished_types(self, node: Node, needs: tuple[ValueType, ...], collective: Collective, outputs=None
                       ) -> list[tuple[int, ValueType, ValueType]]:
        """``(value, computed, held)`` for each output of ``node`` (those at positions ``outputs``, else all) when it
        reads its operands in ``needs`` and ``collective`` finishes it: each device computes its partial result laid
        out as propagation said, the collective combines them whole. Where ``needs`` read every range the node's rule
        read (a contraction's ranged free axes, kept by its finish), a result propagation left ranged is computed
        ranged; it is held so unless the program returns it (then it is moved into the blocks it is returned in,
        after its finish — a partial sum by one move that sums each device's rows first where that moves less)."""
        reads = self.sharded.need_spans.get(node.id)
        rule = self.rule_needs(node.id) if reads is not None else ()
        # (a route places every row where propagation's result holds it, whatever it read)
        keeps = collective.kind is CollectiveKind.ROUTE or reads is not None and all(
            need.layout[k] == want.layout[k] and need.span_of(k) == want.span_of(k)
            for need, want, per in zip(needs, rule, reads, strict=True) if per for k, r in enumerate(per)
            if r is not None)
        # a placement's rows lie where the op left them (a mirror's, a rotation's, a route's): a whole value, placed
        placed = None if collective.kind.placement is None else \
            finish_placement(self.graph, node, needs[0], collective, self.mesh_shape)
        out = []
        for v in (node.outputs if outputs is None else [node.outputs[k] for k in outputs]):
            ranged = self._ranges.get(v) if keeps else None
            base = held_whole(self.sharded.layout(v)) if ranged is None else ranged
            # a returned result finished ranged is then moved into the blocks it is returned in (emit)
            held = self.type(v) if v in self.returned else base
            computed = ValueType(base.layout, span=base.span, placement=placed) if placed is not None else \
                ValueType(base.layout, collective.mesh_axes, collective.kind.reduction, span=base.span)
            out.append((v, computed, held))
        return out

    def _keeps_ranges(self, node: Node) -> bool:
        """True when ``node`` computes its results as propagation laid them out (no strategy revised what it reads,
        how it computes or holds them): then it reads, and leaves, the ranges its rule said. A node a strategy
        revised reads and leaves none (equal blocks or whole, as the revision says)."""
        return node.id not in self.need_overrides and not any(v in self.held or v in self.computed
                                                              for v in node.outputs)

    def _ranged_type(self, value: int) -> ValueType | None:
        """The ranged type ``value`` is held in, or None (returned values are held in equal blocks or whole)."""
        ranged = self._ranges.get(value)
        if ranged is None or (value in self.returned and not self._carried_ranged(value, ranged)):
            return None
        producer = self.graph.nodes[self.graph.producer[value]]
        if (producer.op == PARAMETER and not self.sharded.is_body) or not self._keeps_ranges(producer):
            return None  # a program's argument arrives whole along it (a body's input in the blocks it is carried in)
        return ranged

    @cached_property
    def _ranges(self) -> dict[int, ValueType]:
        """value -> its ranged type, for the values propagation left ranged (a strategy's revision of how one is held
        wins over it)."""
        found = {}
        for value, sharding in enumerate(self.sharded.shardings):
            if sharding.spans:
                found[value] = _ranged(sharding.shape, sharding.layout, sharding.spans, self.mesh_shape)
        return found

    @cached_property
    def returned(self) -> frozenset[int]:
        """The values the program returns."""
        return frozenset(self.graph.outputs)

    def output_type(self, k: int) -> ValueType:
        """The type the program returns output ``k`` in: as its value is held — or sliced further where it mirrors an
        argument (``shardprop.propagation.ShardedGraph.returned_sliced``: a free slice of the value, which its
        readers take as it is held)."""
        if k in self.sharded.returned_sliced and not self.sharded.is_body:
            return ValueType(self.sharded.returned_sliced[k])
        return self.type(self.graph.outputs[k])

    @cached_property
    def output_indices(self) -> dict[int, tuple[int, ...]]:
        """Returned value -> the outputs it is returned as (a value may be returned several times)."""
        found: dict[int, list[int]] = {}
        for k, v in enumerate(self.graph.outputs):
            found.setdefault(v, []).append(k)
        return {v: tuple(ks) for v, ks in found.items()}

    def _carried_ranged(self, value: int, ranged: ValueType) -> bool:
        """True for a body's output held in the blocks a loop carries uneven axes in (``ceil(n / count)`` rows): the
        op takes it so, ranged (a program's results are held in equal blocks or whole)."""
        if not self.sharded.is_body:
            return False
        shape = self.graph.avals[value].shape
        return all(span is None or span == uneven_span(n, shard_count(self.mesh_shape, m))
                   for n, m, span in zip(shape, ranged.layout, ranged.span, strict=True))

    def _returned_type(self, value: int) -> ValueType:
        """How a value the program returns is held (``shardprop.propagation.ShardedGraph.returned_layout``); a
        body's output ranged otherwise than a carry is held whole along it, as the op takes it (``out_layouts``)."""
        if self.sharded.is_body:
            return held_whole(self.sharded.layout(value))
        return held_whole(self.sharded.returned_layout(value))

    @cached_property
    def _types(self) -> tuple[ValueType, ...]:
        table = [held_whole(sharding.layout) for sharding in self.sharded.shardings]
        for value in self._ranges:
            ranged = self._ranged_type(value)
            if ranged is not None:
                table[value] = ranged
            elif value in self.returned:
                table[value] = self._returned_type(value)
        for value, vtype in self.held.items():
            table[value] = vtype
        return tuple(table)

    def collective(self, node_id: int) -> Collective | None:
        """The collective that finishes node ``node_id``, or None."""
        return self.collectives.get(node_id)

    def body_plans(self, node_id: int) -> tuple[BodyPlan, ...] | None:
        """The bodies of node ``node_id`` (a loop, a cond) with their decisions; None for a node without any
        (or one that fell back)."""
        plans = self.bodies.get(node_id)
        if plans is not None:
            return plans
        bodies = self.sharded.bodies.get(node_id)
        return None if bodies is None else tuple(BodyPlan(b, Decisions.propagated(b.sharded)) for b in bodies)

    def edges(self, node: Node):
        """``(operand value, type the node consumes it in)`` for each operand, in operand order."""
        return zip(node.operands, self.needs(node.id), strict=True)

    def revised(self, *, needs: Mapping[int, tuple[ValueType, ...]] = _EMPTY, held: Mapping[int, ValueType] = _EMPTY,
                computed: Mapping[int, ValueType] = _EMPTY, collectives: Mapping[int, Collective] = _EMPTY,
                bodies: Mapping[int, tuple[BodyPlan, ...]] = _EMPTY,
                unfinished: frozenset[int] = frozenset()) -> Decisions:
        """A new ``Decisions`` with these entries added (or replaced; ``unfinished`` drops the collectives of those
        nodes: their sums wait); this one is unchanged — and returned as it is where nothing is added (what it has
        worked out kept)."""
        if not (needs or held or computed or collectives or bodies or unfinished):
            return self
        return replace(
            self,
            need_overrides=MappingProxyType({**self.need_overrides, **needs}),
            held=MappingProxyType({**self.held, **held}),
            computed=MappingProxyType({**self.computed, **computed}),
            collectives=MappingProxyType({k: c for k, c in {**self.collectives, **collectives}.items()
                                          if k not in unfinished}),
            bodies=MappingProxyType({**self.bodies, **bodies}),
        )


@dataclass(frozen=True, eq=False)
class BodyPlan:
    """A body (``shardprop.core.rules.Body``) with the decisions made for it: which of its sums are finished
    by a collective, which of its values (carries among them) stay partial sums through the loop."""

    body: Body
    decisions: Decisions

    @property
    def out_types(self) -> tuple[ValueType, ...]:
        """The types the op takes the body's outputs in: its layouts, partial where the carry is kept partial."""
        graph = self.body.sharded.graph
        mesh_shape = self.decisions.mesh_shape
        return tuple(carried_type(graph.avals[v].shape, layout, mesh_shape, self.decisions.type(v).partial)
                     for v, layout in zip(graph.outputs, self.body.out_layouts, strict=True))

    @property
    def partial_carries(self) -> list[tuple[int, tuple[str, ...]]]:
        """``(loop output, mesh axes)`` of each carry the body keeps a partial sum (summed after the loop)."""
        graph = self.body.sharded.graph
        return [(c.output, self.decisions.type(graph.inputs[c.body_input]).partial) for c in self.body.carries
                if self.decisions.type(graph.inputs[c.body_input]).partial]


def _ranged(shape: tuple[int, ...], layout: Layout, spans, mesh_shape) -> ValueType:
    """The type of a value laid out as ``layout`` whose ranged axes are ``spans`` (per axis ``(mesh axes, span)`` or
    None); a span that is the axis's equal blocks is spelled as them."""
    layout, rows = list(layout), [None] * len(shape)
    for k, ranged in enumerate(spans):
        if ranged is None:
            continue
        mesh_axes, span = ranged
        layout[k] = mesh_axes
        rows[k] = spelled(span, shape[k], shard_count(mesh_shape, mesh_axes))
    return ValueType(tuple(layout), span=tuple(rows))


class Draft(Decisions):
    """A pass's scratch copy of ``Decisions`` whose revisions it fills in place, answering through the
    same methods as it goes; ``frozen`` is the immutable product the pass returns."""

    @classmethod
    def of(cls, decisions: Decisions) -> Draft:
        given = {f.name: getattr(decisions, f.name) for f in fields(Decisions)}
        return cls(**given | {"need_overrides": dict(decisions.need_overrides), "held": dict(decisions.held)})

    # A draft changes as the pass fills it: answer from the revisions directly, not from tables.
    def needs(self, node_id: int) -> tuple[ValueType, ...]:
        override = self.need_overrides.get(node_id)
        return whole(self.sharded.needs[node_id]) if override is None else override

    def type(self, value: int) -> ValueType:
        held = self.held.get(value)
        if held is not None:
            return held
        ranged = self._ranged_type(value)
        if ranged is None:
            return self._returned_type(value) if value in self.returned and value in self._ranges else \
                held_whole(self.sharded.layout(value))
        return ranged

    def layout(self, value: int) -> Layout:
        return self.type(value).even_layout

    def set_needs(self, node_id: int, needs: tuple[ValueType, ...]) -> None:
        self.need_overrides[node_id] = needs  # type: ignore[index]

    def hold(self, value: int, vtype: ValueType) -> None:
        self.held[value] = vtype  # type: ignore[index]

    def frozen(self) -> Decisions:
        given = {f.name: getattr(self, f.name) for f in fields(Decisions)}
        return Decisions(**given | {"need_overrides": MappingProxyType(dict(self.need_overrides)),
                                    "held": MappingProxyType(dict(self.held))})
