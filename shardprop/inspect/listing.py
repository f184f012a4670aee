"""The text forms of a plan: the annotated listing of its sharded IR, stage by stage, and the stage table.

``str(prog.graph)`` (and ``sp.show(prog)``) print the listing: every instruction a stage runs, one per line — the
moves (``all_gather``, ``all_to_all``, ``ppermute``, ``psum``, ``psum_scatter``, a local ``slice``, ``take_once``) as
equations next to the ops::

    { lambda ;
        a:f32[16@i,8@j]   # a
        b:f32[16@i,8@j]   # b
      let
      ── stage 0 ──
        c:f32[16@i,8@j] = add a b                          # f.py:8
      ── stage 1 ──
        c:f32[16@i,8] = all_gather[j axis=1] c             # 64 B per device
        e:f32[16@i] = reduce_sum[axes=(1,)] c              # f.py:10
      in (e,) }

Every value prints with its type (``16@i``: 16 elements laid out over mesh axis ``i``; ``{+j}``: still a partial sum
over ``j``), as the IR holds it there. ``str(prog.stages)`` prints the stage table: per stage its ops, inputs (with
their sources), the collectives inside it and its outputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from ..core.layouts import Layout, layout_to_spec
from ..core.steps import realign_shift, StepKind
from ..core.types import ValueType, type_string, typed
from ..expr.graph import (CONSTANT, PARAMETER, argument_lines, format_constant, format_params, value_name, where)
from ..gc_pause import gc_paused
from ..splitting import Plan, Stage
from ..splitting.ir import BodyProgram, Compute, Finish, Move, Ref, transfers_of
from .products import part_name


def format_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def format_ms(seconds: float, digits: int = 2) -> str:
    """``1.25 ms``: a duration in milliseconds."""
    return f"{seconds * 1e3:.{digits}f} ms"


def stage_ops(plan: Plan, stage: Stage) -> list[str]:
    """The ops a stage runs, in order (its embedded constants are not ops)."""
    nodes = plan.graph.nodes
    return [nodes[n].op for n in stage.nodes if nodes[n].op != CONSTANT]


def ops_summary(ops: list[str], counted: bool = False, moves: bool = False) -> str:
    """``2 ops (add, sub)``, ``1 op (dot_general)``; with ``counted``, ``3 ops (add×2, sub)``. A stage with no ops
    only moves values (``moves``: before a stage outside shard_map) or builds constants (a program's constant
    outputs).

    >>> ops_summary(["add", "add", "sub"], counted=True)
    '3 ops (add×2, sub)'
    """
    if not ops:
        return "no ops (moves only)" if moves else "no ops (constants only)"
    kinds = {op: ops.count(op) for op in dict.fromkeys(ops)}
    names = ", ".join(f"{op}×{k}" if counted and k > 1 else op for op, k in kinds.items())
    return f"{len(ops)} op{'' if len(ops) == 1 else 's'} ({names})"


def moves_values(stage: Stage) -> bool:
    """True when ``stage`` runs a move."""
    return any(isinstance(i, Move) for i in stage.instructions)


def typed_name(plan: Plan, value: int, layout: Layout) -> str:
    """``c:f32[16@i,8@j]``: the value's name and its type laid out as ``layout`` (whole)."""
    return typed(value, plan.graph.avals[value], ValueType(layout))


_MOVE_OPS = {StepKind.SLICE: "slice", StepKind.ALL_GATHER: "all_gather", StepKind.ALL_TO_ALL: "all_to_all",
             StepKind.PERMUTE: "ppermute", StepKind.PSUM: "psum", StepKind.PSUM_SCATTER: "psum_scatter",
             StepKind.TAKE_ONCE: "take_once", StepKind.HALO: "halo", StepKind.REALIGN: "realign",
             StepKind.UNSPAN: "unspan", StepKind.TAKE_ROWS: "take_rows", StepKind.MIRROR: "mirror",
             StepKind.ROTATE: "rotate", StepKind.ROUTE: "route"}


def move_op_name(move: Move | Finish) -> str:
    """``all_gather``, ``psum``, ``pmax``: the operation a move (or a finish) runs, as the listing names it."""
    return str(move.kind) if isinstance(move, Finish) else _MOVE_OPS[move.step.kind]


