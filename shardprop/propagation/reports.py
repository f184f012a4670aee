"""What propagation tells the user: one ``ReshardWarning`` per sharding conflict it resolved by moving an operand, and
one ``FallbackWarning`` per primitive that took the conservative rule — each at the user's line, with the move's
collectives and bytes as the move planner plans them (``describe_move``)."""

from __future__ import annotations

from ..errors import FallbackWarning, ReshardWarning
from ..expr.graph import PARAMETER, Graph, Node, value_name, warn_at, where
from ..core.layouts import Layout, Sharded, layout_to_spec
from ..core.moves import move_bytes, plan_move
from ..core.steps import exchanges
from ..core.types import ValueType
from ..ops import lookup
from ..ops.opdef import Trait
from .origins import trace_origin
from .product import ShardedGraph


def warn_reshards(graph: Graph, sharded: ShardedGraph, inside: str = "", chosen: frozenset[int] = frozenset()) -> None:
    """One ``ReshardWarning`` per conflict resolved, at the user's line, carrying the conflict — those inside
    loop and branch bodies too (moved there on every iteration). ``chosen`` are the arguments (flat positions)
    whose layouts the layout search chose: a conflict an axis of theirs takes part in is the search's priced
    choice, not a clash of the user's layouts, and is not warned about."""
    for node_id, bodies in sorted(sharded.bodies.items()):
        node = graph.nodes[node_id]
        for body in bodies:
            inside_body = f" inside the {body.name} of `{node.op}` at {where(node)}" + \
                ("" if not body.carries else ", on every iteration")
            warn_reshards(body.sharded.graph, body.sharded, inside_body)
    for node_id, (operand, message) in sorted(sharded.reshards.items()):
        node = graph.nodes[node_id]
        if node_id in sharded.priced or _laid_out_by(sharded, node, chosen):  # a move chosen as the cheapest way
            continue
        if not _the_users_clash(sharded, node, operand):  # shardprop's own layouts met: its choice, made silently
            continue
        moved = node.operands[operand]
        have, need = sharded.layout(moved), sharded.needs[node_id][operand]
        aval = sharded.graph.avals[moved]
        how, nbytes = describe_move(aval, have, need, sharded.mesh_shape)
        text = (f"shardprop: resolved a sharding conflict in `{node.op}` at "
                f"{where(node)}{inside} by moving operand {operand} "
                f"({value_name(moved)}, "
                f"{aval}): {how} to the other operand's layout, {layout_to_spec(need)}, ~{nbytes:.0f} B per device "
                f"(conflicts='error' refuses instead)\n{message}")
        warn_at(node, text, ReshardWarning)


def _the_users_clash(sharded: ShardedGraph, node: Node, operand: int) -> bool:
    """Whether the layouts that clash at ``node`` are all the user's: every sharded axis of its operands on a mesh
    axis the move of ``operand`` changes traces back to an argument's spec or a sharding constraint. An axis an op
    created and laid out as it met (a ``one_hot``'s iota, a causal mask, a mean's gradient broadcast adopting a
    layout) is shardprop's own choice: a clash it takes part in is resolved without a ``ReshardWarning``; and an update
    moved to the layout of the buffer it is written into (``Trait.WRITES``) is what writing it means."""
    if operand and Trait.WRITES in lookup(node.op).traits:
        return False
    have, need = sharded.layout(node.operands[operand]), sharded.needs[node.id][operand]
    changed = {name for a, b in zip(have, need, strict=True) if a != b for name in (*a, *b)}
    for value in node.operands:
        for axis, a in enumerate(sharded.shardings[value].axes):
            if isinstance(a, Sharded) and changed & set(a.mesh_axes):
                origin = trace_origin(sharded.graph, sharded.shardings, value, axis).node
                if origin.op != PARAMETER and Trait.ANNOTATION not in lookup(origin.op).traits:
                    return False
    return True


def _laid_out_by(sharded: ShardedGraph, node: Node, arguments: frozenset[int]) -> bool:
    """Whether a sharded axis of one of ``node``'s operands comes from one of ``arguments`` (flat positions)."""
    if not arguments:
        return False
    for value in node.operands:
        for axis, a in enumerate(sharded.shardings[value].axes):
            if isinstance(a, Sharded):
                origin = trace_origin(sharded.graph, sharded.shardings, value, axis)
                if origin.is_argument and origin.node.params["index"] in arguments:
                    return True
    return False


def describe_move(aval, have: Layout, need: Layout, mesh_shape) -> tuple[str, float]:
    """How a value of ``aval`` held as ``have`` is moved to ``need`` (``an all-to-all over i from axis 1 to axis 0
    moves it``), and the bytes one device sends: the move planner's plan, as the program runs it."""
    steps = plan_move(aval.shape, aval.dtype, ValueType(have), ValueType(need), mesh_shape)
    sent = [s for s in steps if exchanges(s, mesh_shape)]
    how = f"{', then '.join(map(str, sent))} moves it" if sent else "each device slices it locally"
    return how, move_cost(aval, have, need, mesh_shape)


def move_cost(aval, have: Layout, need: Layout, mesh_shape) -> float:
    """Bytes one device sends to bring a value of ``aval`` from ``have`` to ``need``."""
    return move_bytes(aval.shape, aval.dtype, ValueType(have), ValueType(need), mesh_shape)


def warn_fallbacks(graph: Graph, fallbacks, causes=None) -> None:
    """One ``FallbackWarning`` per primitive that fell back in this program, attributed to the user's line
    of its first use (so that Python's warning filters, and the printed location, name the user's code)."""
    uses: dict[str, list[Node]] = {}
    for node_id in sorted(fallbacks):
        node = graph.nodes[node_id]
        uses.setdefault(node.op, []).append(node)
    for name, nodes in sorted(uses.items()):
        first = nodes[0]
        more = "" if len(nodes) == 1 else f" (and {len(nodes) - 1} more use(s))"
        cause = (causes or {}).get(first.id)
        message = (f"shardprop: no sharding rule for primitive `{name}` at {where(first)}{more} "
                   f"({cause or 'or none that applies here'}); using the conservative rule (operands gathered, "
                   "result replicated)")
        warn_at(first, message, FallbackWarning)
