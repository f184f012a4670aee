"""Why — ``sp.explain(prog, "e")``: for each axis of a value, where its sharding came from.

A sharded axis is followed back through shard parents (the Nx lineage of shards) to the input spec or the op
that created it, one step per op, each with the rule that carried it and the user's source line. A
replicated axis is followed back through the axes that feed it until the op that dropped the sharding
(a reduction, a contraction, a scan, a conservative fallback) or the input spec that never had one. How the
node consumes its operands (an axis taken whole, the gather or collective that pays for it) closes the story.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..expr.graph import (CONSTANT, PARAMETER, argument_label, format_constant, format_params, short_source,
                          value_name, where)
from ..ops import lookup
from ..ops.fallback import fallback_for
from ..propagation.origins import trace_origin
from ..propagation.product import RETURNED
from ..propagation.uses import Mirror, mirrored_outputs
from ..core.types import type_string
from ..core.layouts import Layout, Sharded, is_refinement, layout_to_spec, shard_count
from ..core.steps import StepKind
from ..core.types import typed
from ..splitting import Plan
from ..splitting.ir import Move, transfers_of
from ..core.boxes import LineageContext, full_box, hull
from .lineage.walk import seeded_dependencies
from .listing import collective_lines, format_bytes, move_equation
from .products import Scope, body_prefix, locate
from .searched import explain_choice


@dataclass(frozen=True)
class Step:
    """Op ``op`` (rule ``rule``, at ``source``) produced axis ``axis`` of ``value``."""

    value: int
    axis: int
    op: str
    rule: str
    source: str | None

    def __str__(self) -> str:
        at = short_source(self.source, "an unknown line")
        return f"{value_name(self.value)} axis {self.axis}: `{self.op}` at {at} (rule {self.rule})"


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


def explain(prog: Any, value: Any) -> Explanation:
    """Why every axis of ``value`` (a printed name such as ``"e"``, a value id, an argument's name as the listing
    prints it, ``"params['w']"``, or its key path as ``jax.tree_util.keystr`` prints it, ``"[0]['w']"``, or a path
    into a loop's or a cond's body as the listing prints it, ``"e/body/c"``) has its sharding; for an argument whose
    layout ``sp.AUTO`` chose, why the search chose it and what its other layouts would have cost.

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
    plan, v, scopes = locate(prog, value)
    scope = scopes[-1] if scopes else None
    sharded, graph = plan.sharded, plan.graph
    node = graph.nodes[graph.producer[v]]
    sharding = sharded.shardings[v]
    held = _returned_as(plan, v)  # (as held; or as returned, sliced further where it mirrors an argument)
    axes = []
    for axis, (size, a) in enumerate(zip(sharding.shape, sharding.axes, strict=True)):
        propagated = a.mesh_axes if isinstance(a, Sharded) else ()
        ranged = isinstance(a, Sharded) and a.span is not None
        if ranged and plan.type(v).span_of(axis) is not None:  # each device holds the rows of its block
            origin, steps = _sharded_origin(plan, v, axis, a, scopes)
            rows = tuple(a.span.held(d, size) for d in range(shard_count(plan.mesh_shape, a.mesh_axes)))
            axes.append(AxisWhy(axis, size, a.mesh_axes, origin, steps, rows=rows))
        elif ranged:  # returned: a JAX array cannot be uneven
            axes.append(AxisWhy(axis, size, (), f"ranged over {'*'.join(a.mesh_axes)} where it is computed, gathered "
                                f"whole where it is returned (a JAX array cannot be uneven)", ()))
        elif held[axis] != propagated:  # the plan holds it differently (a reduce-scatter leaves it finer)
            axes.append(AxisWhy(axis, size, held[axis], _held_origin(plan, node, axis, held[axis], propagated), ()))
        elif isinstance(a, Sharded):
            origin, steps = _sharded_origin(plan, v, axis, a, scopes)
            axes.append(AxisWhy(axis, size, a.mesh_axes, origin, steps))
        else:
            origin, steps, reason = _replicated_origin(plan, v, axis, scopes)
            axes.append(AxisWhy(axis, size, (), origin, steps, reason))
    search = getattr(prog, "search", None)
    searched = () if search is None or scopes or v not in graph.inputs else \
        explain_choice(search, graph.inputs.index(v))
    if not scopes and v in graph.inputs and graph.inputs.index(v) in getattr(prog, "kept", ()):
        searched = ("its spec is the layout of the array it was called with: an unannotated argument already laid "
                    "out on the mesh keeps its layout, as under jax.jit",)
    if not scopes and v in graph.inputs and graph.inputs.index(v) in getattr(prog, "declared", ()):
        searched = ("its spec is its Variable's sharding metadata (nnx.with_partitioning, as nnx.get_partition_spec "
                    "reads it): an unannotated NNX Variable not yet placed on the mesh takes it",)
    return Explanation(v, _equation(plan, node, v, scope), sharded.rules[node.id], tuple(axes),
                       tuple(_consumes(plan, node, scope)), plan.mesh_shape, _partial(plan, v, scope), searched)


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
                f"{_argument(plan, mirror.argument)}, {plan.sharded.spec(argument)}, whose shape it has: "
                f"each device keeps its block, nothing moved (propagation left this axis {was}; {_MIRRORS})")
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


