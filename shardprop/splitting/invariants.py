"""The invariants of a ``Plan`` and its sharded IR (checked when ``shardprop.checks`` is enabled).

* every node other than arguments and constants runs in exactly one stage, as one ``Compute``;
* every ref an instruction reads is available: a stage input, or made earlier in the stage (in a body: a body
  input, or made earlier in the body);
* a ``Compute`` consumes its operands in the types the plan says and makes its results in the types it computes
  them in; every value a stage computes is made in the type the plan holds it in; a ``Move`` takes its step's
  ``before`` type to its ``after``;
* stage inputs and outputs are whole (a partial value never crosses a stage boundary), every stage input and
  program output comes from a source that exists earlier and is that value, and a stage reads every input it
  takes;
* a stage outside ``shard_map`` holds only primitives that run there, and no other stage holds one;
* no layout uses a mesh axis twice.
"""

from __future__ import annotations

from ..checks import enabled
from ..core.layouts import Layout, uses_mesh_axes_once
from ..core.types import ValueType
from ..errors import InvariantError
from ..expr.graph import CONSTANT, PARAMETER
from ..ops import lookup
from .ir import Compute, Finish, Move, Ref, reads, results
from .plan import Plan, Source


def checked(plan: Plan) -> Plan:
    """``plan``, after checking its invariants when checks are enabled."""
    if enabled():
        check_plan(plan)
    return plan


def check_plan(plan: Plan) -> None:
    graph = plan.graph
    nodes = graph.nodes
    placed: dict[int, int] = {}
    for position, stage in enumerate(plan.stages):
        if stage.id != position:
            _fail(f"stage {stage.id} is at position {position}")
        for i in stage.inputs:
            _check_source(plan, i.source, i.ref, before=stage.id, what=f"stage {stage.id} input")
        for n in stage.nodes:
            node = nodes[n]
            if node.op == PARAMETER:
                _fail(f"stage {stage.id} runs argument node {n}")
            if node.op == CONSTANT:
                continue
            if n in placed:
                _fail(f"node {n} (`{node.op}`) runs in stages {placed[n]} and {stage.id}")
            if lookup(node.op).runs_outside_shard_map != stage.outside_shard_map:
                _fail(f"node {n} (`{node.op}`) runs {'outside' if stage.outside_shard_map else 'inside'} shard_map "
                      f"in stage {stage.id}, but its record says otherwise")
            placed[n] = stage.id
        made = check_instructions(plan, stage.instructions, {i.ref for i in stage.inputs}, f"stage {stage.id}",
                                  typed=not stage.outside_shard_map)
        computed = {i.node for i in stage.instructions if isinstance(i, Compute)}
        if computed != set(stage.nodes):
            _fail(f"stage {stage.id} runs nodes {sorted(computed ^ set(stage.nodes))[:5]} it does not list, or lists "
                  "nodes it does not run")
        for ref in stage.output_refs:
            if ref not in made:
                _fail(f"stage {stage.id} outputs {ref}, which it neither makes nor receives")
        read = {ref for instruction in stage.instructions for ref in reads(instruction)}
        unread = [i.ref for i in stage.inputs if i.ref not in read]
        if unread:
            _fail(f"stage {stage.id} takes {unread[:3]} and never reads them")
    missing = [n.id for n in nodes if n.op not in (PARAMETER, CONSTANT) and n.id not in placed]
    if plan.stages and missing:
        _fail(f"nodes {missing[:5]} run in no stage")
    for k, (v, source) in enumerate(zip(graph.outputs, plan.output_sources, strict=True)):
        _check_source(plan, source, Ref(v, plan.output_type(k)), before=len(plan.stages), what=f"program output {k}")


def check_instructions(view, instructions, available: set[Ref], where: str, typed: bool = True) -> set[Ref]:
    """The refs ``instructions`` make, after checking that each reads only refs available by then (``available``,
    then what it made), in the types ``view`` says (not ``typed``: a stage outside shard_map, on whole arrays).
    Bodies are checked alike, recursively."""
    graph = view.graph
    made = set(available)
    for instruction in instructions:
        for ref in reads(instruction):
            if ref not in made:
                _fail(f"{where}: {_describe(instruction, graph)} reads {ref}, which is neither made before it nor "
                      "received")
        if isinstance(instruction, Move) and (instruction.step.before != instruction.source.type
                                              or instruction.step.after != instruction.result.type):
            _fail(f"{where}: a move's step {instruction.step} does not take {instruction.source} to "
                  f"{instruction.result}")
        if isinstance(instruction, Compute) and typed and graph.nodes[instruction.node].op != CONSTANT:
            node = graph.nodes[instruction.node]
            wanted = tuple(Ref(v, need) for v, need in view.edges(node))
            if instruction.inputs != wanted:
                _fail(f"{where}: `{node.op}` (node {node.id}) consumes {instruction.inputs}, the plan says {wanted}")
            computed = tuple(Ref(v, view.computed_type(v)) for v in node.outputs)
            if instruction.outputs != computed:
                _fail(f"{where}: `{node.op}` (node {node.id}) makes {instruction.outputs}, the plan says {computed}")
            for body in instruction.bodies or ():
                inner = check_instructions(body.plan.decisions, body.instructions, set(body.inputs),
                                           f"{where}, body of `{node.op}` (node {node.id})")
                if any(ref not in inner for ref in body.outputs):
                    _fail(f"{where}: a body of `{node.op}` (node {node.id}) does not make its outputs")
        for ref in results(instruction):
            _check_layout(ref.type.layout, f"{where}: {ref}")
        made.update(results(instruction))
    for instruction in instructions:
        if isinstance(instruction, Compute) and typed:
            for v in graph.nodes[instruction.node].outputs:
                if Ref(v, view.type(v)) not in made:
                    _fail(f"{where}: value {v} is computed but never held as the plan says, {view.type(v)}")
    return made


def _describe(instruction, graph) -> str:
    if isinstance(instruction, Compute):
        return f"`{graph.nodes[instruction.node].op}` (node {instruction.node})"
    return "a finish" if isinstance(instruction, Finish) else f"a move ({instruction.step})"


def _check_source(plan: Plan, source: Source, ref: Ref, *, before: int, what: str) -> None:
    if ref.type.pending:
        _fail(f"{what} {ref} is pending ({ref.type.placement or 'a partial sum'}): it would cross a stage boundary "
              "unfinished")
    if source.is_argument:
        inputs = plan.graph.inputs
        if not 0 <= source.index < len(inputs) or inputs[source.index] != ref.value:
            _fail(f"{what} {ref.value} names argument {source.index}, which is not that value")
        if ref.type != ValueType(plan.layout(ref.value)):
            _fail(f"{what} takes argument {source.index} as {ref.type}, but it arrives as {plan.layout(ref.value)}")
        return
    if not 0 <= source.stage < before:
        _fail(f"{what} {ref.value} comes from stage {source.stage}, which does not run before it")
    outputs = plan.stages[source.stage].output_refs
    if not 0 <= source.index < len(outputs) or outputs[source.index] != ref:
        _fail(f"{what} {ref} names output {source.index} of stage {source.stage}, which is not that ref")


def _check_layout(layout: Layout, what: str) -> None:
    if not uses_mesh_axes_once(layout):
        _fail(f"{what} uses a mesh axis twice: {layout}")


def _fail(message: str):
    raise InvariantError(f"splitting produced an inconsistent Plan: {message} (a shardprop bug: please report "
                         "it with the function and in_specs)")
