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
from ..core.layouts import Sharded
from ..splitting import CollectiveKind, Plan, Source
from .products import as_plan, body_prefix

SCHEMA_ID = "shardprop.inspect/1"


def _layout(layout) -> list[list[str]]:
    return [list(m) for m in layout]


@gc_paused
def to_json(prog: Any) -> dict[str, Any]:
    """A JSON-ready dict of the program (see :data:`SCHEMA`)."""
    plan = as_plan(prog)
    graph = plan.graph
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
        **_values_and_nodes(plan, ""), "stages": stages,
    }


def _values_and_nodes(plan: Plan, path: str) -> dict[str, list]:
    """``values`` and ``nodes`` of a plan's graph; a loop's or a cond's node lists its ``bodies`` the same way
    (their values named ``path/name`` in sp.explain, e.g. ``e/body/c``)."""
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
        entry = {
            "id": node.id, "op": node.op,
            "operands": [value_name(v) for v in node.operands], "outputs": [value_name(v) for v in node.outputs],
            "params": format_params(node), "source": node.source, "rule": str(sharded.rules[node.id]),
            "fallback": node.id in sharded.fallbacks, "stage": plan.stage_of(node.id),
            "needs": [_layout(n) for n in needs],
            "collective": None if collective is None else {
                "kind": str(collective.kind), "mesh_axes": list(collective.mesh_axes),
                "dimension": collective.dimension,
                **({"outputs": list(collective.outputs)} if collective.outputs is not None else {})},
        }
        if node.id in plan.deferred:
            entry["partial_over"] = list(plan.deferred[node.id])
        bodies = []
        for body_plan in plan.body_plans(node.id) or ():
            body = body_plan.body
            inner = Plan.of_body(body_plan, plan.strategy)
            prefix = body_prefix(node, body, path)
            bodies.append({
                "name": body.name, "path": prefix, "repeats": body.repeats if body.carries else 1,
                "inputs": [{"index": k, "value": value_name(v), "layout": _layout(inner.layout(v)),
                            "operand": body.operands[k]} for k, v in enumerate(inner.graph.inputs)],
                "outputs": [{"index": k, "value": value_name(v), "layout": _layout(layout)}
                            for k, (v, layout) in enumerate(zip(inner.graph.outputs, body.out_layouts, strict=True))],
                "partial_carries": [{"output": c.output, "mesh_axes": list(inner.partial_inputs[c.body_input])}
                                    for c in body.carries if c.body_input in inner.partial_inputs],
                **_values_and_nodes(inner, prefix + "/"),
            })
        if bodies:
            entry["bodies"] = bodies
        nodes.append(entry)
    return {"values": values, "nodes": nodes}


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


_VALUES = {"type": "array", "items": _object({
    "id": {"type": "integer", "minimum": 0}, "name": _NAME, "dtype": {"type": "string"},
    "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}}, "layout": _LAYOUT,
    "producer": {"type": "integer", "minimum": 0},
    "axes": {"type": "array", "items": _object({
        "axis": {"type": "integer", "minimum": 0},
        "mesh_axes": {"type": "array", "items": {"type": "string"}},
        "shards": {"type": "array", "items": _object({
            "id": {"type": "integer", "minimum": 0}, "start": {"type": "integer", "minimum": 0},
            "stop": {"type": "integer", "minimum": 0},
            "parents": {"type": "array", "items": {"type": "integer", "minimum": 0}}})}})}})}
_STRINGS = {"type": "array", "items": {"type": "string"}}
_NODE = _object({
    "id": {"type": "integer", "minimum": 0}, "op": {"type": "string"},
    "operands": {"type": "array", "items": _NAME}, "outputs": {"type": "array", "items": _NAME},
    "params": {"type": "string"}, "source": {"type": ["string", "null"]}, "rule": {"type": "string"},
    "fallback": {"type": "boolean"}, "stage": {"type": ["integer", "null"]},
    "needs": {"type": "array", "items": _LAYOUT},
    "collective": {"oneOf": [{"type": "null"}, _object({
        "kind": {"enum": [kind.value for kind in CollectiveKind]}, "mesh_axes": _STRINGS,
        "dimension": {"type": ["integer", "null"]},
        # a loop finished by one psum of these outputs (its carries kept partial sums)
        "outputs": {"type": "array", "items": {"type": "integer", "minimum": 0}},
    }, required=["kind", "mesh_axes", "dimension"])]},
    "partial_over": _STRINGS,  # a sum inside a body left partial over these mesh axes (summed after the loop)
    # a loop's or a cond's bodies: ``path`` names their values in sp.explain ("e/body/c"); ``repeats`` is null
    # for a while loop (unknown trip count); input ``operand`` is the op's operand it comes from
    "bodies": {"type": "array", "items": _object({
        "name": {"type": "string"}, "path": {"type": "string"}, "repeats": {"type": ["integer", "null"]},
        "inputs": {"type": "array", "items": _object({"index": {"type": "integer"}, "value": _NAME,
                                                      "layout": _LAYOUT, "operand": {"type": "integer"}})},
        "outputs": {"type": "array", "items": _object({"index": {"type": "integer"}, "value": _NAME,
                                                       "layout": _LAYOUT})},
        "partial_carries": {"type": "array", "items": _object({"output": {"type": "integer"},
                                                               "mesh_axes": _STRINGS})},
        "values": _VALUES, "nodes": {"type": "array", "items": {"$ref": "#/$defs/node"}}})},
}, required=["id", "op", "operands", "outputs", "params", "source", "rule", "fallback", "stage", "needs",
             "collective"])

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://shardprop.dev/schema/inspect-1.json",
    "title": "shardprop inspect output",
    "$defs": {"node": _NODE},
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
        "values": _VALUES,
        "nodes": {"type": "array", "items": {"$ref": "#/$defs/node"}},
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
