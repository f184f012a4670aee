"""What inspection reads: one ``shardprop.Plan``, whichever product the user hands over."""

from __future__ import annotations

import difflib
import numbers
from dataclasses import dataclass
from typing import Any

from ..errors import OptionError, UnknownValueError
from ..expr.graph import Node, value_name, where
from ..propagation import ShardedGraph
from ..core.rules import Body
from ..splitting import Plan
from ..splitting.decisions import BodyPlan
from ..splitting.ir import BodyProgram


def as_plan(prog: Any) -> Plan:
    """The plan behind a ``shardprop.Program`` (or its ``prog.graph``), a ``shardprop.Plan``, or
    a ``shardprop.ShardedGraph`` (propagation's view, no stages: ``Plan.unsplit``)."""
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
    """A value id from what the user typed: an argument's name (``"params['w']"``) or key path (``"[0]['w']"``), a
    key of one (``"wq"``: refused, naming them, where several arguments have it), an output's path (``"out[1]"``,
    ``"out[0]['w']"``), its printed name (``"c"``: the user's names win where the two are spelled alike), its id,
    or the ``shardprop.Node`` that computes it (a node with several outputs must be named by the output wanted)."""
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
        for names in (graph.argument_names, graph.argument_paths):  # params['w'], or its key path [0]['w']: the
            if name in names:                                         # user's own names first
                return graph.inputs[names.index(name)]
        if name in graph.output_paths:  # out[1], out[0]['w']
            return graph.outputs[graph.output_paths.index(name)]
        keyed = _arguments_keyed(graph, name)  # a key of the user's (wq): never a generated name spelled alike
        if len(keyed) == 1:
            return graph.inputs[keyed[0]]
        if keyed:
            paths = ", ".join(graph.argument_names[k] for k in keyed)
            raise UnknownValueError(f"{name!r} names {len(keyed)} arguments: {paths}; name the one you want by its "
                                    f"path")
        value = _value_of_name(name)
        if value is not None and value < count:
            return value
        known = [*graph.argument_names, *graph.output_paths, *(value_name(v) for v in range(count))]
        near = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
        close = f"; did you mean {' or '.join(repr(n) for n in near)}?" if near else ""
    raise UnknownValueError(f"no value {ref!r} in this graph{close} (give a name as printed in the listing, 'a' "
                            f"... {value_name(count - 1)!r}, a value id below {count}, or a Node)")


def _arguments_keyed(graph, key: str) -> list[int]:
    """The flat arguments a key of whose path is ``key`` (``wq`` of ``params['layers'][0]['wq']``, ``weight`` of
    ``model.weight``): the user's names, which a value name the listing generates (``wq``) never shadows."""
    return [k for k, path in enumerate(graph.argument_keys)
            if key and any(key in (str(getattr(entry, "key", "")), str(getattr(entry, "name", ""))) for entry in path)]


def _value_of_name(name: str) -> int | None:
    """Inverse of ``value_name`` (``a``…``z``, ``ba``, ``bb``…)."""
    if not name or not name.isalpha() or not name.islower():
        return None
    value = 0
    for ch in name:
        value = value * 26 + (ord(ch) - ord("a"))
    return value if value_name(value) == name else None


@dataclass(frozen=True)
class Scope:
    """Where a value named by a path (``"e/body/c"``) lives: inside ``body_plan`` (its ``name``) of the op
    ``node`` of the enclosing plan; ``path`` is the prefix its values are named with (``"e/body"``)."""

    path: str
    node: Node
    body_plan: BodyPlan

    @property
    def body(self) -> Body:
        return self.body_plan.body

    def describe(self) -> str:
        """``the body of `scan` at f.py:12, run 6 times``."""
        body = self.body
        runs = "" if not body.carries else \
            ", every iteration" if body.repeats is None else f", run {body.repeats} times"
        part = part_name(body)
        part = part if part.startswith("branch") else f"the {part}"
        return f"{part} of `{self.node.op}` at {where(self.node)}{runs}"


def part_name(body: Body) -> str:
    """``body``, ``condition``, ``branch 1``: the part of its op a body is, in words."""
    return {"cond": "condition"}.get(body.name, body.name.replace("branch", "branch "))


def body_prefix(node: Node, body: Body, outer: str = "") -> str:
    """``e/body``: how values inside ``body`` of ``node`` are named (after the op's first output)."""
    return f"{outer}{value_name(node.outputs[0])}/{body.name}"


def locate(prog: Any, ref: Any) -> tuple[Plan, int, tuple[Scope, ...]]:
    """The plan a value lives in, its id there, and the bodies on the way: a name as printed (``"c"``), a value
    id or Node of the program, or a path into a loop's or a cond's body as the listing prints it
    (``"e/body/c"``: value ``c`` of the body of the op computing ``e``; ``"e/cond/b"``, ``"e/branch1/d"``)."""
    plan = as_plan(prog)
    if not (isinstance(ref, str) and "/" in ref):
        return plan, resolve_value(plan, ref), ()
    parts = [p.strip() for p in ref.strip().strip("/").split("/")]
    scopes: list[Scope] = []
    prefix = ""
    while len(parts) > 1:
        if len(parts) == 2:
            raise UnknownValueError(f"{ref!r}: a path names a value inside a body as <op output>/<part>/<value>, "
                                    "e.g. 'e/body/c'")
        name, part, parts = parts[0], parts[1], parts[2:]
        # (a path's head is the op's output as the listing prints it: a generated name, whatever keys are spelled so)
        printed = _value_of_name(name)
        head = printed if printed is not None and printed < len(plan.graph.avals) else resolve_value(plan, name)
        node = plan.graph.nodes[plan.graph.producer[head]]
        plans = plan.body_programs(node.id) or tuple(plan.body_plans(node.id) or ())
        names = [_body_of(p).name for p in plans]
        if part not in names:
            has = f"its parts are {', '.join(map(repr, names))}" if names else \
                "it has no body (not a loop or a cond, or one that fell back)"
            raise UnknownValueError(f"{ref!r}: `{node.op}` computing {name!r} has no part {part!r}; {has}")
        found = plans[names.index(part)]
        prefix = body_prefix(node, _body_of(found), prefix) + "/"
        if isinstance(found, BodyProgram):
            scopes.append(Scope(prefix[:-1], node, found.plan))
            plan = Plan.of_body(found, plan.strategy)
        else:  # an unsplit plan: propagation's view of the body, no IR
            scopes.append(Scope(prefix[:-1], node, found))
            plan = Plan.unsplit(found.body.sharded)
    return plan, resolve_value(plan, parts[0]), tuple(scopes)


def _body_of(found) -> Body:
    return found.plan.body if isinstance(found, BodyProgram) else found.body
