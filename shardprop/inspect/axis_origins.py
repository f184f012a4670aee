"""Where an axis's sharding came from, as ``sp.explain`` tells it: a sharded axis followed back through its shard
parents to the input spec or the op that created it; a replicated axis followed back through the axes feeding it to
the op that dropped the sharding (with the rule's own why) or the input spec that never had one."""

from __future__ import annotations

from dataclasses import dataclass

from ..expr.graph import CONSTANT, PARAMETER, argument_label, short_source, value_name, where
from ..ops import lookup
from ..ops.fallback import fallback_for
from ..ops.opdef import Family, Trait
from ..propagation.origins import trace_origin
from ..propagation.product import MADE, RETURNED
from ..propagation.uses import Mirror, mirrored_outputs
from ..core.layouts import Layout, Sharded, layout_to_spec
from ..splitting import Plan
from ..core.boxes import LineageContext, full_box, hull
from .lineage.walk import seeded_dependencies
from .products import Scope


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


def argument_text(plan: Plan, index: int) -> str:
    """``argument params['w'] (d)``: an argument leaf as the user knows it (its parameter and key path) and its
    handle in the listing."""
    return argument_label(plan.graph, index)


def body_input_text(plan: Plan, scopes: tuple[Scope, ...], index: int) -> str:
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


