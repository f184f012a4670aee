"""The text forms of a plan: the annotated listing, stage by stage, and the stage table.

``str(prog.graph)`` (and ``sp.show(prog)``) print the listing::

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
``str(prog.stages)`` prints the stage table: per stage its ops, inputs (with their sources), the collectives
inside it and its outputs.
"""

from __future__ import annotations


from ..expr.graph import CONSTANT, PARAMETER, render, short_dtype, short_source, value_name
from ..gc_pause import gc_paused
from ..core.layouts import Layout, format_layout, layout_to_spec
from ..splitting import Plan, Stage, StageInput
from ..splitting.cost import Move, collective_bytes, move_bytes, movement
from .products import Scope, body_prefix, part_name


def crossing(plan: Plan, stage_input: StageInput) -> tuple[Move, float]:
    """How ``stage_input`` is moved into its stage (gathered, all-to-all, or not at all), and bytes per device."""
    have = plan.layout(stage_input.value)
    return movement(have, stage_input.layout), move_bytes(plan, stage_input.value, have, stage_input.layout)


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


def typed_name(plan: Plan, value: int, layout: Layout) -> str:
    """``c:f32[16@i,8@j]``: the value's name and type with ``layout``."""
    aval = plan.graph.avals[value]
    return f"{value_name(value)}:{short_dtype(aval.dtype)}[{format_layout(aval.shape, layout)}]"


@gc_paused
def format_listing(plan: Plan) -> str:
    """The listing of ``plan``'s graph, stage by stage (see the module docstring)."""
    graph = plan.graph
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
        notes = []
        resolved = plan.sharded.reshards.get(node.id)
        if resolved is not None:  # a conflict resolved by moving one operand
            operand = node.operands[resolved[0]]
            move = movement(plan.layout(operand), plan.needs(node.id)[resolved[0]])
            notes.append(f"conflict resolved: {value_name(operand)} {move}")
        collective = plan.collective(node.id)
        if collective is not None:
            notes.append(f"finished by {collective} ({format_bytes(collective_bytes(plan, node, collective))} "
                         "per device)")
        if node.id in plan.pending:
            notes.append(_pending_note(plan, node.id))
        return "; ".join(notes)

    return render(graph, type_of=type_of, before_node=lambda node: headers.get(node.id, []), order=order, note=note,
                  after_node=lambda node: _body_listings(plan, node, ""))


def _body_listings(view, node, outer: str) -> list[str]:
    """The listing of each body of a loop or a cond, indented under it: its values in the layouts each device
    holds its blocks in, the moves and collectives inside it (every iteration), the carries kept partial sums.
    Values inside are named ``<path>/<name>`` (``e/body/c``) for ``sp.explain``."""
    plans = view.body_plans(node.id)
    if not plans:
        return []
    out = []
    for body_plan in plans:
        body, inner = body_plan.body, body_plan.decisions
        scope = Scope(body_prefix(node, body, outer), node, body_plan)
        partial = _kept_partial(body_plan)
        kept = ""
        if partial:
            outputs, axes = [k for k, _ in partial], "*".join(partial[0][1])
            kept = (f"; carries {', '.join(map(str, outputs))} kept partial sums over {axes}" if len(outputs) > 1
                    else f"; carry {outputs[0]} kept a partial sum over {axes}") + ", summed after the loop"
        out.append(f"  {scope.path}: {scope.describe()}{kept}")
        graph = inner.graph

        def type_of(v: int, inner=inner) -> str:
            return _body_type(inner, v)

        def note(n, inner=inner) -> str:
            notes = [f"{value_name(v)} {move}" for v, need in dict.fromkeys(inner.edges(n))
                     if (move := movement(inner.layout(v), need)).kind is not None]
            collective = inner.collective(n.id)
            if collective is not None:
                notes.append(f"finished by {collective}")
            if n.id in inner.pending:
                notes.append(_pending_note(inner, n.id))
            if n.id in inner.deferred:
                notes.append(f"left a partial sum over {'*'.join(inner.deferred[n.id])} (summed after the loop)")
            return "; ".join(notes)

        listing = render(graph, type_of=type_of, note=note,
                         after_node=lambda n, inner=inner, path=scope.path: _body_listings(inner, n, path + "/"))
        out += [f"    {line}" for line in listing.splitlines()]
        moved = [f"{value_name(v)} {move}" for v, move in _moved_outputs(body_plan)]
        if moved:
            when = "at the end of each iteration" if body.carries else "at its end"
            out.append(f"    {when}: {', '.join(moved)} (into the layout the op takes it in)")
    return out


def _stage_header(plan: Plan, stage: Stage) -> list[str]:
    graph = plan.graph
    arriving = []
    for i in stage.inputs:
        move, nbytes = crossing(plan, i)
        if i.source.is_argument and move.kind is None:
            continue  # arguments are readable by every stage; only moving them costs anything
        shape = graph.avals[i.value].shape
        where = f"argument {i.source.index}" if i.source.is_argument else f"stage {i.source.stage}"
        if move.kind is not None:
            how = (f"{move}: [{format_layout(shape, plan.layout(i.value))}] -> "
                   f"[{format_layout(shape, i.layout)}], {format_bytes(nbytes)} per device")
        else:
            how = f"as [{format_layout(shape, i.layout)}], no communication"
        arriving.append(f"   {value_name(i.value)} from {where}, {how}")
    where = " (outside shard_map)" if stage.outside_shard_map else ""
    if not arriving:
        return [f"── stage {stage.id}{where} ──"]
    return [f"── stage {stage.id}{where} ── receives:", *arriving]