def _argument(plan: Plan, index: int) -> str:
    """``argument params['w'] (d)``: an argument leaf as the user knows it (its parameter and key path) and its
    handle in the listing."""
    return argument_label(plan.graph, index)


def _body_input(plan: Plan, scopes: tuple[Scope, ...], index: int) -> str:
    """What body input ``index`` is, in the enclosing program's names: ``body input 1 (b) is carry 0 of `scan`
    (it starts as f, then is the previous iteration's)``."""
    scope = scopes[-1]
    outer = "" if len(scopes) == 1 else scopes[-2].path + "/"
    node, body = scope.node, scope.body
    v = plan.graph.inputs[index]
    operand = f"{outer}{value_name(node.operands[body.operands[index]])}"
    carry = next((c for c in body.carries if c.body_input == index), None)
    if carry is not None:
        what = f"carry {carry.output} of `{node.op}` (it starts as {operand}, then is the previous iteration's)"
    elif index in body.sliced:
        what = f"one iteration's slice of {operand}, the `{node.op}`'s xs"
    else:
        what = f"{operand}, operand {body.operands[index]} of `{node.op}`"
    return f"body input {index} ({value_name(v)}) is {what}, held as {layout_to_spec(plan.layout(v))}"


def _sharded_origin(plan: Plan, v: int, axis: int, a: Sharded,
                    scopes: tuple[Scope, ...] = ()) -> tuple[str, tuple[Step, ...]]:
    """The origin walk (shard parents back to a shard without parents), told as steps."""
    sharded = plan.sharded
    origin = trace_origin(plan.graph, sharded.shardings, v, axis)
    steps = tuple(Step(u, k, n.op, sharded.rules[n.id], n.source) for u, k, n in origin.steps)
    root, names = origin.value, "*".join(a.mesh_axes)
    met = sharded.adoptions.get((root, origin.axis))
    if met is None:
        where_from = "from the ops it meets"
    elif met == RETURNED:  # asked for by a returned value that mirrors an argument (propagation/uses.py)
        mirrors = mirrored_outputs(sharded)
        mirror = _mirror_of(plan, v) or next(iter(mirrors.values()), None)
        if mirror is None:
            where_from = f"from a returned value, asked for in the layout of an argument it mirrors ({_MIRRORS})"
        else:
            argument = plan.graph.inputs[mirror.argument]
            where_from = (f"from output {mirror.output}, returned laid out like {_argument(plan, mirror.argument)} "
                          f"({sharded.spec(argument)}), whose shape it has ({_MIRRORS})")
    else:
        node = plan.graph.nodes[met]
        asked = _asked_by_use(plan, node)
        where_from = (f"from the sharding constraint at {where(node)}" if node.op == "sharding_constraint"
                      else f"as {asked}" if asked is not None
                      else f"where it meets a sharded operand of `{node.op}` at {where(node)}")
    if origin.is_argument:
        index = origin.node.params["index"]
        if scopes:
            text = f"{_body_input(plan, scopes, index)}; this is its axis {origin.axis}"
        elif sharded.is_unannotated_input(root):
            text = (f"{_argument(plan, index)} is unannotated; its axis {origin.axis} adopted "
                    f"{names} "
                    f"{where_from}")
        else:
            text = (f"{_argument(plan, index)} has spec {sharded.spec(root)}; this is its axis "
                    f"{origin.axis}")
    elif _asked_by_use(plan, origin.node) is not None:
        text = _asked_by_use(plan, origin.node)
    else:
        text = (f"`{origin.node.op}` at {where(origin.node)} created {value_name(root)} axis "
                f"{origin.axis}, unannotated; it adopted {names} {where_from}")
    return text, steps


