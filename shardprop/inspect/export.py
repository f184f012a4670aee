"""The JSON form of a sharded program, for tools: values with their shards (and shard parents) and types, nodes
with their rules and stages, stages with their inputs, outputs and sharded IR — every move and collective an
instruction with its price. ``SCHEMA`` is its JSON Schema (``shardprop inspect --schema`` prints it);
``docs/inspecting.md`` describes every field.

Layouts are lists with one entry per tensor axis: the list of mesh axes the axis is laid out over, major
first (``[]`` when replicated). A type is a layout and ``partial``, the mesh axes over which the value is still an
unreduced partial sum (``[]``: whole). Values are named as in the listing (``"a"``, ``"b"``, ...).
"""

from __future__ import annotations

from typing import Any

from ..expr.graph import CONSTANT, PARAMETER, format_params, short_dtype, value_name
from ..gc_pause import gc_paused
from ..core.layouts import Sharded
from ..core.types import PlacementKind, Reduction, ValueType
from ..splitting import CollectiveKind, Plan, Source
from ..splitting.ir import Compute, Move, Ref, transfers_of
from .listing import move_op_name
from .products import as_plan, body_prefix
from .searched import SEARCH_SCHEMA, search_to_dict

SCHEMA_ID = "shardprop.inspect/3"


def _layout(layout) -> list[list[str]]:
    return [list(m) for m in layout]


def _type(vtype: ValueType) -> dict[str, Any]:
    out: dict[str, Any] = {"layout": _layout(vtype.layout), "partial": list(vtype.partial)}
    if vtype.partial and vtype.reduction is not Reduction.SUM:
        out["reduction"] = str(vtype.reduction)
    if vtype.placement is not None:
        placement = vtype.placement  # (a route's rounds are its step's: "transfers", "moved_bytes")
        out["placement"] = {"kind": str(placement.kind), "mesh_axes": list(placement.mesh_axes), "axis": placement.axis,
                            "shift": placement.shift}
    return out


def _ref(ref: Ref) -> dict[str, Any]:
    return {"value": value_name(ref.value), **_type(ref.type)}


def _instructions(instructions, graph) -> list[dict[str, Any]]:
    """Each instruction of the IR: a node run on blocks, or one move or finish with what it sends (``finishes``:
    whether it combines its node's partial results — a psum, a reduce-scatter, a pmax — rather than bringing an
    operand to it)."""
    out = []
    for instruction in instructions:
        if isinstance(instruction, Compute):
            out.append({"kind": "compute", "node": instruction.node,
                        "inputs": [_ref(r) for r in instruction.inputs],
                        "outputs": [_ref(r) for r in instruction.outputs]})
            continue
        sent = transfers_of(instruction)
        entry = {"kind": "move" if isinstance(instruction, Move) else "finish", "node": instruction.node,
                 "finishes": instruction.finishes, "op": move_op_name(instruction), "from": _ref(instruction.source),
                 "to": _ref(instruction.result), "moved_bytes": sum(t.moved_bytes for t in sent),
                 "transfers": [str(t.kind) for t in sent]}
        if isinstance(instruction, Move):
            step = instruction.step
            entry.update(mesh_axes=list(step.mesh_axes), axis=step.axis, to_axis=step.to_axis)
        else:
            entry.update(mesh_axes=list(instruction.mesh_axes), axis=None, to_axis=None)
        out.append(entry)
    return out


