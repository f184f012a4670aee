"""What inspection reads: the products of the passes, whichever one the user hands over."""

from __future__ import annotations

from typing import Any

from ..errors import OptionError
from ..expr.graph import value_name
from ..propagation import ShardedGraph
from ..splitting import Plan


def products(prog: Any) -> tuple[ShardedGraph, Plan | None]:
    """``(sharded graph, plan or None)`` from a :class:`~shardprop.Program`, a :class:`~shardprop.Plan` or a
    :class:`~shardprop.ShardedGraph`."""
    plan = getattr(prog, "plan", None)
    if isinstance(plan, Plan):
        return plan.sharded, plan
    if isinstance(prog, Plan):
        return prog.sharded, prog
    if isinstance(prog, ShardedGraph):
        staged_plan = getattr(prog, "plan", None)
        return prog, staged_plan if isinstance(staged_plan, Plan) else None
    raise OptionError(f"expected a Program, Plan or ShardedGraph to inspect, got {type(prog).__name__}; "
                      "use fs.trace(*args) to get the Program of an autoshard function")


def resolve_value(sharded: ShardedGraph, ref: Any) -> int:
    """A value id from what the user typed: its printed name (``"c"``) or its id."""
    count = len(sharded.graph.avals)
    if isinstance(ref, bool):
        ref = None  # not a value id
    if isinstance(ref, int) and 0 <= ref < count:
        return ref
    if isinstance(ref, str):
        name = ref.strip()
        value = _value_of_name(name)
        if value is not None and value < count:
            return value
    raise OptionError(f"no value {ref!r} in this graph: give a name as printed in the listing ('a' ... "
                      f"{value_name(count - 1)!r}) or a value id below {count}")


def _value_of_name(name: str) -> int | None:
    """Inverse of :func:`value_name` (``a``…``z``, ``ba``, ``bb``…)."""
    if not name or not name.isalpha() or not name.islower():
        return None
    value = 0
    for ch in name:
        value = value * 26 + (ord(ch) - ord("a"))
    return value if value_name(value) == name else None


def layout_of(sharded: ShardedGraph, plan: Plan | None, value: int):
    """The layout ``value`` is held in: the plan's (a reduce-scatter may hold it finer) or propagation's."""
    return plan.layout(value) if plan is not None else sharded.layout(value)