def move_op(move: Move | Finish) -> str:
    """``all_gather[j axis=1]``: the operation with its parameters."""
    if isinstance(move, Finish):
        return f"{move_op_name(move)}[{'*'.join(move.mesh_axes)}]"
    step = move.step
    params = ["*".join(step.mesh_axes)]
    if step.kind is StepKind.ALL_TO_ALL:
        params.append(f"axis={step.axis}->{step.to_axis}")
    elif step.kind is StepKind.HALO:  # the rows it adds, as the type after it holds them: halo[i axis=1 <1,1>]
        lo, hi = step.after.halo_of(step.axis)
        params.append(f"axis={step.axis} <{lo},{hi}>")
    elif step.kind is StepKind.REALIGN:  # how far the rows move: realign[i axis=1 by=-1]
        params.append(f"axis={step.axis} by={realign_shift(step)}")
    elif step.kind is StepKind.ROTATE:  # where each device's rows lie: rotate[i axis=1 by=63]
        params.append(f"axis={step.axis} by={step.before.placement.shift}")
    elif step.axis is not None:
        params.append(f"axis={step.axis}")
    return f"{move_op_name(move)}[{' '.join(params)}]"


def move_equation(move: Move | Finish) -> str:
    """``all_gather[j axis=1] c``: a move (or a finish) as the right-hand side of an equation."""
    return f"{move_op(move)} {value_name(move.source.value)}"


def _instruction_rows(plan_graph, instructions, note, indent: str, body_rows) -> list[tuple[str, str | None]]:
    """``(equation, comment)`` rows for ``instructions``; a loop's bodies follow its equation (``body_rows``)."""
    avals, nodes = plan_graph.avals, plan_graph.nodes
    rows: list[tuple[str, str | None]] = []
    for instruction in instructions:
        if isinstance(instruction, Compute):
            node = nodes[instruction.node]
            outs = " ".join(typed(r.value, avals[r.value], r.type) for r in instruction.outputs)
            if node.op == CONSTANT:
                rhs = f"constant {format_constant(node, avals[node.output])}"
            else:
                rhs = " ".join([node.op + format_params(node), *(value_name(v) for v in node.operands)])
            comment = "  ".join(filter(None, [where(node, ""), note(instruction)]))
            rows.append((f"{indent}{outs} = {rhs}", comment or None))
            rows += body_rows(instruction, node)
        else:
            result = instruction.result
            sent = sum(t.moved_bytes for t in transfers_of(instruction))
            merged = isinstance(instruction, Move) and instruction.merged
            comment = (f"{format_bytes(sent)} per device" if transfers_of(instruction) else
                       "rows exchanged already (XLA merges the two)" if merged else "local")
            rows.append((f"{indent}{typed(result.value, avals[result.value], result.type)} = "
                         f"{move_equation(instruction)}", comment))
    return rows


@gc_paused
def format_listing(plan: Plan) -> str:
    """The listing of ``plan``'s sharded IR, stage by stage (see the module docstring); for an unsplit plan,
    propagation's view of the graph."""
    graph = plan.graph
    rows: list[tuple[str, str | None]] = []

    def note(compute: Compute) -> str:
        resolved = plan.sharded.reshards.get(compute.node)
        if resolved is None:
            return ""
        operand = graph.nodes[compute.node].operands[resolved[0]]
        return f"conflict resolved: {value_name(operand)} moved"

    def body_rows(compute: Compute, node) -> list[tuple[str, None]]:
        return [(f"  {line}", None) for line in _body_listings(plan, compute, node, "")]

    if plan.stages:
        for stage in plan.stages:
            where = " (outside shard_map)" if stage.outside_shard_map else ""
            rows.append((f"  ── stage {stage.id}{where} ──", None))
            rows += _instruction_rows(graph, stage.instructions, note, "    ", body_rows)
    else:  # propagation's view: every node in the layout propagation gave it
        computes = [Compute(n.id, (), tuple(Ref(v, plan.type(v)) for v in n.outputs)) for n in graph.nodes
                    if n.op != PARAMETER]
        rows += _instruction_rows(graph, computes, note, "    ", lambda c, n: [])
    head = argument_lines(graph, lambda v: typed(v, graph.avals[v], plan.type(v)))
    return _lines("\n".join(["{ lambda ;", *head, "  let"]), rows, graph.outputs)


