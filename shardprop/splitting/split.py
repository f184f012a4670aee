"""``split(sharded_graph) -> Plan``: cut the graph into stages where data must be gathered.

An edge *needs a gather* when the consumer wants an axis coarser than the producer holds it (a reduction
over a sharded axis, a contraction, a conservative fallback). Each node goes to the earliest stage after
every producer it must gather from: ``stage(n) = max(stage(p) + gathers(p → n))``. That is one linear walk,
and every node lands in exactly one stage, so shared subexpressions are computed once; later stages receive
them as inputs. Arguments and constants are not computations: any stage may read an argument (in whatever
layout it needs; moving it there is the gather) and each stage embeds the constants it uses.

The pipeline, one product to the next::

    Decisions.propagated(sharded)      propagation's layouts
    -> finish_with_collectives         (collective, auto) sums, maxima, contractions finished in place
    -> defer_sums_past_linear_consumers  a psum moved down a linear chain to its smallest value
    -> scatter_where_consumers_slice   psum -> psum_scatter where every consumer slices the sum anyway
    -> pull_gathers_back               (auto) each remaining gather where it moves the fewest bytes
    -> stages                          the cut, then the Plan
"""

from __future__ import annotations

from ..errors import OptionError
from ..expr.graph import CONSTANT, PARAMETER
from ..gc_pause import gc_paused
from ..propagation import ShardedGraph
from ..core.layouts import Layout, layout_refines, received_layout
from .strategy import Strategy
from .decisions import BodyPlan, Decisions
from ..core.collectives import Collective
from .cost import body_transfers, collective_bytes
from ..core.transfers import total_moved
from .partial_sums import deferred_sums
from ..ops import lookup
from .invariants import checked
from .plan import Plan, Source, Stage, StageInput
from .strategies import (defer_sums_past_linear_consumers, finish_with_collectives, pull_gathers_back,
                         scatter_where_consumers_slice)

STRATEGIES = tuple(s.value for s in Strategy)


def needs_gather(produced: Layout, needed: Layout) -> bool:
    """True when some axis of ``needed`` is not a local slice of ``produced``."""
    return not layout_refines(produced, needed)


@gc_paused
def split(sharded: ShardedGraph, *, strategy: str = "auto") -> Plan:
    """Assign every node to a stage; see the module docstring.

    For the Nx design note's example (``a``, ``b`` sharded ``P("i", "j")``), stage 0 computes ``x = a + b``
    and ``y = a - b`` and stage 1 takes ``x`` gathered along axis 1, ``y`` gathered along axis 0 — that is
    ``strategy="gather"``. With ``"collective"`` the sums are finished with a ``psum`` instead, and the plan
    has one stage; ``"auto"`` (the default) takes, node by node, whichever the cost model says moves fewer
    bytes.
    """
    if not isinstance(sharded, ShardedGraph):
        raise OptionError(f"split takes a ShardedGraph (sp.propagate(...), or prog.sharded of a Program), got "
                          f"{type(sharded).__name__}")
    strategy = Strategy.parse(strategy)
    decisions = decide(sharded, strategy)
    stages, output_sources = cut_into_stages(decisions)
    return checked(Plan(sharded=sharded, need_overrides=decisions.need_overrides,
                        collectives=decisions.collectives, held=decisions.held, bodies=decisions.bodies,
                        pending=decisions.pending,
                        stages=stages, output_sources=output_sources, strategy=strategy))


