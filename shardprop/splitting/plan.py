"""The product of graph splitting: a ``Plan`` — the plan view (``Decisions``) and its stages."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

import numpy as np
from jax.sharding import PartitionSpec

from ..errors import StageIndexError
from ..propagation import ShardedGraph
from ..core.layouts import Layout, layout_to_spec
from .strategy import Strategy
from ..core.types import held_whole
from .decisions import Decisions
from .ir import BodyProgram, Instruction, NodeIR, Ref, index_nodes


def stage_count(count: int) -> str:
    """``2 stages (0 to 1)``: how many stages a program has, for messages."""
    if count == 0:
        return "no stages (its outputs are its arguments)"
    return "1 stage (stage 0)" if count == 1 else f"{count} stages (0 to {count - 1})"


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


@dataclass(frozen=True, slots=True)
class StageInput:
    """Value ``value``, laid out as ``layout`` (whole: a partial value never crosses a stage boundary), taken from
    ``source`` as it made it — an argument in its spec, a value as an earlier stage held it or moved it."""

    value: int
    layout: Layout
    source: Source

    @property
    def ref(self) -> Ref:
        return Ref(self.value, held_whole(self.layout))


@dataclass(frozen=True, eq=False)
class Stage:
    """A piece of the graph that runs as one ``shard_map`` — the Nx design cuts one where data must be gathered,
    and the gather is the first thing the next stage does — or, with ``outside_shard_map``, primitives without a
    record that run on whole arrays under the program's ``jax.jit`` (the ``shard_map`` stage before brings their
    operands whole; it may hold nothing else: ``no ops (moves only)``).

    ``nodes`` are node ids (constants first, then graph order); ``instructions`` its sharded IR (``.ir``): the
    moves its nodes' operands need, the nodes, the collectives that finish them; ``outputs`` are the values later
    stages or the program take from it, each laid out as ``out_layouts`` says (whole).
    """

    id: int
    nodes: tuple[int, ...]
    inputs: tuple[StageInput, ...]
    outputs: tuple[int, ...]
    out_layouts: tuple[Layout, ...]
    instructions: tuple[Instruction, ...] = ()
    outside_shard_map: bool = False

    @property
    def output_refs(self) -> tuple[Ref, ...]:
        return tuple(Ref(v, held_whole(layout)) for v, layout in zip(self.outputs, self.out_layouts, strict=True))

    @property
    def in_specs(self) -> tuple[PartitionSpec, ...]:
        return tuple(layout_to_spec(i.layout) for i in self.inputs)

    @property
    def out_specs(self) -> tuple[PartitionSpec, ...]:
        return tuple(layout_to_spec(layout) for layout in self.out_layouts)


@dataclass(frozen=True, eq=False, kw_only=True)
class Plan(Decisions):
    """The split program: the decisions, ``stages`` in execution order, and where each program output comes
    from. A plan with no stages (``unsplit``) is propagation's view, for inspecting a ShardedGraph."""

    stages: tuple[Stage, ...]
    output_sources: tuple[Source, ...]
    strategy: Strategy | None
    # A body's plan (``of_body``) has no stages: its IR, which runs inside its op's stage, is here.
    instructions: tuple[Instruction, ...] = ()

    @property
    def is_split(self) -> bool:
        """False for ``unsplit`` plans: propagation's view, with no stages and no strategy."""
        return self.strategy is not None

    @classmethod
    def unsplit(cls, sharded: ShardedGraph) -> Plan:
        """Propagation's answers and no stages: what inspection shows for a ShardedGraph."""
        return cls(sharded=sharded, stages=(), output_sources=(), strategy=None)

    @classmethod
    def of_body(cls, body: BodyProgram, strategy: Strategy | None) -> Plan:
        """A body's decisions and IR as a plan with no stages (a body runs inside its op's stage), for inspection."""
        d = body.plan.decisions
        return cls(sharded=d.sharded, need_overrides=d.need_overrides, held=d.held, computed=d.computed,
                   collectives=d.collectives, bodies=d.bodies, stages=(), output_sources=(), strategy=strategy,
                   instructions=body.instructions)

    @cached_property
    def _node_ir(self) -> dict[int, NodeIR]:
        return index_nodes([i for stage in self.stages for i in stage.instructions] + list(self.instructions))

    def node_ir(self, node_id: int) -> NodeIR | None:
        """What the IR does for node ``node_id`` (its operands' moves, the node, its finish); None for arguments, and
        for every node of an unsplit plan."""
        return self._node_ir.get(node_id)

    def body_programs(self, node_id: int) -> tuple[BodyProgram, ...]:
        """The IR of a loop's or a cond's bodies (none for other nodes, and in an unsplit plan)."""
        found = self._node_ir.get(node_id)
        return () if found is None or found.compute.bodies is None else found.compute.bodies

    @cached_property
    def _instruction_stage(self) -> dict[int, int]:
        return {id(instruction): stage.id for stage in self.stages for instruction in stage.instructions}

    def stage_running(self, instruction: Instruction) -> int | None:
        """The stage whose IR holds ``instruction`` (a move of ``node_ir(n).moves_in`` may have run in an earlier
        stage, for an earlier consumer); None for a body's instruction, and in a plan without stages."""
        return self._instruction_stage.get(id(instruction))

    @cached_property
    def _stage_of(self) -> dict[int, int]:
        first: dict[int, int] = {}
        for stage in self.stages:
            for n in stage.nodes:
                first.setdefault(n, stage.id)
        return first

    def stage_at(self, k) -> Stage:
        """Stage ``k`` (a ``shardprop.StageIndexError`` naming the range otherwise).

        Examples:
            >>> mesh = sp.make_mesh((8,), ("i",))
            >>> plan = sp.autoshard(lambda x: 2 * x, mesh=mesh, in_specs=(P("i"),)).trace(jnp.ones(16)).plan
            >>> plan.stage_at(0).id
            0
            >>> plan.stage_at(5)
            Traceback (most recent call last):
            ...
            shardprop.errors.StageIndexError: no stage 5: this program has 1 stage (stage 0)
        """
        count = len(self.stages)
        if isinstance(k, bool) or not isinstance(k, int | np.integer) or not 0 <= k < count:
            raise StageIndexError(f"no stage {k!r}: this program has {stage_count(count)}")
        return self.stages[int(k)]

    def stage_of(self, node_id: int) -> int | None:
        """The stage that runs node ``node_id`` (a constant: the first stage that embeds it); None for
        arguments, and for every node of an unsplit plan."""
        return self._stage_of.get(node_id)

    def __repr__(self) -> str:
        # Printing the stage table is inspection's job (prog.stages, sp.inspect.format_stages(plan)).
        n = len(self.stages)
        return f"<Plan {n} stage{'' if n == 1 else 's'}, {len(self.graph.nodes)} nodes, strategy {self.strategy}>"
