"""Why — ``sp.explain(prog, "e")``: for each axis of a value, where its sharding came from.

A sharded axis is followed back through shard parents (the Nx lineage of shards) to the input spec or the op
that created it, one step per op, each with the rule that carried it and the user's source line. A
replicated axis is followed back through the axes that feed it until the op that dropped the sharding
(a reduction, a contraction, a scan, a conservative fallback) or the input spec that never had one. How the
node consumes its operands (an axis taken whole, the gather or collective that pays for it) closes the story.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..errors import UnknownValueError
from ..expr.graph import (CONSTANT, PARAMETER, format_constant, format_params, value_name, where)
from ..propagation.product import MADE
from ..propagation.uses import mirrored_outputs
from ..core.types import type_string
from ..core.layouts import Sharded, is_refinement, layout_to_spec, shard_count
from ..core.steps import StepKind
from ..core.types import typed
from ..splitting import Plan
from ..splitting.ir import Move, transfers_of
from .listing import collective_lines, format_bytes, move_equation
from .products import Scope, as_plan, body_prefix, locate
from .axis_origins import (MIRRORED_OUTPUTS, Step, argument_text, asked_by_use, replicated_origin, returned_as,
                           sharded_origin, why_rule)
from .searched import explain_choice, explain_value_choice


@dataclass(frozen=True)
class AxisWhy:
    """The story of one axis: ``origin`` (where the sharding, or its absence, starts), the ``steps`` from
    there to the value, and for a replicated axis the ``reason``."""

    axis: int
    size: int
    mesh_axes: tuple[str, ...]
    origin: str
    steps: tuple[Step, ...]
    reason: str | None = None
    rows: tuple[tuple[int, int], ...] = ()  # a ranged axis: the rows each device's block holds

    def lines(self, mesh_shape) -> list[str]:
        if self.rows:
            held = " ".join(f"{a}:{b}" if b > a else "-" for a, b in self.rows)
            head = f"axis {self.axis} ({self.size}): ranged over {'*'.join(self.mesh_axes)}, each block's rows: {held}"
        elif self.mesh_axes:
            count = 1
            for name in self.mesh_axes:
                count *= mesh_shape[name]
            head = (f"axis {self.axis} ({self.size}): sharded over {'*'.join(self.mesh_axes)}, {count} blocks of "
                    f"{self.size // count}")
        else:
            head = f"axis {self.axis} ({self.size}): replicated"
        out = [head, f"  origin: {self.origin}"]
        out += [f"  -> {step}" for step in self.steps]
        if self.reason:
            out.append(f"  why: {self.reason}")
        return out


@dataclass(frozen=True)
class Explanation:
    """``sp.explain``'s answer; ``str()`` is the readable form, the fields are for tools."""

    value: int
    equation: str
    rule: str
    axes: tuple[AxisWhy, ...]
    consumes: tuple[str, ...]
    mesh_shape: Any
    partial: str | None = None  # why the value is held as a partial sum, and where it is summed
    search: tuple[str, ...] = ()  # an sp.AUTO argument: why the search chose its layout, and the others' costs

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: value names instead of ids."""
        return {
            "value": value_name(self.value), "equation": self.equation, "rule": self.rule,
            "axes": [{"axis": a.axis, "size": a.size, "mesh_axes": list(a.mesh_axes), "origin": a.origin,
                      "steps": [{"value": value_name(s.value), "axis": s.axis, "op": s.op, "rule": s.rule,
                                 "source": s.source} for s in a.steps],
                      "reason": a.reason} for a in self.axes],
            "consumes": list(self.consumes), "partial": self.partial, "search": list(self.search),
        }

    def __str__(self) -> str:
        lines = [self.equation, f"  rule: {self.rule}"]
        for axis in self.axes:
            lines += ["  " + line for line in axis.lines(self.mesh_shape)]
        if self.partial:
            lines.append(f"  partial: {self.partial}")
        lines += ["  " + line for line in self.search]
        if self.consumes:
            lines.append("  operands:")
            lines += [f"    {c}" for c in self.consumes]
        return "\n".join(lines)


@dataclass(frozen=True)
class LineExplanation:
    """``sp.explain(prog, "model.py:50")``'s answer: every value made on a line of the user's, each explained (in
    program order); ``str()`` is the readable form, iterating gives the ``Explanation``s."""

    line: str
    explanations: tuple[Explanation, ...]

    def __iter__(self):
        return iter(self.explanations)

    def __len__(self) -> int:
        return len(self.explanations)

    def to_dict(self) -> dict[str, Any]:
        return {"line": self.line, "values": [e.to_dict() for e in self.explanations]}

    def __str__(self) -> str:
        count = len(self.explanations)
        head = f"{count} value{'' if count == 1 else 's'} made at {self.line}:"
        return "\n\n".join([head, *map(str, self.explanations)])


# a source line as the listing prints it (llama.py:69), or with more of its path (examples/llama.py:69)
_SOURCE_LINE = re.compile(r"^(?P<file>[^:\s]+\.py):(?P<line>\d+)$")


def explain(prog: Any, value: Any) -> Explanation | LineExplanation:
    """Why every axis of ``value`` (a printed name such as ``"e"``, a value id, an argument's name as the listing
    prints it, ``"params['w']"``, its key path as ``jax.tree_util.keystr`` prints it, ``"[0]['w']"``, or a key of it
    the arguments share with no other, ``"w"``; an output's path, ``"out[1]"``; a path into a loop's or a cond's
    body as the listing prints it, ``"e/body/c"``) has its sharding — or every value made on a source line,
    ``"model.py:50"`` (a ``LineExplanation``); for an argument whose
    layout ``sp.AUTO`` chose, why the search chose it and what its other layouts would have cost; for a value the
    search laid out (under ``sp.AUTO`` or ``strategy="optimal"``), each layout it could be held in, solved again.

    Examples:
        >>> mesh = sp.make_mesh((4, 2), ("i", "j"))
        >>> def f(a, b):                                   # the Nx design note's example
        ...     x, y = a + b, a - b
        ...     return jnp.sum(x, axis=1)[:, None] + jnp.sum(y, axis=0)[None, :]
        >>> a, b = jnp.arange(128.0).reshape(16, 8), jnp.ones((16, 8))
        >>> prog = sp.autoshard(f, mesh=mesh, in_specs=(P("i", "j"), None), strategy="gather").trace(a, b)
        >>> print(sp.explain(prog, "e"))
        e:f32[16@i] = reduce_sum[axes=(1,)] c   # <doctest ...>:3   [stage 1]
          rule: reductions.reduction
          axis 0 (16): sharded over i, 4 blocks of 4
            origin: argument a has spec P('i', 'j'); this is its axis 0
            -> c axis 0: `add` at <doctest ...>:2 (rule elementwise.elementwise)
            -> e axis 0: `reduce_sum` at <doctest ...>:3 (rule reductions.reduction)
          operands:
            c: takes axis 1 (sharded over j) whole, as P('i',). Reductions drop sharding on the reduced axes: the
            op needs those axes whole (the split pass cuts there) and the other axes keep their sharding. Paid for
            by all_gather[j axis=1] c (64 B per device) before it, in its stage.
    """
    if isinstance(value, str) and _SOURCE_LINE.match(value.strip()):
        return _explain_line(prog, value.strip())
    plan, v, scopes = locate(prog, value)
    scope = scopes[-1] if scopes else None
    sharded, graph = plan.sharded, plan.graph
    node = graph.nodes[graph.producer[v]]
    sharding = sharded.shardings[v]
    held = returned_as(plan, v)  # (as held; or as returned, sliced further where it mirrors an argument)
    axes = []
    for axis, (size, a) in enumerate(zip(sharding.shape, sharding.axes, strict=True)):
        propagated = a.mesh_axes if isinstance(a, Sharded) else ()
        ranged = isinstance(a, Sharded) and a.span is not None
        if ranged and plan.type(v).span_of(axis) is not None:  # each device holds the rows of its block
            origin, steps = sharded_origin(plan, v, axis, a, scopes)
            rows = tuple(a.span.held(d, size) for d in range(shard_count(plan.mesh_shape, a.mesh_axes)))
            axes.append(AxisWhy(axis, size, a.mesh_axes, origin, steps, rows=rows))
        elif ranged:  # returned: a JAX array cannot be uneven
            axes.append(AxisWhy(axis, size, (), f"ranged over {'*'.join(a.mesh_axes)} where it is computed, gathered "
                                f"whole where it is returned (a JAX array cannot be uneven)", ()))
        elif held[axis] != propagated:  # the plan holds it differently (a reduce-scatter leaves it finer)
            axes.append(AxisWhy(axis, size, held[axis], _held_origin(plan, node, axis, held[axis], propagated), ()))
        elif isinstance(a, Sharded):
            origin, steps = sharded_origin(plan, v, axis, a, scopes)
            axes.append(AxisWhy(axis, size, a.mesh_axes, origin, steps))
        else:
            origin, steps, reason = replicated_origin(plan, v, axis, scopes)
            axes.append(AxisWhy(axis, size, (), origin, steps, reason))
    search = getattr(prog, "search", None)
    searched = () if search is None or scopes else explain_choice(search, graph.inputs.index(v)) \
        if v in graph.inputs else explain_value_choice(search, v)
    if not scopes and v in graph.inputs and graph.inputs.index(v) in getattr(prog, "kept", ()):
        searched = ("its spec is the layout of the array it was called with: an unannotated argument already laid "
                    "out on the mesh keeps its layout, as under jax.jit",)
    if not scopes and v in graph.inputs and graph.inputs.index(v) in getattr(prog, "declared", ()):
        searched = ("its spec is its Variable's sharding metadata (nnx.with_partitioning, as nnx.get_partition_spec "
                    "reads it): an unannotated NNX Variable not yet placed on the mesh takes it",)
    return Explanation(v, _equation(plan, node, v, scope), sharded.rules[node.id], tuple(axes),
                       tuple(_consumes(plan, node, scope)), plan.mesh_shape, _partial(plan, v, scope), searched)


def _explain_line(prog: Any, line: str) -> LineExplanation:
    """Every value the program's nodes at ``line`` (``file.py:N``, or more of its path) make, explained: a library's
    node counts at the user's line that called it."""
    graph = as_plan(prog).graph
    made = [(node, [src for src in (node.source, node.caller) if src]) for node in graph.nodes
            if node.op not in (PARAMETER, CONSTANT)]
    values = [v for node, sources in made if any(_at(src, line) for src in sources) for v in node.outputs]
    if not values:
        file = line.rsplit(":", 1)[0]
        known = sorted({place for _, sources in made for place in map(_file_and_line, sources)
                        if place is not None and place[0].endswith(file)})
        hint = f" (the lines of {file} it has: {', '.join(f'{f}:{n}' for f, n in known)})" if known else ""
        raise UnknownValueError(f"no value of this program is made at {line}{hint}")
    return LineExplanation(line, tuple(explain(prog, v) for v in values))


