"""The backward pass: a value's uses decide its layout where producing it that way costs least.

The forward walk lays each value out from its operands. Where a use then needs it in another layout (a
gradient taken by ``p - lr * g`` in its parameter's layout, a replicated result sliced by the op that reads it),
the value is moved just before that use. This pass asks, from the last node back, whether the value's producer
could have produced it in the layout its uses need for no more than that move costs — its operands taken
sliced (free: each device keeps its block of a replicated operand) or gathered (an all-gather of a smaller
operand than the result) — and if so asks the producer's operands the same, and so on: a conflict is resolved
at the op of the chain where it costs least, not at the op that found it.

The answer is a set of *views*: ``(node, operand) -> layout``, the layout in which the node is to take that
operand. Propagation runs once more with them (``shardprop.propagation.propagate``); each view is priced by the
one move model (``shardprop.core.moves.move_bytes``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..core.layouts import Layout, layout_refines
from ..core.moves import move_bytes
from ..core.types import ValueType
from ..expr.graph import CONSTANT, PARAMETER
from ..ops import has_record, lookup
from ..ops.opdef import Family
from .producing import mesh_axes_used, produce_as_remembered
from .product import MADE, RETURNED, ShardedGraph


@dataclass(frozen=True)
class Mirror:
    """The program's ``output`` is asked for in the layout of its ``argument``: it mirrors it (a gradient, an updated
    parameter or optimizer state comes out shaped like the argument it belongs to, and laid out like it — as
    ``jax.jit``'s explicit mode types a cotangent like its primal — wherever producing it so moves no more)."""

    output: int
    argument: int


@dataclass(frozen=True)
class View:
    """A node takes one of its operands in ``layout`` (the forward walk had it take it in ``was``) because ``use`` (a
    later node, or a program output mirroring an argument) needs the value it produces, or one computed from it,
    laid out accordingly."""

    layout: Layout
    was: Layout
    use: int | Mirror
    exact: bool = False  # taken in exactly ``layout`` (the search decided it), never kept as held where it was


Views = Mapping[tuple[int, int], View]


@dataclass(frozen=True)
class Backward:
    """What the backward pass found: the ``views`` to propagate with, and the conflicts (by node) it ``priced``: a node
    of their chain could have produced the moved operand in the layout the conflict needs, at a higher price, so the
    move where the conflict is met is a choice among priced alternatives (not warned about), not a clash of the
    user's layouts (which no node could have avoided: warned, and refused under ``conflicts='error'``)."""

    views: Views
    priced: frozenset[int]


def wanted_views(sharded: ShardedGraph, *, optimistic: bool = False, exchanges: bool = False,
                 finest: bool = False, memo: dict | None = None) -> Backward:
    """The views that produce values in the layout their uses need, where that moves less than moving them there
    (see the module docstring); empty when every use takes its operand as it is held.

    A chain of such steps, from a use back to the nodes that change how they take their operands, is kept or
    dropped whole: kept when it moves fewer bytes in all, or as many and some node takes an operand sliced where it
    was held whole (a choice the forward walk did not make); dropped when it only carries a move back through ops
    that have no choice (x + x.T: the all-to-all before the transpose rather than after), so that a clash stays
    where the user's code meets it. ``optimistic`` carries a chain back through a node even where that node's
    operands cost more to move than its result: several operands computed from one value (adam's
    ``m / (sqrt(v) + eps)``, both from the gradient) may all be produced in place by one choice further back.
    ``exchanges`` lets a node take an operand by an all-to-all (its mesh axes moved from one axis to another) where
    no operand held whole can be sliced instead. ``finest`` asks a value whose uses ask nested slices of it (an
    elementwise use as held, a product sliced) in the finest of them: the others then read it sliced too, which
    changes what they make (priced by the plan, not here). ``memo``: a dict kept between calls on one graph and mesh
    (``propagate(memo=)``'s), remembering how each node could produce its value otherwise, where no shards were
    made (``_produce_as_remembered``)."""
    walk = _BackwardWalk(sharded, optimistic=optimistic, exchanges=exchanges, finest=finest, memo=memo)
    for node in reversed(sharded.graph.nodes):
        walk.visit(node)
    return walk.found()


