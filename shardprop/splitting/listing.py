"""The annotated listing: the sharded graph printed stage by stage, with what crosses each stage boundary.

``str(prog.graph)`` (and ``sp.show(prog)``) print it::

    { lambda ; a:f32[16@i,8@j] b:f32[16@i,8@j]. let
      ── stage 0 ──
        c:f32[16@i,8@j] = add a b                       # f.py:8
        ...
      ── stage 1 ── receives:
         c from stage 0, gathered over j: [16@i,8@j] -> [16@i,8], 64 B per device
        e:f32[16@i] = reduce_sum[axes=(1,)] c           # f.py:10
      in (i,) }

Every value prints with its per-axis sharding (``16@i``: 16 elements laid out over mesh axis ``i``), in the
layout the plan holds it in. A node finished by a collective says so after its source line.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from ..expr.graph import PARAMETER, render, short_dtype, value_name
from ..gc_pause import gc_paused
from ..propagation import ShardedGraph
from ..propagation.sharding import format_layout
from .stage import Plan, StageInput
from .strategies import collective_bytes, gather_bytes


def crossing(plan: Plan, stage_input: StageInput) -> tuple[tuple[str, ...], float]:
    """What moving ``stage_input`` into its stage costs: the mesh axes gathered, and bytes per device."""
    have = plan.layout(stage_input.value)
    gathered = tuple(name for h, w in zip(have, stage_input.layout, strict=True) for name in h[len(w):])
    return gathered, gather_bytes(plan.sharded, stage_input.value, have, stage_input.layout)


def format_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


@gc_paused
def format_listing(plan: Plan) -> str:
    """The listing of ``plan``'s graph, stage by stage (see the module docstring)."""
    sharded = plan.sharded
    graph = sharded.graph
    avals = graph.avals

    def type_of(v: int) -> str:
        return f"{short_dtype(avals[v].dtype)}[{format_layout(avals[v].shape, plan.layout(v))}]"

    order, headers, printed = [], {}, set()
    for stage in plan.stages:
        first = True
        for n in stage.nodes:
            if n in printed:
                continue  # a constant embedded in several stages prints once
            printed.add(n)
            if first:
                headers[n] = _stage_header(plan, stage)
                first = False
            order.append(graph.nodes[n])
    order += [node for node in graph.nodes if node.id not in printed and node.op != PARAMETER]

    def note(node) -> str:
        collective = plan.collectives.get(node.id)
        if collective is None:
            return ""
        return f"finished by {collective} ({format_bytes(collective_bytes(sharded, node, collective))} per device)"

    return render(graph, type_of=type_of, before_node=lambda node: headers.get(node.id, []), order=order, note=note)


def _stage_header(plan: Plan, stage) -> list[str]:
    graph = plan.sharded.graph
    arriving = []
    for i in stage.inputs:
        gathered, nbytes = crossing(plan, i)
        if i.source[0] is None and not gathered:
            continue  # arguments are readable by every stage; only moving them costs anything
        shape = graph.avals[i.value].shape
        where = f"argument {i.source[1]}" if i.source[0] is None else f"stage {i.source[0]}"
        if gathered:
            how = (f"gathered over {'*'.join(gathered)}: [{format_layout(shape, plan.layout(i.value))}] -> "
                   f"[{format_layout(shape, i.layout)}], {format_bytes(nbytes)} per device")
        else:
            how = f"as [{format_layout(shape, i.layout)}], no communication"
        arriving.append(f"   {value_name(i.value)} from {where}, {how}")
    if not arriving:
        return [f"── stage {stage.id} ──"]
    return [f"── stage {stage.id} ── receives:", *arriving]


@dataclass(frozen=True, eq=False)
class StagedGraph(ShardedGraph):
    """A :class:`ShardedGraph` that knows its plan, so that it prints the annotated listing with stages
    (``prog.graph``)."""

    plan: Plan | None = None

    @classmethod
    def of(cls, plan: Plan) -> StagedGraph:
        sharded = plan.sharded
        return cls(**{f.name: getattr(sharded, f.name) for f in fields(ShardedGraph)}, plan=plan)

    def render(self, before_node=None) -> str:
        if before_node is not None or self.plan is None:
            return super().render(before_node)
        return format_listing(self.plan)

    def __str__(self) -> str:
        return self.render()
