"""``propagate(graph, in_specs, mesh=mesh) -> ShardedGraph``: the shard propagation pass.

Walks the graph in order and applies each node's sharding rule (the ``propagate`` piece of its primitive's
record, ``shardprop.ops.lookup``). Unannotated inputs (spec
``None``) and axes created by broadcasts start *open* and adopt the sharding they first meet; this takes
two walks: the first learns what every open axis meets, the second runs with those choices fixed and builds
the real shards. An open axis that met nothing, or several different shardings, is replicated — replicated
data is compatible with every sharding, so that choice can never introduce a conflict.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import math
from collections.abc import Callable
from typing import Any

import jax
from jax.sharding import Mesh, PartitionSpec

from ..errors import (ConflictKind, FallbackWarning, NoRuleError, OptionError, ReshardWarning, ShardingConflictError,
                      ShardingError, SpecError, SpecTreeError, abridged)
from ..gc_pause import gc_paused
from ..mesh import as_auto_mesh
from ..expr.graph import CONSTANT, PARAMETER, Graph, Node, argument_label, short_dtype, value_name, warn_at, where
from ..ops import has_record, lookup
from ..core.rules import CREATED, OpenTracker, RuleConflict, RuleContext
from .invariants import checked
from .memo import Recording, Variants, memo_key, replay, resolutions
from .origins import trace_origin
from .product import RETURNED, RuleName, ShardedGraph
from .uses import lookup_alternatives, mirrored_outputs, wanted_views
from ..core.layouts import (Layout, Open, Sharded, TensorSharding, layout_from_spec, layout_refines, layout_to_spec,
                            shard_count, uneven_span, uses_mesh_axes_once)
from ..core.moves import move_bytes, plan_move
from ..core.steps import exchanges
from ..core.types import ValueType

CONFLICT_MODES = ("reshard", "error")


def is_spec(x: Any) -> bool:
    """A leaf of ``in_specs`` propagation takes: a PartitionSpec, or None (unannotated)."""
    return x is None or isinstance(x, PartitionSpec)


def flat_in_specs(in_specs: Any, graph: Graph, is_leaf: Callable[[Any], bool] = is_spec) -> list[Any]:
    """Broadcast ``in_specs`` — a pytree prefix of the argument tuple, as in ``shard_map`` — to one entry
    (a PartitionSpec, or None for unannotated; whatever ``is_leaf`` accepts) per flat input."""
    return flat_specs_of_tree(in_specs, graph.in_tree, is_leaf)


def flat_specs_of_tree(in_specs: Any, in_tree: Any, is_leaf: Callable[[Any], bool] = is_spec) -> list[Any]:
    """``flat_in_specs`` for arguments of pytree structure ``in_tree`` (before they are traced)."""
    n = in_tree.num_leaves
    if is_leaf(in_specs):
        return [in_specs] * n
    spec_leaves, spec_tree = jax.tree_util.tree_flatten(in_specs, is_leaf=is_leaf)
    args_skeleton = jax.tree_util.tree_unflatten(in_tree, [0] * n)
    try:
        subtrees = spec_tree.flatten_up_to(args_skeleton)
    except (ValueError, TypeError) as err:
        raise SpecTreeError(
            f"in_specs {abridged(repr(in_specs))} is not a pytree prefix of the arguments (structure "
            f"{abridged(in_tree)}): {abridged(err)}") from None
    flat: list[PartitionSpec | None] = []
    for spec, sub in zip(spec_leaves, subtrees, strict=True):
        if not is_leaf(spec):
            hint = " (sp.AUTO is chosen by autoshard's search, before propagation)" if repr(spec) == "sp.AUTO" else ""
            raise SpecTreeError(f"in_specs leaf {spec!r} is neither a PartitionSpec nor None{hint}")
        flat.extend([spec] * len(jax.tree_util.tree_leaves(sub)))
    return flat


@gc_paused
def propagate(graph: Graph, in_specs: Any, *, mesh: Mesh, strict: bool = False,
              conflicts: str = "reshard", price: Callable[[ShardedGraph], float] | None = None,
              backward: bool | str = True, lineage: bool = True, memo: dict | None = None,
              adopt: bool = True) -> ShardedGraph:
    """Give every value of ``graph`` a sharding on ``mesh``, starting from ``in_specs``.

    ``in_specs`` is a pytree prefix of the arguments: ``PartitionSpec`` (``P()`` replicates) or ``None``
    (unannotated: adopts the sharding of whatever it meets). A primitive without a rule gets the
    conservative rule and one ``FallbackWarning``; with ``strict=True`` it raises ``NoRuleError`` instead.
    Two operands sharded incompatibly (a conflict) are resolved by moving the one cheaper to move — it is
    gathered before the op, which then slices it locally — with a ``ReshardWarning``; ``conflicts="error"`` (and
    ``strict=True``) raises ``ShardingConflictError`` instead, as the Nx design halts.

    After the forward walk a backward pass lets a value's uses decide its layout where that moves no more
    (``propagation/uses.py``); ``price`` (a ShardedGraph's bytes moved: ``autoshard`` passes its plan's estimate)
    compares the candidates, and without it they are compared by the bytes of the nodes' operand moves alone;
    ``backward=False`` keeps the forward walk's layouts (the Nx design's propagation, for comparison);
    ``backward="quick"`` tries one setting of the backward pass (exchanges asked, not the finest slices), a few
    walks rather than dozens: the layout search's screen. ``lineage=False`` makes no shards where nothing reads them
    (the same layouts, each axis without its blocks: what pricing reads), for the search's screens. ``memo``, a dict
    the caller keeps between calls on one graph and mesh, reuses the rules' results on operands laid out as in an
    earlier walk (walks that make no shards: a rule is then a function of its node and its operands' layouts, and
    of the calls it makes on their open axes, replayed: ``memo.py``); without one, this call's walks share their own.
    With a backward pass the candidates are compared as walked without shards, and only the one kept is walked
    again with them (``lineage``).
    ``adopt=False`` replicates every axis nothing annotates (a broadcast's, an unannotated argument's) rather than
    letting it adopt what it meets: one walk rather than two (the layout search's rough screen).

    Examples:
        >>> mesh = sp.make_mesh((4, 2), ("i", "j"))
        >>> x = jnp.ones((16, 8))
        >>> sg = sp.propagate(sp.trace(lambda a, b: a + b, x, x), (P("i", "j"), None), mesh=mesh)
        >>> print(sg)
        { lambda ;
            a:f32[16@i,8@j]   # a
            b:f32[16@i,8@j]   # b
          let
            c:f32[16@i,8@j] = add a b   # <doctest ...>:1
          in (c,) }
    """
    if conflicts not in CONFLICT_MODES:
        raise OptionError(f"conflicts={conflicts!r}: expected one of {CONFLICT_MODES}")
    mesh = as_auto_mesh(mesh)
    mesh_shape = dict(mesh.shape)
    specs = flat_in_specs(in_specs, graph)
    input_layouts: list[Layout | None] = []
    for index, (spec, value) in enumerate(zip(specs, graph.inputs, strict=True)):
        shape = graph.avals[value].shape
        input_layouts.append(None if spec is None else layout_from_spec(spec, shape, mesh_shape,
                                                                         f"argument {graph.argument_names[index]}",
                                                                         uneven=True))
    sharded = propagate_layouts(graph, input_layouts, mesh, strict=strict,
                                conflicts="error" if strict else conflicts, price=price, backward=backward,
                                lineage=lineage, memo=memo, adopt=adopt)
    if strict and sharded.fallbacks:
        first = min(sharded.fallbacks)
        node, cause = graph.nodes[first], sharded.fallback_causes.get(first)
        raise NoRuleError(f"no sharding rule applies to `{node.op}` at {where(node)}"
                          f"{f' ({cause})' if cause else ''} (strict=True; without it the conservative rule would "
                          "gather its operands)")
    warn_fallbacks(graph, sharded.fallbacks, sharded.fallback_causes)
    warn_reshards(graph, sharded)
    return checked(sharded)


def warn_reshards(graph: Graph, sharded: ShardedGraph, inside: str = "") -> None:
    """One ``ReshardWarning`` per conflict resolved, at the user's line, carrying the conflict — those inside
    loop and branch bodies too (moved there on every iteration)."""
    for node_id, bodies in sorted(sharded.bodies.items()):
        node = graph.nodes[node_id]
        for body in bodies:
            inside_body = f" inside the {body.name} of `{node.op}` at {where(node)}" + \
                ("" if not body.carries else ", on every iteration")
            warn_reshards(body.sharded.graph, body.sharded, inside_body)
    for node_id, (operand, message) in sorted(sharded.reshards.items()):
        if node_id in sharded.priced:  # a move chosen as the cheapest way, not a clash of the user's layouts
            continue
        node = graph.nodes[node_id]
        moved = node.operands[operand]
        have, need = sharded.layout(moved), sharded.needs[node_id][operand]
        aval = sharded.graph.avals[moved]
        how, nbytes = describe_move(aval, have, need, sharded.mesh_shape)
        text = (f"shardprop: resolved a sharding conflict in `{node.op}` at "
                f"{where(node)}{inside} by moving operand {operand} "
                f"({value_name(moved)}, "
                f"{aval}): {how} to the other operand's layout, {layout_to_spec(need)}, ~{nbytes:.0f} B per device "
                f"(conflicts='error' refuses instead)\n{message}")
        warn_at(node, text, ReshardWarning)


def describe_move(aval, have: Layout, need: Layout, mesh_shape) -> tuple[str, float]:
    """How a value of ``aval`` held as ``have`` is moved to ``need`` (``an all-to-all over i from axis 1 to axis 0
    moves it``), and the bytes one device sends: the move planner's plan, as the program runs it."""
    steps = plan_move(aval.shape, aval.dtype, ValueType(have), ValueType(need), mesh_shape)
    sent = [s for s in steps if exchanges(s, mesh_shape)]
    how = f"{', then '.join(map(str, sent))} moves it" if sent else "each device slices it locally"
    return how, move_cost(aval, have, need, mesh_shape)


def move_cost(aval, have: Layout, need: Layout, mesh_shape) -> float:
    """Bytes one device sends to bring a value of ``aval`` from ``have`` to ``need``."""
    return move_bytes(aval.shape, aval.dtype, ValueType(have), ValueType(need), mesh_shape)


def warn_fallbacks(graph: Graph, fallbacks, causes=None) -> None:
    """One ``FallbackWarning`` per primitive that fell back in this program, attributed to the user's line
    of its first use (so that Python's warning filters, and the printed location, name the user's code)."""
    uses: dict[str, list[Node]] = {}
    for node_id in sorted(fallbacks):
        node = graph.nodes[node_id]
        uses.setdefault(node.op, []).append(node)
    for name, nodes in sorted(uses.items()):
        first = nodes[0]
        more = "" if len(nodes) == 1 else f" (and {len(nodes) - 1} more use(s))"
        cause = (causes or {}).get(first.id)
        message = (f"shardprop: no sharding rule for primitive `{name}` at {where(first)}{more} "
                   f"({cause or 'or none that applies here'}); using the conservative rule (operands gathered, "
                   "result replicated)")
        warn_at(first, message, FallbackWarning)


def propagate_layouts(graph: Graph, input_layouts: list[Layout | None], mesh: Mesh, *,
                      strict: bool = False, conflicts: str = "error",
                      price: Callable[[ShardedGraph], float] | None = None,
                      backward: bool | str = True, lineage: bool = True,
                      memo: dict | None = None, adopt: bool = True) -> ShardedGraph:
    """``propagate`` from validated input layouts (None: unannotated); no warnings. Rules use it to
    shard sub-computations such as scan bodies. ``price`` gives the bytes a candidate moves (the backward pass's
    layouts against the forward walk's); without it, the bytes of the nodes' operand moves. ``backward=False``
    keeps the forward walk's layouts (a loop's or a branch's body: its candidates would need the loop's price, per
    iteration, which the operand moves alone misjudge)."""
    if strict:
        missing = [n for n in graph.nodes if n.op not in (PARAMETER, CONSTANT) and not has_record(n.op)]
        if missing:
            node = missing[0]
            raise NoRuleError(
                f"no sharding rule for primitive `{node.op}` at "
                f"{where(node)} "
                f"(strict=True; without it the conservative rule would gather its operands and replicate its "
                f"result){'' if len(missing) == 1 else f'; {len(missing) - 1} more op(s) without a rule'}")
    body = functools.partial(_propagate_body, mesh=mesh, conflicts=conflicts)  # bodies resolve conflicts alike
    # the rules' results on operands laid out as before, shared by this call's walks (the candidates differ from the
    # forward walk in a few views: most nodes see the same operands) — or by the caller's calls on this graph and mesh
    memo = {} if memo is None else memo
    # with a backward pass the candidates are walked without shards (comparing them reads layouts alone, and those
    # walks share the memo) and the one kept is walked again with them; the backward pass then reruns a node's rule
    # where it asks which operand blocks its blocks came from (uses.py)
    exploring = lineage and not backward
    forward = _walks(graph, mesh, input_layouts, body, "reshard", views={}, lineage=exploring, memo=memo, adopt=adopt)
    # the backward pass (uses.py): node by node where each step costs no more, and optimistically, every step a
    # conflict can be carried back, where several steps may pay off together; the program moving least is kept
    # (optimism carries only conflicts' chains: without a conflict it finds what the node-by-node pass finds)
    # (and, with exchanges, asking nested slices' finest: its effect on the other uses is the plan's price to judge)
    # ("quick": exchanges asked, finest not — the setting that alone finds the cheapest plan most often)
    found = [wanted_views(forward, optimistic=optimistic, exchanges=exchanges, finest=finest, memo=memo)
             for optimistic in (False, True)[:1 + bool(forward.reshards)]
             for exchanges in ((True,) if backward == "quick" else (False, True))
             for finest in ((False,) if backward == "quick" else (False, True))] if backward else []
    priced = frozenset().union(*(f.priced for f in found))
    candidates = [dataclasses.replace(forward, priced=priced & forward.reshards.keys())]
    walked = [dict(conflicts="reshard", views={})]  # how each candidate was walked (the one kept is walked again)
    seen = {_layouts(candidates[0])}
    view_sets = [f.views for f in found if f.views]
    # a lookup's other way (the indices gathered, not the table), alone and with each set of views
    lookups = lookup_alternatives(forward) if backward else {}
    if lookups:
        view_sets += [lookups] + [{**lookups, **views} for views in view_sets]
    for views in dict.fromkeys(tuple(sorted(views.items())) for views in view_sets):
        # a created value (a broadcast's) several nodes read is made as the others need it and sliced for a view; or
        # made as the view asks, for all of them: both are priced (each distinct program once)
        # and a returned value's open axes adopt the layout it mirrors (all the chain making it laid out so), or it is
        # made as without the mirror and returned sliced (an open chain through a cumsum would then finish it)
        variants = Variants()  # (each distinct program walked once)
        for shared, adopt_returned in itertools.product((False, True)[:1 + _views_shared_created(graph, dict(views))],
                                                        (True, False)[:1 + _views_returned(graph, dict(views))]):
            how = dict(conflicts=conflicts, views=dict(views), priced=priced, adopt_shared=shared,
                       adopt_returned=adopt_returned)
            try:
                candidate = _walks(graph, mesh, input_layouts, body, lineage=exploring, memo=memo, adopt=adopt,
                                   variants=variants, **how)
            except ShardingConflictError:
                continue  # the views met a clash of the user's own: refused (or resolved) as without them
            key = _layouts(candidate)
            if key not in seen:
                seen.add(key)
                candidates.append(candidate)
                walked.append(how)
    cost = price or ShardedGraph.edge_move_bytes
    # (on a tie, the one returning more outputs laid out like the arguments they mirror; then the later candidate:
    # the views over the forward walk, a value adopting a view over slicing it)
    order = {id(c): k for k, c in enumerate(candidates)}
    best = min(candidates, key=lambda c: (cost(c) if len(candidates) > 1 else 0,
                                          -_mirrors_met(c),
                                          len(c.reshards) - len(c.priced), -order[id(c)]))
    if best is candidates[0] and conflicts != "reshard" and forward.reshards.keys() - priced:
        return _walks(graph, mesh, input_layouts, body, conflicts, views={}, priced=priced)  # raises the clash
    if lineage == exploring:
        return best
    kept = _walks(graph, mesh, input_layouts, body, lineage=True, memo=memo, adopt=adopt, **walked[order[id(best)]])
    return dataclasses.replace(kept, priced=best.priced)


def _mirrors_met(sharded: ShardedGraph) -> int:
    """How many outputs come back laid out like the arguments they mirror (uses.py)."""
    return sum(sharded.output_layout(k) == sharded.layout(sharded.graph.inputs[mirror.argument])
               for k, mirror in mirrored_outputs(sharded).items())


def _layouts(sharded: ShardedGraph) -> tuple:
    """What tells two candidates apart: every value's layout, every node's operand layouts, what is returned."""
    return (tuple(s.layout for s in sharded.shardings), tuple(sharded.needs),
            tuple(sorted(sharded.returned_sliced.items())))


def _views_shared_created(graph: Graph, views) -> bool:
    """Whether a view asks for a value made by an op (not an argument) that other nodes (or outputs) read too."""
    readers = collections.Counter(v for n in graph.nodes for v in n.operands)
    readers.update(graph.outputs)
    for node_id, j in views:
        value = graph.outputs[j] if node_id == RETURNED else graph.nodes[node_id].operands[j]
        if readers[value] > 1 and graph.nodes[graph.producer[value]].op != PARAMETER:
            return True
    return False


def _views_returned(graph: Graph, views) -> bool:
    """Whether a view asks for a returned value computed by an op from other values (not an argument's, nor a
    broadcast's or a constant's own)."""
    for node_id, k in views:
        if node_id == RETURNED:
            producer = graph.nodes[graph.producer[graph.outputs[k]]]
            if producer.op not in (PARAMETER, CONSTANT, "broadcast_in_dim", "iota") and producer.operands:
                return True
    return False


def _walks(graph: Graph, mesh: Mesh, input_layouts, body, conflicts: str, views, priced=frozenset(),
           adopt_shared: bool = False, adopt_returned: bool = True, lineage: bool = True,
           memo: dict | None = None, adopt: bool = True, variants: Variants | None = None) -> ShardedGraph:
    """The two forward walks (the first learns what open axes meet, the second makes the shards), each node taking
    the operands ``views`` names in the layout it says; the conflicts at ``priced`` nodes are resolved whatever
    ``conflicts`` says (the backward pass priced them: moving there is the cheapest way). ``adopt=False``: one walk,
    every open axis replicated (nothing for a first walk to learn). ``variants``: the earlier calls with these
    arguments but other ``adopt_shared`` and ``adopt_returned`` (``Variants``): a call they show to make the
    product one of them made returns that product, unwalked."""
    mesh_shape = dict(mesh.shape)
    if not adopt:
        final = _Walk(graph, mesh_shape, input_layouts, body, resolve=_replicated, conflicts=conflicts, views=views,
                      priced=priced, adopt_shared=adopt_shared, adopt_returned=adopt_returned, lineage=lineage,
                      memo=memo)
        final.run()
        return _product(graph, mesh, final, priced)
    settings = dict(adopt_shared=adopt_shared, adopt_returned=adopt_returned)
    known = None if variants is None else variants.walked_alike(settings)
    if known is not None:
        return known
    first = _Walk(graph, mesh_shape, input_layouts, body, opens=OpenTracker(), conflicts=conflicts, views=views,
                  priced=priced, adopt_shared=adopt_shared, adopt_returned=adopt_returned, memo=memo)
    try:
        first.run()
    except ShardingConflictError as plain:
        # The exploratory walk makes no shards; replay with lineage so that the error can say where each
        # operand's sharding came from (following shard parents back to an input spec).
        try:
            _Walk(graph, mesh_shape, input_layouts, body, resolve=_replicated, conflicts=conflicts,
                  views=views, priced=priced, adopt_shared=adopt_shared, adopt_returned=adopt_returned).run()
        except ShardingConflictError as detailed:
            raise detailed from None
        raise plain from None
    resolved = None if variants is None else resolutions(first.opens)
    known = None if variants is None else variants.resolved_alike(settings, first.settings_read, resolved)
    if known is not None:
        return known
    try:
        final = _Walk(graph, mesh_shape, input_layouts, body, resolve=first.opens.resolution, conflicts=conflicts,
                      adopted_from=first.opens.adopted_from, views=views, priced=priced, adopt_shared=adopt_shared,
                      adopt_returned=adopt_returned, lineage=lineage, memo=memo)
        final.run()
    except ShardingError:
        # The adopted shardings clashed somewhere the first walk could not see (two open axes of one
        # tensor adopting the same mesh axis). Replicating every open axis is always consistent.
        final = _Walk(graph, mesh_shape, input_layouts, body, resolve=_replicated, conflicts=conflicts,
                      views=views, priced=priced, adopt_shared=adopt_shared, adopt_returned=adopt_returned)
        final.run()
    product = _product(graph, mesh, final, priced)
    if variants is not None:
        variants.made(settings, first.settings_read, resolved, product)
    return product


@functools.lru_cache(maxsize=1024)
def _replicated_sharding(shape: tuple[int, ...]) -> TensorSharding:
    """A value of ``shape`` held whole on every device (a constant's): one immutable object per shape."""
    return TensorSharding(shape, (None,) * len(shape))


def _replicated(key) -> None:
    """The resolution of every open axis as replicated (always consistent)."""
    return None


def _product(graph: Graph, mesh: Mesh, final: _Walk, priced: frozenset) -> ShardedGraph:
    """The ShardedGraph a final walk made."""
    return ShardedGraph(graph, mesh, tuple(final.shardings), tuple(final.needs), tuple(final.rule_names),
                        frozenset(final.fallbacks), final.bodies, final.reshards, final.adoptions,
                        final.fallback_causes, final.need_spans, views=final.views_taken,
                        priced=priced & final.reshards.keys())


def _argument_axis(ctx: RuleContext, axis: int, size: int, mesh_axes: tuple[str, ...]):
    """An argument's axis laid out over ``mesh_axes`` as its spec says: equal blocks, or — where they do not divide
    it — ranges, the last blocks short (the argument arrives whole along it, as a JAX array cannot be uneven, and
    each device takes its rows)."""
    if not mesh_axes:
        return None
    span = uneven_span(size, shard_count(ctx.mesh_shape, mesh_axes))
    if span is None:
        return ctx.root(axis, size, mesh_axes)
    return ctx.ranged(axis, size, mesh_axes, span, [])


def _propagate_body(graph: Graph, input_layouts: list[Layout], *, mesh: Mesh, conflicts: str) -> ShardedGraph:
    return dataclasses.replace(propagate_layouts(graph, input_layouts, mesh, conflicts=conflicts, backward=False),
                               is_body=True)


class _Walk:
    """One pass over the graph. With ``opens`` it records what open axes meet; with ``resolve`` it fixes
    every created axis to the mesh axes ``resolve((value, axis))`` returns (None: replicated)."""

    def __init__(self, graph: Graph, mesh_shape, input_layouts, propagate_body, *,
                 opens: OpenTracker | None = None, resolve=None, conflicts: str = "error", adopted_from=None,
                 views=None, priced=frozenset(), adopt_shared: bool = False, adopt_returned: bool = True,
                 lineage: bool = True, memo: dict | None = None):
        self.adopt_returned = adopt_returned
        self.lineage = lineage and resolve is not None
        # rule results by (node, operand layouts): only where no shards are made (else each result's are new)
        self.memo = None if self.lineage else memo
        self.conflicts = conflicts
        self.adopt_shared = adopt_shared
        self.priced = priced
        self.views = views or {}
        self.views_taken: dict[tuple[int, int], object] = {}  # the views this walk's nodes took (see uses.py)
        self._reads: collections.Counter | None = None  # value -> how many operands and outputs read it
        self.settings_read: set[str] = set()  # which of adopt_shared, adopt_returned decided something here
        self.adopted_from = adopted_from
        self.adoptions: dict[tuple[int, int], int] = {}  # (value, axis) -> the node whose sharding it adopted
        self.reshards: dict[int, tuple[int, str]] = {}  # node id -> (operand moved, the conflict's message)
        self.graph, self.mesh_shape, self.input_layouts = graph, mesh_shape, input_layouts
        self.propagate_body = propagate_body
        self.bodies: dict[int, ShardedGraph] = {}
        self.opens = opens if opens is not None else OpenTracker()
        self.resolve = resolve
        self.ids = itertools.count()
        self.shardings: list[TensorSharding | None] = [None] * len(graph.avals)
        self.needs: list[tuple[Layout, ...]] = []
        self.rule_names: list[str] = []
        self.fallbacks: list[int] = []
        self.fallback_causes: dict[int, str] = {}
        self.need_spans: dict[int, tuple] = {}  # node id -> the ranged rows it consumes (RuleOutput.need_spans)

    def run(self) -> None:
        # One context for the whole walk (its avals are set per node): 10^5-node graphs are the norm.
        ctx = RuleContext((), (), self.mesh_shape, self.ids, self.opens, lineage=self.lineage,
                          propagate_body=self.propagate_body, graph=self.graph)
        records: dict = {}  # primitive name -> its record, looked up once per walk
        shardings = self.shardings
        viewed = {node_id for node_id, _ in self.views}  # the nodes views name (most name none: no lookup per operand)
        for node, (in_avals, out_avals) in zip(self.graph.nodes, self.graph.node_avals, strict=True):
            ctx.node = node.id
            ctx.out_avals, ctx.in_avals = out_avals, in_avals
            if node.op == PARAMETER:
                layout = self.input_layouts[node.params["index"]]
                shape = out_avals[0].shape
                if layout is None:  # unannotated: every axis is created open
                    axes = tuple(CREATED if n > 1 else None for n in shape)
                else:
                    axes = tuple(_argument_axis(ctx, k, n, layout[k]) for k, n in enumerate(shape))
                rule_name = RuleName.INPUT_SPEC if layout is not None else RuleName.UNANNOTATED_INPUT
                outputs, needs = (TensorSharding(shape, axes),), ()
            elif node.op == CONSTANT:  # replicated: nothing to settle or check
                outputs, needs, rule_name = (_replicated_sharding(out_avals[0].shape),), (), RuleName.CONSTANT
            else:
                op = records.get(node.op)
                if op is None:
                    op = records[node.op] = lookup(node.op)
                operands = [shardings[v] for v in node.operands]
                if node.id in viewed:
                    operands = self._viewed(ctx, node, operands)
                if not op.reads_ranges:  # a ranged axis is no equal blocks: a rule that knows nothing of it reads
                    operands = [o.without_ranges() if o.spans else o for o in operands]  # it whole
                try:
                    result, outputs = self._apply(ctx, node, op, operands)
                except RuleConflict as conflict:
                    result, outputs = self._reshard(ctx, node, op, operands, conflict)
                except SpecError as err:  # an annotation inside the graph (a sharding constraint) is bad
                    raise type(err)(f"`{node.op}` at {where(node)}: {err}") from None
                needs = result.needs
                if result.need_spans is not None:
                    self.need_spans[node.id] = result.need_spans
                if result.body is not None:
                    self.bodies[node.id] = result.body
                if op.is_fallback or result.fallback:
                    rule_name = RuleName.FALLBACK
                    self.fallbacks.append(node.id)
                    if result.fallback_cause:
                        self.fallback_causes[node.id] = result.fallback_cause
                else:
                    rule_name = op.rule_name
            if node.op == PARAMETER:
                outputs = tuple(self._settle(ctx, v, s) for v, s in zip(node.outputs, outputs, strict=True))
                for sharding in outputs:
                    self._check(node, sharding)
            for value, sharding in zip(node.outputs, outputs, strict=True):
                shardings[value] = sharding
            self.needs.append(needs if type(needs) is tuple else tuple(needs))
            self.rule_names.append(rule_name)
        self._view_returned()

    def _view_returned(self) -> None:
        """The created axes of a returned value take the layout the backward pass asks for it (it mirrors an
        argument: uses.py), as a use's view asks its operand's (``_viewed``): no node reads it to ask."""
        # a value returned as several outputs mirroring differently laid out arguments adopts, per axis, what all their
        # layouts start with: each output is then its slice, free (adopting one's finer layout would make the others
        # gather it)
        shared: dict[int, Layout] = {}
        for (node_id, k), view in self.views.items():
            if node_id == RETURNED:
                value = self.graph.outputs[k]
                have = shared.get(value, view.layout)
                shared[value] = tuple(_common_start(a, b) for a, b in zip(have, view.layout, strict=True))
        for (node_id, k), view in self.views.items():
            if node_id != RETURNED:
                continue
            value = self.graph.outputs[k]
            sharding = self.shardings[value]
            # (else made as its readers need it, and returned sliced)
            opens = [(a, want) for a, want in zip(sharding.axes, shared[value], strict=True)
                     if isinstance(a, Open) and want]
            if opens:
                self.settings_read.add("adopt_returned")
            if opens and self.adopt_returned and self._adopts(value):
                for a, want in opens:
                    self.opens.request(a, want, RETURNED)
            if self.resolve is None:
                continue
            # the final walk: met, or returned sliced so (free: each device keeps its block of what it holds whole,
            # its readers taking it as held; ShardedGraph.returned_layout)
            if sharding.layout == view.layout or not sharding.spans and layout_refines(sharding.layout, view.layout):
                self.views_taken[(node_id, k)] = view

    def _viewed(self, ctx: RuleContext, node: Node, operands: list[TensorSharding]) -> list[TensorSharding]:
        """``operands`` as the backward pass asks ``node`` to take them: an axis sliced further (each device keeps its
        block) or gathered, so that the node produces its value in the layout its uses need."""
        viewed = list(operands)
        for j, sharding in enumerate(operands):
            view = self.views.get((node.id, j))
            if view is None or sharding.spans:
                continue
            if any(isinstance(a, Open) for a in sharding.axes) and self._adopts(node.operands[j]):
                for a, want in zip(sharding.axes, view.layout, strict=True):
                    if isinstance(a, Open) and want:
                        self.opens.request(a, want, node.id)
                continue
            axes = []
            # a view changes the axes it asks for; an axis it leaves as the forward walk had it, now held otherwise
            # (an open axis upstream adopted a layout the views asked elsewhere), is kept so where that clashes with
            # nothing it asks: gathering it would undo the very adoption the views caused
            for k, (a, want) in enumerate(zip(sharding.axes, view.layout, strict=True)):
                elsewhere = {m for k2, w in enumerate(view.layout) if k2 != k for m in w}
                if sharding.layout[k] == want or (
                        want == view.was[k] and sharding.layout[k] and not elsewhere & set(sharding.layout[k])):
                    axes.append(a)
                elif want and sharding.shape[k] % shard_count(self.mesh_shape, want) == 0:
                    axes.append(ctx.root(k, sharding.shape[k], want))
                else:
                    axes.append(None)
            viewed[j] = TensorSharding(sharding.shape, tuple(axes))
            self.views_taken[(node.id, j)] = view
        return viewed

    def _adopts(self, value: int) -> bool:
        """Whether a view of ``value``'s open axes lays the value itself out so (they adopt what is asked): an
        unannotated argument, or a created value (a broadcast's) this use alone reads. A created value read by
        other uses too is made as they need it and sliced for this one (free) — or, with ``adopt_shared``, made as
        the view asks for all of them."""
        if self.graph.nodes[self.graph.producer[value]].op == PARAMETER:
            return True
        if self._reads is None:
            self._reads = collections.Counter(v for n in self.graph.nodes for v in n.operands)
            self._reads.update(self.graph.outputs)
        if self._reads[value] == 1:
            return True
        self.settings_read.add("adopt_shared")
        return self.adopt_shared

    def _settle(self, ctx: RuleContext, value: int, sharding: TensorSharding) -> TensorSharding:
        """Replace created-axis markers: open in the first walk, resolved in the final one."""
        if not any(a is CREATED for a in sharding.axes):
            return sharding
        axes = list(sharding.axes)
        if self.resolve is None:
            for k, a in enumerate(axes):
                if a is CREATED:
                    axes[k] = Open((value, k))
                    self.opens.find((value, k))
            return TensorSharding(sharding.shape, tuple(axes))
        used = {name for a in axes if isinstance(a, Sharded) for name in a.mesh_axes}
        for k, a in enumerate(axes):
            if a is CREATED:
                mesh_axes = self.resolve((value, k))
                fits = mesh_axes and sharding.shape[k] % shard_count(self.mesh_shape, mesh_axes) == 0
                if fits and not used.intersection(mesh_axes):
                    axes[k] = ctx.root(k, sharding.shape[k], mesh_axes)
                    used.update(mesh_axes)
                    source = None if self.adopted_from is None else self.adopted_from((value, k))
                    if source is not None:
                        self.adoptions[(value, k)] = source
                else:
                    axes[k] = None
        return TensorSharding(sharding.shape, tuple(axes))

    def _apply(self, ctx: RuleContext, node: Node, op, operands: list[TensorSharding]):
        """The rule on ``operands``: ``(RuleOutput, settled output shardings)``; a conflict is a RuleConflict. From the
        memo where an earlier walk gave the node operands laid out alike (its outputs too, settled and checked, where
        the rule creates no axis and meets no open one: settling them is then nothing); where they hold open axes, the
        rule's calls on the tracker replayed on this walk's (memo.py)."""
        keyed = None if self.memo is None else memo_key(node.id, operands)
        if keyed is None:
            return self._settled(ctx, node, op.propagate(ctx, *operands, **node.params))
        key, opens = keyed
        found = self.memo.get(key)
        if found is not None:
            if opens:
                result = replay(found, self.opens, opens)
                return self._settled(ctx, node, result) if found.creates else (result, result.outputs)
            return found if found[1] is not None else self._settled(ctx, node, found[0])
        if not opens:
            result, outputs = self._settled(ctx, node, op.propagate(ctx, *operands, **node.params))
            if result.body is None:
                created = any(a is CREATED for sharding in result.outputs for a in sharding.axes)
                self.memo[key] = (result, None if created else outputs)
            return result, outputs
        # the rule sees the tracker through its context: one that logs its calls, for a later walk to replay
        recording = Recording(self.opens, opens)
        recorded = RuleContext(ctx.in_avals, ctx.out_avals, self.mesh_shape, self.ids, recording, lineage=False,
                               propagate_body=self.propagate_body, graph=self.graph)
        recorded.node = node.id
        result = op.propagate(recorded, *operands, **node.params)
        settled = self._settled(ctx, node, result)
        entry = recording.entry(result) if recording.replayable and result.body is None else None
        if entry is not None:
            self.memo[key] = entry
        return settled

    def _settled(self, ctx: RuleContext, node: Node, result):
        """``(result, its outputs settled and checked)``."""
        outputs = tuple(self._settle(ctx, v, s) for v, s in zip(node.outputs, result.outputs, strict=True))
        for sharding in outputs:
            self._check_mesh_axes_once(sharding)
        return result, outputs

    def _check(self, node: Node, sharding: TensorSharding) -> None:
        try:
            self._check_mesh_axes_once(sharding)
        except RuleConflict as conflict:
            raise self._conflict(node, conflict) from None

    def _reshard(self, ctx: RuleContext, node: Node, op, operands: list[TensorSharding], conflict: RuleConflict):
        """Resolve ``conflict`` by moving one operand: the rule again with it as if replicated (so it is consumed
        in the layout the rule then needs: moved by an all-to-all, or gathered and sliced locally), for the operand
        cheapest to move; or the conflict error."""
        if self.conflicts != "reshard" and node.id not in self.priced:
            raise self._conflict(node, conflict) from None
        avals = self.graph.avals
        options = []
        for k, sharding in enumerate(operands):
            count = math.prod(shard_count(self.mesh_shape, m) for m in sharding.layout)
            if count == 1:
                continue  # nothing to gather
            trial = list(operands)
            trial[k] = TensorSharding(sharding.shape, (None,) * len(sharding.shape))
            try:
                result, outputs = self._apply(ctx, node, op, trial)
            except RuleConflict:
                continue
            moved = move_cost(avals[node.operands[k]], sharding.layout, result.needs[k], self.mesh_shape)
            options.append((moved, -k, result, outputs))
        if not options:
            raise self._conflict(node, conflict) from None
        _, minus_k, result, outputs = min(options, key=lambda o: (o[0], o[1]))
        if self.resolve is not None:  # the final walk: say what was resolved (with lineage in the message)
            self.reshards[node.id] = (-minus_k, str(self._conflict(node, conflict)))
        return result, outputs

    @staticmethod
    def _check_mesh_axes_once(sharding: TensorSharding) -> None:
        if uses_mesh_axes_once(sharding.layout):
            return
        seen: dict[str, int] = {}
        for k, a in enumerate(sharding.axes):
            if isinstance(a, Sharded):
                for name in a.mesh_axes:
                    if name in seen:
                        raise RuleConflict(
                            k, f"mesh axis {name!r} would shard both output axes {seen[name]} and {k}; a mesh axis "
                               "may shard at most one axis of a tensor", (sharding.layout[seen[name]], a.mesh_axes),
                            kind=ConflictKind.REUSE)
                    seen[name] = k

    def _conflict(self, node: Node, conflict: RuleConflict) -> ShardingConflictError:
        lines = [f"sharding conflict in `{node.op}` at {where(node)}"]
        for i, v in enumerate(node.operands):
            sharding = self.shardings[v]
            dtype = short_dtype(self.graph.avals[v].dtype)
            lines.append(f"  operand {i} ({value_name(v)}): {dtype}[{sharding.format_dims()}]")
            if self.lineage:  # shards exist: say where each sharded axis came from
                for axis, a in enumerate(sharding.axes):
                    if isinstance(a, Sharded):
                        lines.append(f"    axis {axis} @{'*'.join(a.mesh_axes)}: {self._origin(v, axis)}")
        on_axis = f"output axis {conflict.axis}: " if conflict.axis is not None else ""
        lines.append(f"  {on_axis}{conflict.detail}")
        lines.append("  fix: constrain one operand to the other's layout (jax.lax.with_sharding_constraint), or "
                     "change an input spec so that they agree; conflicts='reshard' (autoshard's default) moves the "
                     "operand cheaper to move")
        return ShardingConflictError("\n".join(lines), op=node.op, source=node.source, axis=conflict.axis,
                                     layouts=conflict.layouts, kind=conflict.kind)

    def _origin(self, value: int, axis: int) -> str:
        """Where the sharding of ``value``'s ``axis`` came from: the input spec (or the op that created the
        axis), and the ops in between, in program order."""
        origin = trace_origin(self.graph, self.shardings, value, axis)
        node = origin.node
        if origin.is_argument:
            root = (f"{argument_label(self.graph, node.params['index'])} has spec "
                    f"{self.shardings[origin.value].spec}")
        else:
            root = f"`{node.op}` at {where(node)} adopted it"
        ops = [f"`{n.op}` at {where(n)}" for _, _, n in origin.steps]
        if not ops:
            return root
        more = f" -> ... {len(ops) - 4} more ops" if len(ops) > 4 else ""
        return f"{root}, via {' -> '.join(ops[:4])}{more}"


def _common_start(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...]:
    """The longest run of mesh axes both layouts of one axis start with: a layout both are local slices of."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]