def _at(source: str, line: str) -> bool:
    """Whether ``source`` (a full ``path:N``) is ``line`` (its last parts)."""
    return source == line or source.endswith(("/" + line, "\\" + line))


def _file_and_line(source: str) -> tuple[str, int] | None:
    """``("llama.py", 58)`` from ``/path/to/llama.py:58``; None where it names no line."""
    path, _, number = source.rpartition(":")
    return (path.replace("\\", "/").rsplit("/", 1)[-1], int(number)) if number.isdigit() else None


def _held_origin(plan: Plan, node, axis: int, held: tuple[str, ...], propagated: tuple[str, ...]) -> str:
    was = f"sharded over {'*'.join(propagated)}" if propagated else "replicated"
    ir = plan.node_ir(node.id)
    scattered = [f for f in (ir.finishes if ir else ()) if isinstance(f, Move)
                 and f.step.kind is StepKind.PSUM_SCATTER and f.step.axis == axis]
    if scattered:
        return (f"`{node.op}` at {where(node)} is finished by a reduce-scatter "
                f"({move_equation(scattered[0])}): each device keeps only its block over {'*'.join(held)} of the sum "
                f"(propagation alone left this axis {was}; the consumers slice it anyway)")
    mirrors = mirrored_outputs(plan.sharded)
    mirror = next((mirrors[k] for v in node.outputs for k in plan.output_indices.get(v, ())
                   if k in plan.sharded.returned_sliced and k in mirrors), None)
    if mirror is not None:
        argument = plan.graph.inputs[mirror.argument]
        return (f"returned as output {mirror.output} sliced over {'*'.join(held)}, laid out like "
                f"{argument_text(plan, mirror.argument)}, {plan.sharded.spec(argument)}, whose shape it has: "
                f"each device keeps its block, nothing moved (propagation left this axis {was}; {MIRRORED_OUTPUTS})")
    return f"the plan holds this value over {'*'.join(held) or 'no mesh axis'} (propagation left this axis {was})"


