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
from itertools import count

from ..core.layouts import Layout, Sharded, TensorSharding, is_refinement, layout_refines, shard_count
from ..core.moves import move_bytes
from ..core.rules import CREATED, OpenTracker, RuleConflict, RuleContext
from ..core.types import ValueType, held_whole
from ..errors import ShardingError
from ..expr.graph import CONSTANT, PARAMETER
from ..ops import has_record, lookup
from ..ops.opdef import Family
from .origins import holds
from .product import RETURNED, ShardedGraph


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
    graph, mesh_shape = sharded.graph, sharded.mesh_shape
    consumers: list[list[tuple[int, int]]] = [[] for _ in graph.avals]
    for node in graph.nodes:
        for j, value in enumerate(node.operands):
            consumers[value].append((node.id, j))
    mirrors = {} if sharded.is_body else mirrored_outputs(sharded)
    for output in mirrors:  # a returned value asked for like its argument: a use that moves nothing
        consumers[graph.outputs[output]].append((RETURNED, output))
    conflicts = {(node_id, operand) for node_id, (operand, _) in sharded.reshards.items()}
    chains = _Chains()
    finished = {node.id for node in graph.nodes if has_record(node.op) and lookup(node.op).finish is not None}

    def asks(edge, held):
        """What a use asks of its operand: its need — but a node a collective may finish (a contraction, a
        scatter-add, a lookup) takes it as it is held: the axes its propagation rule needs whole, the split pass
        may instead keep sharded and finish (a psum of the result), so they are no move to avoid."""
        if edge[0] == RETURNED:
            return sharded.layout(graph.inputs[mirrors[edge[1]].argument])
        if edge[0] not in finished:
            return sharded.needs[edge[0]][edge[1]]
        # (a product the split may finish by a psum of partial products takes this operand's summed axes sliced as
        # the other operand holds them: asked for so, free where it is held whole)
        node = graph.nodes[edge[0]]
        return _summed_as_partner_holds(sharded, node, edge[1]) if node.op == "dot_general" else held

    def use(edge) -> int | Mirror:
        return mirrors[edge[1]] if edge[0] == RETURNED else edge[0]

    wants: dict[tuple[int, int], tuple[Layout, int]] = {}  # (node, operand) -> (layout asked there, its chain)

    def returned_as_asked(value) -> None:
        """A returned value its producer cannot be asked to make otherwise (its uses disagree, it has several
        results): its open axes (a broadcast's, say) may still adopt the layout it mirrors, or it is returned sliced
        so — a candidate the plan's price decides on."""
        held = sharded.layout(value)
        for edge in consumers[value]:
            if edge[0] == RETURNED and edge not in wants and asks(edge, held) != held:
                chain = chains.start(use(edge))
                wants[edge] = (asks(edge, held), chain)
                chains.step(chain, 0.0, True)

    for node in reversed(graph.nodes):
        # an unannotated argument takes the layout its uses ask (it adopts what it meets: here, what they need)
        free = node.op == PARAMETER and not sharded.is_body and sharded.is_unannotated_input(node.outputs[0])
        if node.op in (PARAMETER, CONSTANT) and not free:
            if node.op == CONSTANT and graph.avals[node.outputs[0]].ndim:
                returned_as_asked(node.outputs[0])  # a constant array returned (a zero gradient): sliced like it
            continue
        if not free and (node.id in sharded.fallbacks or not has_record(node.op)
                         or lookup(node.op).runs_outside_shard_map):
            continue  # (it may run outside shard_map, on whole arrays: nothing there to slice)
        if not free and (len(node.outputs) != 1 or node.id in sharded.bodies):
            for value in node.outputs:  # no trial of it (several results, a loop): its returned results may be sliced
                if not sharded.shardings[value].spans:
                    returned_as_asked(value)
            continue
        value = node.outputs[0]
        # a returned value may change its layout too (the program returns it as produced, as jax.jit's outputs take
        # the layout propagation gives them); a body's outputs are taken by its op as they are
        if sharded.is_body and value in graph.outputs or sharded.shardings[value].spans or not consumers[value]:
            continue
        held = sharded.layout(value)
        # a mirror asks last: where nodes read the value, they decide (it may still be returned sliced so)
        reading = [edge for edge in consumers[value] if edge[0] != RETURNED]
        asking = reading or consumers[value]
        asked = {wants[edge][0] if edge in wants else asks(edge, held) for edge in asking}
        # uses that ask it sliced further than others take it (an elementwise use of a whole value can take it
        # sliced too, for free): with ``finest``, the finest, where each is a slice of what is held and of the others
        finer = [a for a in asked if all(layout_refines(b, a) for b in asked)] if finest else []
        if len(asked) > 1 and finer and all(layout_refines(held, a) for a in asked):
            asked = {finer[0]}
        if len(asked) != 1 or held in asked:
            returned_as_asked(value)
            continue
        target = asked.pop()
        # its readers slice it for free, and so does an output that mirrors a layout the target is no slice of: made
        # as held, each takes its own slice (made as the readers ask, that output could not be sliced from it)
        mirrored = [asks(edge, held) for edge in consumers[value] if edge[0] == RETURNED]
        if layout_refines(held, target) and any(layout_refines(held, m) and not layout_refines(target, m)
                                                for m in mirrored):
            returned_as_asked(value)
            continue
        joined = [wants[edge][1] for edge in asking if edge in wants]
        # (a new chain starts at the use that asks the layout: the one explain names)
        first = next((edge for edge in asking if asks(edge, held) == target), asking[0])
        chain = chains.join(joined) if joined else chains.start(use(first))
        aval = graph.avals[value]
        move = move_bytes(aval.shape, aval.dtype, ValueType(held), ValueType(target), mesh_shape)
        # what the uses pay when the value is not produced so: each later step of a chain counted one move of it in
        # its price; the uses the forward walk planned share one move, whichever read it (a returned value is
        # returned as held: a mirror asks, but pays nothing when not met)
        here = move * (len(joined) + any(edge not in wants and edge[0] != RETURNED for edge in consumers[value]))
        clashes = [consumer for consumer, j in consumers[value] if (consumer, j) in conflicts]
        if clashes:
            chains.conflicted(chain, clashes)
        # (free, but no choice of its own: it follows the chain, which must make one elsewhere to be kept)
        plan = (0.0, [], False) if free else _produce_as_remembered(sharded, node, target, exchanges, memo)
        if plan is None:  # no operand layouts make it so
            returned_as_asked(value)
            continue
        cost, operand_layouts, choice = plan
        if cost > here and not (optimistic and chains.is_conflict(chain)):
            returned_as_asked(value)
            continue
        chains.step(chain, cost - here, choice)
        for j, layout in enumerate(operand_layouts):
            if layout is not None:
                wants[(node.id, j)] = (layout, chain)
        if reading:
            returned_as_asked(value)
        else:  # a returned value's created axes take the layout it mirrors (no node to ask)
            for edge in consumers[value]:
                wants[edge] = (target, chain)
    views = {}
    for (node_id, j), (layout, chain) in wants.items():
        if chains.kept(chain):
            was = sharded.layout(graph.outputs[j]) if node_id == RETURNED else sharded.needs[node_id][j]
            views[(node_id, j)] = View(layout, was, chains.use(chain))
    return Backward(views, frozenset(chains.priced()))


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
            if output not in pinned and not sharded.is_unannotated_input(value) and _used(sharded.layout(value)):
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