def _lines(head: str, rows: list[tuple[str, str | None]], outputs) -> str:
    width = max((len(text) for text, comment in rows if comment is not None), default=0)
    lines = [head] + [f"{text.ljust(width)}   # {comment}" if comment else text for text, comment in rows]
    outs = " ".join(value_name(v) for v in outputs)
    lines.append(f"  in ({outs},) }}" if len(outputs) == 1 else f"  in ({outs}) }}")
    return "\n".join(lines)


def _body_listings(plan: Plan, compute: Compute, node, outer: str) -> list[str]:
    """The listing of each body of a loop or a cond, indented under it: its instructions on every iteration
    (moves and collectives included), and the carries kept partial sums. Values inside are named
    ``<path>/<name>`` (``e/body/c``) for ``sp.explain``."""
    out = []
    for body in compute.bodies or ():
        path = f"{outer}{value_name(node.outputs[0])}/{body.plan.body.name}"
        out.append(f"  {path}: {_describe(body, node)}{_kept(body)}")
        graph = body.plan.body.sharded.graph

        def body_rows(inner: Compute, inner_node, path=path) -> list[tuple[str, None]]:
            return [(f"  {line}", None) for line in _body_listings(plan, inner, inner_node, path + "/")]

        rows = _instruction_rows(graph, body.instructions, lambda c: "", "    ", body_rows)
        params = " ".join(typed(r.value, graph.avals[r.value], r.type) for r in body.inputs)
        text = _lines(f"{{ lambda ; {params}. let", rows, [r.value for r in body.outputs])
        out += [f"    {line}" for line in text.splitlines()]
    return out


def _describe(body: BodyProgram, node) -> str:
    part = part_name(body.plan.body)
    part = part if part.startswith("branch") else f"the {part}"
    runs = "" if not body.plan.body.carries else \
        ", every iteration" if body.repeats is None else f", run {body.repeats} times"
    return f"{part} of `{node.op}` at {where(node)}{runs}"


def _kept(body: BodyProgram) -> str:
    partial = body.plan.partial_carries
    if not partial:
        return ""
    outputs, axes = [k for k, _ in partial], "*".join(partial[0][1])
    return (f"; carries {', '.join(map(str, outputs))} kept partial sums over {axes}" if len(outputs) > 1
            else f"; carry {outputs[0]} kept a partial sum over {axes}") + ", summed after the loop"


def format_stages(plan: Plan, sources: Mapping[int, str] | None = None) -> str:
    """One block per stage: its ops, its inputs (value, type, source), the collectives inside it and its
    outputs (value, type). ``sources``: where the specs of the arguments the user did not annotate came from
    (``{3: "chosen by sp.AUTO"}``), said after them."""
    lines = [line for stage in plan.stages for line in _stage_lines(plan, stage, sources or {})]
    lines.append(f"program outputs: {', '.join(str(s) for s in plan.output_sources)}")
    return "\n".join(lines)


def source_name(plan: Plan, source) -> str:
    """Where a stage input comes from, as the user knows it: the argument's name (``params['w']``) or ``stage 0
    output 1``."""
    return plan.graph.argument_names[source.index] if source.is_argument else str(source)


def _stage_lines(plan: Plan, stage: Stage, sources: Mapping[int, str]) -> list[str]:
    """Stage ``stage``'s block of the stage table (see ``format_stages``)."""
    lines = []
    ops = stage_ops(plan, stage)
    where = ", outside shard_map" if stage.outside_shard_map else ""
    lines.append(f"stage {stage.id}: {ops_summary(ops, moves=moves_values(stage))}{where}")
    for i in stage.inputs:
        source = sources.get(i.source.index) if i.source.is_argument else None
        chosen = f" ({source})" if source else ""
        origin = source_name(plan, i.source)
        lines.append(f"  in  {typed_name(plan, i.value, i.layout)}  {layout_to_spec(i.layout)}  <- {origin}"
                     f"{chosen}")
    lines += collective_lines(plan, stage.instructions, "  ")
    for ref in stage.output_refs:
        lines.append(f"  out {typed_name(plan, ref.value, ref.type.layout)}  {layout_to_spec(ref.type.layout)}")
    return lines