def _partial(plan: Plan, v: int, scope: Scope | None) -> str | None:
    """Why ``v`` is held as a partial sum, and which collective sums it: a sum's ``psum`` waits for a later, smaller
    value (each device carries its summand through ops linear in it), or — in a loop's body — for the loop's end."""
    axes = plan.type(v).partial
    if not axes:
        return None
    graph = plan.graph
    chain, u = [], v
    while plan.type(u).partial and u not in graph.outputs and len(graph.consumers[u]) == 1:
        consumer = graph.nodes[graph.consumers[u][0]]
        chain.append(consumer)
        u = consumer.outputs[0]
    over = "*".join(axes)
    through = ", ".join(f"`{n.op}`" for n in chain[:-1])
    head = f"each device holds one summand of its block (the sum over {over} is not reduced yet)" + (
        f", carried through {through}, linear in it" if through else "")
    if plan.type(u).partial:  # inside a loop's body: a carry summed once after the loop
        of_body = f" of {scope.describe()}" if scope else ""
        return f"{head}; it is a carry{of_body} kept partial: one psum after the loop sums it, not one per iteration"
    finisher = chain[-1]
    ir = plan.node_ir(finisher.id)
    sent = sum(t.moved_bytes for f in (ir.finishes if ir else ()) for t in transfers_of(f))
    return (f"{head}; `{finisher.op}` at {where(finisher)} consumes it partial and a psum of its smaller "
            f"result sums it ({format_bytes(sent)} per device there)")


