"""Cutting the graph into stages where data must be gathered, and emitting each stage's IR.

An edge *needs a gather* when the consumer wants an axis coarser than the producer holds it (a reduction over a
sharded axis, a contraction, a conservative fallback). Each node goes to the earliest stage after every producer
it must gather from: ``stage(n) = max(stage(p) + gathers(p → n))``. That is one linear walk, and every node lands
in exactly one stage, so shared subexpressions are computed once; later stages receive them as inputs. Arguments
and constants are not computations: any stage may read an argument and each stage embeds the constants it uses.
A partial value never crosses a stage boundary: the nodes of a chain whose psum waits run in the stage that
finishes it.

A stage receives each value as it was made (an argument in its spec, a value as an earlier stage holds it, or as
an earlier stage already moved it) and moves it inside its own ``shard_map`` (``.emit``): no layout change is
left to XLA between stages. A primitive without a record runs outside ``shard_map``, on whole arrays, in a stage
after its level's ``shard_map`` stage, which brings its operands whole.

Since every move is an instruction, the cuts are not needed for correctness — one ``shard_map`` could run the
whole IR. They are kept because they are the Nx design's stages: the granularity at which the debugger steps,
compares and profiles, and at which a stage is run on its own (``Program.stage(k)``).
"""

from __future__ import annotations

from ..core.layouts import Layout, layout_refines
from ..core.moves import is_mesh_type
from ..core.steps import StepKind
from ..core.types import ValueType
from ..expr.graph import CONSTANT, PARAMETER
from ..ops import lookup
from .decisions import Decisions
from .emit import Emitter, handed_over
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

    # Primitives without a record run outside shard_map, on whole arrays, in a stage of their own after their
    # level's shard_map stage (which brings their operands whole); what reads their results starts the next level.
    outside = {n.id for n in nodes if n.op not in leaf_ops and lookup(n.op).runs_outside_shard_map}

    def boundary(v: int, need: ValueType, consumer: int) -> bool:
        if producer[v] in outside:
            return consumer not in outside
        return consumer not in outside and needs_gather(decisions.layout(v), need.layout)

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
    for node in reversed(nodes):  # a partial or ranged value never crosses a stage boundary: it runs with its consumers
        if node.id in level_of and any(decisions.type(v).partial or decisions.type(v).span for v in node.outputs):
            level_of[node.id] = min((level_of[c] for v in node.outputs for c in graph.consumers[v]),
                                    default=level_of[node.id])  # (a piece no one reads: where it is)
    # Each level is a shard_map stage, followed by a stage outside shard_map when the level holds such nodes
    # (they neither read nor feed the shard_map stage of their own level).
    # A level with nodes outside shard_map always has a shard_map stage before them: it brings their operands to
    # the types they take them in (whole), so that no layout change is left to XLA; an empty one is dropped.
    kinds = sorted({(level, n in outside) for n, level in level_of.items()} |
                   {(level, False) for n, level in level_of.items() if n in outside})
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


def worth_taking(instruction, ref: Ref, nodes, mesh_shape, returned=frozenset()) -> bool:
    """True when a later stage takes ``ref``, a result of ``instruction``, rather than making it again: a whole value
    over whole mesh axes (a move's intermediate over a sub-axis has no spec a ``shard_map`` could pass it in), not a
    constant (each stage embeds its own) and not a local slice (redone where needed, for free) — unless the program
    returns it so (a value returned sliced: ``returned``). Partial and placed values never leave their stage."""
    if ref.type.pending or not is_mesh_type(ref.type, mesh_shape):
        return False
    if isinstance(instruction, Move):
        return instruction.step.kind is not StepKind.SLICE or ref.value in returned
    return not (isinstance(instruction, Compute) and nodes[instruction.node].op == CONSTANT)


def _constants_of(nodes, producer, stage_nodes: list[int]) -> tuple[int, ...]:
    """The constants a stage embeds: those its nodes read and those among its nodes."""
    read = {producer[v] for n in stage_nodes for v in nodes[n].operands if nodes[producer[v]].op == CONSTANT}
    return tuple(sorted(read | {n for n in stage_nodes if nodes[n].op == CONSTANT}))