# The families whose collective finish reads a node's operands as its rule takes them (a view's slices included):
# contractions' and convolutions' summed pairs, reductions' kept axes. Others (scatters, lookups, scans) keep the
# forward walk's layouts for their operands.
_FINISHED_AS_TAKEN = (Family.CONTRACTION, Family.REDUCTION)
_CONVOLUTION = "conv_general_dilated"  # of the window family, the one whose finish is a contraction's


def _summed_as_partner_holds(sharded: ShardedGraph, node, j: int) -> Layout:
    """Operand ``j`` of a ``dot_general`` as a psum finish takes it: each contracted axis it holds whole sliced over the
    mesh axes the other operand's paired axis is held over (each device multiplies its blocks and sums them)."""
    (lhs, rhs), _ = node.params["dimension_numbers"]
    own, other = sharded.layout(node.operands[j]), sharded.layout(node.operands[1 - j])
    mine, theirs = (lhs, rhs) if j == 0 else (rhs, lhs)
    taken = list(own)
    for a, b in zip(mine, theirs, strict=True):
        if not own[a] and other[b] and not _used(taken) & set(other[b]) \
                and sharded.graph.avals[node.operands[j]].shape[a] % shard_count(sharded.mesh_shape, other[b]) == 0:
            taken[a] = other[b]
    return tuple(taken)