def _equation(plan: Plan, node, v: int, scope: Scope | None) -> str:
    typ = typed(v, plan.graph.avals[v], plan.type(v))
    inside = f"   [in {scope.path}: {scope.describe()}]" if scope else ""
    if node.op == PARAMETER:
        index = node.params["index"]
        return f"{typ} = body input {index}{inside}" if scope else \
            f"{typ} = argument {plan.graph.argument_names[index]}"
    if node.op == CONSTANT:
        return f"{typ} = constant {format_constant(node, plan.graph.avals[v])}{inside}"
    rhs = " ".join([node.op + format_params(node), *(value_name(u) for u in node.operands)])
    stage = plan.stage_of(node.id)
    return f"{typ} = {rhs}   # {where(node)}" + (inside or ("" if stage is None else f"   [stage {stage}]"))


def _consumes(plan: Plan, node, scope: Scope | None = None) -> list[str]:
    """How the node consumes each operand whose sharding it does not keep: which axes it takes whole and what pays
    for it (the moves the IR makes before it, or a collective that finishes its result), an operand a sum counts
    once, a conflict resolved by moving an operand, and its bodies' moves."""
    if node.op in (PARAMETER, CONSTANT):
        return []
    ir = plan.node_ir(node.id)
    out = []
    for u, need in dict.fromkeys(plan.edges(node)):
        have = plan.type(u)
        whole = [j for j, (h, w) in enumerate(zip(have.layout, need.layout, strict=True))
                 if h and not is_refinement(h, w)]
        if whole:
            taken = ", ".join(f"axis {j} (sharded over {'*'.join(have.layout[j])})" for j in whole)
            asked = any(j != MADE and node.operands[j] == u for j, _ in plan.sharded.views_of.get(node.id, ()))
            why = (asked_by_use(plan, node) if asked else None) or why_rule(node.op)
            line = f"{value_name(u)}: takes {taken} whole, as {layout_to_spec(need.layout)}. {why}"
            paid = _paid_by(plan, ir, u, scope)
            if paid:
                line += f" Paid for by {paid}."
            out.append(line)
        elif (have.span or need.span) and have.span != need.span:  # ranged rows moved into the blocks it reads
            line = (f"{value_name(u)}: read as {type_string(plan.graph.avals[u], need)}, the rows of its blocks "
                    f"(held as {type_string(plan.graph.avals[u], have)})")
            paid = _paid_by(plan, ir, u, scope)
            out.append(line + (f". Paid for by {paid}." if paid else ": cut locally"))
        if need.partial and not have.partial:
            what = "starts a carry kept a partial sum" if ir and ir.compute.bodies else "counted once in the sum"
            out.append(f"{value_name(u)}: {what} — taken on each group's first device over {'*'.join(need.partial)}, "
                       "zero on the others (every device adds its own share to it)")
    resolved = plan.sharded.reshards.get(node.id)
    if resolved is not None:
        operand = node.operands[resolved[0]]
        have, need = plan.layout(operand), plan.needs(node.id)[resolved[0]].layout
        how = _paid_by(plan, ir, operand, scope) or "a local slice"
        if node.id in plan.sharded.priced:
            why = ("moving it here is the cheapest way: producing it in that layout where it is computed would move "
                   "more, so it is a priced choice, which conflicts='error' allows")
        else:
            why = "the specs clash here; conflicts='error' refuses instead"
        out.append(f"{value_name(operand)}: moved to resolve a sharding conflict (the operands were sharded "
                   f"incompatibly; {why}): {how}, from {layout_to_spec(have)} to {layout_to_spec(need)}, the other "
                   "operand's layout")
    bodies = ir.compute.bodies if ir else None
    if bodies:
        outer = f"{scope.path}/" if scope else ""
        out += collective_lines(plan, (ir.compute,), "")
        paths = " or ".join(f"'{body_prefix(node, b.plan.body, outer)}/<value>'" for b in bodies)
        out.append(f"values inside: sp.explain(prog, {paths}) (print(prog.graph) lists them under the op)")
    collective = plan.collective(node.id)
    if collective is not None:
        reduced = ", ".join(
            f"{value_name(u)} axis {j} ({'*'.join(m)})" for u in dict.fromkeys(node.operands)
            for j, m in enumerate(plan.layout(u)) if set(m) & set(collective.mesh_axes))
        finishes = ir.finishes if ir else ()
        how = ", then ".join(move_equation(f) for f in finishes) or str(collective)
        sent = sum(t.moved_bytes for f in finishes for t in transfers_of(f))
        out.append(f"each device works on its own blocks of {reduced or 'its operands'}; {how} finishes the result "
                   f"({format_bytes(sent)} per device)")
    return out


def _paid_by(plan: Plan, ir, value: int, scope: Scope | None) -> str:
    """The moves the IR makes to bring ``value`` to the node, what they send and where they run
    (``all_gather[j axis=1] c (64 B per device) before it, in its stage``; a move made earlier, for another
    consumer, says so); empty when they send nothing."""
    moves = [m for m in (ir.moves_in if ir else ()) if m.source.value == value]
    sent = sum(t.moved_bytes for m in moves for t in transfers_of(m))
    if not any(transfers_of(m) for m in moves):
        return ""
    if scope:
        return (f"{', then '.join(move_equation(m) for m in moves)} ({format_bytes(sent)} per device) inside "
                f"{scope.describe()}, each time")
    node = ir.compute.node
    parts = []
    for m in moves:
        if m.node == node:
            parts.append(move_equation(m))
        else:
            other = plan.graph.nodes[m.node]
            parts.append(f"{move_equation(m)} (made in stage {plan.stage_running(m)} for `{other.op}` at "
                         f"{where(other)}, reused here)")
    ours = all(m.node == node for m in moves)
    return f"{', then '.join(parts)} ({format_bytes(sent)} per device){' before it, in its stage' if ours else ''}"