def _emit_stages(decisions: Decisions, members: list[list[int]], runs_outside: list[bool]):
    """Each stage's IR, its inputs (each ref from the earliest source that has it) and its outputs (every ref a
    later stage or the program takes from it). The operands of a stage outside ``shard_map`` are brought to the
    types it takes them in by the ``shard_map`` stage before it; a ``shard_map`` stage left with nothing to do is
    dropped."""
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

    emitters: list[Emitter] = []
    published = [0] * len(members)

    def publish(s: int) -> None:  # what later stages may take from stage s instead of redoing it
        instructions = emitters[s].instructions
        for instruction in instructions[published[s]:]:
            for ref in results(instruction):
                if worth_taking(instruction, ref, nodes, decisions.mesh_shape, decisions.returned):
                    source_of.setdefault(ref, (s, -1))
        published[s] = len(instructions)

    constants: list[tuple[int, ...]] = []  # each stage embeds the constants it uses
    stage_of = {n: s for s, stage_nodes in enumerate(members) for n in stage_nodes}
    for s, stage_nodes in enumerate(members):
        for n in stage_nodes:  # a ranged value read in a later stage than it was made in: handed over whole
            for v in nodes[n].operands:
                made = stage_of.get(producer[v], s)
                vtype = decisions.type(v)
                if made < s and vtype.span and Ref(v, handed_over(vtype)) not in source_of:
                    emitters[made].bring(emitters[made].held(v), handed_over(vtype), n)
                    publish(made)
        emitter = Emitter(decisions, importable=source_of.keys())
        constants.append(_constants_of(nodes, producer, stage_nodes))
        for n in constants[s]:
            emitter.node(n)
        if runs_outside[s]:
            before, local = emitters[s - 1], set(stage_nodes)  # the shard_map stage before (see cut_into_stages)
            for n in stage_nodes:
                for v, need in decisions.edges(nodes[n]):
                    wanted = Ref(v, need)
                    if nodes[producer[v]].op == CONSTANT or producer[v] in local or wanted in source_of:
                        continue  # built here, made here, or already made (and taken from where it was)
                    before.bring(before.held(v), need, n)
                    source_of.setdefault(wanted, (s - 1, -1))  # taken as made, whatever a later stage would redo
            publish(s - 1)
        for n in stage_nodes:
            if nodes[n].op == CONSTANT:
                continue
            emitter.outside(n) if runs_outside[s] else emitter.node(n)
        emitters.append(emitter)
        publish(s)
    for v in graph.outputs:  # a constant output: built, and output, by the last stage
        if nodes[producer[v]].op == CONSTANT:
            source_of.setdefault(Ref(v, decisions.type(v)), (len(members) - 1, -1))
    output_sources = [take(Ref(v, decisions.output_type(k))) for k, v in enumerate(graph.outputs)]
    inputs = [tuple(StageInput(ref.value, ref.type.layout, take(ref)) for ref in emitter.imported)
              for emitter in emitters]
    kept = [s for s, emitter in enumerate(emitters) if emitter.instructions or outputs[s]]
    number = {s: k for k, s in enumerate(kept)}

    def renumbered(source: Source) -> Source:
        return source if source.stage is None else Source(number[source.stage], source.index)

    stages = []
    for s in kept:
        refs = tuple(outputs[s])
        stages.append(Stage(number[s], constants[s] + tuple(n for n in members[s] if nodes[n].op != CONSTANT),
                            tuple(StageInput(i.value, i.layout, renumbered(i.source)) for i in inputs[s]),
                            tuple(r.value for r in refs), tuple(r.type.layout for r in refs),
                            tuple(emitters[s].instructions), runs_outside[s]))
    return tuple(stages), tuple(renumbered(source) for source in output_sources)


def _sink_argument_only_nodes(decisions: Decisions, stage_of: dict[int, int], boundary) -> None:
    """Move nodes that depend on arguments and constants only (a broadcast bias, a cast of a weight) down
    to the first stage that uses them: computing them early would only ship their results between stages,
    while the arguments they read are available to every stage anyway."""
    graph = decisions.graph
    nodes, consumers, argument_only = graph.nodes, graph.consumers, graph.argument_only
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