def _used(layout) -> set[str]:
    return {m for axes in layout for m in axes}


def _slices_free(held: Layout, need: Layout) -> bool:
    """True when ``need`` shards an axis over a mesh axis ``held`` does not use at all: each device keeps a block of
    what it holds whole (an all-to-all, which also shards an axis further, is no such choice)."""
    used = _used(held)
    return any(m not in used for axes in need for m in axes)


def _produce_as_remembered(sharded: ShardedGraph, node, target: Layout, exchanges: bool, memo: dict | None):
    """``_produce_as``, from ``memo`` where a backward pass asked it before of the node, its operands, its value
    and its operands' needs laid out alike, in a walk without shards (what it reads is then their layouts, and which
    operand the walk moved to resolve a conflict)."""
    if memo is None:
        return _produce_as(sharded, node, target, exchanges)
    held = [_axes_key(sharded.shardings[v]) for v in (*node.operands, node.outputs[0])]
    if any(axes is None for axes in held):  # shards made (or an open axis): their lineage is read
        return _produce_as(sharded, node, target, exchanges)
    key = ("produce as", node.id, target, exchanges, tuple(held), sharded.needs[node.id],
           sharded.reshards.get(node.id, (None,))[0])
    if key not in memo:
        memo[key] = _produce_as(sharded, node, target, exchanges)
    return memo[key]


def _axes_key(sharding: TensorSharding) -> tuple | None:
    """Each axis of ``sharding`` as its mesh axes and span; None where one has shards or is open."""
    key = []
    for a in sharding.axes:
        if a is None:
            key.append(None)
        elif isinstance(a, Sharded) and not a.shards:
            key.append((a.mesh_axes, a.span))
        else:
            return None
    return tuple(key)


def _produce_as(sharded: ShardedGraph, node, target: Layout,
                exchanges: bool) -> tuple[float, list[Layout | None], bool] | None:
    """How ``node`` could produce its value in ``target``: (bytes its operands' moves cost beyond what they cost now,
    per operand the layout to take it in or None where unchanged, whether that is a choice — ``_is_choice``);
    None when no such operand layouts exist."""
    rule = lookup(node.op)
    if rule.finish is not None and rule.family not in _FINISHED_AS_TAKEN and node.op != _CONVOLUTION:
        return None  # its finish would read its operands as held, not as a view takes them
    operands = [sharded.shardings[v] for v in node.operands]
    if any(o.spans for o in operands):
        return None
    trial = _trial_layouts(sharded, node, rule, operands, target, exchanges)
    result = None if trial is None else _run(rule, sharded, node, trial)
    if result is None:
        return None
    (layout, created), needs = result
    held = sharded.layout(node.outputs[0])
    if any(t != got and not c for t, got, c in zip(target, layout, created, strict=True)):
        return None
    graph, mesh_shape = sharded.graph, sharded.mesh_shape
    cost = 0.0
    for operand_id, operand, new, old in zip(node.operands, operands, needs, sharded.needs[node.id], strict=True):
        aval = graph.avals[operand_id]
        have = held_whole(operand.layout)
        cost += move_bytes(aval.shape, aval.dtype, have, ValueType(new), mesh_shape) - \
            move_bytes(aval.shape, aval.dtype, have, ValueType(old), mesh_shape)
    # an axis the node creates (a broadcast's) takes whatever layout it is given: a choice too
    choice = _is_choice(operands, needs, sharded.needs[node.id], target) or any(
        c and t != h for t, h, c in zip(target, held, created, strict=True))
    # each operand is asked for in the layout the node then consumes it in (an elementwise op slices the operands
    # the trial left whole as it slices the one it changed): produced so upstream, it is not moved at all here
    layouts = [tuple(map(tuple, new)) if tuple(map(tuple, new)) != tuple(map(tuple, old)) else None
               for new, old in zip(needs, sharded.needs[node.id], strict=True)]
    return cost, layouts, choice


