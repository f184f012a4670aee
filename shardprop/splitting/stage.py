"""Stages: the product of graph splitting."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from jax.sharding import PartitionSpec

from ..expr.graph import short_dtype, value_name
from ..propagation import ShardedGraph
from ..propagation.sharding import Layout, format_layout, layout_to_spec

# Where a stage input comes from, as in Nx's ``Nx.Defn.Graph``: ``(stage_id, output_index)`` for an
# earlier stage's output, ``(None, input_index)`` for an argument of the program.
Source = tuple[int | None, int]


@dataclass(frozen=True, slots=True)
class StageInput:
    """Value ``value``, delivered to the stage laid out as ``layout``, taken from ``source``."""

    value: int
    layout: Layout
    source: Source


@dataclass(frozen=True, eq=False)
class Stage:
    """A piece of the graph that runs as one ``shard_map`` with no communication inside.

    ``nodes`` are node ids in graph order; ``outputs`` are the values later stages or the program need,
    each in the layout it was computed in.
    """

    id: int
    nodes: tuple[int, ...]
    inputs: tuple[StageInput, ...]
    outputs: tuple[int, ...]
    out_layouts: tuple[Layout, ...]

    @property
    def in_specs(self) -> tuple[PartitionSpec, ...]:
        return tuple(layout_to_spec(i.layout) for i in self.inputs)

    @property
    def out_specs(self) -> tuple[PartitionSpec, ...]:
        return tuple(layout_to_spec(layout) for layout in self.out_layouts)


@dataclass(frozen=True, eq=False)
class Plan:
    """The split program: ``stages`` in execution order, and where each program output comes from."""

    sharded: ShardedGraph
    stages: tuple[Stage, ...]
    output_sources: tuple[Source, ...]
    strategy: str = "gather"
    # Under "collective": the layouts some nodes consume their operands in instead of ``sharded.needs``,
    # and the collective that finishes each of those nodes.
    need_overrides: Mapping[int, tuple[Layout, ...]] = field(default_factory=dict)
    collectives: Mapping[int, Any] = field(default_factory=dict)
    # Values a reduce-scatter leaves more finely sharded than propagation laid them out.
    held: Mapping[int, Layout] = field(default_factory=dict)

    def needs(self, node_id: int) -> tuple[Layout, ...]:
        """The layouts node ``node_id`` consumes its operands in, in this plan."""
        return self.need_overrides.get(node_id) or self.sharded.needs[node_id]

    def layout(self, value: int) -> Layout:
        """The layout ``value`` is held in, in this plan."""
        return self.held.get(value) or self.sharded.layout(value)

    def stage_of(self) -> dict[int, int]:
        """``{node_id: stage_id}`` for every node that runs in a stage."""
        return {n: s.id for s in self.stages for n in s.nodes}

    def format_stages(self) -> str:
        return format_stages(self.sharded, self.stages, self.output_sources, self.collectives, self.layout)

    def __str__(self) -> str:
        return self.format_stages()


class StageList(tuple):
    """``prog.stages``: a tuple of :class:`Stage` that prints as a table."""

    sharded: ShardedGraph
    output_sources: tuple[Source, ...]
    collectives: Mapping[int, Any]

    def __new__(cls, stages, sharded, output_sources, collectives=None, layout=None):
        self = super().__new__(cls, stages)
        self.sharded, self.output_sources, self.collectives = sharded, output_sources, collectives or {}
        self.layout = layout or sharded.layout
        return self

    def __str__(self) -> str:
        return format_stages(self.sharded, self, self.output_sources, self.collectives, self.layout)


def format_stages(sharded: ShardedGraph, stages, output_sources, collectives=None, layout=None) -> str:
    """One block per stage: its ops, its inputs (value, layout, source), the collectives that finish
    partial results inside it, and its outputs (value, layout)."""
    collectives = collectives or {}
    layout = layout or sharded.layout
    graph = sharded.graph
    lines = []

    def typ(v, layout):
        return f"{value_name(v)}:{short_dtype(graph.avals[v].dtype)}[{format_layout(graph.avals[v].shape, layout)}]"

    for stage in stages:
        ops = [graph.nodes[n].op for n in stage.nodes if graph.nodes[n].op != "constant"]
        lines.append(f"stage {stage.id}: {len(ops)} ops ({', '.join(dict.fromkeys(ops))})")
        for i in stage.inputs:
            src = f"argument {i.source[1]}" if i.source[0] is None else f"stage {i.source[0]} output {i.source[1]}"
            produced = layout(i.value)
            moved = "" if produced == i.layout else \
                f"  (gathered from [{format_layout(graph.avals[i.value].shape, produced)}])"
            lines.append(f"  in  {typ(i.value, i.layout)}  {layout_to_spec(i.layout)}  <- {src}{moved}")
        for n in stage.nodes:
            if n in collectives:
                c, node = collectives[n], graph.nodes[n]
                where = f" at {node.source.rsplit('/', 1)[-1]}" if node.source else ""
                lines.append(f"  {c} finishes `{node.op}`{where}")
        for v, out_layout in zip(stage.outputs, stage.out_layouts, strict=True):
            lines.append(f"  out {typ(v, out_layout)}  {layout_to_spec(out_layout)}")
    outs = ", ".join(f"argument {s[1]}" if s[0] is None else f"stage {s[0]} output {s[1]}" for s in output_sources)
    lines.append(f"program outputs: {outs}")
    return "\n".join(lines)