class _BackwardWalk:
    """``wanted_views``'s walk from the last node back: what each use asks of its operand (``wants``: the layout asked
    and the chain asking it), the chains they make (``_Chains``)."""

    def __init__(self, sharded: ShardedGraph, *, optimistic: bool, exchanges: bool, finest: bool, memo: dict | None):
        self.sharded, self.graph, self.mesh_shape = sharded, sharded.graph, sharded.mesh_shape
        self.optimistic, self.exchanges, self.finest, self.memo = optimistic, exchanges, finest, memo
        graph = self.graph
        self.consumers: list[list[tuple[int, int]]] = [[] for _ in graph.avals]
        for node in graph.nodes:
            for j, value in enumerate(node.operands):
                self.consumers[value].append((node.id, j))
        self.mirrors = {} if sharded.is_body else mirrored_outputs(sharded)
        for output in self.mirrors:  # a returned value asked for like its argument: a use that moves nothing
            self.consumers[graph.outputs[output]].append((RETURNED, output))
        self.conflicts = {(node_id, operand) for node_id, (operand, _) in sharded.reshards.items()}
        self.chains = _Chains()
        self.finished = {node.id for node in graph.nodes if has_record(node.op) and lookup(node.op).finish is not None}
        self.wants: dict[tuple[int, int], tuple[Layout, int]] = {}  # (node, operand) -> (layout asked, its chain)

    def asks(self, edge, held) -> Layout:
        """What a use asks of its operand: its need — but a node a collective may finish (a contraction, a
        scatter-add, a lookup) takes it as it is held: the axes its propagation rule needs whole, the split pass
        may instead keep sharded and finish (a psum of the result), so they are no move to avoid."""
        sharded, graph = self.sharded, self.graph
        if edge[0] == RETURNED:
            return sharded.layout(graph.inputs[self.mirrors[edge[1]].argument])
        if edge[0] not in self.finished:
            return sharded.needs[edge[0]][edge[1]]
        # (a product the split may finish by a psum of partial products takes this operand's summed axes sliced as
        # the other operand holds them: asked for so, free where it is held whole — the op's ``finished_operand``)
        node = graph.nodes[edge[0]]
        finished_operand = lookup(node.op).finished_operand
        if finished_operand is None:
            return held
        return finished_operand(node, edge[1], [sharded.layout(v) for v in node.operands],
                                sharded.needs[edge[0]][edge[1]], [graph.avals[v].shape for v in node.operands],
                                self.mesh_shape)

    def use(self, edge) -> int | Mirror:
        return self.mirrors[edge[1]] if edge[0] == RETURNED else edge[0]

    def returned_as_asked(self, value) -> None:
        """A returned value its producer cannot be asked to make otherwise (its uses disagree, it has several
        results): its open axes (a broadcast's, say) may still adopt the layout it mirrors, or it is returned sliced
        so — a candidate the plan's price decides on."""
        held = self.sharded.layout(value)
        for edge in self.consumers[value]:
            if edge[0] == RETURNED and edge not in self.wants and self.asks(edge, held) != held:
                chain = self.chains.start(self.use(edge))
                self.wants[edge] = (self.asks(edge, held), chain)
                self.chains.step(chain, 0.0, True)

    def _asked_of(self, node) -> int | None:
        """The value of ``node`` its uses may ask it to produce otherwise; None for a node not asked (a parameter of
        the user's layout, a constant, a fallback, a loop, several results), its returned results handled."""
        sharded, graph = self.sharded, self.graph
        # an unannotated argument takes the layout its uses ask (it adopts what it meets: here, what they need)
        free = node.op == PARAMETER and not sharded.is_body and sharded.is_unannotated_input(node.outputs[0])
        if node.op in (PARAMETER, CONSTANT) and not free:
            if node.op == CONSTANT and graph.avals[node.outputs[0]].ndim:
                self.returned_as_asked(node.outputs[0])  # a constant array returned (a zero gradient): sliced like it
            return None
        if not free and (node.id in sharded.fallbacks or not has_record(node.op)
                         or lookup(node.op).runs_outside_shard_map):
            return None  # (it may run outside shard_map, on whole arrays: nothing there to slice)
        if not free and (len(node.outputs) != 1 or node.id in sharded.bodies):
            for value in node.outputs:  # no trial of it (several results, a loop): its returned results may be sliced
                if not sharded.shardings[value].spans:
                    self.returned_as_asked(value)
            return None
        value = node.outputs[0]
        # a returned value may change its layout too (the program returns it as produced, as jax.jit's outputs take
        # the layout propagation gives them); a body's outputs are taken by its op as they are
        if sharded.is_body and value in graph.outputs or sharded.shardings[value].spans or not self.consumers[value]:
            return None
        return value

    def _target(self, value, held, asking) -> Layout | None:
        """The one layout the uses ``asking`` ask of ``value`` (held as ``held``) other than it is held; None where
        they ask it as held, or disagree (then it is returned as asked)."""
        asked = {self.wants[edge][0] if edge in self.wants else self.asks(edge, held) for edge in asking}
        # uses that ask it sliced further than others take it (an elementwise use of a whole value can take it
        # sliced too, for free): with ``finest``, the finest, where each is a slice of what is held and of the others
        finer = [a for a in asked if all(layout_refines(b, a) for b in asked)] if self.finest else []
        if len(asked) > 1 and finer and all(layout_refines(held, a) for a in asked):
            asked = {finer[0]}
        if len(asked) != 1 or held in asked:
            return None
        target = asked.pop()
        # its readers slice it for free, and so does an output that mirrors a layout the target is no slice of: made
        # as held, each takes its own slice (made as the readers ask, that output could not be sliced from it)
        mirrored = [self.asks(edge, held) for edge in self.consumers[value] if edge[0] == RETURNED]
        if layout_refines(held, target) and any(layout_refines(held, m) and not layout_refines(target, m)
                                                for m in mirrored):
            return None
        return target

    def visit(self, node) -> None:
        """Ask ``node`` to produce its value as its uses ask, where that moves no more than moving it there."""
        value = self._asked_of(node)
        if value is None:
            return
        sharded, chains, wants = self.sharded, self.chains, self.wants
        held = sharded.layout(value)
        # a mirror asks last: where nodes read the value, they decide (it may still be returned sliced so)
        reading = [edge for edge in self.consumers[value] if edge[0] != RETURNED]
        asking = reading or self.consumers[value]
        target = self._target(value, held, asking)
        if target is None:
            self.returned_as_asked(value)
            return
        joined = [wants[edge][1] for edge in asking if edge in wants]
        # (a new chain starts at the use that asks the layout: the one explain names)
        first = next((edge for edge in asking if self.asks(edge, held) == target), asking[0])
        chain = chains.join(joined) if joined else chains.start(self.use(first))
        aval = self.graph.avals[value]
        move = move_bytes(aval.shape, aval.dtype, ValueType(held), ValueType(target), self.mesh_shape)
        # what the uses pay when the value is not produced so: each later step of a chain counted one move of it in
        # its price; the uses the forward walk planned share one move, whichever read it (a returned value is
        # returned as held: a mirror asks, but pays nothing when not met)
        here = move * (len(joined) + any(edge not in wants and edge[0] != RETURNED for edge in self.consumers[value]))
        clashes = [consumer for consumer, j in self.consumers[value] if (consumer, j) in self.conflicts]
        if clashes:
            chains.conflicted(chain, clashes)
        free = node.op == PARAMETER  # (asked of, a parameter is an unannotated argument: ``_asked_of``)
        # (free, but no choice of its own: it follows the chain, which must make one elsewhere to be kept)
        plan = (0.0, [], False) if free else produce_as_remembered(sharded, node, target, self.exchanges, self.memo)
        if plan is None:  # no operand layouts make it so
            self.returned_as_asked(value)
            return
        cost, operand_layouts, choice = plan
        # made as its readers ask, a value returned for the next call (a KV cache) goes back to its argument's layout
        cost += sum(move_bytes(aval.shape, aval.dtype, ValueType(target), ValueType(mirrored), self.mesh_shape)
                    for mirrored in (self.asks(edge, held) for edge in self.consumers[value] if edge[0] == RETURNED)
                    if reading and mirrored != target)
        if cost > here and not (self.optimistic and chains.is_conflict(chain)):
            self.returned_as_asked(value)
            return
        chains.step(chain, cost - here, choice)
        for j, layout in enumerate(operand_layouts):
            if layout is not None:
                wants[(node.id, j)] = (layout, chain)
        if not node.operands and not free:  # (an iota: nothing to take otherwise, it is made so)
            wants[(node.id, MADE)] = (target, chain)
        if reading:
            self.returned_as_asked(value)
        else:  # a returned value's created axes take the layout it mirrors (no node to ask)
            for edge in self.consumers[value]:
                wants[edge] = (target, chain)

    def found(self) -> Backward:
        """The views of the chains kept, and the conflicts priced."""
        views = {}
        for (node_id, j), (layout, chain) in self.wants.items():
            if self.chains.kept(chain):
                was = self.sharded.layout(self.graph.outputs[j]) if node_id == RETURNED else \
                    self.sharded.layout(self.graph.nodes[node_id].outputs[0]) if j == MADE else \
                    self.sharded.needs[node_id][j]
                views[(node_id, j)] = View(layout, was, self.chains.use(chain))
        return Backward(views, frozenset(self.chains.priced()))