@gc_paused
def to_json(prog: Any) -> dict[str, Any]:
    """A JSON-ready dict of the program (see ``SCHEMA``); with ``search`` where ``sp.AUTO`` chose layouts."""
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
            "instructions": _instructions(stage.instructions, graph),
        })
    split = plan.is_split
    return {
        "schema": SCHEMA_ID,
        "mesh": {"axis_names": list(plan.mesh_shape), "shape": list(plan.mesh_shape.values())},
        "strategy": str(plan.strategy) if split else None,
        "inputs": [{"index": k, "name": graph.argument_names[k], "value": value_name(v),
                    "layout": _layout(plan.layout(v)), "spec_source": _spec_source(prog, k)}
                   for k, v in enumerate(graph.inputs)],
        "outputs": [{"index": k, "value": value_name(v), "layout": _layout(plan.output_type(k).layout),
                     "source": _source(plan.output_sources[k]) if split else None}
                    for k, v in enumerate(graph.outputs)],
        **_values_and_nodes(plan, ""), "stages": stages,
        **({"search": search_to_dict(prog.search)} if getattr(prog, "search", None) is not None else {}),
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
                       "shape": list(avals[v].shape), **_type(plan.type(v)),
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
            "needs": [_type(n) for n in needs],
            "collective": None if collective is None else {
                "kind": str(collective.kind), "mesh_axes": list(collective.mesh_axes)},
        }
        bodies = []
        for program in plan.body_programs(node.id):
            body = program.plan.body
            inner = Plan.of_body(program, plan.strategy)
            prefix = body_prefix(node, body, path)
            bodies.append({
                "name": body.name, "path": prefix, "repeats": program.repeats,
                "inputs": [{"index": k, "value": value_name(r.value), **_type(r.type), "operand": body.operands[k]}
                           for k, r in enumerate(program.inputs)],
                "outputs": [{"index": k, "value": value_name(r.value), **_type(r.type)}
                            for k, r in enumerate(program.outputs)],
                "partial_carries": [{"output": output, "mesh_axes": list(axes)}
                                    for output, axes in program.plan.partial_carries],
                "instructions": _instructions(program.instructions, inner.graph),
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


# where an argument's spec came from: written by the user (or unannotated: propagation's), chosen by sp.AUTO, or
# the layout of the array it was called with, or its NNX Variable's sharding metadata
SPEC_SOURCES = ("in_specs", "sp.AUTO", "array", "metadata")


def _spec_source(prog, k: int) -> str:
    search = getattr(prog, "search", None)
    if search is not None and k in search.searched:
        return "sp.AUTO"
    if k in getattr(prog, "kept", ()):
        return "array"
    return "metadata" if k in getattr(prog, "declared", ()) else "in_specs"


def _object(properties: dict, required: list[str] | None = None) -> dict:
    return {"type": "object", "properties": properties, "required": required or list(properties),
            "additionalProperties": False}


_STRINGS = {"type": "array", "items": {"type": "string"}}
# a type: a layout, and the mesh axes over which the value is still a partial sum ("reduction": a partial maximum,
# minimum or arg-extreme, only just before the collective that combines it; "placement": rows an op left out of
# their places, only just before the mirror, rotation or route that puts them there)
_TYPE_FIELDS = {"layout": _LAYOUT, "partial": _STRINGS,
                "reduction": {"enum": [r.value for r in Reduction if r is not Reduction.SUM]},
                "placement": _object({"kind": {"enum": [k.value for k in PlacementKind]}, "mesh_axes": _STRINGS,
                                      "axis": {"type": ["integer", "null"]}, "shift": {"type": "integer"}})}
_TYPE_REQUIRED = ["layout", "partial"]
_TYPE = _object(_TYPE_FIELDS, _TYPE_REQUIRED)
_REF = _object({"value": _NAME, **_TYPE_FIELDS}, ["value", *_TYPE_REQUIRED])
# the sharded IR: a node run on blocks ("compute"), one step of a move, or a maximum's (minimum's, arg-extreme's)
# collective ("finish"), with what it sends; "node" is the node a move serves (null: a body's output moved at its end)
_INSTRUCTIONS = {"type": "array", "items": {"oneOf": [
    _object({"kind": {"const": "compute"}, "node": {"type": "integer", "minimum": 0},
             "inputs": {"type": "array", "items": _REF}, "outputs": {"type": "array", "items": _REF}}),
    _object({"kind": {"enum": ["move", "finish"]}, "node": {"type": ["integer", "null"]},
             "finishes": {"type": "boolean"}, "op": {"type": "string"},
             "from": _REF, "to": _REF, "moved_bytes": {"type": "number", "minimum": 0}, "transfers": _STRINGS,
             "mesh_axes": _STRINGS, "axis": {"type": ["integer", "null"]}, "to_axis": {"type": ["integer", "null"]}}),
]}}
_SHARDS = {"type": "array", "items": _object({
    "id": {"type": "integer", "minimum": 0}, "start": {"type": "integer", "minimum": 0},
    "stop": {"type": "integer", "minimum": 0},
    "parents": {"type": "array", "items": {"type": "integer", "minimum": 0}}})}
_AXES = {"type": "array", "items": _object({
    "axis": {"type": "integer", "minimum": 0}, "mesh_axes": {"type": "array", "items": {"type": "string"}},
    "shards": _SHARDS})}
_VALUES = {"type": "array", "items": _object({
    "id": {"type": "integer", "minimum": 0}, "name": _NAME, "dtype": {"type": "string"},
    "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}}, **_TYPE_FIELDS,
    "producer": {"type": "integer", "minimum": 0}, "axes": _AXES},
    ["id", "name", "dtype", "shape", *_TYPE_REQUIRED, "producer", "axes"])}
_NODE = _object({
    "id": {"type": "integer", "minimum": 0}, "op": {"type": "string"},
    "operands": {"type": "array", "items": _NAME}, "outputs": {"type": "array", "items": _NAME},
    "params": {"type": "string"}, "source": {"type": ["string", "null"]}, "rule": {"type": "string"},
    "fallback": {"type": "boolean"}, "stage": {"type": ["integer", "null"]},
    "needs": {"type": "array", "items": _TYPE},
    # the collective that finishes the node right after it (which outputs, and into which types: its IR says)
    "collective": {"oneOf": [{"type": "null"}, _object({
        "kind": {"enum": [kind.value for kind in CollectiveKind]}, "mesh_axes": _STRINGS})]},
    # a loop's or a cond's bodies: ``path`` names their values in sp.explain ("e/body/c"); ``repeats`` is null
    # for a while loop (unknown trip count); input ``operand`` is the op's operand it comes from
    "bodies": {"type": "array", "items": _object({
        "name": {"type": "string"}, "path": {"type": "string"}, "repeats": {"type": ["integer", "null"]},
        "inputs": {"type": "array", "items": _object({"index": {"type": "integer"}, "value": _NAME,
                                                      **_TYPE_FIELDS, "operand": {"type": "integer"}},
                                                     ["index", "value", *_TYPE_REQUIRED, "operand"])},
        "outputs": {"type": "array", "items": _object({"index": {"type": "integer"}, "value": _NAME,
                                                       **_TYPE_FIELDS}, ["index", "value", *_TYPE_REQUIRED])},
        "partial_carries": {"type": "array", "items": _object({"output": {"type": "integer"},
                                                               "mesh_axes": _STRINGS})},
        "instructions": _INSTRUCTIONS,
        "values": _VALUES, "nodes": {"type": "array", "items": {"$ref": "#/$defs/node"}}})},
}, required=["id", "op", "operands", "outputs", "params", "source", "rule", "fallback", "stage", "needs",
             "collective"])

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://shardprop.dev/schema/inspect-2.json",
    "title": "shardprop inspect output",
    "$defs": {"node": _NODE},
    **_object({
        "schema": {"const": SCHEMA_ID},
        "mesh": _object({"axis_names": {"type": "array", "items": {"type": "string"}},
                         "shape": {"type": "array", "items": {"type": "integer", "minimum": 1}}}),
        "strategy": {"type": ["string", "null"]},
        # an argument leaf: its name as jax.jit names it (params['w']), and where its spec came from
        "inputs": {"type": "array", "items": _object({"index": {"type": "integer"}, "name": {"type": "string"},
                                                      "value": _NAME, "layout": _LAYOUT,
                                                      "spec_source": {"enum": list(SPEC_SOURCES)}})},
        "outputs": {"type": "array", "items": _object({"index": {"type": "integer"}, "value": _NAME,
                                                       "layout": _LAYOUT,
                                                       "source": {"oneOf": [_SOURCE, {"type": "null"}]}})},
        "values": _VALUES,
        "nodes": {"type": "array", "items": {"$ref": "#/$defs/node"}},
        # a program whose sp.AUTO arguments the search laid out: what it chose (inspect/searched.py)
        "search": SEARCH_SCHEMA,
        "stages": {"type": "array", "items": _object({
            "id": {"type": "integer", "minimum": 0},
            "nodes": {"type": "array", "items": {"type": "integer", "minimum": 0}},
            "outside_shard_map": {"const": True},  # present only for a stage that runs outside shard_map
            "inputs": {"type": "array", "items": _object({"value": _NAME, "layout": _LAYOUT, "source": _SOURCE})},
            "outputs": {"type": "array", "items": _object({"value": _NAME, "layout": _LAYOUT})},
            "instructions": _INSTRUCTIONS},
            required=["id", "nodes", "inputs", "outputs", "instructions"])},
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
            "consumes": {"type": "array", "items": {"type": "string"}},
            "partial": {"type": ["string", "null"]},
            "search": {"type": "array", "items": {"type": "string"}}})},
        # --lineage OUT:BLOCK: {OUT:BLOCK: {value, box, exact, inputs: {flat input index: [box, ...]}}}
        "lineage": {"type": "object", "additionalProperties": _object({
            "value": _NAME, "box": _BOX, "exact": {"type": "boolean"},
            "inputs": {"type": "object", "propertyNames": {"pattern": "^[0-9]+$"},
                       "additionalProperties": {"type": "array", "items": _BOX}}})},
    }, required=["schema", "mesh", "strategy", "inputs", "outputs", "values", "nodes", "stages"]),
}