def decide(sharded: ShardedGraph, strategy: Strategy) -> Decisions:
    """The strategy's decisions for ``sharded`` and, the same way, for every body of its loops and conds (a
    body is not cut: what it must move, it moves inside, every iteration), with the sums a loop can carry
    unreduced (:func:`~shardprop.splitting.partial_sums.deferred_sums`)."""
    decisions = Decisions.propagated(sharded)
    if strategy is not Strategy.GATHER:
        decisions = finish_with_collectives(decisions, only_if_cheaper=strategy is Strategy.AUTO)
        decisions = defer_sums_past_linear_consumers(decisions)
    decisions = scatter_where_consumers_slice(decisions)
    if strategy is Strategy.AUTO:
        decisions = pull_gathers_back(decisions)
    bodies: dict[int, tuple[BodyPlan, ...]] = {}
    finished: dict[int, Collective] = {}
    for node_id, each in sharded.bodies.items():
        # Under "auto" a body is also decided as under "collective": a sum it then carries out of the loop
        # unreduced costs one collective in all, not one per iteration — which local choices cannot see.
        options = []
        for choice in (strategy, Strategy.COLLECTIVE) if strategy is Strategy.AUTO else (strategy,):
            plans = tuple(BodyPlan(body, decide(body.sharded, choice)) for body in each)
            found = deferred_sums(plans)
            plans, collective = found if found is not None else (plans, None)
            trial = decisions.revised(bodies={node_id: plans},
                                      collectives={node_id: collective} if collective else {})
            node = sharded.graph.nodes[node_id]
            cost = total_moved(body_transfers(trial, node_id)) + (
                collective_bytes(trial, node, collective) if collective else 0.0)
            options.append((cost, len(options), plans, collective))
        _, _, bodies[node_id], collective = min(options, key=lambda o: o[:2])
        if collective is not None:
            finished[node_id] = collective
    return decisions.revised(bodies=bodies, collectives=finished) if bodies else decisions


def cut_into_stages(decisions: Decisions) -> tuple[tuple[Stage, ...], tuple[Source, ...]]:
    """The stages, and where each program output comes from."""
    graph = decisions.graph
    nodes, producer = graph.nodes, graph.producer
    leaf_ops = (PARAMETER, CONSTANT)

    # Primitives without a record run outside shard_map, on whole arrays: a stage boundary on either side.
    outside = {n.id for n in nodes if n.op not in leaf_ops and lookup(n.op).runs_outside_shard_map}

    def boundary(v: int, need: Layout, consumer: int) -> bool:
        return needs_gather(decisions.layout(v), need) or producer[v] in outside or consumer in outside

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
    for node_id, pending in decisions.pending.items():  # a partial value never crosses a stage boundary
        level_of[node_id] = level_of[pending.finisher]
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
    inputs: list[dict[tuple[int, Layout], StageInput]] = [{} for _ in range(n_stages)]
    outputs: list[dict[int, int]] = [{} for _ in range(n_stages)]  # value -> output index
    constants: list[set[int]] = [set() for _ in range(n_stages)]

    def export(v: int) -> Source:
        p = producer[v]
        if nodes[p].op == PARAMETER:
            return Source(None, nodes[p].params["index"])
        s = stage_of[p]
        return Source(s, outputs[s].setdefault(v, len(outputs[s])))

    for node in nodes:
        if node.op in leaf_ops:
            continue
        s = stage_of[node.id]
        members[s].append(node.id)
        for v, need in decisions.edges(node):
            p = producer[v]
            if nodes[p].op == CONSTANT:
                constants[s].add(p)
            elif nodes[p].op == PARAMETER or stage_of[p] != s:
                layout_in = received_layout(decisions.layout(v), need)
                if (v, layout_in) not in inputs[s]:
                    inputs[s][(v, layout_in)] = StageInput(v, layout_in, export(v))

    output_sources = []
    for v in graph.outputs:
        p = producer[v]
        if nodes[p].op == CONSTANT:  # built by the last stage, which outputs it
            stage_of[p] = n_stages - 1
            constants[n_stages - 1].add(p)
        output_sources.append(export(v))

    stages = []
    for s in range(n_stages):
        body = tuple(sorted(constants[s]) + members[s])  # constants first, then graph order
        outs = tuple(outputs[s])
        stages.append(Stage(s, body, tuple(inputs[s].values()), outs, tuple(decisions.layout(v) for v in outs),
                            outside_shard_map=runs_outside[s]))
    return tuple(stages), tuple(output_sources)


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