def _trial_layouts(sharded: ShardedGraph, node, rule, operands, target: Layout,
                   exchanges: bool) -> list[list[tuple[str, ...]]] | None:
    """Operand layouts under which ``node``'s rule lays its value out as ``target``: the operand axes a dropped
    mesh axis came from (by shard lineage) take it no more; an axis ``target`` shards further takes the mesh axes
    from an operand axis held whole (each device slices its block) or, with ``exchanges``, from another axis of the
    same operand (an all-to-all). None when no operand axis does it."""
    graph, mesh_shape = sharded.graph, sharded.mesh_shape
    value = node.outputs[0]
    held = sharded.layout(value)
    trial = [list(o.layout) for o in operands]
    output = sharded.shardings[value]
    for axis, (have, want) in enumerate(zip(held, target, strict=True)):
        dropped = set(have) - set(want)
        if not dropped:
            continue
        if isinstance(output.axes[axis], Sharded) and not output.axes[axis].shards:
            output, operands = _with_lineage(sharded, node, rule, operands)
        a = output.axes[axis]
        for shard in a.shards if isinstance(a, Sharded) else ():
            for parent in shard.parents:
                for j, operand in enumerate(operands):
                    if holds(operand, parent):
                        trial[j][parent.axis] = tuple(m for m in trial[j][parent.axis] if m not in dropped)
    for axis, (have, want) in enumerate(zip(held, target, strict=True)):
        if want == have or not (set(want) - set(have)):
            continue
        outputs = _run(rule, sharded, node, trial)
        # the removals alone may do; an axis the node creates takes whatever it is given
        found = outputs is not None and (outputs[0][0][axis] == tuple(want) or outputs[0][1][axis])
        # an operand axis of the result axis's size first (elementwise ops, transposes); then any it divides, and
        # then its mesh axes added to an axis already sharded (a reshape merging axes takes them on one axis)
        size = graph.avals[value].shape[axis]
        for j, k, extend in [(j, k, extend) for moving in (False, True)[:1 + exchanges] for extend in (False, True)
                             for same in (True, False) for j, operand in enumerate(operands)
                             for k in range(len(operand.shape)) if moving == bool(_used(trial[j]) & set(want))
                             and same == (operand.shape[k] == size) and extend <= bool(trial[j][k])]:
            axes = tuple(m for m in trial[j][k] if m not in want) + tuple(want) if extend else tuple(want)
            if found or operands[j].shape[k] % shard_count(mesh_shape, axes) or trial[j][k] == axes:
                continue
            before = list(trial[j])
            trial[j] = [tuple(m for m in a if m not in want) for a in trial[j]]
            trial[j][k] = axes
            outputs = _run(rule, sharded, node, trial)
            if outputs is not None and outputs[0][0][axis] == tuple(want):
                found = True
                break
            trial[j] = before
        if not found:
            return None
    return trial


def _with_lineage(sharded: ShardedGraph, node, rule, operands: list[TensorSharding]):
    """``node``'s output and operands with shards, for a walk that made none (``propagate(lineage=False)``, the layout
    search's screens): the node's rule on its operands given fresh blocks — which operand blocks each output block
    came from is the rule's alone. An operand the walk moved to resolve a conflict is taken replicated, as it was."""
    avals = sharded.graph.avals
    ctx = RuleContext(tuple(avals[v] for v in node.operands), tuple(avals[v] for v in node.outputs),
                      sharded.mesh_shape, count(), OpenTracker(), lineage=True, graph=sharded.graph)
    ctx.node = node.id
    moved = sharded.reshards.get(node.id, (None,))[0]
    fresh = [TensorSharding(o.shape, tuple(ctx.root(k, o.shape[k], a.mesh_axes) if isinstance(a, Sharded) and j != moved
                                           else None for k, a in enumerate(o.axes)))
             for j, o in enumerate(operands)]
    return rule.propagate(ctx, *fresh, **node.params).outputs[0], fresh