def format_stages(plan: Plan) -> str:
    """One block per stage: its ops, its inputs (value, layout, source), the collectives that finish
    partial results inside it, and its outputs (value, layout)."""
    graph = plan.graph
    lines = []
    for stage in plan.stages:
        ops = stage_ops(plan, stage)
        where = ", outside shard_map" if stage.outside_shard_map else ""
        lines.append(f"stage {stage.id}: {len(ops)} ops ({', '.join(dict.fromkeys(ops))}){where}")
        for i in stage.inputs:
            produced = plan.layout(i.value)
            how = movement(produced, i.layout).kind
            moved = "" if how is None else \
                f"  ({'gathered' if how == 'all-gather' else 'all-to-all'} from " \
                f"[{format_layout(graph.avals[i.value].shape, produced)}])"
            lines.append(f"  in  {typed_name(plan, i.value, i.layout)}  {layout_to_spec(i.layout)}  <- "
                         f"{i.source}{moved}")
        for n in stage.nodes:
            collective = plan.collective(n)
            if collective is not None:
                node = graph.nodes[n]
                where = f" at {short_source(node.source)}" if node.source else ""
                lines.append(f"  {collective} finishes `{node.op}`{where}")
            lines += body_lines(plan, n, "  ")
        for v, out_layout in zip(stage.outputs, stage.out_layouts, strict=True):
            lines.append(f"  out {typed_name(plan, v, out_layout)}  {layout_to_spec(out_layout)}")
    lines.append(f"program outputs: {', '.join(str(s) for s in plan.output_sources)}")
    return "\n".join(lines)


def body_lines(view, node_id: int, indent: str) -> list[str]:
    """What the bodies of a loop or a cond do beyond computing on their blocks — values moved inside them, sums
    finished by collectives, carries kept partial — indented under the op; nothing for a body that does not
    communicate."""
    plans = view.body_plans(node_id)
    if not plans:
        return []
    node = view.graph.nodes[node_id]
    out = []
    for body_plan in plans:
        body, inner = body_plan.body, body_plan.decisions
        graph = inner.graph
        said = []
        for output, axes in _kept_partial(body_plan):
            said.append(f"carry {output} kept a partial sum over {'*'.join(axes)} (summed after the loop)")
        for n in graph.nodes:
            where = f" at {short_source(n.source)}" if n.source else ""
            for v, need in dict.fromkeys(inner.edges(n)):
                move = movement(inner.layout(v), need)
                if move.kind is not None:
                    said.append(f"{graph.value_name(v)}:{_body_type(inner, v)} {move} for `{n.op}`{where}")
            collective = inner.collective(n.id)
            if collective is not None:
                said.append(f"{collective} finishes `{n.op}`{where}")
            said += body_lines(inner, n.id, "  ")
        for v, move in _moved_outputs(body_plan):
            said.append(f"output {graph.value_name(v)}:{_body_type(inner, v)} {move} at the end")
        if not said:
            continue
        what = part_name(body)
        times = "" if not body.carries else " every iteration" if body.repeats is None else f", x{body.repeats}"
        out.append(f"{indent}`{node.op}` at {short_source(node.source)} {what}{times}:")
        out += [f"{indent}  {line}" for line in said]
    return out


def _kept_partial(body_plan) -> list[tuple[int, tuple[str, ...]]]:
    """``(loop output, mesh axes)`` of each carry the body keeps a partial sum (summed after the loop)."""
    inputs = body_plan.decisions.partial_inputs
    return [(c.output, inputs[c.body_input]) for c in body_plan.body.carries if inputs.get(c.body_input)]


def _moved_outputs(body_plan) -> list[tuple[int, Move]]:
    """``(body output, move)`` of each output the body holds otherwise than the op takes it: moved at its end."""
    inner = body_plan.decisions
    return [(v, move) for v, want in zip(inner.graph.outputs, body_plan.body.out_layouts, strict=True)
            if (move := movement(inner.layout(v), want)).kind is not None]


def _body_type(view, v: int) -> str:
    aval = view.graph.avals[v]
    return f"{short_dtype(aval.dtype)}[{format_layout(aval.shape, view.layout(v))}]"


class StageTable(tuple):
    """``prog.stages``: the plan's stages (a tuple of :class:`~shardprop.Stage`) that prints as the table."""

    plan: Plan

    def __new__(cls, plan: Plan):
        self = super().__new__(cls, plan.stages)
        self.plan = plan
        return self

    def __str__(self) -> str:
        return format_stages(self.plan)


class AnnotatedGraph:
    """``prog.graph``: the program's sharded graph as the plan holds it, which prints as the annotated listing,
    stage by stage. The products themselves are ``prog.plan`` and ``prog.sharded``."""

    __slots__ = ("plan",)

    def __init__(self, plan: Plan):
        self.plan = plan

    def __str__(self) -> str:
        return format_listing(self.plan)

    def __repr__(self) -> str:
        graph = self.plan.graph
        return f"<AnnotatedGraph {len(graph.nodes)} nodes, {len(self.plan.stages)} stages>"


def _pending_note(view, node_id: int) -> str:
    """A node left holding a partial sum: which later node's collective finishes it."""
    pending = view.pending[node_id]
    finisher = view.graph.nodes[pending.finisher]
    collective = view.collective(finisher.id)
    return (f"left a partial sum over {'*'.join(pending.mesh_axes)}: summed later, by the {collective} finishing "
            f"`{finisher.op}` at {short_source(finisher.source, 'an unknown line')} (smaller there)")
