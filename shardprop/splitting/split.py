"""``split(sharded_graph) -> Plan``: decide how each node pays for what it needs, cut the graph into stages
where data must be gathered, and emit each stage's sharded IR.

The pipeline, one product to the next:

    Decisions.propagated(sharded)      propagation's layouts, every value whole
    -> finish_in_blocks                cumulative ops and reversals done block by block, finished by a collective
    -> finish_with_collectives         (collective, auto) sums, maxima, contractions finished in place
    -> defer_sums_past_linear_consumers  a psum moved down a linear chain to its smallest value
    -> scatter_where_consumers_slice   a sum held finer where every consumer slices it anyway (a reduce-scatter)
    -> pull_gathers_back               (auto) each remaining gather where it moves the fewest bytes
    -> bodies                          each loop's and cond's bodies decided alike; sums carried partial
    -> cut_into_stages                 the stages (``cut.py``), each with its IR (``emit.py``), then the Plan
"""

from __future__ import annotations

from ..core.types import ValueType
from ..core.transfers import total_moved
from ..errors import OptionError
from ..gc_pause import gc_paused
from ..propagation import ShardedGraph
from .cost import body_transfers, collective_bytes, price
from .cut import cut_into_stages
from .decisions import BodyPlan, Decisions
from .invariants import checked
from .partial_sums import DeferredSums, deferred_sums
from .plan import Plan
from .strategies import (defer_sums_past_linear_consumers, finish_in_blocks, finish_with_collectives, pull_gathers_back,
                         scatter_where_consumers_slice)
from .strategy import Strategy

STRATEGIES = tuple(s.value for s in Strategy)


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
    strategy = Strategy.parse(strategy).splitting
    decisions = decide(sharded, strategy)
    stages, output_sources = cut_into_stages(decisions)
    return checked(Plan(sharded=sharded, need_overrides=decisions.need_overrides, held=decisions.held,
                        computed=decisions.computed, collectives=decisions.collectives, bodies=decisions.bodies,
                        stages=stages, output_sources=output_sources, strategy=strategy))


def decide(sharded: ShardedGraph, strategy: Strategy) -> Decisions:
    """The strategy's decisions for ``sharded`` and, the same way, for every body of its loops and conds (a
    body is not cut: what it must move, it moves inside, every iteration), with the sums a loop can carry
    unreduced (``shardprop.splitting.partial_sums.deferred_sums``)."""
    decisions = finish_in_blocks(Decisions.propagated(sharded))
    if strategy is not Strategy.GATHER:
        decisions = finish_with_collectives(decisions, only_if_cheaper=strategy is Strategy.AUTO)
        decisions = defer_sums_past_linear_consumers(decisions)
    decisions = scatter_where_consumers_slice(decisions)
    if strategy is Strategy.AUTO:
        decisions = pull_gathers_back(decisions)
    for node_id, each in sharded.bodies.items():
        # Under "auto" a body is also decided as under "collective": a sum it then carries out of the loop
        # unreduced costs one collective in all, not one per iteration — which local choices cannot see.
        options = []
        node = sharded.graph.nodes[node_id]
        for choice in (strategy, Strategy.COLLECTIVE) if strategy is Strategy.AUTO else (strategy,):
            plans = tuple(BodyPlan(body, decide(body.sharded, choice)) for body in each)
            found = deferred_sums(plans)
            if found is not None and any(decisions.needs(node_id)[k].span for k in found.operands):
                found = None  # a carry taken in ranged rows (uneven): its sum is not deferred out of the loop
            trial = decisions.revised(bodies={node_id: plans}) if found is None else _with_deferred(
                decisions, node, found)
            collective = trial.collective(node_id)
            cost = total_moved(body_transfers(trial, node_id)) + (
                collective_bytes(trial, node, collective) if collective else 0.0)
            options.append((cost, len(options), trial))
        decisions = min(options, key=lambda o: o[:2])[2]
    return decisions


def _with_deferred(decisions: Decisions, node, found: DeferredSums) -> Decisions:
    """``decisions`` with loop ``node``'s bodies keeping sums partial: the carries it finishes are computed
    partial, and their initial values consumed partial."""
    axes = found.collective.mesh_axes
    needs = tuple(ValueType(need.layout, axes) if k in found.operands else need
                  for k, (_, need) in enumerate(decisions.edges(node)))
    computed = {node.outputs[k]: ValueType(decisions.layout(node.outputs[k]), axes) for k in found.outputs}
    return decisions.revised(bodies={node.id: found.plans}, collectives={node.id: found.collective},
                             needs={node.id: needs}, computed=computed)


class PlanPricer:
    """The price propagation compares its candidate layouts by: the bytes per device a candidate's plan moves, as the
    cost model estimates them (the estimate the compiled program is checked against), and the work it makes each
    device do (``shardprop.splitting.cost.price``). Each candidate's plan is kept, so the one propagation picks
    is not split again."""

    def __init__(self, strategy: str):
        self.strategy = strategy
        self._plans: dict[int, tuple] = {}  # id -> (candidate, its plan): the candidate kept alive, its id unique

    def __call__(self, sharded) -> float:
        plan = split(sharded, strategy=self.strategy)
        self._plans[id(sharded)] = (sharded, plan)
        return price(plan)

    def plan_for(self, sharded):
        """The plan of ``sharded``: the one priced, or a new split when it was not a candidate (nothing to compare)."""
        kept = self._plans.get(id(sharded))
        return kept[1] if kept is not None and kept[0] is sharded else split(sharded, strategy=self.strategy)
