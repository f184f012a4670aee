"""Where a sharded axis came from: the one walk back through shard parents.

Every shard records the shards it was computed from, so the sharding of any axis can be followed back to a
shard without parents — an argument's spec, or an axis an op created and that adopted what it met — one op
at a time. Conflict errors say where each operand's sharding came from with it, and ``sp.explain`` tells the
story of an axis with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..expr.graph import CONSTANT, PARAMETER, Graph, Node
from ..core.layouts import Shard, Sharded, TensorSharding


@dataclass(frozen=True)
class Origin:
    """Axis ``axis`` of ``value`` was laid out by ``node`` (an argument, or the op that created it); ``steps``
    are the ``(value, axis, node)`` that carried it from there, in program order, ending at the value asked
    about (empty when the value is the root itself)."""

    value: int
    axis: int
    node: Node
    steps: tuple[tuple[int, int, Node], ...]

    @property
    def is_argument(self) -> bool:
        return self.node.op == PARAMETER


def holds(sharding: TensorSharding, shard: Shard) -> bool:
    """True when ``shard`` is one of the shards of ``sharding`` (on the axis it belongs to)."""
    a = sharding.axes[shard.axis] if shard.axis < len(sharding.axes) else None
    return isinstance(a, Sharded) and any(s is shard for s in a.shards)


def trace_origin(graph: Graph, shardings: Sequence[TensorSharding], value: int, axis: int) -> Origin:
    """Follow the first shard of ``value``'s ``axis`` (which must be sharded) through its first parents back
    to a shard without parents. ``shardings[v]`` is the sharding of value ``v`` (those after ``value`` are not
    read, so a pass may ask in the middle of a walk)."""
    a = shardings[value].axes[axis]
    assert isinstance(a, Sharded), "trace_origin follows a sharded axis"
    shard, v, steps = a.shards[0], value, []
    while True:
        node = graph.nodes[graph.producer[v]]
        if not shard.parents or node.op in (PARAMETER, CONSTANT):
            break
        parent = shard.parents[0]
        holder = next((u for u in node.operands if holds(shardings[u], parent)), None)
        if holder is None:
            break
        steps.append((v, axis, node))
        v, axis, shard = holder, parent.axis, parent
    return Origin(v, axis, graph.nodes[graph.producer[v]], tuple(reversed(steps)))
