"""The JSON form of a sharded program, for tools: values with their shards (and shard parents), nodes with
their rules and stages, stages with their inputs, outputs and collectives. :data:`SCHEMA` is its JSON Schema
(``shardprop inspect --schema`` prints it); ``docs/inspecting.md`` describes every field.

Layouts are lists with one entry per tensor axis: the list of mesh axes the axis is laid out over, major
first (``[]`` when replicated). Values are named as in the listing (``"a"``, ``"b"``, ...).
"""

from __future__ import annotations

from typing import Any

from ..expr.graph import CONSTANT, PARAMETER, format_params, short_dtype, value_name
from ..gc_pause import gc_paused
from ..propagation.sharding import Sharded
from ..splitting import CollectiveKind, Source
from .products import as_plan

SCHEMA_ID = "shardprop.inspect/1"


def _layout(layout) -> list[list[str]]:
    return [list(m) for m in layout]


@gc_paused
def to_json(prog: Any) -> dict[str, Any]:
    """A JSON-ready dict of the program (see :data:`SCHEMA`)."""
    plan = as_plan(prog)
    sharded, graph = plan.sharded, plan.graph
    avals = graph.avals
    values = []
    for v, sharding in enumerate(sharded.shardings):
        axes = []
        for k, a in enumerate(sharding.axes):
            shards = [{"id": s.id, "start": s.start, "stop": s.stop, "parents": [p.id for p in s.parents]}
                      for s in a.shards] if isinstance(a, Sharded) else []
            axes.append({"axis": k, "mesh_axes": list(a.mesh_axes) if isinstance(a, Sharded) else [],
                         "shards": shards})
        values.append({"id": v, "name": value_name(v), "dtype": short_dtype(avals[v].dtype),
                       "shape": list(avals[v].shape), "layout": _layout(plan.layout(v)),
                       "producer": graph.producer[v], "axes": axes})
    nodes = []
    for node in graph.nodes:
        needs = plan.needs(node.id) if node.op not in (PARAMETER, CONSTANT) else ()
        collective = plan.collective(node.id)
        nodes.append({
            "id": node.id, "op": node.op,
            "operands": [value_name(v) for v in node.operands], "outputs": [value_name(v) for v in node.outputs],
            "params": format_params(node), "source": node.source, "rule": str(sharded.rules[node.id]),
            "fallback": node.id in sharded.fallbacks, "stage": plan.stage_of(node.id),
            "needs": [_layout(n) for n in needs],
            "collective": None if collective is None else {
                "kind": str(collective.kind), "mesh_axes": list(collective.mesh_axes),
                "dimension": collective.dimension},
        })
    stages = []
    for stage in plan.stages:
        extra = {"outside_shard_map": True} if stage.outside_shard_map else {}  # only then: say what is unusual
        stages.append({
            "id": stage.id, "nodes": list(stage.nodes), **extra,
            "inputs": [{"value": value_name(i.value), "layout": _layout(i.layout),
                        "source": _source(i.source)} for i in stage.inputs],
            "outputs": [{"value": value_name(v), "layout": _layout(layout)}
                        for v, layout in zip(stage.outputs, stage.out_layouts, strict=True)],
        })
    split = plan.is_split
    return {
        "schema": SCHEMA_ID,
        "mesh": {"axis_names": list(plan.mesh_shape), "shape": list(plan.mesh_shape.values())},
        "strategy": str(plan.strategy) if split else None,
        "inputs": [{"index": k, "value": value_name(v), "layout": _layout(plan.layout(v))}
                   for k, v in enumerate(graph.inputs)],
        "outputs": [{"index": k, "value": value_name(v), "layout": _layout(plan.layout(v)),
                     "source": _source(plan.output_sources[k]) if split else None}
                    for k, v in enumerate(graph.outputs)],
        "values": values, "nodes": nodes, "stages": stages,
    }


def _source(source: Source) -> dict[str, int]:
    return {"argument": source.index} if source.is_argument else {"stage": source.stage, "output": source.index}


_LAYOUT = {"type": "array", "items": {"type": "array", "items": {"type": "string"}}}
_SOURCE = {"oneOf": [
    {"type": "object", "required": ["argument"], "additionalProperties": False,
     "properties": {"argument": {"type": "integer", "minimum": 0}}},
    {"type": "object", "required": ["stage", "output"], "additionalProperties": False,
     "properties": {"stage": {"type": "integer", "minimum": 0}, "output": {"type": "integer", "minimum": 0}}},
]}
_NAME = {"type": "string", "pattern": "^[a-z]+$"}
_BOX = {"type": "array", "items": {"type": "array", "items": {"type": "integer", "minimum": 0},
                                   "minItems": 2, "maxItems": 2}}


