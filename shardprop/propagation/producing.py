"""How a node could produce its value in another layout, for the backward pass (``uses.py``): the operand layouts
under which its rule lays the value out so (``_trial_layouts``: the operand axes a dropped mesh axis came from, by
shard lineage, take it no more; an axis sharded further takes it from an operand axis held whole, or by an
all-to-all), what moving the operands there costs beyond what they cost now (the one move model,
``shardprop.core.moves.move_bytes``), and whether that is a choice the forward walk did not make — remembered across
the walks of one graph and mesh where no shards were made (``produce_as_remembered``)."""

from __future__ import annotations

from itertools import count

from ..core.layouts import Layout, Sharded, TensorSharding, is_refinement, shard_count
from ..core.moves import move_bytes
from ..core.rules import CREATED, OpenTracker, RuleConflict, RuleContext
from ..core.types import ValueType, held_whole
from ..errors import ShardingError
from ..ops import lookup
from .origins import holds
from .product import ShardedGraph


def mesh_axes_used(layout) -> set[str]:
    """The mesh axes ``layout`` shards some axis over."""
    return {m for axes in layout for m in axes}


def _slices_free(held: Layout, need: Layout) -> bool:
    """True when ``need`` shards an axis over a mesh axis ``held`` does not use at all: each device keeps a block of
    what it holds whole (an all-to-all, which also shards an axis further, is no such choice)."""
    used = mesh_axes_used(held)
    return any(m not in used for axes in need for m in axes)


def produce_as_remembered(sharded: ShardedGraph, node, target: Layout, exchanges: bool, memo: dict | None):
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
    if rule.finish is not None and not rule.finish_follows_needs:
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
                             for k in range(len(operand.shape)) if moving == bool(mesh_axes_used(trial[j]) & set(want))
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
    wanted = mesh_axes_used(target)
    losing, keeping, trading = [], [], []
    for operand, new, old in zip(operands, needs, was, strict=True):
        loses = any(set(o) - set(n) for o, n in zip(old, new, strict=True))
        losing.append(loses)
        trading.append(loses and any(set(n) - set(o) for o, n in zip(old, new, strict=True)))
        kept = all(n == o or is_refinement(h, n) for n, o, h in zip(new, old, operand.layout, strict=True))
        keeping.append(not loses and kept and bool(mesh_axes_used(new) & wanted))
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
