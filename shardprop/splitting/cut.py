"""Cutting the graph into stages where data must be gathered, and emitting each stage's IR.

An edge *needs a gather* when the consumer wants an axis coarser than the producer holds it (a reduction over a
sharded axis, a contraction, a conservative fallback). Each node goes to the earliest stage after every producer
it must gather from: ``stage(n) = max(stage(p) + gathers(p → n))``. That is one linear walk, and every node lands
in exactly one stage, so shared subexpressions are computed once; later stages receive them as inputs. Arguments
and constants are not computations: any stage may read an argument and each stage embeds the constants it uses.
A partial value never crosses a stage boundary: the nodes of a chain whose psum waits run in the stage that
finishes it.

A stage receives each value as it was made (an argument in its spec, a value as an earlier stage holds it, or as
an earlier stage already moved it) and moves it inside its own ``shard_map`` (:mod:`.emit`): no layout change is
left to XLA between stages.
"""

from __future__ import annotations

from ..core.layouts import Layout, layout_refines
from ..core.moves import is_mesh_type
from ..core.types import ValueType
from ..expr.graph import CONSTANT, PARAMETER
from ..ops import lookup
from .decisions import Decisions
from .emit import Emitter
from .ir import Compute, Move, Ref, results
from .plan import Source, Stage, StageInput


def needs_gather(produced: Layout, needed: Layout) -> bool:
    """True when some axis of ``needed`` is not a local slice of ``produced``."""
    return not layout_refines(produced, needed)


def cut_into_stages(decisions: Decisions) -> tuple[tuple[Stage, ...], tuple[Source, ...]]:
    """The stages, each with its IR, and where each program output comes from."""
    graph = decisions.graph
    nodes, producer = graph.nodes, graph.producer
    leaf_ops = (PARAMETER, CONSTANT)

    # Primitives without a record run outside shard_map, on whole arrays: a stage boundary on either side.
    outside = {n.id for n in nodes if n.op not in leaf_ops and lookup(n.op).runs_outside_shard_map}

    def boundary(v: int, need: ValueType, consumer: int) -> bool:
        return needs_gather(decisions.layout(v), need.layout) or producer[v] in outside or consumer in outside

    level_of: dict[int, int] = {}
    for node in nodes:
        if node.op in leaf_ops:
            continue
        level = 0
        for v, need in decisions.edges(node):
            p = producer[v]
            if nodes[p].op in leaf_ops:
                continue
            level = max(level, level_of[p] + boundary(v, need, node.id))
        level_of[node.id] = level
    _sink_argument_only_nodes(decisions, level_of, boundary)
    for node in reversed(nodes):  # a partial value never crosses a stage boundary: it runs with its consumers
        if node.id in level_of and any(decisions.type(v).partial for v in node.outputs):
            level_of[node.id] = min(level_of[c] for v in node.outputs for c in graph.consumers[v])
    # Each level is a shard_map stage, followed by a stage outside shard_map when the level holds such nodes
    # (they neither read nor feed the shard_map stage of their own level).
    kinds = sorted({(level, n in outside) for n, level in level_of.items()})
    stage_number = {kind: k for k, kind in enumerate(kinds)}
    stage_of = {n: stage_number[(level, n in outside)] for n, level in level_of.items()}
    runs_outside = [is_outside for _, is_outside in kinds]

    n_stages = len(kinds)
    if n_stages == 0 and any(nodes[producer[v]].op == CONSTANT for v in graph.outputs):
        n_stages = 1  # a function returning only constants still needs a stage to build them
        runs_outside = [False]
    members: list[list[int]] = [[] for _ in range(n_stages)]
    for node in nodes:
        if node.op in leaf_ops:
            continue
        members[stage_of[node.id]].append(node.id)
    for v in graph.outputs:  # a constant output is built by the last stage, which outputs it
        if nodes[producer[v]].op == CONSTANT:
            members[-1].append(producer[v])
    return _emit_stages(decisions, members, runs_outside)