def sharded_origin(plan: Plan, v: int, axis: int, a: Sharded,
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
        mirror = mirror_of(plan, v) or next(iter(mirrors.values()), None)
        if mirror is None:
            where_from = ("from a returned value, asked for in the layout of an argument it mirrors "
                          f"({MIRRORED_OUTPUTS})")
        else:
            argument = plan.graph.inputs[mirror.argument]
            where_from = (f"from output {mirror.output}, returned laid out like {argument_text(plan, mirror.argument)} "
                          f"({sharded.spec(argument)}), whose shape it has ({MIRRORED_OUTPUTS})")
    else:
        node = plan.graph.nodes[met]
        asked = asked_by_use(plan, node)
        where_from = (f"from the sharding constraint at {where(node)}" if Trait.ANNOTATION in lookup(node.op).traits
                      else f"as {asked}" if asked is not None
                      else f"where it meets a sharded operand of `{node.op}` at {where(node)}")
    if origin.is_argument:
        index = origin.node.params["index"]
        if scopes:
            text = f"{body_input_text(plan, scopes, index)}; this is its axis {origin.axis}"
        elif sharded.is_unannotated_input(root):
            text = (f"{argument_text(plan, index)} is unannotated; its axis {origin.axis} adopted "
                    f"{names} "
                    f"{where_from}")
        else:
            text = (f"{argument_text(plan, index)} has spec {sharded.spec(root)}; this is its axis "
                    f"{origin.axis}")
    elif asked_by_use(plan, origin.node) is not None:
        text = asked_by_use(plan, origin.node)
    else:
        text = (f"`{origin.node.op}` at {where(origin.node)} created {value_name(root)} axis "
                f"{origin.axis}, unannotated; it adopted {names} {where_from}")
    return text, steps


def returned_as(plan: Plan, value: int) -> Layout:
    """The layout ``value`` is explained in: as held, or — returned as an output sliced further (it mirrors an
    argument) — as the first such output comes back."""
    outputs = plan.output_indices.get(value, ())
    sliced = [k for k in outputs if k in plan.sharded.returned_sliced]
    return plan.output_type(sliced[0]).layout if sliced else plan.type(value).layout


def mirror_of(plan: Plan, value: int) -> Mirror | None:
    """The argument a returned ``value`` mirrors (the first output it is returned as that mirrors one), or None."""
    mirrors = mirrored_outputs(plan.sharded)
    return next((mirrors[k] for k, out in enumerate(plan.graph.outputs) if out == value and k in mirrors), None)


MIRRORED_OUTPUTS = ("an output shaped like an argument — a gradient, an updated parameter or state — is returned in "
                    "that argument's layout wherever that moves no more")


def asked_by_use(plan: Plan, node) -> str | None:
    """Why ``node`` takes an operand in another layout than it is held in because a later use asked (the backward
    pass, propagation/uses.py): which operand, how, which use and what that saves; None when no use asked."""
    sharded = plan.sharded
    views = sharded.views_of.get(node.id, [])
    if not views:
        return None
    use = views[0][1].use
    if views[0][0] == MADE:  # made from no operand (an iota), in the layout its use asks
        view = views[0][1]
        made = (f"`{node.op}` at {where(node)} makes {value_name(node.outputs[0])} as {layout_to_spec(view.layout)} "
                f"(its created axes would have adopted {layout_to_spec(view.was)})")
        if isinstance(use, Mirror):
            return (f"{made}, backward from output {use.output}: it has the shape of "
                    f"{argument_text(plan, use.argument)} and is returned laid out like it ({MIRRORED_OUTPUTS})")
        reader = plan.graph.nodes[use]
        return (f"{made}, backward from a use: `{reader.op}` at {where(reader)} needs it laid out so, and made so it "
                "is moved nowhere")
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
    if views[0][1].exact:  # the layout search's solution, realized (search/realize.py)
        return (f"`{node.op}` at {where(node)} takes {', '.join(taken)}: the layout solve's choice, the plan cheapest "
                "over every value's layout together (sp.explain of this node's value lists its other layouts)")
    if isinstance(use, Mirror):
        argument = plan.graph.inputs[use.argument]
        return (f"`{node.op}` at {where(node)} takes {', '.join(taken)}, backward from output {use.output}: it has "
                f"the shape of {argument_text(plan, use.argument)} and is returned laid out "
                f"like it, {plan.sharded.spec(argument)}, which this moves no more for ({MIRRORED_OUTPUTS})")
    if use == node.id:  # a lookup's other way (propagation/uses.py: lookup_alternatives)
        return (f"`{node.op}` at {where(node)} takes {', '.join(taken)}: its indices' batch and the table's whole "
                f"window share those mesh axes, and the plan moves less with the indices gathered and the window kept "
                f"sharded than with the table gathered (both were priced)")
    use = plan.graph.nodes[use]
    return (f"`{node.op}` at {where(node)} takes {', '.join(taken)}, backward from a use: `{use.op}` at {where(use)} "
            "needs what is computed from it laid out so, and taking it so here moves no more than moving the result "
            "there would")


def replicated_origin(plan: Plan, v: int, axis: int,
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
                origin = body_input_text(plan, scopes, index)
                reason = (f"it arrives with axis {axis} whole: explain the operand it is passed (outside the body) "
                          "for why — in a loop, or the carry's layout, which the loop keeps the same on every "
                          "iteration")
            elif sharded.is_unannotated_input(v):
                origin = f"{argument_text(plan, index)} is unannotated"
                reason = (f"its axis {axis} met no sharding, or several different ones, so it stays replicated "
                          "(replicated is compatible with every sharding)")
            else:
                origin = f"{argument_text(plan, index)} has spec {sharded.spec(v)}"
                reason = f"the spec does not shard its axis {axis}"
            break
        if node.op == CONSTANT:
            origin, reason = f"{here} is a constant", "constants are replicated on every device"
            break
        step = Step(v, axis, node.op, sharded.rules[node.id], node.source)
        if node.id in sharded.fallbacks:
            origin, reason = f"`{node.op}` at {where(node)}", why_rule(node.op, fallback=True,
                                                                            cause=sharded.fallback_causes.get(node.id))
            steps.append(step)
            break
        feeding = feeding_axes(plan, node, v, axis)
        # Propagation's layouts on purpose: this walk tells why propagation left the axis replicated (the plan
        # may hold an operand differently afterwards; the listing and `consumes` show that).
        dropped = [(u, j) for u, j in feeding if sharded.layout(u)[j]]
        if dropped:
            u, j = dropped[0]
            origin = (f"`{node.op}` at {where(node)} takes {value_name(u)} axis {j} (sharded over "
                      f"{'*'.join(sharded.layout(u)[j])}) and leaves {here} replicated")
            reason = asked_by_use(plan, node) or _contraction_reason(plan, node, v, axis, u, j) or why_rule(node.op)
            steps.append(step)
            break
        if not feeding:
            origin = f"`{node.op}` at {where(node)} created {here}"
            reason = asked_by_use(plan, node) or (
                "a new axis starts unannotated; it met no sharding, or several different ones, so it stays "
                "replicated" if lookup(node.op).lineage_exact else why_rule(node.op))
            steps.append(step)
            break
        steps.append(step)
        constant_free = [(u, j) for u, j in feeding if graph.nodes[graph.producer[u]].op != CONSTANT]
        v, axis = (constant_free or feeding)[0]
    return origin, tuple(reversed(steps)), reason


def _contraction_reason(plan: Plan, node, v: int, axis: int, u: int, j: int) -> str | None:
    """Why a contraction leaves axis ``axis`` of its result ``v`` replicated where operand ``u``'s axis ``j``, which
    it keeps there, is sharded: the axes it sums over and the one it keeps named (its record's factors: a factor
    both operands carry is a batch axis where kept), and the mesh axis's other use (a mesh axis shards one axis of a
    tensor) or its rule's choice to take it whole. None for an op of another family."""
    record, graph, sharded = lookup(node.op), plan.graph, plan.sharded
    shapes = [graph.avals[w].shape for w in node.operands]
    factors = record.factors(node, shapes) if record.family is Family.CONTRACTION and record.factors else None
    if factors is None:
        return None
    kept = {edge for out in range(len(graph.avals[v].shape)) for edge in feeding_axes(plan, node, v, out)}
    summed = [f"{value_name(w)} axis {k}" for w, shape in zip(node.operands, shapes, strict=True)
              for k in range(len(shape)) if (w, k) not in kept and shape[k] > 1]
    position = node.operands.index(u)
    shared = factors[position][j] in {f for k, axes in enumerate(factors) if k != position for f in axes}
    text = (f"`{node.op}` sums over {' and '.join(summed) or 'no axis'} and keeps the others; {value_name(v)} axis "
            f"{axis} is {value_name(u)} axis {j}, {'a batch axis' if shared else 'a kept axis'}, sharded over "
            f"{'*'.join(sharded.layout(u)[j])} there")
    mesh_axes = set(sharded.layout(u)[j])
    taken = [(k, m) for k, m in enumerate(sharded.layout(v)) if mesh_axes & set(m)]
    if taken:
        k, m = taken[0]
        return (f"{text}, but {'*'.join(m)} shards {value_name(v)} axis {k} (a mesh axis shards at most one axis of a "
                f"tensor): {value_name(u)} is taken whole there")
    return f"{text}; its rule takes it whole here (the operands: {_operand_specs(plan, node)})"


def _operand_specs(plan: Plan, node) -> str:
    """``x P('i',), w P(None, 'j')``: the operands of ``node`` with their specs."""
    return ", ".join(f"{value_name(u)} {layout_to_spec(plan.sharded.layout(u))}" for u in node.operands)


def feeding_axes(plan: Plan, node, v: int, axis: int) -> list[tuple[int, int]]:
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


def why_rule(op: str, fallback: bool = False, cause: str | None = None) -> str:
    """The first sentence of the rule's docstring (or its family's): the why lives next to the rule."""
    record = lookup(op)
    if fallback or record.is_fallback:
        return fallback_for(op).why + f" ({cause or 'no proven rule for this op here'})"
    return record.why
