"""The shard graph in Google's Model Explorer (``ai-edge-model-explorer``, the ``viewer`` extra).

``to_model_explorer(prog)`` draws the program's sharded IR as a Model Explorer ``GraphCollection``: one node per
argument, per op and per move or collective of the IR (an ``all_gather``, a ``psum``, a local ``slice``), edges as
the IR passes its values, and groups (collapsible layers) for the stages, inside a stage for the user's function
each op was written in, and inside a loop or a cond for each of its bodies. Every node carries the types the plan
holds its values in (per axis: the mesh axes, the shards and their ranges; the axes still a partial sum), its op and
the user's line; a move carries its bytes. ``model_explorer_overlays(prog)`` colours the nodes by bytes moved and by
layout; ``visualize(prog)`` (``inspect/viewer.py``) serves it in the browser. Everything is read from the plan view
(``Plan.type``, ``Plan.node_ir``) and the IR, as the listing and ``to_json`` read it; nothing is re-derived.

Start at ``to_model_explorer``; ``_Drawing`` walks the IR, ``_grouped`` keeps every group small.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from ..core.layouts import Sharded, Span, layout_to_spec, shard_count
from ..core.types import ValueType, pending_text, type_string
from ..errors import InvariantError
from ..expr.graph import CONSTANT, PARAMETER, format_params, value_name, where
from ..extras import require
from ..gc_pause import gc_paused
from ..splitting import Plan
from ..splitting.invariants import check_plan
from ..splitting.ir import Compute, Move, Ref, transfers_of
from .dot import STAGE_BORDERS, STAGE_COLOURS
from .listing import format_bytes, move_op, move_op_name, ops_summary, stage_ops
from .products import as_plan

if TYPE_CHECKING:
    from model_explorer.graph_builder import GraphCollection
    from model_explorer.node_data_builder import ModelNodeData

GRAPH_ID = "shardprop"
GROUP_LIMIT = 200  # most direct children a group gets: a 10^4-node stage opens as chunks, not as one wall of nodes
LAYOUT_COLOURS = ("#cfe2f3", "#d9ead3", "#fff2cc", "#f4cccc", "#d9d2e9", "#fce5cd", "#d0e0e3", "#ead1dc",
                  "#9fc5e8", "#b6d7a8", "#ffe599", "#ea9999", "#b4a7d6", "#f9cb9c", "#a2c4c9", "#d5a6bd")


def _builder():
    require("model_explorer", extra="viewer")
    from model_explorer import graph_builder

    return graph_builder


@gc_paused
def to_model_explorer(prog: Any, *, label: str = "shardprop") -> GraphCollection:
    """The program's shard graph as a Model Explorer ``GraphCollection`` (one graph, id ``"shardprop"``).

    Groups: ``stage k``; inside, the user's function an op was written in (``stage 1/f``); inside a loop's or a
    cond's group (``scan e``), one per body (``body``, ``cond``, ``branch1``). A group with more than
    ``GROUP_LIMIT`` nodes is cut into ``nodes a-b`` chunks. Node attributes: ``op``, ``params``, ``source``, ``rule``,
    ``stage``, and per output value its ``type``, ``layout``, ``partial`` (mesh axes still a pending sum) and, per
    tensor axis, its shards with their ranges; a move or collective: ``bytes per device``, ``runs`` and the node it
    ``serves``. Output metadata: ``shape``, ``dtype``, ``layout``. A plan that fails its invariant checks raises
    ``shardprop.InvariantError``; without the ``viewer`` extra, ``shardprop.ExtraNotInstalledError``.

    Examples:
        >>> mesh = sp.make_mesh((4, 2), ("i", "j"))
        >>> def f(a, b):                                   # the Nx design note's example
        ...     x, y = a + b, a - b
        ...     return jnp.sum(x, axis=1)[:, None] + jnp.sum(y, axis=0)[None, :]
        >>> a, b = jnp.arange(128.0).reshape(16, 8), jnp.ones((16, 8))
        >>> prog = sp.autoshard(f, mesh=mesh, in_specs=(P("i", "j"), None), strategy="gather").trace(a, b)
        >>> graph = sp.to_model_explorer(prog).graphs[0]
        >>> sorted({n.namespace.split("/")[0] for n in graph.nodes if n.namespace})
        ['stage 0', 'stage 1']
    """
    gb = _builder()
    plan = as_plan(prog)
    if plan.is_split:
        check_plan(plan)  # an inconsistent plan would be drawn with dangling edges: say it is a bug instead
    drawing = _Drawing(plan, gb)
    nodes = _grouped(drawing.draw())
    stage_attrs = {f"stage {stage.id}": {
        "ops": ops_summary(stage_ops(plan, stage), counted=True),
        "moved per device": format_bytes(drawing.stage_bytes.get(stage.id, 0.0)),
        "in specs": ", ".join(map(str, stage.in_specs)), "out specs": ", ".join(map(str, stage.out_specs)),
    } for stage in plan.stages}
    mesh = ", ".join(f"{k}={n}" for k, n in plan.mesh_shape.items())
    stage_attrs[""] = {"mesh": mesh, "strategy": str(plan.strategy), "stages": str(len(plan.stages)),
                       **{f"layout {k}": layout for k, layout in enumerate(drawing.layouts)}}
    colours = [gb.GroupNodeConfig(namespaceRegex=f"^stage {stage.id}$",
                                  backgroundColor=STAGE_COLOURS[stage.id % len(STAGE_COLOURS)],
                                  borderColor=STAGE_BORDERS[stage.id % len(STAGE_BORDERS)])
               for stage in plan.stages]
    graph = gb.Graph(id=GRAPH_ID, nodes=nodes, groupNodeAttributes=stage_attrs, groupNodeConfigs=colours)
    return gb.GraphCollection(label=label, graphs=[graph])


def model_explorer_overlays(prog: Any) -> dict[str, ModelNodeData]:
    """Model Explorer node data for ``to_model_explorer(prog)``, by name: ``"bytes moved"`` (per node, the bytes one
    device sends for it per run of the program, white to red) and ``"layout"`` (one colour per distinct layout a
    node makes its value in — its mesh axes and pending combine: ``P('i', 'j')``, ``P('i',){+j}``,
    ``P('j',){max i}``; a ranged axis counts as its mesh axes, its rows are in the node's ``type``). Every node of
    the graph has a value in each.

    Examples:
        >>> mesh = sp.make_mesh((4, 2), ("i", "j"))
        >>> def f(a, b):                                   # the Nx design note's example
        ...     x, y = a + b, a - b
        ...     return jnp.sum(x, axis=1)[:, None] + jnp.sum(y, axis=0)[None, :]
        >>> a, b = jnp.arange(128.0).reshape(16, 8), jnp.ones((16, 8))
        >>> prog = sp.autoshard(f, mesh=mesh, in_specs=(P("i", "j"), None), strategy="gather").trace(a, b)
        >>> overlays = sp.model_explorer_overlays(prog)
        >>> sorted(overlays)
        ['bytes moved', 'layout']
        >>> overlays["bytes moved"].graphsData["shardprop"].results["stage 1 move 0"].value
        64.0
    """
    require("model_explorer", extra="viewer")
    from model_explorer import node_data_builder as ndb

    plan = as_plan(prog)
    drawing = _Drawing(plan, _builder())
    drawing.draw()
    moved = {key: ndb.NodeDataResult(value=float(sent)) for key, sent in drawing.node_bytes.items()}
    by_bytes = ndb.GraphNodeData(results=moved, name="bytes moved", gradient=[
        ndb.GradientItem(stop=0, bgColor="#ffffff"), ndb.GradientItem(stop=1, bgColor="#cc0000")])
    layouts = drawing.layouts
    by_layout = ndb.GraphNodeData(name="layout", results={
        key: ndb.NodeDataResult(value=layouts.index(layout), bgColor=LAYOUT_COLOURS[layouts.index(layout)
                                                                                    % len(LAYOUT_COLOURS)])
        for key, layout in drawing.node_layout.items()})
    return {"bytes moved": ndb.ModelNodeData(graphsData={GRAPH_ID: by_bytes}),
            "layout": ndb.ModelNodeData(graphsData={GRAPH_ID: by_layout})}


def model_explorer_json(collection: GraphCollection) -> str:
    """The JSON text Model Explorer loads (``model-explorer graph.json``, or dropped on its page): the collection
    as its server sends one, ``{"label": ..., "graphs": [...]}``."""
    return json.dumps(dataclasses.asdict(collection), separators=(",", ":"))


def layout_text(vtype: ValueType) -> str:
    """``P('i', 'j')``, ``P('i',){+j}``, ``P('j',){max i}``: the mesh axes a type lays each axis out over (a ranged
    axis too: its rows are spread over those devices) as a PartitionSpec, with the combine still pending."""
    spec = str(layout_to_spec(vtype.layout))
    return f"{spec}{{{pending_text(vtype)}}}" if vtype.pending else spec


class _Drawing:
    """One walk over the plan's IR making Model Explorer nodes (``draw``), and what the overlays read:
    ``node_bytes`` and ``node_layout`` per node id, ``stage_bytes`` per stage."""

    def __init__(self, plan: Plan, gb):
        self.plan, self.gb = plan, gb
        self.nodes: list = []
        self.node_bytes: dict[str, float] = {}
        self.node_layout: dict[str, str] = {}
        self.stage_bytes: dict[int, float] = {}
        self.by_key: dict[str, Any] = {}

    @property
    def layouts(self) -> list[str]:
        """The distinct layouts nodes make their values in, in order of appearance (the layout overlay's values)."""
        return list(dict.fromkeys(self.node_layout.values()))

    def draw(self) -> list:
        plan, graph = self.plan, self.plan.graph
        arguments = {}
        for k, v in enumerate(graph.inputs):
            node = graph.nodes[graph.producer[v]]
            arguments[k] = self._add(f"n{node.id}", f"argument {graph.argument_names[k]}", "", plan, node,
                                     [Ref(v, plan.type(v))], [])
        made_in: dict[int, dict[Ref, tuple[str, int]]] = {}
        for stage in plan.stages:
            made: dict[Ref, tuple[str, int]] = {}
            for i in stage.inputs:
                if i.source.is_argument:
                    made[i.ref] = arguments[i.source.index]
                else:
                    made[i.ref] = _made(made_in[i.source.stage], i.ref)
            self._instructions(plan, stage.instructions, made, f"stage {stage.id}", "", stage.id, 1)
            made_in[stage.id] = made
        if not plan.stages:  # propagation's view: each node in the layout propagation gave it
            made = {Ref(v, plan.type(v)): arguments[k] for k, v in enumerate(graph.inputs)}
            computes = [Compute(n.id, tuple(Ref(v, plan.type(v)) for v in n.operands),
                                tuple(Ref(v, plan.type(v)) for v in n.outputs))
                        for n in graph.nodes if n.op != PARAMETER]
            self._instructions(plan, computes, made, "", "", None, 1)
            made_in[None] = made
        for k, v in enumerate(graph.outputs):
            source = plan.output_sources[k] if plan.is_split else None
            vtype = plan.output_type(k)
            if source is None or source.is_argument:
                found = arguments[source.index] if source is not None else _made(made_in[None], Ref(v, vtype))
            else:
                found = _made(made_in[source.stage], Ref(v, vtype))
            self._add(f"out{k}", f"output {k}", "", plan, None, [Ref(v, vtype)], [found])
        return self.nodes

    def _instructions(self, plan: Plan, instructions, made: dict, namespace: str, prefix: str, stage: int | None,
                      runs: int) -> None:
        """Nodes for ``instructions`` in group ``namespace``; ``made`` maps each ref to the node output that makes
        it; ``prefix`` names a body's nodes apart (``e/body/``); ``runs``: times they run per run of the program."""
        graph = plan.graph
        moves = 0
        for instruction in instructions:
            if isinstance(instruction, Compute):
                node = graph.nodes[instruction.node]
                group = _join(namespace, _function_of(node))
                sources = [_made(made, r) for r in instruction.inputs]
                key = f"{prefix}n{node.id}"
                label = "constant" if node.op == CONSTANT else node.op
                self._add(key, label, group, plan, node, list(instruction.outputs), sources, stage=stage)
                for k, ref in enumerate(instruction.outputs):
                    made[ref] = (key, k)
                for body in instruction.bodies or ():
                    self._body(plan, instruction, node, body, made, group, prefix, stage, runs)
                continue
            sent = sum(t.moved_bytes for t in transfers_of(instruction)) * runs
            served = graph.nodes[instruction.node] if instruction.node is not None else None
            group = _join(namespace, _function_of(served)) if served is not None else namespace
            key = f"{prefix or namespace + ' '}move {moves}"
            moves += 1
            attrs = [("op", move_op(instruction)),
                     ("from", type_string(graph.avals[instruction.source.value], instruction.source.type)),
                     ("to", type_string(graph.avals[instruction.result.value], instruction.result.type)),
                     ("bytes per device", _number(sent / runs)), ("runs", str(runs)),
                     ("bytes per device per program run", _number(sent)),
                     ("transfers", ", ".join(str(t.kind) for t in transfers_of(instruction)) or "local")]
            if isinstance(instruction, Move) and instruction.merged:
                attrs.append(("merged", "rows exchanged by an earlier step (XLA merges the two)"))
            if served is not None:
                attrs.append(("serves", self.gb.NodeIdsNodeAttributeValue(nodeIds=[f"{prefix}n{served.id}"])))
            self._add(key, move_op_name(instruction), group, plan, None, [instruction.result],
                      [_made(made, instruction.source)], stage=stage, attrs=attrs, sent=sent)
            made[instruction.result] = (key, 0)
            if stage is not None:
                self.stage_bytes[stage] = self.stage_bytes.get(stage, 0.0) + sent

    def _body(self, plan: Plan, compute: Compute, node, program, made: dict, group: str, prefix: str,
              stage: int | None, runs: int) -> None:
        """A loop's or a cond's body as a group of its own (``scan e/body``): its inputs fed by the op's operands,
        its outputs feeding the op."""
        body = program.plan.body
        inner = Plan.of_body(program, plan.strategy)
        path = f"{prefix}{value_name(node.outputs[0])}/{body.name}/"
        namespace = _join(group, f"{node.op} {value_name(node.outputs[0])}", body.name)
        inner_made: dict[Ref, tuple[str, int]] = {}
        for k, ref in enumerate(program.inputs):
            param = inner.graph.nodes[inner.graph.producer[ref.value]]
            key = f"{path}n{param.id}"
            operand = compute.inputs[body.operands[k]]
            self._add(key, f"input {k}", namespace, inner, param, [ref], [_made(made, operand)], stage=stage)
            inner_made[ref] = (key, 0)
        times = runs * (program.repeats or 1)  # a while loop's trip count is unknown: counted once, as estimates do
        self._instructions(inner, program.instructions, inner_made, namespace, path, stage, times)
        self.by_key[f"{prefix}n{node.id}"].incomingEdges.extend(
            self.gb.IncomingEdge(sourceNodeId=key, sourceNodeOutputId=str(out), targetNodeInputId=f"{body.name} {k}")
            for k, (key, out) in enumerate(_made(inner_made, r) for r in program.outputs))

    def _add(self, key: str, label: str, namespace: str, plan: Plan, node, outputs: list[Ref], sources: list,
             *, stage: int | None = None, attrs: list | None = None, sent: float = 0.0) -> tuple[str, int]:
        gb, graph = self.gb, plan.graph
        rows = list(attrs or ())
        if node is not None and node.op != PARAMETER:
            rows += [("op", node.op), ("params", format_params(node)), ("source", where(node, "")),
                     ("rule", str(plan.sharded.rules[node.id]))]
        if stage is not None:
            rows.append(("stage", str(stage)))
        several = len(outputs) > 1
        metadata = []
        for k, ref in enumerate(outputs):
            aval = graph.avals[ref.value]
            name = value_name(ref.value)
            tag = f"{name} " if several else ""
            rows += [(f"{tag}value", name), (f"{tag}type", type_string(aval, ref.type)),
                     (f"{tag}layout", layout_text(ref.type)), (f"{tag}partial", pending_text(ref.type) or "-")]
            rows += [(f"{tag}axis {a}", text) for a, text in enumerate(_axes(plan, ref, aval))]
            metadata.append(gb.MetadataItem(id=str(k), attrs=[
                gb.KeyValue("__tensor_tag", name), gb.KeyValue("shape", str(list(aval.shape))),
                gb.KeyValue("dtype", str(aval.dtype)), gb.KeyValue("layout", layout_text(ref.type)),
                gb.KeyValue("type", type_string(aval, ref.type))]))
        edges = [gb.IncomingEdge(sourceNodeId=source, sourceNodeOutputId=str(out), targetNodeInputId=str(k))
                 for k, (source, out) in enumerate(sources)]
        drawn = gb.GraphNode(id=key, label=label, namespace=namespace, incomingEdges=edges,
                             attrs=[gb.KeyValue(k, v) for k, v in rows], outputsMetadata=metadata)
        self.nodes.append(drawn)
        self.by_key[key] = drawn
        self.node_bytes[key] = sent
        self.node_layout[key] = layout_text(outputs[0].type) if outputs else "-"
        return key, 0


def _axes(plan: Plan, ref: Ref, aval) -> list[str]:
    """Per tensor axis: ``16 @i: #12[0:4] #13[4:8] ...`` — the mesh axes the type lays it out over and the rows each
    device block holds, read from the type (its span, for a ranged axis); where the axis is held as the value's
    producer computed it, the rows carry the ids of propagation's shards (``16`` alone: replicated). An axis a move
    changed (a realign, an all-to-all) has the rows of its new type and no ids: propagation's shards describe the
    computed value."""
    computed = plan.computed_type(ref.value)
    axes = plan.sharded.shardings[ref.value].axes if ref.value < len(plan.sharded.shardings) else ()
    out = []
    for k, (size, mesh_axes) in enumerate(zip(aval.shape, ref.type.layout, strict=True)):
        if not mesh_axes:
            out.append(str(size))
            continue
        rows = _rows(size, shard_count(plan.sharded.mesh_shape, mesh_axes), ref.type.span_of(k))
        axis = axes[k] if k < len(axes) else None
        as_computed = computed.layout[k] == mesh_axes and computed.span_of(k) == ref.type.span_of(k)
        ids = ([f"#{s.id}" for s in axis.shards] if as_computed and isinstance(axis, Sharded)
               and axis.mesh_axes == tuple(mesh_axes) and len(axis.shards) == len(rows) else [""] * len(rows))
        blocks = " ".join(f"{i}[{a}:{b}]" for i, (a, b) in zip(ids, rows, strict=True))
        out.append(f"{size} @{'*'.join(mesh_axes)}: {blocks}")
    return out


def _rows(size: int, count: int, span: Span | None) -> list[tuple[int, int]]:
    """The rows of an axis of ``size`` each of ``count`` device blocks holds, from the type's span (None: equal
    blocks, ``ceil``-sized where they do not divide it)."""
    span = span if span is not None else Span(0, -(-size // count))
    return [span.held(device, size) for device in range(count)]


def _made(made: dict, ref: Ref) -> tuple[str, int]:
    found = made.get(ref)
    if found is None:
        raise InvariantError(f"the IR reads {value_name(ref.value)} as {ref.type} before anything makes it (a "
                             "shardprop bug: please report it)")
    return found


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.1f}"


def _join(*parts: str) -> str:
    return "/".join(p for p in parts if p)


def _function_of(node) -> str:
    """The user's function ``node`` was written in (its innermost ``def`` around the user's line), or ``""`` when
    the trace recorded no line or the file cannot be read as Python."""
    source = None if node is None else (node.caller or node.source)
    if not source:
        return ""
    path, _, line = source.rpartition(":")
    if not line.isdigit():
        return ""
    best = ""
    for start, stop, name in _functions(path):
        if start <= int(line) <= stop:
            best = name  # sorted by start: the innermost def around the line comes last
    return best


@lru_cache(maxsize=256)
def _functions(path: str) -> tuple[tuple[int, int, str], ...]:
    """``(first line, last line, qualified name)`` of every function in the Python file ``path``, by first line."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return ()
    found = []

    def visit(parent, outer: str) -> None:
        for child in ast.iter_child_nodes(parent):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{outer}.{child.name}" if outer else child.name
                if not isinstance(child, ast.ClassDef):
                    found.append((child.lineno, child.end_lineno or child.lineno, name))
                visit(child, name)
            else:
                visit(child, outer)

    visit(tree, "")
    return tuple(sorted(found))


def _grouped(nodes: list) -> list:
    """``nodes`` with every group that would have more than ``GROUP_LIMIT`` direct children (nodes and groups) cut
    into chunks, in order (``nodes 0-199``, ``stages 0-199``; chunks of chunks beyond ``GROUP_LIMIT``²): Model
    Explorer lays out all the children of a group at once when it is opened."""
    members: dict[str, dict[tuple[str, str], Any]] = {"": {}}  # group -> its children in order: nodes and groups
    for node in nodes:
        parts = node.namespace.split("/") if node.namespace else []
        for k, part in enumerate(parts):
            members.setdefault("/".join(parts[:k]), {}).setdefault(("group", part), None)
        members.setdefault(node.namespace, {})[("node", node.id)] = node

    def place(group: str, placed: str) -> None:
        children = list(members.get(group, {}).items())
        depth = max(0, math.ceil(math.log(len(children), GROUP_LIMIT)) - 1) if len(children) > GROUP_LIMIT else 0
        for k, ((kind, name), node) in enumerate(children):
            chunks = []
            for level in range(depth, 0, -1):
                size = GROUP_LIMIT ** level
                first, last = k // size * size, min(k // size * size + size, len(children)) - 1
                stages = all(c[0] == "group" and c[1].startswith("stage ") for c, _ in children[first:last + 1])
                chunks.append(f"{'stages' if stages else 'nodes'} {first}-{last}")
            where = _join(placed, *chunks)
            if kind == "node":
                node.namespace = where
            else:
                place(_join(group, name), _join(where, name))

    place("", "")
    return nodes
