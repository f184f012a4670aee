"""What inspection reads: one :class:`~shardprop.Plan`, whichever product the user hands over."""

from __future__ import annotations

import difflib
import numbers
from typing import Any

from ..errors import OptionError, UnknownValueError
from ..expr.graph import Node, value_name
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
    """A value id from what the user typed: its printed name (``"c"``), its id, or the :class:`~shardprop.Node`
    that computes it (a node with several outputs must be named by the output wanted)."""
    graph = plan.graph
    count = len(graph.avals)
    if isinstance(ref, Node):
        if 0 <= ref.id < len(graph.nodes) and graph.nodes[ref.id].outputs == ref.outputs:
            if len(ref.outputs) == 1:
                return ref.output
            raise UnknownValueError(f"node `{ref.op}` has {len(ref.outputs)} outputs "
                                    f"({', '.join(map(value_name, ref.outputs))}): name the one you want")
        raise UnknownValueError(f"node {ref.id} (`{ref.op}`) is not a node of this graph")
    if isinstance(ref, bool):
        ref = None  # not a value id
    if isinstance(ref, numbers.Integral) and 0 <= ref < count:
        return int(ref)
    close = ""
    if isinstance(ref, str):
        name = ref.strip()
        value = _value_of_name(name)
        if value is not None and value < count:
            return value
        near = difflib.get_close_matches(name.lower(), [value_name(v) for v in range(count)], n=3, cutoff=0.5)
        close = f"; did you mean {' or '.join(repr(n) for n in near)}?" if near else ""
    raise UnknownValueError(f"no value {ref!r} in this graph{close} (give a name as printed in the listing, 'a' "
                            f"... {value_name(count - 1)!r}, a value id below {count}, or a Node)")


def _value_of_name(name: str) -> int | None:
    """Inverse of :func:`value_name` (``a``…``z``, ``ba``, ``bb``…)."""
    if not name or not name.isalpha() or not name.islower():
        return None
    value = 0
    for ch in name:
        value = value * 26 + (ord(ch) - ord("a"))
    return value if value_name(value) == name else None
