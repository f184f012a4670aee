"""What each node of a traced program can do: its strategies, found by asking its sharding rule.

A node's strategy is the layouts its rule is handed (one per operand, even blocks) and what follows from them, as the
split decides it (``shardprop.splitting.split.decide`` on a graph of that node alone): the types it consumes its
operands in, the types its outputs are held in, the collective that finishes it (none, a required one, or the one
``finish`` offers in place of gathering) and its price in the cost model's terms — the work each device does
(``compute_bytes``), the bytes its finish moves, a loop's bodies' moves. Two handed tuples that lead to the same
consumption, outputs and price are one strategy. One a collective finishes is handed what it consumes: an op's own
finish, decided alike on those (``_handed_as_consumed``), reads them so wherever its operands are held (the split's
``as_handed``); a loop's sums kept out of its bodies are decided on the bodies as handed, and such a strategy is
``tied`` to its operands held as handed.

>>> menu = node_menu(graph, node, mesh, handed_options)   # doctest: +SKIP
>>> first = menu.strategies[0]                            # doctest: +SKIP
>>> first.needs, first.outputs, first.cost                # doctest: +SKIP
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass, replace

from ..core.collectives import Collective, CollectiveKind
from ..core.layouts import Layout, Sharded, TensorSharding, shard_count
from ..core.rules import CREATED, OpenTracker, RuleConflict, RuleContext
from ..core.transfers import total_moved
from ..core.types import ValueType
from ..errors import ShardingError
from ..expr.graph import PARAMETER, Graph, Node
from ..ops import lookup
from ..ops.opdef import Family
from ..propagation import ShardedGraph
from ..propagation.product import RuleName
from ..splitting.cost import body_transfers, collective_bytes, compute_bytes
from ..splitting.split import decide
from ..splitting.strategy import Strategy

# the most handed tuples a node's rule is asked about: every combination of its operands' candidates while there are
# at most this many, else each operand's candidates with the others as the first tuple has them
FULL_PRODUCT_AT_MOST = 256


@dataclass(frozen=True)
class NodeStrategy:
    """One way for a node to run: its rule ``handed`` these operand layouts consumes its operands in ``needs``,
    holds its outputs in ``outputs``, is finished by ``collective`` (or not) and costs ``cost`` (work and finishing
    bytes per device, in bytes' worth)."""

    handed: tuple[Layout, ...]
    needs: tuple[ValueType, ...]
    outputs: tuple[ValueType, ...]
    collective: Collective | None
    cost: float
    finished: bool  # the collective is the one ``finish`` offers in place of gathering (not required)
    # realized only where its operands are held as handed (a loop's sums, decided on its bodies as handed)
    tied: bool = False

    @property
    def scattered(self) -> bool:
        """A sum held finer than its rule lays it out: its finish is a reduce-scatter (``_scattered``)."""
        return (self.collective is not None and self.collective.kind is CollectiveKind.PSUM
                and any(name in self.collective.mesh_axes for t in self.outputs for m in t.layout for name in m))

    def laid_out(self, k: int) -> Layout:
        """Output ``k``'s layout as the node's rule lays it out: as held, less the mesh axes a reduce-scatter adds."""
        layout = self.outputs[k].even_layout
        if not self.scattered:
            return layout
        return tuple(tuple(name for name in m if name not in self.collective.mesh_axes) for m in layout)


@dataclass(frozen=True)
class Menu:
    """A node's strategies; ``sampled``: its operands' layouts combine in too many ways to ask about each, even one
    mesh axis at a time (a loop's many carries): ``strategies`` are those asked about, a solve over them is optimal
    among them only."""

    strategies: tuple[NodeStrategy, ...]
    sampled: bool


def node_signature(graph: Graph, node: Node) -> tuple | None:
    """What a node's rule answers are a function of, beside the layouts it is handed: its primitive and parameters,
    its operands' and outputs' shapes and dtypes, and which of its operands are scalars (a rule may read a literal: a
    pad's). None where the parameters are not hashable (a loop's body: its answers are found for it alone)."""
    avals = tuple((graph.avals[v].shape, str(graph.avals[v].dtype)) for v in node.operands + node.outputs)
    scalars = tuple(v for v in node.operands if graph.avals[v].shape == ())
    key = (node.op, tuple(sorted(node.params.items())), avals, scalars)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def node_menu(graph: Graph, node: Node, mesh, handed_options: list[tuple[Layout, ...]],
              propagate_body=None, *, answers: dict | None = None) -> Menu:
    """The strategies of ``node`` when its operands may be handed in any of ``handed_options`` (per operand, its
    candidate layouts; the first is the default), deduplicated, in a fixed order: where its record names its factors,
    every way to lay the mesh axes over them (``_factored``: complete, never sampled); else every combination of the
    options where there are few (``FULL_PRODUCT_AT_MOST``), else every combination the rule accepts one mesh axis at
    a time, then every way to lay those per-axis answers over each other (``_combined``); else each operand's layouts
    with the others at their defaults or replicated, the menu ``sampled``.
    ``answers``: the rule's answers kept across the nodes of one build, by ``node_signature`` and handed tuple (the
    layers of a model ask their rules alike)."""
    mesh_shape = dict(mesh.shape)
    op = lookup(node.op)
    one = _one_node_graph(graph, node)
    found: dict[tuple, NodeStrategy] = {}
    probed: dict[tuple[Layout, ...], list[tuple[Layout, ...]]] = {}

    signature = node_signature(graph, node) if answers is not None else None

    def visit(handed: tuple[Layout, ...]) -> list[tuple[Layout, ...]]:
        """Ask the rule about ``handed`` (once), keep the strategies it leads to; the layouts they consume the operands
        in."""
        if handed not in probed:
            shared = (signature, handed) if signature is not None else None
            strategies = answers.get(shared) if shared is not None else None
            if strategies is None:
                strategies = asked(handed)
                if shared is not None:
                    answers[shared] = strategies
            for strategy in strategies:
                tied = strategy.collective is not None and op.finish is None
                found.setdefault((strategy.needs, strategy.outputs, strategy.collective, strategy.cost,
                                  strategy.finished, strategy.handed if tied else None),
                                 replace(strategy, tied=True) if tied else _handed_as_consumed(strategy))
            probed[handed] = [tuple(t.even_layout for t in strategy.needs) for strategy in strategies]
        return probed[handed]

    # without a finish of its own (or a body), the split decides a node by its rule's answer alone, whatever was
    # handed: one decision per answer (a quarter of a transformer's asks answer alike)
    decided: dict[tuple, list[NodeStrategy]] = {}

    def asked(handed: tuple[Layout, ...]) -> tuple[NodeStrategy, ...]:
        result = probe(graph, node, op, handed, mesh_shape, propagate_body)
        if result is None:
            return ()
        alike = op.finish is None and result.body is None
        strategies = []
        for outputs in _settled_outputs(result.outputs, mesh_shape):
            answer = (tuple(result.needs), _answer_key(outputs), result.fallback, result.need_spans) if alike else None
            if answer in decided:
                strategies += [replace(s, handed=tuple(handed)) for s in decided[answer]]
                continue
            made = _decided(_one_node_product(one, mesh, handed, result, outputs, op), node.op, handed)
            if alike:
                decided[answer] = made
            strategies += made
        return tuple(strategies)

    sampled = False
    shapes = tuple(graph.avals[v].shape for v in node.operands)
    factors = op.factors(node, shapes) if op.factors is not None else None
    if factors is not None:
        for handed in _factored(factors, shapes, tuple(mesh_shape.items())):
            visit(handed)
    elif math.prod(len(o) for o in handed_options) <= FULL_PRODUCT_AT_MOST:
        for handed in itertools.product(*handed_options):
            visit(handed)
    else:
        for handed in _stars(handed_options):
            visit(handed)
        # a loop's or branch's operands are values apart (one mesh axis may lay out several): not one factor per axis
        laid = None if op.family is Family.CONTROL_FLOW else _combined(handed_options, shapes, mesh_shape, visit)
        sampled = laid is None
        for handed in laid or ():
            visit(handed)
    return Menu(tuple(found.values()), sampled)


def _handed_as_consumed(strategy: NodeStrategy) -> NodeStrategy:
    """A strategy its op's own finish completes, handed its operands as it consumes them: the rule handed those
    decides it alike (checked on the bench models' menus and on random contractions, ``tests/search/test_menu.py``),
    so one strategy stands for every handed tuple that leads to it — its operands brought to what it consumes by the
    edges' moves, whatever their producers hold (realized as views: ``.realize``)."""
    if strategy.collective is None:
        return strategy
    return replace(strategy, handed=tuple(t.even_layout for t in strategy.needs))


def _answer_key(outputs: tuple[TensorSharding, ...]) -> tuple:
    """Outputs as a rule lays them out, comparable across asks (its shards are fresh each time)."""
    return tuple((o.shape, tuple((a.mesh_axes, a.span) if isinstance(a, Sharded) else a for a in o.axes))
                 for o in outputs)


def _stars(options) -> list[tuple[Layout, ...]]:
    """Each operand's candidates with the others at their first (default) candidate, and with the others replicated
    (a rule lays a replicated operand out as the sharded one asks: every factor one operand can carry is met)."""
    replicated = tuple(((),) * len(o[0]) for o in options)
    tuples = []
    for base in (tuple(o[0] for o in options), replicated):
        tuples.append(base)
        tuples += [base[:k] + (layout,) + base[k + 1:] for k, candidates in enumerate(options) for layout in candidates
                   if layout != base[k]]
    return list(dict.fromkeys(tuples))


@functools.lru_cache(maxsize=4096)
def _factored(factors: tuple[tuple[int | None, ...], ...], shapes, mesh_items) -> tuple[tuple[Layout, ...], ...]:
    """Every handed tuple laying each mesh axis over one of the op's ``factors`` or none (several over one factor, in
    every order), the operands' axes laid out as their factors (an axis of none whole): those whose blocks divide the
    operands' ``shapes``. Every strategy the rule and the split find for any tuple consumes its operands so, and is
    found again handed what it consumes (``_handed_as_consumed``): these tuples find them all, without the product
    of every operand's layouts."""
    mesh_shape = dict(mesh_items)
    count = 1 + max((f for axes in factors for f in axes if f is not None), default=-1)
    names = list(mesh_shape)
    out = []
    for choice in itertools.product(range(-1, count), repeat=len(names)):
        over: dict[int, list[str]] = {}
        for name, f in zip(names, choice, strict=True):
            if f >= 0:
                over.setdefault(f, []).append(name)
        for orders in itertools.product(*(itertools.permutations(axes) for axes in over.values())):
            laid = dict(zip(over, orders, strict=True))
            handed = tuple(tuple(() if f is None else laid.get(f, ()) for f in axes) for axes in factors)
            if all(n % shard_count(mesh_shape, m) == 0 for shape, layout in zip(shapes, handed, strict=True)
                   for n, m in zip(shape, layout, strict=True)):
                out.append(handed)
    return tuple(out)


def _only(layout: Layout, name: str) -> Layout:
    return tuple(tuple(a for a in axes if a == name) for axes in layout)


def _combined(options, shapes, mesh_shape, visit) -> list[tuple[Layout, ...]] | None:
    """Handed tuples laying several mesh axes at once, built without their product: for each mesh axis, the operands'
    candidates cut down to that axis, every combination the rule accepts (``visit``: what it consumes, cut down too);
    then every choice of one accepted combination per axis, laid over each other (mesh order, and the reverse where
    two axes meet on one tensor axis). A rule's factors take each mesh axis independently, so a consistent tuple
    is met this way whichever its producers' layouts were; those whose blocks divide the operands' ``shapes`` (two
    axes laid over one may not). None where one axis's combinations, or the choices laid over each other, are more
    than ``FULL_PRODUCT_AT_MOST``."""
    per_axis = []
    for name in mesh_shape:
        cut = [tuple(dict.fromkeys(_only(layout, name) for layout in o)) for o in options]
        if math.prod(len(o) for o in cut) > FULL_PRODUCT_AT_MOST:
            return None
        accepted = [tuple(_only(layout, name) for layout in consumed) for handed in itertools.product(*cut)
                    for consumed in visit(handed)]
        per_axis.append(list(dict.fromkeys(accepted)) or [tuple(((),) * len(o[0]) for o in options)])
    if math.prod(len(a) for a in per_axis) > FULL_PRODUCT_AT_MOST:
        return None
    out = []
    for parts in itertools.product(*per_axis):
        for order in (parts, parts[::-1]):
            out.append(tuple(tuple(tuple(a for part in order for a in part[k][d]) for d in range(len(parts[0][k])))
                             for k in range(len(options))))
    return [handed for handed in dict.fromkeys(out)
            if all(n % shard_count(mesh_shape, axes) == 0 for shape, layout in zip(shapes, handed, strict=True)
                   for n, axes in zip(shape, layout, strict=True))]


def probe(graph: Graph, node: Node, op, handed: tuple[Layout, ...], mesh_shape, propagate_body):
    """The rule's answer for operands laid out as ``handed`` (no shards made), or None where it refuses them (a
    conflict, or an output laid out over one mesh axis twice)."""
    in_avals, out_avals = (tuple(graph.avals[v] for v in node.operands), tuple(graph.avals[v] for v in node.outputs))
    ctx = RuleContext(in_avals, out_avals, mesh_shape, itertools.count(), OpenTracker(), lineage=False,
                      propagate_body=propagate_body, graph=graph)
    ctx.node = node.id
    operands = _handed_shardings(tuple(a.shape for a in in_avals), tuple(handed))
    try:
        result = op.propagate(ctx, *operands, **node.params)
    except (RuleConflict, ShardingError):
        return None
    for sharding in result.outputs:  # a mesh axis on two axes of an output: the walk's conflict (Walk._settled)
        names = [name for a in sharding.axes if isinstance(a, Sharded) for name in a.mesh_axes]
        if len(names) != len(set(names)):
            return None
    return result


@functools.lru_cache(maxsize=65536)
def _handed_shardings(shapes, handed: tuple[Layout, ...]) -> tuple[TensorSharding, ...]:
    """Operands of ``shapes`` laid out as ``handed`` (no shards made): what the rule is asked about, and what the
    one-node program's arguments hold (made once for both)."""
    return tuple(TensorSharding(shape, tuple(Sharded(m, ()) if m else None for m in layout))
                 for shape, layout in zip(shapes, handed, strict=True))


def _settled_outputs(outputs: tuple[TensorSharding, ...], mesh_shape) -> list[tuple[TensorSharding, ...]]:
    """The outputs with each created axis (a broadcast's new one) laid out every way it can be: replicated, or over
    one mesh axis no other axis of that output uses and that divides it. None of them may use a mesh axis twice."""
    if not any(a is CREATED for sharding in outputs for a in sharding.axes):
        return [tuple(outputs)]  # (nothing to settle: every ask but a broadcast's; ``probe`` refused a mesh axis twice)
    per_output = []
    for sharding in outputs:
        used = {name for a in sharding.axes if isinstance(a, Sharded) for name in a.mesh_axes}
        free = [name for name in mesh_shape if name not in used]
        choices = []
        for k, a in enumerate(sharding.axes):
            if a is CREATED:
                n = sharding.shape[k]
                choices.append([None] + [Sharded((name,), ()) for name in free if n % mesh_shape[name] == 0])
            else:
                choices.append([a])
        settled = []
        for axes in itertools.product(*choices):
            names = [name for a in axes if isinstance(a, Sharded) for name in a.mesh_axes]
            if len(names) == len(set(names)):
                settled.append(TensorSharding(sharding.shape, tuple(axes)))
        per_output.append(settled)
    return list(itertools.product(*per_output))


@functools.lru_cache(maxsize=4096)
def _one_node_graph(graph: Graph, node: Node) -> Graph:
    """``node`` alone, its operands the arguments (values 0..m-1) and its outputs values m..; it returns nothing (its
    outputs are held as the node leaves them, not as a program returns them)."""
    m = len(node.operands)
    params = tuple(Node(k, PARAMETER, (), (k,), {"index": k}, None) for k in range(m))
    inner = Node(m, node.op, tuple(range(m)), tuple(range(m, m + len(node.outputs))), node.params, node.source,
                 node.primitive)
    avals = tuple(graph.avals[v] for v in node.operands) + tuple(graph.avals[v] for v in node.outputs)
    return Graph(nodes=params + (inner,), avals=avals, inputs=tuple(range(m)), outputs=(), in_tree=None,
                 out_tree=None)


def _one_node_product(one: Graph, mesh, handed, result, outputs, op) -> ShardedGraph:
    """The propagated one-node program: its arguments held as handed, the node as its rule answered."""
    m = len(handed)
    args = _handed_shardings(tuple(a.shape for a in one.avals[:m]), tuple(handed))
    fallback = op.is_fallback or result.fallback
    return ShardedGraph(one, mesh, args + tuple(outputs), ((),) * m + (tuple(result.needs),),
                        (RuleName.INPUT_SPEC,) * m + (RuleName.FALLBACK if fallback else op.rule_name,),
                        frozenset({m}) if fallback else frozenset(),
                        {m: result.body} if result.body is not None else {},
                        need_spans={m: result.need_spans} if result.need_spans is not None else {})


def _decided(sharded: ShardedGraph, op_name: str, handed) -> list[NodeStrategy]:
    """The node gathering what its rule needs whole, and — where its record offers one — finished by a collective
    instead (each as the split decides it on the one-node program); a sum finished so may also be held finer, a
    reduce-scatter along one axis (``_scattered``)."""
    m = len(handed)
    node = sharded.graph.nodes[m]
    found = []
    # without a finish of its own a node is decided alike either way (its required collective, if any, is the same)
    offers = lookup(op_name).finish is not None or bool(sharded.bodies)
    for choice in (Strategy.GATHER, Strategy.COLLECTIVE):
        if choice is Strategy.COLLECTIVE and not offers:
            break
        decisions = decide(sharded, choice)
        collective = decisions.collective(m)
        required = collective is not None and collective.kind.required
        if choice is Strategy.COLLECTIVE and (collective is None or required):
            continue  # nothing offered beyond what gathering does
        if not sharded.bodies and all(not need.partial and need.even_layout == h
                                      for need, h in zip(decisions.needs(m), handed, strict=True)):
            offers = False  # nothing gathered: a finish, which takes the place of gathering, has nothing to do
        for view in (decisions, *_scattered(decisions, node, collective)):
            found.append(_strategy(view, node, handed, collective, choice is Strategy.COLLECTIVE))
    return found


def _strategy(view, node, handed, collective, finished: bool) -> NodeStrategy:
    """The node as ``view`` decides it, priced: its work, its finish's bytes, its bodies' moves."""
    cost = compute_bytes(view, node) if lookup(node.op).work is not None else 0.0
    if collective is not None:
        cost += collective_bytes(view, node, collective)
    cost += total_moved(body_transfers(view, node.id))
    return NodeStrategy(tuple(handed), view.needs(node.id), tuple(view.type(v) for v in node.outputs), collective,
                        cost, finished)


def _scattered(decisions, node, collective) -> list:
    """A sum's result held finer, one variant per axis its mesh axes can also lay out: the split's reduce-scatter
    where every reader takes the value sliced so (``splitting.strategies.scatter_where_consumers_slice``), half
    an all-reduce's bytes — the layouts Megatron's sequence parallelism keeps between its matmuls."""
    if collective is None or collective.kind is not CollectiveKind.PSUM or len(node.outputs) != 1:
        return []
    (v,) = node.outputs
    held = decisions.type(v)
    if held.partial:
        return []
    layout, shape = held.layout, decisions.graph.avals[v].shape
    out = []
    for d in range(len(layout)):
        target = layout[:d] + (layout[d] + collective.mesh_axes,) + layout[d + 1:]
        if shape[d] % shard_count(decisions.mesh_shape, target[d]) == 0:
            out.append(decisions.revised(held={v: ValueType(target)}))
    return out
