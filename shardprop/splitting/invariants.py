"""The invariants of a :class:`Plan` (checked when ``shardprop.checks`` is enabled).

* every node other than arguments and constants runs in exactly one stage;
* every operand a stage's node reads is available in that stage: computed earlier in it, a constant it
  embeds, or a stage input in a layout the node's need is a local slice of;
* every stage input, and every program output, comes from a source that exists earlier (an argument, or an
  output of an earlier stage that is that value);
* a stage outside ``shard_map`` holds only primitives that run there, and no other stage holds one;
* stage outputs are held in the plan's layout; no layout uses a mesh axis twice.
"""

from __future__ import annotations

from ..checks import enabled
from ..errors import InvariantError
from ..expr.graph import CONSTANT, PARAMETER
from ..ops import lookup
from ..core.layouts import Layout, layout_refines, uses_mesh_axes_once
from .plan import Plan, Source


def checked(plan: Plan) -> Plan:
    """``plan``, after checking its invariants when checks are enabled."""
    if enabled():
        check_plan(plan)
    return plan


def check_plan(plan: Plan) -> None:
    graph = plan.graph
    nodes = graph.nodes
    placed: dict[int, int] = {}
    for position, stage in enumerate(plan.stages):
        if stage.id != position:
            _fail(f"stage {stage.id} is at position {position}")
        available: dict[int, list[Layout]] = {}
        for i in stage.inputs:
            _check_source(plan, i.source, i.value, before=stage.id, what=f"stage {stage.id} input")
            _check_layout(i.layout, f"stage {stage.id} input")
            available.setdefault(i.value, []).append(i.layout)
        for n in stage.nodes:
            node = nodes[n]
            if node.op == PARAMETER:
                _fail(f"stage {stage.id} runs argument node {n}")
            if node.op == CONSTANT:
                available[node.outputs[0]] = [plan.layout(node.outputs[0])]
                continue
            if n in placed:
                _fail(f"node {n} (`{node.op}`) runs in stages {placed[n]} and {stage.id}")
            if lookup(node.op).runs_outside_shard_map != stage.outside_shard_map:
                _fail(f"node {n} (`{node.op}`) runs {'outside' if stage.outside_shard_map else 'inside'} shard_map "
                      f"in stage {stage.id}, but its record says otherwise")
            placed[n] = stage.id
            for v, need in plan.edges(node):
                _check_layout(need, f"node {n} (`{node.op}`) need")
                if not any(layout_refines(have, need) for have in available.get(v, ())):
                    _fail(f"node {n} (`{node.op}`) in stage {stage.id} reads value {v} laid out {need}, which "
                          "the stage neither computes before it nor receives")
            for v in node.outputs:
                _check_layout(plan.layout(v), f"value {v}")
                available[v] = [plan.layout(v)]
        for v, layout in zip(stage.outputs, stage.out_layouts, strict=True):
            if layout != plan.layout(v) or v not in available:
                _fail(f"stage {stage.id} outputs value {v}, which it does not hold in the plan's layout")
    missing = [n.id for n in nodes if n.op not in (PARAMETER, CONSTANT) and n.id not in placed]
    if plan.stages and missing:
        _fail(f"nodes {missing[:5]} run in no stage")
    for k, (v, source) in enumerate(zip(graph.outputs, plan.output_sources, strict=True)):
        _check_source(plan, source, v, before=len(plan.stages), what=f"program output {k}")


def _check_source(plan: Plan, source: Source, value: int, *, before: int, what: str) -> None:
    if source.is_argument:
        inputs = plan.graph.inputs
        if not 0 <= source.index < len(inputs) or inputs[source.index] != value:
            _fail(f"{what} {value} names argument {source.index}, which is not that value")
        return
    if not 0 <= source.stage < before:
        _fail(f"{what} {value} comes from stage {source.stage}, which does not run before it")
    outputs = plan.stages[source.stage].outputs
    if not 0 <= source.index < len(outputs) or outputs[source.index] != value:
        _fail(f"{what} {value} names output {source.index} of stage {source.stage}, which is not that value")



def _check_layout(layout: Layout, what: str) -> None:
    if not uses_mesh_axes_once(layout):
        _fail(f"{what} uses a mesh axis twice: {layout}")


def _fail(message: str):
    raise InvariantError(f"splitting produced an inconsistent Plan: {message} (a shardprop bug: please report "
                         "it with the function and in_specs)")
