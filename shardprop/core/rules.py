"""What a sharding rule sees and returns: ``RuleContext``, ``RuleOutput``, ``RuleConflict``.

A rule (the ``propagate`` piece of a primitive's ``shardprop.ops.OpDef``) has one signature::

    rule(ctx: RuleContext, *operands: TensorSharding, **params) -> RuleOutput

It receives the operands' shardings and the equation's params, and returns the output shardings plus the
layout in which it *consumes* each operand (``needs``). A need coarser than what the operand has (a sharded
axis the op wants whole) is where the splitting pass cuts; a finer need is a local slice. Rules are pure:
they raise ``RuleConflict`` and the dispatcher adds the op, the source line and the operands.
"""

from __future__ import annotations

import itertools

from dataclasses import dataclass

import numpy as np
from typing import Any, NamedTuple

from ..errors import ConflictKind
from ..expr.graph import Aval, constant_behind
from .layouts import AxisSharding, Layout, Open, Shard, Sharded, Span, TensorSharding, is_refinement, shard_count


class RuleOutput(NamedTuple):
    outputs: tuple[TensorSharding, ...]
    needs: tuple[Layout, ...]
    # A rule that shards sub-computations (a scan body) returns them (a tuple of Body) for the backend.
    body: Any = None
    # True when the rule could not prove anything better and used the conservative rule: warned about.
    fallback: bool = False
    # Why, when the cause is inside a sub-computation (its primitive and line), for the warning and strict=True.
    fallback_cause: str | None = None
    # A rule that reads ranged rows (``shardprop.core.layouts.Span``): per operand, per axis, the
    # ``(mesh axes, span)`` it consumes that axis in (the need's layout says () there), or None; None: no axis.
    need_spans: tuple | None = None


class RuleConflict(Exception):
    """Raised by a rule: output ``axis`` cannot be given one sharding (``detail`` says why); ``layouts`` are
    the per-axis layouts (mesh axes) that clash, ``kind`` as in ``shardprop.ShardingConflictError``."""

    def __init__(self, axis: int | None, detail: str, layouts: tuple[tuple[str, ...], ...] = (),
                 kind: ConflictKind = ConflictKind.MISMATCH):
        super().__init__(detail)
        self.axis, self.detail, self.layouts, self.kind = axis, detail, layouts, kind


