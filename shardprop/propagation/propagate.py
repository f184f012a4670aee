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
from dataclasses import dataclass
import itertools
from collections.abc import Callable
from typing import Any

import jax
from jax.sharding import Mesh, PartitionSpec

from ..errors import NoRuleError, OptionError, ShardingConflictError, ShardingError, SpecTreeError, abridged
from ..gc_pause import gc_paused
from ..mesh import as_auto_mesh
from ..expr.graph import CONSTANT, PARAMETER, Graph, where
from ..ops import has_record, lookup
from ..ops.opdef import Trait
from ..core.rules import OpenTracker
from .invariants import checked
from .memo import ADOPTING, Adoption, Variants, resolutions
from .product import MADE, RETURNED, ShardedGraph
from .reports import warn_fallbacks, warn_reshards
from .uses import lookup_alternatives, mirrored_outputs, wanted_views
from .walk import Walk
from ..core.layouts import Layout, layout_from_spec

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
              conflicts: str = "reshard") -> ShardedGraph:
    """Give every value of ``graph`` a sharding on ``mesh``, starting from ``in_specs``.

    ``in_specs`` is a pytree prefix of the arguments: ``PartitionSpec`` (``P()`` replicates) or ``None``
    (unannotated: adopts the sharding of whatever it meets). A primitive without a rule gets the
    conservative rule and one ``FallbackWarning``; with ``strict=True`` it raises ``NoRuleError`` instead.
    Two operands sharded incompatibly (a conflict) are resolved by moving the one cheaper to move — it is
    gathered before the op, which then slices it locally — with a ``ReshardWarning``; ``conflicts="error"`` (and
    ``strict=True``) raises ``ShardingConflictError`` instead, as the Nx design halts.

    After the forward walk a backward pass lets a value's uses decide its layout where that moves no more
    (``propagation/uses.py``), its candidates compared by the bytes of the nodes' operand moves; ``propagate_with``
    takes how to walk (``Walking``: the price ``autoshard`` compares them by — its plan's — or the forward walk
    alone, the Nx design's propagation, for comparison).

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
    return propagate_with(graph, in_specs, mesh=mesh, strict=strict, conflicts=conflicts, walking=Walking())


@dataclass(frozen=True)
class Walking:
    """How propagation walks, where ``propagate``'s default is not wanted: ``price`` compares the backward pass's
    candidates (a ShardedGraph's price: ``autoshard`` passes its plan's, ``splitting.split.PlanPricer``; None: the
    bytes of the nodes' operand moves); ``backward=False`` keeps the forward walk's layouts (a loop's body, and the
    Nx design's propagation, for comparison)."""

    price: Callable[[ShardedGraph], float] | None = None
    backward: bool = True


@gc_paused
def propagate_with(graph: Graph, in_specs: Any, *, mesh: Mesh, strict: bool, conflicts: str,
                   walking: Walking) -> ShardedGraph:
    """``propagate``, walked as ``walking`` says: with ``Walking(price=...)`` the backward pass's candidates compared by
    that price, with ``Walking(backward=False)`` the forward walk alone.

    Examples:
        >>> mesh = sp.make_mesh((8,), ("i",))
        >>> graph = sp.trace(lambda a, b: a + b, jnp.ones((16, 8)), jnp.ones((16, 8)))
        >>> sp.propagate_with(graph, (P("i"), None), mesh=mesh, strict=False, conflicts="reshard",
        ...                   walking=sp.Walking(backward=False)).in_specs
        (P('i',), P('i',))
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
                                conflicts="error" if strict else conflicts, walking=walking)
    if strict and sharded.fallbacks:
        first = min(sharded.fallbacks)
        node, cause = graph.nodes[first], sharded.fallback_causes.get(first)
        raise NoRuleError(f"no sharding rule applies to `{node.op}` at {where(node)}"
                          f"{f' ({cause})' if cause else ''} (strict=True; without it the conservative rule would "
                          "gather its operands)")
    warn_fallbacks(graph, sharded.fallbacks, sharded.fallback_causes)
    warn_reshards(graph, sharded)
    return checked(sharded)


def propagate_layouts(graph: Graph, input_layouts: list[Layout | None], mesh: Mesh, *,
                      strict: bool = False, conflicts: str = "error", walking: Walking = Walking(),
                      lineage: bool = True, memo: dict | None = None) -> ShardedGraph:
    """``propagate`` from validated input layouts (None: unannotated); no warnings. Rules use it to
    shard sub-computations such as scan bodies, walking the forward walk alone (``Walking(backward=False)``: a
    body's candidates would need the loop's price, per iteration, which the operand moves alone misjudge).
    ``lineage=False`` makes no shards where nothing reads them (the same layouts, each axis without its blocks), and
    ``memo`` (``memo.py``) is the rules' results this call's walks share — both for the tests of what they
    change (nothing)."""
    price, backward = walking.price, walking.backward
    if strict:
        missing = [n for n in graph.nodes if n.op not in (PARAMETER, CONSTANT) and not has_record(n.op)]
        if missing:
            node = missing[0]
            raise NoRuleError(
                f"no sharding rule for primitive `{node.op}` at "
                f"{where(node)} "
                f"(strict=True; without it the conservative rule would gather its operands and replicate its "
                f"result){'' if len(missing) == 1 else f'; {len(missing) - 1} more op(s) without a rule'}")
    body = functools.partial(propagate_body, mesh=mesh, conflicts=conflicts)  # bodies resolve conflicts alike
    # the rules' results on operands laid out as before, shared by this call's walks (the candidates differ from the
    # forward walk in a few views: most nodes see the same operands) — or by the caller's calls on this graph and mesh
    memo = {} if memo is None else memo
    # with a backward pass the candidates are walked without shards (comparing them reads layouts alone, and those
    # walks share the memo) and the one kept is walked again with them; the backward pass then reruns a node's rule
    # where it asks which operand blocks its blocks came from (uses.py)
    exploring = lineage and not backward
    forward = _walks(graph, mesh, input_layouts, body, "reshard", views={}, lineage=exploring, memo=memo)
    # the backward pass (uses.py): node by node where each step costs no more, and optimistically, every step a
    # conflict can be carried back, where several steps may pay off together; the program moving least is kept
    # (optimism carries only conflicts' chains: without a conflict it finds what the node-by-node pass finds)
    # (and, with exchanges, asking nested slices' finest: its effect on the other uses is the plan's price to judge)
    found = [wanted_views(forward, optimistic=optimistic, exchanges=exchanges, finest=finest, memo=memo)
             for optimistic in (False, True)[:1 + bool(forward.reshards)]
             for exchanges in (False, True)
             for finest in (False, True)] if backward else []
    priced = frozenset().union(*(f.priced for f in found))
    candidates = [dataclasses.replace(forward, priced=priced & forward.reshards.keys())]
    walked = [dict(conflicts="reshard", views={})]  # how each candidate was walked (the one kept is walked again)
    seen = {_layouts(candidates[0])}
    for views in _view_sets(forward, found, backward):
        variants = Variants()  # (each distinct program walked once)
        for adoption in _adoptions(graph, dict(views)):
            how = dict(conflicts=conflicts, views=dict(views), priced=priced, adoption=adoption)
            try:
                candidate = _walks(graph, mesh, input_layouts, body, lineage=exploring, memo=memo,
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
    kept = _walks(graph, mesh, input_layouts, body, lineage=True, memo=memo, **walked[order[id(best)]])
    return dataclasses.replace(kept, priced=best.priced)


def _view_sets(forward: ShardedGraph, found, backward) -> list[tuple]:
    """The distinct sets of views the candidates are walked with (sorted items): the backward pass's; a lookup's
    other way (the indices gathered, not the table), alone and with each of them; and, first (so that they lose a
    tie), the returned values' views alone — each returned sliced, made as the forward walk made it, where the chain
    behind it costs more in the plan than the backward pass reckons (a window's halo)."""
    view_sets = [f.views for f in found if f.views]
    lookups = lookup_alternatives(forward) if backward else {}
    if lookups:
        view_sets += [lookups] + [{**lookups, **views} for views in view_sets]
    returned = [{key: view for key, view in views.items() if key[0] == RETURNED} for views in view_sets]
    view_sets = [views for views in returned if views] + view_sets
    return list(dict.fromkeys(tuple(sorted(views.items())) for views in view_sets))


def _adoptions(graph: Graph, views) -> list[Adoption]:
    """The settings a view set is walked under, where each decides something: a created value (a broadcast's) several
    nodes read made as the others need it and sliced for a view, or made as the view asks for all of them; a returned
    value's open axes adopting the layout it mirrors (all the chain making it laid out so), or made as without the
    mirror and returned sliced (an open chain through a cumsum would then finish it); a created value one use reads
    made as its view asks, or (where a reshape between cannot carry the layout back to where the axis was created) as
    without it, and sliced for it."""
    return [Adoption(shared=shared, returned=returned, viewed=viewed)
            for shared, returned, viewed in itertools.product((False, True)[:1 + _views_shared_created(graph, views)],
                                                              (True, False)[:1 + _views_returned(graph, views)],
                                                              (False, True))]


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
        if node_id != RETURNED and j == MADE:
            continue  # (made so: no open axis to adopt it)
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
            if producer.op not in (PARAMETER, CONSTANT) and Trait.BROADCAST not in lookup(producer.op).traits \
                    and producer.operands:
                return True
    return False


def _walks(graph: Graph, mesh: Mesh, input_layouts, body, conflicts: str, views, priced=frozenset(),
           adoption: Adoption = ADOPTING, lineage: bool = True,
           memo: dict | None = None, variants: Variants | None = None) -> ShardedGraph:
    """The two forward walks (the first learns what open axes meet, the second makes the shards), each node taking
    the operands ``views`` names in the layout it says; the conflicts at ``priced`` nodes are resolved whatever
    ``conflicts`` says (the backward pass priced them: moving there is the cheapest way). ``variants``: the earlier
    calls with these
    arguments but another ``adoption`` (``Variants``): a call they show to make the
    product one of them made returns that product, unwalked."""
    mesh_shape = dict(mesh.shape)
    known = None if variants is None else variants.walked_alike(adoption)
    if known is not None:
        return known
    first = Walk(graph, mesh_shape, input_layouts, body, opens=OpenTracker(), conflicts=conflicts, views=views,
                  priced=priced, adoption=adoption, memo=memo)
    try:
        first.run()
    except ShardingConflictError as plain:
        # The exploratory walk makes no shards; replay with lineage so that the error can say where each
        # operand's sharding came from (following shard parents back to an input spec).
        try:
            Walk(graph, mesh_shape, input_layouts, body, resolve=_replicated, conflicts=conflicts,
                  views=views, priced=priced, adoption=adoption).run()
        except ShardingConflictError as detailed:
            raise detailed from None
        raise plain from None
    resolved = None if variants is None else resolutions(first.opens)
    known = None if variants is None else variants.resolved_alike(adoption, first.settings_read, resolved)
    if known is not None:
        return known
    try:
        final = Walk(graph, mesh_shape, input_layouts, body, resolve=first.opens.resolution, conflicts=conflicts,
                      adopted_from=first.opens.adopted_from, views=views, priced=priced, adoption=adoption,
                      lineage=lineage, memo=memo)
        final.run()
    except ShardingError:
        # The adopted shardings clashed somewhere the first walk could not see (two open axes of one
        # tensor adopting the same mesh axis). Replicating every open axis is always consistent.
        final = Walk(graph, mesh_shape, input_layouts, body, resolve=_replicated, conflicts=conflicts,
                      views=views, priced=priced, adoption=adoption)
        final.run()
    product = _product(graph, mesh, final, priced)
    if variants is not None:
        variants.made(adoption, first.settings_read, resolved, product)
    return product


def _replicated(key) -> None:
    """The resolution of every open axis as replicated (always consistent)."""
    return None


def _product(graph: Graph, mesh: Mesh, final: Walk, priced: frozenset) -> ShardedGraph:
    """The ShardedGraph a final walk made."""
    return ShardedGraph(graph, mesh, tuple(final.shardings), tuple(final.needs), tuple(final.rule_names),
                        frozenset(final.fallbacks), final.bodies, final.reshards, final.adoptions,
                        final.fallback_causes, final.need_spans, views=final.views_taken,
                        priced=priced & final.reshards.keys())


def propagate_body(graph: Graph, input_layouts: list[Layout], *, mesh: Mesh, conflicts: str) -> ShardedGraph:
    return dataclasses.replace(propagate_layouts(graph, input_layouts, mesh, conflicts=conflicts,
                                                 walking=Walking(backward=False)),
                               is_body=True)


def propagate_decided(graph: Graph, input_layouts: list[Layout], mesh: Mesh, *, views, created,
                      conflicts: str = "reshard") -> ShardedGraph:
    """One walk with every choice already made (the layout search's solution): the arguments laid out as
    ``input_layouts``, each node handed the operands ``views`` names in exactly the layout it says (``View.exact``),
    each axis a rule creates laid out as ``created[(value, axis)]`` says (absent: replicated). No backward pass, no
    warnings; a conflict met (where no view is given) is resolved or refused as ``conflicts`` says."""
    body = functools.partial(propagate_body, mesh=mesh, conflicts="reshard")
    walk = Walk(graph, dict(mesh.shape), input_layouts, body, resolve=lambda key: created.get(key) or None,
                conflicts=conflicts, views=views)
    walk.run()
    return checked(_product(graph, mesh, walk, frozenset()))
