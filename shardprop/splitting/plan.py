"""The product of graph splitting: a :class:`Plan` — the plan view (:class:`Decisions`) and its stages."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

from jax.sharding import PartitionSpec

from ..propagation import ShardedGraph
from ..core.layouts import Layout, layout_to_spec
from .strategy import Strategy
from .decisions import BodyPlan, Decisions


class Source(NamedTuple):
    """Where a stage input comes from, as in Nx's ``Nx.Defn.Graph``: output ``index`` of stage ``stage``, or
    argument ``index`` of the program when ``stage`` is None. Compares equal to the plain tuple."""

    stage: int | None
    index: int

    @property
    def is_argument(self) -> bool:
        return self.stage is None

    def __str__(self) -> str:
        return f"argument {self.index}" if self.stage is None else f"stage {self.stage} output {self.index}"

    def brief(self) -> str:
        """``arg 1`` or ``stage 0``: for tables."""
        return f"arg {self.index}" if self.stage is None else f"stage {self.stage}"


@dataclass(frozen=True, slots=True)
class StageInput:
    """Value ``value``, delivered to the stage laid out as ``layout``, taken from ``source``."""

    value: int
    layout: Layout
    source: Source


@dataclass(frozen=True, eq=False)
class Stage:
    """A piece of the graph that runs as one ``shard_map`` with no gather inside (collectives may finish
    nodes inside it) — or, with ``outside_shard_map``, one primitive without a record that runs on whole
    arrays under the program's ``jax.jit``.

    ``nodes`` are node ids (constants first, then graph order); ``outputs`` are the values later stages or
    the program need, each in the layout the plan holds it in.
    """

    id: int
    nodes: tuple[int, ...]
    inputs: tuple[StageInput, ...]
    outputs: tuple[int, ...]
    out_layouts: tuple[Layout, ...]
    outside_shard_map: bool = False

    @property
    def in_specs(self) -> tuple[PartitionSpec, ...]:
        return tuple(layout_to_spec(i.layout) for i in self.inputs)

    @property
    def out_specs(self) -> tuple[PartitionSpec, ...]:
        return tuple(layout_to_spec(layout) for layout in self.out_layouts)


@dataclass(frozen=True, eq=False, kw_only=True)
class Plan(Decisions):
    """The split program: the decisions, ``stages`` in execution order, and where each program output comes
    from. A plan with no stages (:meth:`unsplit`) is propagation's view, for inspecting a ShardedGraph."""

    stages: tuple[Stage, ...]
    output_sources: tuple[Source, ...]
    strategy: Strategy | None

    @property
    def is_split(self) -> bool:
        """False for :meth:`unsplit` plans: propagation's view, with no stages and no strategy."""
        return self.strategy is not None

    @classmethod
    def unsplit(cls, sharded: ShardedGraph) -> Plan:
        """Propagation's answers and no stages: what inspection shows for a ShardedGraph."""
        return cls(sharded=sharded, stages=(), output_sources=(), strategy=None)

    @classmethod
    def of_body(cls, body_plan: BodyPlan, strategy: Strategy | None) -> Plan:
        """A body's decisions as a plan with no stages (a body runs inside its op's stage), for inspection."""
        d = body_plan.decisions
        return cls(sharded=d.sharded, need_overrides=d.need_overrides, collectives=d.collectives, held=d.held,
                   bodies=d.bodies, partial_inputs=d.partial_inputs, deferred=d.deferred,
                   counted_once=d.counted_once, pending=d.pending,
                   stages=(), output_sources=(),
                   strategy=strategy)

    @cached_property
    def _stage_of(self) -> dict[int, int]:
        first: dict[int, int] = {}
        for stage in self.stages:
            for n in stage.nodes:
                first.setdefault(n, stage.id)
        return first

    def stage_of(self, node_id: int) -> int | None:
        """The stage that runs node ``node_id`` (a constant: the first stage that embeds it); None for
        arguments, and for every node of an unsplit plan."""
        return self._stage_of.get(node_id)

    def __repr__(self) -> str:
        # Printing the stage table is inspection's job (prog.stages, sp.inspect.format_stages(plan)).
        n = len(self.stages)
        return f"<Plan {n} stage{'' if n == 1 else 's'}, {len(self.graph.nodes)} nodes, strategy {self.strategy}>"