class _Created:
    """Marker a rule returns for an axis it creates (a broadcast's new axis): the dispatcher decides whether
    it starts open (adopting what it meets) or takes the sharding resolved for it."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "CREATED"


CREATED = _Created()

class OpenTracker:
    """Union-find over open axes, and the shardings each class of open axes has met (pass 1 only), each with
    the first node that met it (to say where an adopted sharding came from)."""

    def __init__(self):
        self.parent: dict[tuple[int, int], tuple[int, int]] = {}
        self.requests: dict[tuple[int, int], dict[tuple[str, ...], int | None]] = {}

    def find(self, key):
        parent = self.parent.setdefault(key, key)
        if parent == key:
            return key
        root = self.find(parent)
        self.parent[key] = root
        return root

    def union(self, opens: list[Open]) -> Open:
        roots = list(dict.fromkeys(self.find(o.key) for o in opens))
        root = roots[0]
        for other in roots[1:]:
            self.parent[other] = root
            met = self.requests.setdefault(root, {})
            for mesh_axes, node in self.requests.pop(other, {}).items():
                met.setdefault(mesh_axes, node)
        return opens[0] if len(roots) == 1 and opens[0].key == root else Open(root)

    def request(self, open_axis: Open, mesh_axes: tuple[str, ...], node: int | None = None) -> None:
        self.requests.setdefault(self.find(open_axis.key), {}).setdefault(mesh_axes, node)

    def resolution(self, key) -> tuple[str, ...] | None:
        """The mesh axes an open axis should take: the one sharding its class met, or None (replicate)
        when it met none or several (several would be a conflict; replicated is compatible with all)."""
        met = self.requests.get(self.find(key), ())
        return next(iter(met)) if len(met) == 1 else None

    def adopted_from(self, key) -> int | None:
        """The node whose sharding the open axis ``key`` adopts (see ``resolution``), if known."""
        met = self.requests.get(self.find(key), {})
        return next(iter(met.values())) if len(met) == 1 else None


class RuleContext:
    """What a rule may know besides its operands: avals, the mesh, and how to make shards.

    With ``lineage=False`` (the first, exploratory walk) no shards are made: only which mesh axes each axis
    is laid out on matters there, so ``derive`` hands back its first source unchanged.
    """

    __slots__ = ("in_avals", "out_avals", "mesh_shape", "lineage", "propagate_body", "node", "_ids", "_opens",
                 "graph")

    def __init__(self, in_avals: tuple[Aval, ...], out_avals: tuple[Aval, ...], mesh_shape, ids, opens,
                 lineage: bool = True, propagate_body=None, graph=None):
        self.in_avals, self.out_avals, self.mesh_shape = in_avals, out_avals, mesh_shape
        self._ids, self._opens, self.lineage = ids, opens, lineage
        self.node: int | None = None  # the node whose rule runs (set by the walk)
        # propagate_body(graph, input_layouts) -> ShardedGraph: shards a sub-computation on the same mesh.
        self.propagate_body = propagate_body
        self.graph = graph  # the graph walked (for the constants a rule may read)

    def scalar_constant(self, operand: int):
        """The value of operand ``operand`` of the node whose rule runs when it is a scalar literal (a pad's
        value, as ``jnp.pad`` writes it) as a Python scalar; None otherwise."""
        if self.graph is None or self.node is None:
            return None
        graph = self.graph
        value = graph.nodes[self.node].operands[operand]
        if graph.avals[value].shape != ():
            return None
        producer = constant_behind(graph, value)  # (jnp.pad's 0 is an int literal converted)
        if producer is None:
            return None
        return np.asarray(producer.params["value"]).astype(graph.avals[value].dtype).item()

    def ranged(self, axis: int, size: int, mesh_axes: tuple[str, ...], span: Span,
               sources: list[tuple[Sharded, int]]) -> Sharded:
        """Output ``axis`` (of ``size``) over ``mesh_axes``, device ``d`` holding the rows ``span`` says — equal blocks
        when that is what they are. Each device's shard (its range, possibly empty) has as parents the shards of
        ``sources`` (an operand axis, and the shift from output rows to its rows) that its range reads."""
        count = shard_count(self.mesh_shape, mesh_axes)
        even = size % count == 0 and span.offset == 0 and span.block == size // count
        if not self.lineage:
            return Sharded(mesh_axes, (), None if even else span)
        ids, shards = self._ids, []
        for d in range(count):
            first, stop = span.held(d, size)
            parents = tuple(s for source, shift in sources for s in source.shards
                            if stop > first and s.start < stop + shift and first + shift < s.stop)
            shards.append(Shard(next(ids), axis, first, stop - first, parents))
        return Sharded(mesh_axes, tuple(shards), None if even else span)

    def root(self, axis: int, size: int, mesh_axes: tuple[str, ...]) -> Sharded:
        """Fresh shards without parents: ``size`` split evenly over ``mesh_axes``."""
        count = shard_count(self.mesh_shape, mesh_axes)
        if not self.lineage:
            return Sharded(mesh_axes, ())
        length = size // count
        ids = self._ids
        return Sharded(mesh_axes, tuple([Shard(next(ids), axis, i * length, length, ()) for i in range(count)]))

    def derive(self, axis: int, size: int, sources: list[Sharded]) -> Sharded:
        """New shards on output ``axis``, laid out like the finest source (the others are coarser prefixes of
        it): block ``i`` was computed from the block of every source that contains it."""
        finest = sources[0]
        for src in sources[1:]:
            if len(src.mesh_axes) > len(finest.mesh_axes):
                finest = src
        if not self.lineage:  # equal blocks over its mesh axes (not the source's own rows, were it ranged)
            return Sharded(finest.mesh_axes, ())
        count = len(finest.shards)
        length = size // count
        ids = self._ids
        if len(sources) == 1:
            shards = [Shard(next(ids), axis, i * length, length, (p,)) for i, p in enumerate(finest.shards)]
        elif all(len(src.shards) == count for src in sources):
            shards = [Shard(next(ids), axis, i * length, length, parents)
                      for i, parents in enumerate(zip(*(src.shards for src in sources), strict=True))]
        else:
            shards = [Shard(next(ids), axis, i * length, length,
                            tuple(src.shards[i * len(src.shards) // count] for src in sources)) for i in range(count)]
        return Sharded(finest.mesh_axes, tuple(shards))

    def regroup(self, axis: int, size: int, mesh_axes: tuple[str, ...],
                sources: list[tuple[tuple[str, ...], Sharded]]) -> Sharded:
        """New shards on output ``axis`` over ``mesh_axes``, regrouped from operand axes ``sources`` (``(mesh axes,
        axis)``; a reshape merging or splitting axes over several mesh axes): block ``i``'s parents are the blocks of
        each source sharing mesh axes with it whose coordinates on those mesh axes are block ``i``'s."""
        if not self.lineage:
            return Sharded(mesh_axes, ())
        length = size // shard_count(self.mesh_shape, mesh_axes)
        shards = []
        for i, coords in enumerate(_coordinates(mesh_axes, self.mesh_shape)):
            parents = tuple(shard for names, source in sources if set(names) & set(mesh_axes)
                            for shard, theirs in zip(source.shards, _coordinates(names, self.mesh_shape), strict=True)
                            if all(theirs[n] == coords[n] for n in names if n in coords))
            shards.append(Shard(next(self._ids), axis, i * length, length, parents))
        return Sharded(mesh_axes, tuple(shards))

    def request(self, open_axis: Open, mesh_axes: tuple[str, ...]) -> None:
        """An annotation inside the graph (a sharding constraint) asks that ``open_axis`` be laid out over
        ``mesh_axes`` (``()``: replicated), as an input spec does for the axes it meets."""
        self._opens.request(open_axis, mesh_axes, self.node)

    def carry(self, axis: int, size: int, source: AxisSharding) -> AxisSharding:
        """One operand axis passes to output ``axis`` unchanged (new shards, the operand's as parents)."""
        if isinstance(source, Sharded):
            return self.derive(axis, size, [source])
        return source

    def carry_window(self, axis: int, size: int, source: Sharded, reach: tuple[int, int],
                     out_span: Span | None = None) -> Sharded:
        """A windowed op's output ``axis`` laid out like operand axis ``source``: block ``i`` of the output is computed
        from block ``i`` of the operand (the rows it holds, ranged or not) and the rows ``reach`` (before, after) past
        it, so its parents are every operand shard those rows touch (its neighbours' too). ``out_span``: the output's
        blocks when they are not equal (a VALID window's last ones short)."""
        count = shard_count(self.mesh_shape, source.mesh_axes)
        even = out_span is None or (size % count == 0 and out_span == Span(0, size // count))
        if not self.lineage:
            return source if even and source.span is None else Sharded(source.mesh_axes, (), None if even else out_span)
        span = out_span or Span(0, size // count)
        in_block, in_offset = (source.span.block, source.span.offset) if source.span else (source.shards[0].length, 0)
        ids = self._ids
        shards = []
        for i in range(count):
            first = i * in_block - in_offset - reach[0]  # the operand rows read, [first, last)
            last = (i + 1) * in_block - in_offset + reach[1]
            parents = tuple(s for s in source.shards if s.length and s.start < last and first < s.start + s.length)
            start, stop = span.held(i, size)
            shards.append(Shard(next(ids), axis, start, stop - start, parents))
        return Sharded(source.mesh_axes, tuple(shards), None if even else span)

    def carry_reversed(self, axis: int, size: int, source: Sharded) -> Sharded:
        """Operand axis ``source`` reversed onto output ``axis``: block ``i`` of the output is block ``n - 1 - i`` of
        the operand, reversed."""
        if not self.lineage:
            return source
        count, ids = len(source.shards), self._ids
        length = size // count
        shards = (Shard(next(ids), axis, i * length, length, (source.shards[count - 1 - i],)) for i in range(count))
        return Sharded(source.mesh_axes, tuple(shards))

    def carry_unused(self, axis: int, size: int, source: AxisSharding, used: set[str]) -> AxisSharding:
        """``carry``, unless ``source`` is laid out over a mesh axis that an earlier output axis already
        uses (``used``, updated): one mesh axis shards at most one axis of a tensor, so this axis is then
        consumed whole (None) — its operand is gathered along it, which is always correct (``a @ b.T`` with
        both operands sharded on rows; a gather whose indices and table rows share a mesh axis)."""
        if isinstance(source, Sharded):
            if used.intersection(source.mesh_axes):
                return None
            used.update(source.mesh_axes)
        return self.carry(axis, size, source)

    def merge(self, axis: int, size: int, candidates: list[AxisSharding]) -> AxisSharding:
        """The Nx elementwise rule for one output axis, given the operand axes that map onto it.

        Sharded + open → the sharded side's ranges, both as parents; sharded + sharded over the same mesh
        axes → both as parents; sharded over ``i`` + sharded over ``(i, j)`` → the finer, the coarser operand
        cut locally (its blocks contain the finer ones); replicated is compatible with anything (a local
        slice); sharded over mesh axes neither of which refines the other is a conflict.
        """
        if all(c is None for c in candidates):
            return None
        sharded = [c for c in candidates if isinstance(c, Sharded)]
        opens = [c for c in candidates if isinstance(c, Open)]
        if sharded:
            finest = sharded[0].mesh_axes
            for other in sharded[1:]:
                axes = other.mesh_axes
                if axes == finest or is_refinement(axes, finest):
                    continue
                if not is_refinement(finest, axes):
                    raise RuleConflict(axis, f"one operand is sharded over {_names(finest)}, another over "
                                             f"{_names(axes)}", (finest, axes))
                finest = axes
            for open_axis in opens:
                self._opens.request(open_axis, finest, self.node)
            return self.derive(axis, size, sharded)
        if opens:
            return self._opens.union(opens)
        return None


def _names(mesh_axes: tuple[str, ...]) -> str:
    return "*".join(mesh_axes) if mesh_axes else "nothing"


class Carry(NamedTuple):
    """A value a loop carries from one iteration to the next: the body takes it as input ``body_input`` and
    returns it as output ``body_output`` (None: a body that only reads it, a while loop's condition); the loop
    node takes its initial value as operand ``operand`` and returns the last as output ``output``."""

    body_input: int
    body_output: int | None
    operand: int
    output: int


@dataclass(frozen=True, eq=False)
class Body:
    """A sub-computation a rule sharded (a loop body, a while loop's condition, a branch of a ``cond``).

    ``sharded`` is its propagated graph; the op takes the body's outputs in ``out_layouts`` (an output held
    otherwise is moved at the end of the body, inside the loop); ``repeats`` is how many times the body runs
    per execution of the op (a scan's length; None when unknown, a while loop); ``carries`` the loop-carried
    values (empty for a branch). ``name`` is the body's part of the op as inspection names it (``body``,
    ``cond``, ``branch1``: values inside are ``e/body/c``); ``operands[i]`` is the op's operand that body input
    ``i`` comes from (a scan's ``xs``: one iteration's slice; a carry: its initial value, then the last
    iteration's); ``sliced`` the body inputs that are one iteration's slice of their operand (a scan's ``xs``).
    """

    sharded: Any  # the body's ShardedGraph (propagation's product)
    out_layouts: tuple[Layout, ...]
    repeats: int | None = 1
    carries: tuple[Carry, ...] = ()
    name: str = "body"
    operands: tuple[int, ...] = ()
    sliced: frozenset[int] = frozenset()


def _coordinates(mesh_axes: tuple[str, ...], mesh_shape) -> list[dict[str, int]]:
    """Each block's coordinate on each of ``mesh_axes``, blocks numbered row-major (the first mesh axis major)."""
    return [dict(zip(mesh_axes, index, strict=True))
            for index in itertools.product(*(range(mesh_shape[n]) for n in mesh_axes))]