def mirrored_outputs(sharded: ShardedGraph) -> dict[int, Mirror]:
    """The program outputs that mirror an argument, by output index: an output of an argument's shape and dtype, that
    argument annotated and sharded, the output not laid out by an annotation of the user's (``out_specs``, a sharding
    constraint). Where outputs and arguments of one shape and dtype are as many, the k-th output
    mirrors the k-th argument (``jax.grad(f, argnums=...)``, a training step returning its parameters and optimizer
    states updated, in order); otherwise an output mirrors them only where all of them are laid out alike.

    >>> mirrored_outputs(propagate(trace(jax.grad(lambda x, y: (x @ y).sum(), (0, 1)), x, y),      # doctest: +SKIP
    ...                            (P('x'), P(None, 'y')), mesh=mesh))
    {0: Mirror(output=0, argument=0), 1: Mirror(output=1, argument=1)}
    """
    graph = sharded.graph

    def kind(value):
        aval = graph.avals[value]
        return aval.shape, aval.dtype

    arguments: dict[tuple, list[int]] = {}
    for index, value in enumerate(graph.inputs):
        arguments.setdefault(kind(value), []).append(index)
    outputs: dict[tuple, list[int]] = {}
    inputs = set(graph.inputs)
    for index, value in enumerate(graph.outputs):
        if value not in inputs and graph.avals[value].ndim:
            outputs.setdefault(kind(value), []).append(index)
    # (an output the user's annotation lays out — out_specs, a sharding constraint — is never changed)
    pinned = {index for index, value in enumerate(graph.outputs) if value not in inputs
              and has_record(op := graph.nodes[graph.producer[value]].op) and lookup(op).family is Family.PLACEMENT}
    found = {}
    for key, returned in outputs.items():
        alike = arguments.get(key, [])
        if len(alike) == len(returned):
            pairs = zip(returned, alike, strict=True)
        elif alike and len({sharded.layout(graph.inputs[i]) for i in alike}) == 1:
            pairs = ((k, alike[0]) for k in returned)
        else:
            continue
        for output, argument in pairs:
            value = graph.inputs[argument]
            if output not in pinned and not sharded.is_unannotated_input(value) \
                    and mesh_axes_used(sharded.layout(value)):
                found[output] = Mirror(output, argument)
    return found