def collective_lines(plan_or_graph, instructions, indent: str, graph=None) -> list[str]:
    """What ``instructions`` send, one line each (``all_gather[j axis=1] c -> c:f32[16@i,8], 64 B``), and what their
    loops' and conds' bodies send, indented under the op; nothing for instructions that send nothing."""
    graph = graph if graph is not None else plan_or_graph.graph
    out = []
    for instruction in instructions:
        if isinstance(instruction, Compute):
            out += _body_collectives(plan_or_graph, instruction, graph, indent)
            continue
        sent = transfers_of(instruction)
        if not sent:
            continue
        result = instruction.result
        into = typed(result.value, graph.avals[result.value], result.type)
        out.append(f"{indent}{move_equation(instruction)} -> {into}, {format_bytes(sum(t.moved_bytes for t in sent))}"
                   f"{_for(graph, instruction)}")
    return out


def _for(graph, instruction: Move | Finish) -> str:
    node = None if instruction.node is None else graph.nodes[instruction.node]
    if node is None:
        return " at the end of the body"
    at = f" at {where(node)}" if node.source else ""
    return f" (finishes `{node.op}`{at})" if instruction.finishes else f" (for `{node.op}`{at})"


def _body_collectives(plan, compute: Compute, graph, indent: str) -> list[str]:
    out = []
    node = graph.nodes[compute.node]
    for body in compute.bodies or ():
        inner_graph = body.plan.body.sharded.graph
        said = [f"carry {output} kept a partial sum over {'*'.join(axes)} (summed after the loop)"
                for output, axes in body.plan.partial_carries]
        said += [line.strip() for line in collective_lines(plan, body.instructions, "", inner_graph)]
        if not said:
            continue
        what = part_name(body.plan.body)
        times = "" if not body.plan.body.carries else " every iteration" if body.repeats is None else \
            f", x{body.repeats}"
        out.append(f"{indent}`{node.op}` at {where(node)} {what}{times}:")
        out += [f"{indent}  {line}" for line in said]
    return out


@dataclass(frozen=True, eq=False)
class TableStage(Stage):
    """``prog.stages[k]``: the ``shardprop.Stage`` splitting made, printed as its block of the stage table
    (its ops, inputs with where they come from, collectives, outputs)."""

    plan: Plan | None = field(default=None, repr=False)
    sources: Mapping[int, str] = field(default_factory=dict, repr=False)

    def __str__(self) -> str:
        return "\n".join(_stage_lines(self.plan, self, self.sources))

    __repr__ = __str__


class StageTable(tuple):
    """``prog.stages``: the plan's stages (a tuple of ``shardprop.Stage``, each printing as its block) that
    prints as the table."""

    plan: Plan
    sources: Mapping[int, str]

    def __new__(cls, plan: Plan, sources: Mapping[int, str] | None = None):
        sources = dict(sources or {})
        stages = [TableStage(**{f.name: getattr(stage, f.name) for f in fields(Stage)}, plan=plan, sources=sources)
                  for stage in plan.stages]
        self = super().__new__(cls, stages)
        self.plan, self.sources = plan, sources
        return self

    def __str__(self) -> str:
        return format_stages(self.plan, self.sources)


class AnnotatedGraph:
    """``prog.graph``: the program's sharded IR, which prints as the annotated listing, stage by stage. The
    products themselves are ``prog.plan`` and ``prog.sharded``."""

    __slots__ = ("plan",)

    def __init__(self, plan: Plan):
        self.plan = plan

    def __str__(self) -> str:
        return format_listing(self.plan)

    def __repr__(self) -> str:
        graph = self.plan.graph
        return f"<AnnotatedGraph {len(graph.nodes)} nodes, {len(self.plan.stages)} stages>"


__all__ = ["AnnotatedGraph", "StageTable", "TableStage", "collective_lines", "format_bytes", "format_listing",
           "format_ms", "format_stages", "move_equation", "move_op", "move_op_name", "source_name", "stage_ops",
           "type_string", "typed_name"]