def worth_taking(instruction, nodes, mesh_shape) -> bool:
    """A result a later stage takes rather than makes again: a whole value computed here (not a constant), or moved
    here by a collective into a layout over whole mesh axes (a move's intermediate over a sub-axis has no spec a
    ``shard_map`` could pass it in). Partial values never leave their stage; local slices are redone where
    needed."""
    if isinstance(instruction, Move):
        result = instruction.result.type
        return instruction.transfer is not None and not result.partial and is_mesh_type(result, mesh_shape)
    if isinstance(instruction, Compute) and nodes[instruction.node].op == CONSTANT:
        return False
    return not any(ref.type.partial for ref in results(instruction))


def _emit_stages(decisions: Decisions, members: list[list[int]], runs_outside: list[bool]):
    """Each stage's IR, its inputs (each ref from the earliest source that has it) and its outputs (every ref a
    later stage or the program takes from it)."""
    graph = decisions.graph
    nodes, producer = graph.nodes, graph.producer
    # Where each ref can be taken from: arguments as their specs lay them out, then whatever earlier stages made.
    source_of: dict[Ref, tuple[int | None, int]] = {
        Ref(v, decisions.type(v)): (None, nodes[producer[v]].params["index"]) for v in graph.inputs}
    outputs: list[dict[Ref, int]] = [{} for _ in members]

    def take(ref: Ref) -> Source:
        stage, index = source_of[ref]
        if stage is None:
            return Source(None, index)
        return Source(stage, outputs[stage].setdefault(ref, len(outputs[stage])))

    built = []
    for s, stage_nodes in enumerate(members):
        emitter = Emitter(decisions, importable=source_of.keys())
        constants = sorted({producer[v] for n in stage_nodes for v in nodes[n].operands
                            if nodes[producer[v]].op == CONSTANT} | {n for n in stage_nodes
                                                                    if nodes[n].op == CONSTANT})
        for n in constants:
            emitter.node(n)
        for n in stage_nodes:
            if nodes[n].op == CONSTANT:
                continue
            emitter.outside(n) if runs_outside[s] else emitter.node(n)
        inputs = tuple(StageInput(ref.value, ref.type.layout, take(ref)) for ref in emitter.imported)
        for instruction in emitter.instructions:  # what later stages may take from this one instead of redoing it
            if worth_taking(instruction, nodes, decisions.mesh_shape):
                for ref in results(instruction):
                    source_of.setdefault(ref, (s, -1))
        built.append((tuple(constants) + tuple(n for n in stage_nodes if nodes[n].op != CONSTANT), inputs,
                      tuple(emitter.instructions)))
    for v in graph.outputs:  # a constant output: built, and output, by the last stage
        if nodes[producer[v]].op == CONSTANT:
            source_of.setdefault(Ref(v, decisions.type(v)), (len(members) - 1, -1))
    output_sources = tuple(take(Ref(v, decisions.type(v))) for v in graph.outputs)
    stages = []
    for s, (stage_nodes, inputs, instructions) in enumerate(built):
        refs = tuple(outputs[s])
        stages.append(Stage(s, stage_nodes, inputs, tuple(r.value for r in refs), tuple(r.type.layout for r in refs),
                            instructions, runs_outside[s]))
    return tuple(stages), output_sources


def _sink_argument_only_nodes(decisions: Decisions, stage_of: dict[int, int], boundary) -> None:
    """Move nodes that depend on arguments and constants only (a broadcast bias, a cast of a weight) down
    to the first stage that uses them: computing them early would only ship their results between stages,
    while the arguments they read are available to every stage anyway."""
    graph = decisions.graph
    nodes, producer, consumers = graph.nodes, graph.producer, graph.consumers
    argument_only: set[int] = set()
    for node in nodes:
        if node.op not in (PARAMETER, CONSTANT) and all(
            nodes[producer[v]].op in (PARAMETER, CONSTANT) or producer[v] in argument_only for v in node.operands
        ):
            argument_only.add(node.id)
    outputs = set(graph.outputs)
    for node in reversed(nodes):
        if node.id not in argument_only or any(v in outputs for v in node.outputs):
            continue
        latest = []
        for v in node.outputs:
            for c in consumers[v]:
                cut = any(boundary(v, need, c) for u, need in decisions.edges(nodes[c]) if u == v)
                latest.append(stage_of[c] - cut)
        if latest:
            stage_of[node.id] = max(stage_of[node.id], min(latest))