class _Chains:
    """The chains of the backward pass, joined where two meet at one value (union-find): each one's bytes saved
    (negative: fewer moved), whether a node of it makes a choice, whether a conflict started it, and its use."""

    def __init__(self):
        self.parent: dict[int, int] = {}
        self.net: dict[int, float] = {}
        self.choice: dict[int, bool] = {}
        self.conflict: dict[int, bool] = {}
        self.clashes: dict[int, list[int]] = {}  # chain -> the nodes where its conflicts were met
        self.uses: list[int | Mirror] = []  # chain -> the node (or returned value) whose need started it

    def start(self, use: int | Mirror) -> int:
        chain = len(self.uses)
        self.uses.append(use)
        self.parent[chain], self.net[chain], self.choice[chain], self.conflict[chain] = chain, 0.0, False, False
        return chain

    def find(self, chain: int) -> int:
        while self.parent[chain] != chain:
            self.parent[chain] = self.parent[self.parent[chain]]
            chain = self.parent[chain]
        return chain

    def join(self, chains: list[int]) -> int:
        roots = list(dict.fromkeys(self.find(c) for c in chains))
        first = roots[0]
        for other in roots[1:]:
            self.parent[other] = first
            self.net[first] += self.net.pop(other)
            self.choice[first] = self.choice[first] or self.choice.pop(other)
            self.conflict[first] = self.conflict[first] or self.conflict.pop(other)
        return first

    def conflicted(self, chain: int, nodes: list[int]) -> None:
        root = self.find(chain)
        self.conflict[root] = True
        self.clashes.setdefault(root, []).extend(nodes)

    def priced(self) -> set[int]:
        """The conflicts (by node) whose chain reached a node that could produce the operand in place — a choice —
        but moved more there: the move where the conflict was met is the cheapest resolution, chosen, not a clash."""
        found = set()
        for chain, nodes in self.clashes.items():
            root = self.find(chain)
            if self.choice[root] and not self.kept(root):
                found.update(nodes)
        return found

    def is_conflict(self, chain: int) -> bool:
        return self.conflict[self.find(chain)]

    def step(self, chain: int, extra: float, choice: bool) -> None:
        root = self.find(chain)
        self.net[root] += extra
        self.choice[root] = self.choice[root] or choice

    def kept(self, chain: int) -> bool:
        root = self.find(chain)
        return self.net[root] < 0 or self.net[root] == 0 and self.choice[root]

    def use(self, chain: int) -> int | Mirror:
        """The node whose need started the chain (the first, where two chains met)."""
        return self.uses[self.find(chain)]


def lookup_alternatives(sharded: ShardedGraph) -> Views:
    """The other ways to take their operands that ops offer (``OpDef.alternative``: a lookup's indices gathered where
    they share a mesh axis with the table's whole window), as views: candidates the plan's price decides on."""
    graph = sharded.graph
    views = {}
    if sharded.is_body:
        return views
    for node in graph.nodes:
        if node.id in sharded.fallbacks or not has_record(node.op) or lookup(node.op).alternative is None:
            continue
        shapes = [graph.avals[v].shape for v in node.operands]
        needs = sharded.needs[node.id]
        taken = lookup(node.op).alternative(node, shapes, [sharded.layout(v) for v in node.operands], needs)
        for j, layout in taken.items():
            views[(node.id, j)] = View(layout, tuple(needs[j]), node.id)
    return views