def _returned_as(plan: Plan, value: int) -> Layout:
    """The layout ``value`` is explained in: as held, or — returned as an output sliced further (it mirrors an
    argument) — as the first such output comes back."""
    outputs = plan.output_indices.get(value, ())
    sliced = [k for k in outputs if k in plan.sharded.returned_sliced]
    return plan.output_type(sliced[0]).layout if sliced else plan.type(value).layout


def _mirror_of(plan: Plan, value: int) -> Mirror | None:
    """The argument a returned ``value`` mirrors (the first output it is returned as that mirrors one), or None."""
    mirrors = mirrored_outputs(plan.sharded)
    return next((mirrors[k] for k, out in enumerate(plan.graph.outputs) if out == value and k in mirrors), None)


_MIRRORS = ("an output shaped like an argument — a gradient, an updated parameter or state — is returned in that "
            "argument's layout wherever that moves no more")


def _asked_by_use(plan: Plan, node) -> str | None:
    """Why ``node`` takes an operand in another layout than it is held in because a later use asked (the backward
    pass, propagation/uses.py): which operand, how, which use and what that saves; None when no use asked."""
    sharded = plan.sharded
    views = [(j, view) for (n, j), view in sharded.views.items() if n == node.id]
    if not views:
        return None
    taken = []
    for j, view in views:
        u = node.operands[j]
        gained = {m: k for k, (now, was) in enumerate(zip(view.layout, view.was, strict=True)) for m in now
                  if m not in was}
        lost = {m: k for k, (now, was) in enumerate(zip(view.layout, view.was, strict=True)) for m in was
                if m not in now}
        changes = [f"{m} moved from axis {lost[m]} to axis {gained[m]}, an all-to-all" for m in gained if m in lost]
        changes += [f"axis {k} sliced over {m}" for m, k in gained.items() if m not in lost]
        changes += [f"axis {k} gathered over {m}" for m, k in lost.items() if m not in gained]
        taken.append(f"{value_name(u)} ({', '.join(changes)})")
    use = views[0][1].use
    if isinstance(use, Mirror):
        argument = plan.graph.inputs[use.argument]
        return (f"`{node.op}` at {where(node)} takes {', '.join(taken)}, backward from output {use.output}: it has "
                f"the shape of {_argument(plan, use.argument)} and is returned laid out "
                f"like it, {plan.sharded.spec(argument)}, which this moves no more for ({_MIRRORS})")
    if use == node.id:  # a lookup's other way (propagation/uses.py: lookup_alternatives)
        return (f"`{node.op}` at {where(node)} takes {', '.join(taken)}: its indices' batch and the table's whole "
                f"window share those mesh axes, and the plan moves less with the indices gathered and the window kept "
                f"sharded than with the table gathered (both were priced)")
    use = plan.graph.nodes[use]
    return (f"`{node.op}` at {where(node)} takes {', '.join(taken)}, backward from a use: `{use.op}` at {where(use)} "
            "needs what is computed from it laid out so, and taking it so here moves no more than moving the result "
            "there would")


