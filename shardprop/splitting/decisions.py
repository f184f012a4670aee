"""The plan view: for every node, the layouts it consumes its operands in and the collective that finishes it;
for every value, the layout it is held in.

Propagation answers those questions first (:attr:`ShardedGraph.needs`, :meth:`ShardedGraph.layout`); a
communication strategy revises some answers (a sum finished by a ``psum`` consumes its operand as it is; a
reduce-scatter holds its result more finely). :class:`Decisions` holds propagation's product and the
revisions, and answers with the revised value where there is one — the one place that question is answered.
The strategies take one ``Decisions`` and return the next; :class:`~shardprop.splitting.plan.Plan` is the
last one, with its stages; lowering and inspection read a Plan through these methods::

    plan.needs(node_id)        # operand layouts, in operand order
    plan.layout(value)         # the layout the value is held in once computed
    plan.collective(node_id)   # the Collective that finishes the node, or None
    plan.body_plans(node_id)   # a loop's or a cond's bodies, each with its own decisions (BodyPlan)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from types import MappingProxyType

from ..expr.graph import Graph, Node
from ..propagation import ShardedGraph
from ..core.rules import Body
from ..core.layouts import Layout
from ..core.collectives import Collective

_EMPTY: Mapping = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Pending:
    """A node's result left a partial sum over ``mesh_axes``: node ``finisher``'s collective sums it, later."""

    finisher: int
    mesh_axes: tuple[str, ...]


@dataclass(frozen=True, eq=False, kw_only=True)
class Decisions:
    """Propagation's layouts with a strategy's revisions (see the module docstring)."""

    sharded: ShardedGraph
    # node id -> operand layouts, where they differ from ``sharded.needs``
    need_overrides: Mapping[int, tuple[Layout, ...]] = field(default_factory=lambda: _EMPTY)
    # node id -> the collective that finishes it
    collectives: Mapping[int, Collective] = field(default_factory=lambda: _EMPTY)
    # value -> the layout it is held in, where it differs from ``sharded.layout`` (a reduce-scatter's result)
    held: Mapping[int, Layout] = field(default_factory=lambda: _EMPTY)
    # node id -> its bodies' plans, where a strategy decided them (else propagation's, see body_plans)
    bodies: Mapping[int, tuple[BodyPlan, ...]] = field(default_factory=lambda: _EMPTY)
    # A body's inputs (by position) that each device holds as a partial sum over these mesh axes: a loop
    # carries them unreduced and one collective after the loop finishes them (see strategies.defer_sums).
    partial_inputs: Mapping[int, tuple[str, ...]] = field(default_factory=lambda: _EMPTY)
    # Nodes whose sum over these mesh axes is left partial (its psum deferred past the loop, with the carries).
    deferred: Mapping[int, tuple[str, ...]] = field(default_factory=lambda: _EMPTY)
    # Nodes left holding a partial sum because their psum waits for a later, smaller value (see
    # strategies.defer_sums_past_linear_consumers); they run in the finisher's stage.
    pending: Mapping[int, Pending] = field(default_factory=lambda: _EMPTY)
    # Deferred nodes' operands (by position) still counted once: taken on each group's first device, zero on the
    # others (a scatter-add into zeros, whose deferred psum would otherwise have counted its operand once).
    counted_once: Mapping[int, tuple[int, ...]] = field(default_factory=lambda: _EMPTY)

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

    def needs(self, node_id: int) -> tuple[Layout, ...]:
        """The layouts node ``node_id`` consumes its operands in (one per operand)."""
        return self._needs[node_id]

    def layout(self, value: int) -> Layout:
        """The layout ``value`` is held in once its producer (and the collective finishing it) has run."""
        return self._layouts[value]

    # Both answered from tables built once: the passes ask on every edge of 10^5-node graphs.
    @cached_property
    def _needs(self) -> tuple[tuple[Layout, ...], ...]:
        table = list(self.sharded.needs)
        for node_id, needs in self.need_overrides.items():
            table[node_id] = needs
        return tuple(table)

    @cached_property
    def _layouts(self) -> tuple[Layout, ...]:
        table = [sharding.layout for sharding in self.sharded.shardings]
        for value, layout in self.held.items():
            table[value] = layout
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

    def computed_layout(self, value: int) -> Layout:
        """The layout ``value``'s producer computes it in: before a collective finishes it, each device holds
        a partial result laid out as propagation said (a ``psum_scatter`` then holds it finer)."""
        if self.graph.producer[value] in self.collectives:
            return self.sharded.layout(value)
        return self.layout(value)

    def edges(self, node: Node):
        """``(operand value, layout the node consumes it in)`` for each operand, in operand order."""
        return zip(node.operands, self.needs(node.id), strict=True)

    def revised(self, *, needs: Mapping[int, tuple[Layout, ...]] = _EMPTY,
                collectives: Mapping[int, Collective] = _EMPTY, held: Mapping[int, Layout] = _EMPTY,
                bodies: Mapping[int, tuple[BodyPlan, ...]] = _EMPTY,
                partial_inputs: Mapping[int, tuple[str, ...]] | None = None,
                deferred: Mapping[int, tuple[str, ...]] = _EMPTY,
                counted_once: Mapping[int, tuple[int, ...]] = _EMPTY, pending: Mapping[int, Pending] = _EMPTY,
                finished_here: frozenset[int] = frozenset()) -> Decisions:
        """A new ``Decisions`` with these entries added (or replaced; ``finished_here`` drops the collectives of
        those nodes); this one is unchanged."""
        return replace(
            self,
            need_overrides=MappingProxyType({**self.need_overrides, **needs}),
            collectives=MappingProxyType({k: c for k, c in {**self.collectives, **collectives}.items()
                                          if k not in finished_here}),
            held=MappingProxyType({**self.held, **held}),
            bodies=MappingProxyType({**self.bodies, **bodies}),
            partial_inputs=self.partial_inputs if partial_inputs is None else MappingProxyType(dict(partial_inputs)),
            deferred=MappingProxyType({**self.deferred, **deferred}),
            counted_once=MappingProxyType({**self.counted_once, **counted_once}),
            pending=MappingProxyType({**self.pending, **pending}),
        )


@dataclass(frozen=True, eq=False)
class BodyPlan:
    """A body (:class:`~shardprop.propagation.product.Body`) with the decisions made for it: which of its sums
    are finished by a collective, which of its carries stay partial sums through the loop."""

    body: Body
    decisions: Decisions


class Draft(Decisions):
    """A pass's scratch copy of :class:`Decisions` whose revisions it fills in place, answering through the
    same methods as it goes; :meth:`frozen` is the immutable product the pass returns."""

    @classmethod
    def of(cls, decisions: Decisions) -> Draft:
        given = {f.name: getattr(decisions, f.name) for f in fields(Decisions)}
        return cls(**given | {"need_overrides": dict(decisions.need_overrides),
                              "collectives": dict(decisions.collectives), "held": dict(decisions.held)})

    # A draft changes as the pass fills it: answer from the revisions directly, not from tables.
    def needs(self, node_id: int) -> tuple[Layout, ...]:
        override = self.need_overrides.get(node_id)
        return self.sharded.needs[node_id] if override is None else override

    def layout(self, value: int) -> Layout:
        held = self.held.get(value)
        return self.sharded.layout(value) if held is None else held

    def set_needs(self, node_id: int, needs: tuple[Layout, ...]) -> None:
        self.need_overrides[node_id] = needs  # type: ignore[index]

    def finish(self, node_id: int, collective: Collective) -> None:
        self.collectives[node_id] = collective  # type: ignore[index]

    def hold(self, value: int, layout: Layout) -> None:
        self.held[value] = layout  # type: ignore[index]

    def frozen(self) -> Decisions:
        given = {f.name: getattr(self, f.name) for f in fields(Decisions)}
        return Decisions(**given | {"need_overrides": MappingProxyType(dict(self.need_overrides)),
                                    "collectives": MappingProxyType(dict(self.collectives)),
                                    "held": MappingProxyType(dict(self.held))})