def _object(properties: dict, required: list[str] | None = None) -> dict:
    return {"type": "object", "properties": properties, "required": required or list(properties),
            "additionalProperties": False}


SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://shardprop.dev/schema/inspect-1.json",
    "title": "shardprop inspect output",
    **_object({
        "schema": {"const": SCHEMA_ID},
        "mesh": _object({"axis_names": {"type": "array", "items": {"type": "string"}},
                         "shape": {"type": "array", "items": {"type": "integer", "minimum": 1}}}),
        "strategy": {"type": ["string", "null"]},
        "inputs": {"type": "array", "items": _object({"index": {"type": "integer"}, "value": _NAME,
                                                      "layout": _LAYOUT})},
        "outputs": {"type": "array", "items": _object({"index": {"type": "integer"}, "value": _NAME,
                                                       "layout": _LAYOUT,
                                                       "source": {"oneOf": [_SOURCE, {"type": "null"}]}})},
        "values": {"type": "array", "items": _object({
            "id": {"type": "integer", "minimum": 0}, "name": _NAME, "dtype": {"type": "string"},
            "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}}, "layout": _LAYOUT,
            "producer": {"type": "integer", "minimum": 0},
            "axes": {"type": "array", "items": _object({
                "axis": {"type": "integer", "minimum": 0},
                "mesh_axes": {"type": "array", "items": {"type": "string"}},
                "shards": {"type": "array", "items": _object({
                    "id": {"type": "integer", "minimum": 0}, "start": {"type": "integer", "minimum": 0},
                    "stop": {"type": "integer", "minimum": 0},
                    "parents": {"type": "array", "items": {"type": "integer", "minimum": 0}}})}})}})},
        "nodes": {"type": "array", "items": _object({
            "id": {"type": "integer", "minimum": 0}, "op": {"type": "string"},
            "operands": {"type": "array", "items": _NAME}, "outputs": {"type": "array", "items": _NAME},
            "params": {"type": "string"}, "source": {"type": ["string", "null"]}, "rule": {"type": "string"},
            "fallback": {"type": "boolean"}, "stage": {"type": ["integer", "null"]},
            "needs": {"type": "array", "items": _LAYOUT},
            "collective": {"oneOf": [{"type": "null"}, _object({
                "kind": {"enum": [kind.value for kind in CollectiveKind]},
                "mesh_axes": {"type": "array", "items": {"type": "string"}},
                "dimension": {"type": ["integer", "null"]}})]}})},
        "stages": {"type": "array", "items": _object({
            "id": {"type": "integer", "minimum": 0},
            "nodes": {"type": "array", "items": {"type": "integer", "minimum": 0}},
            "outside_shard_map": {"const": True},  # present only for a stage that runs outside shard_map
            "inputs": {"type": "array", "items": _object({"value": _NAME, "layout": _LAYOUT, "source": _SOURCE})},
            "outputs": {"type": "array", "items": _object({"value": _NAME, "layout": _LAYOUT})}},
            required=["id", "nodes", "inputs", "outputs"])},
        # --explain NAME: {NAME: Explanation.to_dict()}
        "explain": {"type": "object", "additionalProperties": _object({
            "value": _NAME, "equation": {"type": "string"}, "rule": {"type": "string"},
            "axes": {"type": "array", "items": _object({
                "axis": {"type": "integer", "minimum": 0}, "size": {"type": "integer", "minimum": 0},
                "mesh_axes": {"type": "array", "items": {"type": "string"}}, "origin": {"type": "string"},
                "steps": {"type": "array", "items": _object({
                    "value": _NAME, "axis": {"type": "integer", "minimum": 0}, "op": {"type": "string"},
                    "rule": {"type": "string"}, "source": {"type": ["string", "null"]}})},
                "reason": {"type": ["string", "null"]}})},
            "consumes": {"type": "array", "items": {"type": "string"}}})},
        # --lineage OUT:BLOCK: {OUT:BLOCK: {value, box, exact, inputs: {flat input index: [box, ...]}}}
        "lineage": {"type": "object", "additionalProperties": _object({
            "value": _NAME, "box": _BOX, "exact": {"type": "boolean"},
            "inputs": {"type": "object", "propertyNames": {"pattern": "^[0-9]+$"},
                       "additionalProperties": {"type": "array", "items": _BOX}}})},
    }, required=["schema", "mesh", "strategy", "inputs", "outputs", "values", "nodes", "stages"]),
}