def _replicated_origin(plan: Plan, v: int, axis: int,
                       scopes: tuple[Scope, ...] = ()) -> tuple[str, tuple[Step, ...], str]:
    """Walk back through the axes that feed this one until the op that dropped a sharding, or its start."""
    sharded, graph = plan.sharded, plan.graph
    steps: list[Step] = []
    while True:
        node = graph.nodes[graph.producer[v]]
        size = graph.avals[v].shape[axis]
        here = f"{value_name(v)} axis {axis}"
        if size == 1:
            origin, reason = f"{here} has size 1", "an axis of size 1 has nothing to shard"
            break
        if node.op == PARAMETER:
            index = node.params["index"]
            if scopes:
                origin = _body_input(plan, scopes, index)
                reason = (f"it arrives with axis {axis} whole: explain the operand it is passed (outside the body) "
                          "for why — in a loop, or the carry's layout, which the loop keeps the same on every "
                          "iteration")
            elif sharded.is_unannotated_input(v):
                origin = f"{_argument(plan, index)} is unannotated"
                reason = (f"its axis {axis} met no sharding, or several different ones, so it stays replicated "
                          "(replicated is compatible with every sharding)")
            else:
                origin = f"{_argument(plan, index)} has spec {sharded.spec(v)}"
                reason = f"the spec does not shard its axis {axis}"
            break
        if node.op == CONSTANT:
            origin, reason = f"{here} is a constant", "constants are replicated on every device"
            break
        step = Step(v, axis, node.op, sharded.rules[node.id], node.source)
        if node.id in sharded.fallbacks:
            origin, reason = f"`{node.op}` at {where(node)}", _why_rule(node.op, fallback=True,
                                                                            cause=sharded.fallback_causes.get(node.id))
            steps.append(step)
            break
        feeding = _feeding_axes(plan, node, v, axis)
        # Propagation's layouts on purpose: this walk tells why propagation left the axis replicated (the plan
        # may hold an operand differently afterwards; the listing and `consumes` show that).
        dropped = [(u, j) for u, j in feeding if sharded.layout(u)[j]]
        if dropped:
            u, j = dropped[0]
            origin = (f"`{node.op}` at {where(node)} takes {value_name(u)} axis {j} (sharded over "
                      f"{'*'.join(sharded.layout(u)[j])}) and leaves {here} replicated")
            reason = _asked_by_use(plan, node) or _why_rule(node.op)
            steps.append(step)
            break
        if not feeding:
            origin = f"`{node.op}` at {where(node)} created {here}"
            reason = ("a new axis starts unannotated; it met no sharding, or several different ones, so it stays "
                      "replicated" if lookup(node.op).lineage_exact else _why_rule(node.op))
            steps.append(step)
            break
        steps.append(step)
        constant_free = [(u, j) for u, j in feeding if graph.nodes[graph.producer[u]].op != CONSTANT]
        v, axis = (constant_free or feeding)[0]
    return origin, tuple(reversed(steps)), reason


def _feeding_axes(plan: Plan, node, v: int, axis: int) -> list[tuple[int, int]]:
    """The operand axes an output axis is computed from: the operand axes that narrow when only the first
    element of that output axis is asked for (read off the lineage rule of the op); where none narrows (an element
    of a sort reads its whole axis), the operand axes at the same position and of the same size."""
    avals = plan.graph.avals
    k = node.outputs.index(v)
    shape = avals[v].shape
    probe = full_box(shape)[:axis] + ((0, 1),) + full_box(shape)[axis + 1:]
    ctx = LineageContext(tuple(avals[u].shape for u in node.operands), tuple(avals[o].shape for o in node.outputs),
                         seeded_dependencies)
    feeding = []
    rule = lookup(node.op).lineage
    # against what the whole output reads: a slice reads part of its sliced axis whichever output axis is probed
    whole = rule(ctx, full_box(shape), k, **node.params)
    for u, boxes, everything in zip(node.operands, rule(ctx, probe, k, **node.params), whole, strict=True):
        if not boxes:
            continue
        bounds, widest = hull(boxes), (hull(everything) if everything else None)
        feeding += [(u, j) for j, ((s, e), n) in enumerate(zip(bounds, avals[u].shape, strict=True))
                    if n > 1 and (s, e) != (widest[j] if widest else (0, n))]
    if not feeding:
        feeding = [(u, axis) for u in node.operands
                   if len(avals[u].shape) == len(shape) and avals[u].shape[axis] == shape[axis] > 1]
    return feeding


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
            asked = any(node.operands[j] == u for n, j in plan.sharded.views if n == node.id)
            why = (_asked_by_use(plan, node) if asked else None) or _why_rule(node.op)
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


def _why_rule(op: str, fallback: bool = False, cause: str | None = None) -> str:
    """The first sentence of the rule's docstring (or its family's): the why lives next to the rule."""
    record = lookup(op)
    if fallback or record.is_fallback:
        return fallback_for(op).why + f" ({cause or 'no proven rule for this op here'})"
    return record.why

