"""What inspection reads: one :class:`~shardprop.Plan`, whichever product the user hands over."""

from __future__ import annotations

from typing import Any

from ..errors import OptionError
from ..expr.graph import value_name
from ..propagation import ShardedGraph
from ..splitting import Plan


def as_plan(prog: Any) -> Plan:
    """The plan behind a :class:`~shardprop.Program` (or its ``prog.graph``), a :class:`~shardprop.Plan`, or
    a :class:`~shardprop.ShardedGraph` (propagation's view, no stages: :meth:`Plan.unsplit`)."""
    if isinstance(prog, Plan):
        return prog
    if isinstance(prog, ShardedGraph):
        return Plan.unsplit(prog)
    plan = getattr(prog, "plan", None)  # a Program, or the annotated graph view it prints
    if isinstance(plan, Plan):
        return plan
    raise OptionError(f"expected a Program, Plan or ShardedGraph to inspect, got {type(prog).__name__}; "
                      "use fs.trace(*args) to get the Program of an autoshard function")


def resolve_value(plan: Plan, ref: Any) -> int:
    """A value id from what the user typed: its printed name (``"c"``) or its id."""
    count = len(plan.graph.avals)
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
