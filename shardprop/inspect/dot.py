"""Pictures of the graph: graphviz DOT text (``to_dot``) and files drawn by ``dot`` (``render``).

Each stage is a cluster with its own colour; arguments are ellipses, constants plain text. An edge is
labelled with the type the value travels in; an edge on which the IR moves the value (a gather, an all-to-all, a
permute) is red and says the steps and the bytes each device sends. A node finished by a collective says which.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

from ..errors import RenderError
from ..core.types import type_string
from ..expr.graph import CONSTANT, PARAMETER, format_constant, value_name, where as node_where
from ..gc_pause import gc_paused
from ..splitting import Plan
from ..splitting.ir import transfers_of
from .listing import format_bytes, move_op
from .products import as_plan

STAGE_COLOURS = ("#cfe2f3", "#d9ead3", "#fff2cc", "#f4cccc", "#d9d2e9", "#fce5cd", "#d0e0e3", "#ead1dc")
STAGE_BORDERS = ("#3d85c6", "#6aa84f", "#bf9000", "#cc0000", "#674ea7", "#e69138", "#45818e", "#a64d79")
GATHER = "#cc0000"


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


@gc_paused
def to_dot(prog: Any, *, title: str | None = None) -> str:
    """The graph as graphviz DOT text, stage clusters coloured, edges labelled with shardings.

    Examples:
        >>> mesh = sp.make_mesh((4, 2), ("i", "j"))
        >>> def f(a, b):                                   # the Nx design note's example
        ...     x, y = a + b, a - b
        ...     return jnp.sum(x, axis=1)[:, None] + jnp.sum(y, axis=0)[None, :]
        >>> a, b = jnp.arange(128.0).reshape(16, 8), jnp.ones((16, 8))
        >>> prog = sp.autoshard(f, mesh=mesh, in_specs=(P("i", "j"), None), strategy="gather").trace(a, b)
        >>> print(sp.to_dot(prog))
        digraph shardprop {
          graph [rankdir=TB, fontname=Helvetica, fontsize=11, labelloc=t, label="mesh i=4, j=2 · strategy gather"];
          ...
          subgraph cluster_stage_0 {
            label="stage 0"; style="rounded,dashed"; color="#3d85c6"; fontcolor="#3d85c6";
          ...
          n0 -> n2 [label="f32[16@i,8@j]"];
          ...
          n2 -> n4 [label="f32[16@i,8@j] → f32[16@i,8]...gather j@1 · 64 B/device", color="#cc0000", ...];
          ...
        }
    """
    plan = as_plan(prog)
    mesh = ", ".join(f"{k}={n}" for k, n in plan.mesh_shape.items())
    heading = title or f"mesh {mesh}" + (f" · strategy {plan.strategy}" if plan.is_split else "")
    lines = ["digraph shardprop {",
             f"  graph [rankdir=TB, fontname=Helvetica, fontsize=11, labelloc=t, label={_quote(heading)}];",
             '  node [shape=box, style="rounded,filled", fontname=Helvetica, fontsize=10, fillcolor=white];',
             "  edge [fontname=Helvetica, fontsize=9];",
             *_node_lines(plan), *_edge_lines(plan)]
    for k, v in enumerate(plan.graph.outputs):
        lines.append(f"  out{k} [label={_quote(f'output {k}: {_typ(plan, v)}')}, shape=ellipse, "
                     'fillcolor="#eeeeee"];')
        lines.append(f"  n{plan.graph.producer[v]} -> out{k};")
    lines.append("}")
    return "\n".join(lines)


def _typ(plan: Plan, v: int) -> str:
    return type_string(plan.graph.avals[v], plan.type(v))


def _node_line(plan: Plan, node, indent: str, fill: str | None = None) -> str:
    """One node's DOT line: an argument (its spec), a constant, or an op with its outputs' types and finishes."""
    sharded, graph = plan.sharded, plan.graph
    outs = " ".join(value_name(v) for v in node.outputs)
    if node.op == PARAMETER:
        index = node.params["index"]
        spec = sharded.spec(node.output)
        if sharded.is_unannotated_input(node.output):
            spec = f"unannotated → {spec}"
        label = f"{outs}: {_typ(plan, node.output)}\n{graph.argument_names[index]} · {spec}"
        return f"{indent}n{node.id} [label={_quote(label)}, shape=ellipse, fillcolor=\"#eeeeee\"];"
    if node.op == CONSTANT:
        label = f"{outs} = {format_constant(node, graph.avals[node.output])}"
        return f"{indent}n{node.id} [label={_quote(label)}, shape=plaintext, style=\"\"];"
    types = "\n".join(f"{value_name(v)}: {_typ(plan, v)}" for v in node.outputs)
    where = node_where(node) if node.source else ""
    ir = plan.node_ir(node.id)
    finishes = ir.finishes if ir else ()
    extra = "".join(f"\n{move_op(f)}" for f in finishes)
    label = f"{node.op}\n{types}" + (f"\n{where}" if where else "") + extra
    colour = f", fillcolor={_quote(fill)}" if fill else ""
    return f"{indent}n{node.id} [label={_quote(label)}{colour}];"


def _node_lines(plan: Plan) -> list[str]:
    """The arguments, then each stage's nodes in a coloured cluster, then the nodes no stage holds."""
    graph = plan.graph
    lines = [_node_line(plan, node, "  ") for node in graph.nodes if node.op == PARAMETER]
    in_stage: set[int] = set()
    for stage in plan.stages:
        k = stage.id % len(STAGE_COLOURS)
        lines += [f"  subgraph cluster_stage_{stage.id} {{",
                  f"    label={_quote(f'stage {stage.id}')}; style=\"rounded,dashed\"; "
                  f"color={_quote(STAGE_BORDERS[k])}; fontcolor={_quote(STAGE_BORDERS[k])};"]
        for n in stage.nodes:
            node = graph.nodes[n]
            if n in in_stage or node.op == CONSTANT:
                continue
            in_stage.add(n)
            lines.append(_node_line(plan, node, "    ", STAGE_COLOURS[k]))
        lines.append("  }")
    lines += [_node_line(plan, node, "  ") for node in graph.nodes
              if node.op != PARAMETER and node.id not in in_stage]
    return lines


def _edge_lines(plan: Plan) -> list[str]:
    """Every operand edge labelled with its type; an edge that moves its value red, with the steps and bytes."""
    graph, avals, producer = plan.graph, plan.graph.avals, plan.graph.producer
    lines = []
    for node in graph.nodes:
        if node.op in (PARAMETER, CONSTANT):
            continue
        ir = plan.node_ir(node.id)
        for v, need in dict.fromkeys(plan.edges(node)):
            moves = [m for m in (ir.moves_in if ir else ()) if m.source.value == v]
            if not any(transfers_of(m) for m in moves if m.node == node.id):
                # moved for another consumer (red on its edge, counted once) and reused here, or not moved at all
                reused = [m.node for m in moves if transfers_of(m)]
                label = _typ(plan, v) if not reused else (
                    f"{_typ(plan, v)} → {type_string(avals[v], need)}\nreused (moved for {graph.nodes[reused[0]].op})")
                lines.append(f"  n{producer[v]} -> n{node.id} [label={_quote(label)}];")
                continue
            mine = [m for m in moves if m.node == node.id]  # a first step made for another consumer is on its edge
            nbytes = format_bytes(sum(t.moved_bytes for m in mine for t in transfers_of(m)))
            steps = ", ".join(m.step.short for m in mine)
            label = f"{_typ(plan, v)} → {type_string(avals[v], need)}\n{steps} · {nbytes}/device"
            lines.append(f"  n{producer[v]} -> n{node.id} [label={_quote(label)}, color={_quote(GATHER)}, "
                         f"fontcolor={_quote(GATHER)}, penwidth=2];")
    return lines


def render(prog: Any, path: str | Path, *, format: str | None = None) -> Path:
    """Draw ``to_dot`` into ``path`` with graphviz's ``dot`` (format from the suffix: svg, png, pdf).

    Raises ``shardprop.RenderError`` with install instructions when ``dot`` is not installed.
    """
    path = Path(path)
    fmt = format or path.suffix.lstrip(".") or "svg"
    dot = shutil.which("dot")
    if dot is None:
        raise RenderError("the graphviz `dot` program is not installed, so the graph cannot be drawn to "
                          f"{path}. Install graphviz (Debian/Ubuntu: apt install graphviz; macOS: brew install "
                          "graphviz; conda: conda install graphviz), or take the DOT text from sp.to_dot(prog) "
                          "(shardprop inspect --format dot) and render it elsewhere.")
    done = subprocess.run([dot, f"-T{fmt}", "-o", str(path)], input=to_dot(prog), text=True, capture_output=True,
                          check=False)
    if done.returncode != 0:
        raise RenderError(f"`dot -T{fmt}` failed (exit {done.returncode}): {done.stderr.strip()}")
    return path