def _is_choice(operands, needs, was, target: Layout) -> bool:
    """True when the node, taking its operands in ``needs`` rather than ``was``, follows another operand's layout than
    before — one kept as held (or sliced from whole) while another is gathered, or one sliced from whole with nothing
    gathered: a choice the forward walk did not make. An operand that loses mesh axes on one axis and gains some on
    another is moved (an all-to-all of it), whether before the node or after it: no choice (x + x.T, two arguments
    laid out crosswise, `a @ w + b` with `a` and `b` crosswise)."""
    wanted = _used(target)
    losing, keeping, trading = [], [], []
    for operand, new, old in zip(operands, needs, was, strict=True):
        loses = any(set(o) - set(n) for o, n in zip(old, new, strict=True))
        losing.append(loses)
        trading.append(loses and any(set(n) - set(o) for o, n in zip(old, new, strict=True)))
        kept = all(n == o or is_refinement(h, n) for n, o, h in zip(new, old, operand.layout, strict=True))
        keeping.append(not loses and kept and bool(_used(new) & wanted))
    return any(keeping) and not any(trading) and (
        any(losing) or any(_slices_free(o.layout, n) for o, n in zip(operands, needs, strict=True)))


def _run(rule, sharded: ShardedGraph, node, trial: list[list[tuple[str, ...]]]):
    """``node``'s rule on operands laid out as ``trial`` (exploratory: no shards made): ((output layout, which axes
    it created), needs), or None when the rule finds a conflict."""
    avals = sharded.graph.avals
    ctx = RuleContext(tuple(avals[v] for v in node.operands), tuple(avals[v] for v in node.outputs),
                      sharded.mesh_shape, count(), OpenTracker(), lineage=False, graph=sharded.graph)
    ctx.node = node.id
    operands = [TensorSharding(avals[v].shape, tuple(Sharded(tuple(m), ()) if m else None for m in layout))
                for v, layout in zip(node.operands, trial, strict=True)]
    try:
        result = rule.propagate(ctx, *operands, **node.params)
    except (RuleConflict, ShardingError):  # those operand layouts cannot be taken together: no way
        return None
    out = result.outputs[0]
    layout = tuple(a.mesh_axes if isinstance(a, Sharded) else () for a in out.axes)
    created = tuple(a is CREATED for a in out.axes)
    return (layout, created), result.needs


def lookup_alternatives(sharded: ShardedGraph) -> Views:
    """The other way to take a lookup whose indices' batch and whole window share a mesh axis (tokens over ``x``
    looking up a table whose features are over ``x``): its rule keeps the axis on the batch and gathers the table;
    the view takes the indices gathered over it instead, the window keeping it (as ``jax.jit`` looks up a
    feature-sharded table) — a candidate the plan's price decides on, as the result's later uses may need either."""
    graph = sharded.graph
    views = {}
    for node in graph.nodes:
        if node.op != "gather" or node.id in sharded.fallbacks or sharded.is_body:
            continue
        dn, sizes = node.params["dimension_numbers"], node.params["slice_sizes"]
        operand = node.operands[0]
        shape, held = graph.avals[operand].shape, sharded.layout(operand)
        operand_need, indices_need = sharded.needs[node.id]
        windows = [k for k in range(len(shape)) if k not in dn.collapsed_slice_dims
                   and k not in dn.operand_batching_dims and sizes[k] == shape[k]]
        dropped = {m for k in windows for m in held[k] if m not in operand_need[k]}
        taken = tuple(tuple(m for m in axes if m not in dropped) for axes in indices_need)
        if dropped and taken != tuple(indices_need):
            views[(node.id, 1)] = View(taken, tuple(indices_need), node.id)
    return views
