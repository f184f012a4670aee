"""How a value held as one :class:`~shardprop.core.types.ValueType` becomes another: the one place moves are
planned and priced.

A move is a short sequence of :class:`Step`\\ s — local slices, all-gathers, all-to-alls, permutes, psums,
reduce-scatters and taking a whole value once as a partial sum — found by :func:`plan_move`, a shortest-path
search over value types that moves the fewest bytes (the ring model of :mod:`shardprop.core.transfers`), ties
broken by fewer collectives, then fewer steps. :func:`step_transfer` prices one step as the collective XLA
compiles it to; ``shardprop/backends/moves.py`` runs the same steps on per-device blocks inside ``shard_map``.
Estimate, executor and listing all read the one plan, so they cannot disagree.

    >>> mesh_shape = {"i": 4, "j": 2}
    >>> have, want = ValueType((("j",), (), ("i",))), ValueType(((), ("i", "j"), ()))
    >>> [str(s) for s in plan_move((16, 32, 24), "float32", have, want, mesh_shape)]
    ['all-to-all over i from axis 2 to axis 1', 'all-to-all over j from axis 0 to axis 1']
    >>> sum(t.moved_bytes for t in move_transfers((16, 32, 24), "float32", have, want, mesh_shape))
    7680.0

Each communicating step compiles to exactly one collective, priced as XLA prints it (checked against compiled HLO
in ``tests/core/test_moves.py``): an all-gather on any tensor axis (XLA copies the block into a transposed layout,
no extra collective), an all-to-all over one or several mesh axes as one all-to-all of a tuple, a permute as one
collective-permute that keeps its identity pairs, a psum as an all-reduce of the block, a psum-scatter as a
reduce-scatter of the result block.

Start reading at :func:`plan_move`; ``_Search`` holds the graph it searches (its edges, and A*'s bound).
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum

import numpy as np

from ..expr import jax_adapter as jx
from ..expr.graph import Aval
from .layouts import Layout, block_shape, shard_count
from .transfers import Transfer, TransferKind, moved, transfer
from .types import Reduction, ValueType


class StepKind(StrEnum):
    """What one step does to a block (see :class:`Step`)."""

    SLICE = "slice"                # cut this device's finer block locally: free
    ALL_GATHER = "all-gather"      # an axis gives up its minor-most mesh axes
    ALL_TO_ALL = "all-to-all"      # an axis hands its minor-most mesh axes to another axis's minor end
    PERMUTE = "permute"            # every device receives, whole, a block some other device holds
    PSUM = "psum"                  # a partial sum is reduced over some of its mesh axes
    PSUM_SCATTER = "psum-scatter"  # ... and scattered over them along an axis (a reduce-scatter)
    TAKE_ONCE = "take-once"        # a whole value becomes a partial sum: the first device of a group keeps it


# The collective XLA compiles each communicating step to.
_TRANSFER_KIND = {
    StepKind.ALL_GATHER: TransferKind.ALL_GATHER,
    StepKind.ALL_TO_ALL: TransferKind.ALL_TO_ALL,
    StepKind.PERMUTE: TransferKind.COLLECTIVE_PERMUTE,
    StepKind.PSUM: TransferKind.ALL_REDUCE,
    StepKind.PSUM_SCATTER: TransferKind.REDUCE_SCATTER,
}


@dataclass(frozen=True, slots=True)
class Step:
    """One move: ``kind`` over ``mesh_axes``, taking a block held as ``before`` to one held as ``after``.

    ``axis`` is the tensor axis a slice cuts, a gather gathers, a reduce-scatter scatters, or an all-to-all
    concatenates (the axis giving up ``mesh_axes``); ``to_axis`` is the axis an all-to-all splits (the axis
    receiving them). A permute's device pairs follow from ``before``, ``after`` and the mesh
    (:func:`permute_pairs`); its ``mesh_axes`` are the mesh axes either layout uses, in mesh order.

    >>> str(Step(StepKind.ALL_GATHER, ("j",), ValueType(((), ("i", "j"))), ValueType(((), ("i",))), axis=1))
    'all-gather over j on axis 1'
    """

    kind: StepKind
    mesh_axes: tuple[str, ...]
    before: ValueType
    after: ValueType
    axis: int | None = None
    to_axis: int | None = None

    def __str__(self) -> str:
        over = f"{'take once' if self.kind is StepKind.TAKE_ONCE else self.kind} over {'*'.join(self.mesh_axes)}"
        if self.kind is StepKind.ALL_TO_ALL:
            return f"{over} from axis {self.axis} to axis {self.to_axis}"
        if self.kind is StepKind.PSUM_SCATTER:
            return f"{over} onto axis {self.axis}"
        return over if self.axis is None else f"{over} on axis {self.axis}"

    @property
    def short(self) -> str:
        """``gather j@1``, ``all-to-all i@2->1``, ``psum j``: for tables and graph edges."""
        verb = "gather" if self.kind is StepKind.ALL_GATHER else str(self.kind)
        axes = "*".join(self.mesh_axes)
        if self.kind is StepKind.ALL_TO_ALL:
            return f"{verb} {axes}@{self.axis}->{self.to_axis}"
        return f"{verb} {axes}" if self.axis is None else f"{verb} {axes}@{self.axis}"


def plan_move(shape: tuple[int, ...], dtype, have: ValueType, want: ValueType,
              mesh_shape: Mapping[str, int]) -> tuple[Step, ...]:
    """The steps that bring a value of ``shape`` held as ``have`` to ``want``, moving the fewest bytes (ring
    model), then using the fewest collectives. Raises ValueError for a type the shape or the mesh cannot hold.

    The plan does not depend on ``dtype`` (every price is proportional to the item size); it is taken so that a
    caller reads the same arguments here as in :func:`move_transfers`.

    >>> [str(s) for s in plan_move((8, 8), "float32", ValueType((("i",), ())), ValueType(((), ("i",))), {"i": 4})]
    ['all-to-all over i from axis 0 to axis 1']
    >>> plan_move((8,), "float32", ValueType(((),), ("i",)), ValueType((("i",),)), {"i": 4})[0].short
    'psum-scatter i@0'
    """
    if have == want:  # the common case, on almost every edge of a graph
        return ()
    return _plan(tuple(shape), have, want, tuple(mesh_shape.items()))


def step_transfer(step: Step, shape: tuple[int, ...], dtype, mesh_shape: Mapping[str, int]) -> Transfer | None:
    """The collective ``step`` compiles to, priced; None for a step that sends nothing between devices (a
    slice, taking once, a collective over groups of one device, or of an empty value, which XLA drops).

    The per-device result XLA reports is the block ``after`` holds: the gathered block, the scattered block,
    and for an all-to-all, a permute and a psum the block itself (the same size before and after)."""
    if not exchanges(step, mesh_shape) or 0 in shape:
        return None
    groups = tuple(n for n in step.mesh_axes if mesh_shape[n] > 1)  # a mesh axis of size 1 groups nothing
    return transfer(_TRANSFER_KIND[step.kind], groups, Aval(tuple(shape), _as_dtype(dtype)), step.after.layout,
                    mesh_shape)


def move_transfers(shape: tuple[int, ...], dtype, have: ValueType, want: ValueType,
                   mesh_shape: Mapping[str, int]) -> list[Transfer]:
    """The collectives of :func:`plan_move`'s plan, in order."""
    found = (step_transfer(s, shape, dtype, mesh_shape) for s in plan_move(shape, dtype, have, want, mesh_shape))
    return [t for t in found if t is not None]


def plan_bytes(shape: tuple[int, ...], dtype, steps: tuple[Step, ...], mesh_shape: Mapping[str, int]) -> float:
    """Bytes one device sends along ``steps`` (ring model)."""
    found = (step_transfer(s, shape, dtype, mesh_shape) for s in steps)
    return sum(t.moved_bytes for t in found if t is not None)


def describe(shape: tuple[int, ...], steps: tuple[Step, ...], mesh_shape: Mapping[str, int]) -> str:
    """One line per step with the block it leaves each device: a listing of a move.

    >>> have, want = ValueType((("i",), ())), ValueType(((), ("i",)))
    >>> print(describe((8, 8), plan_move((8, 8), "float32", have, want, {"i": 4}), {"i": 4}))
    all-to-all over i from axis 0 to axis 1  -> [8, 2]
    """
    return "\n".join(f"{s}  -> {list(block_shape(shape, s.after.layout, mesh_shape))}" for s in steps)


def exchanges(step: Step, mesh_shape: Mapping[str, int]) -> bool:
    """True when ``step`` sends data between devices: a collective over groups of more than one device (a
    permute that moves some block; one that only renames mesh axes of size 1 moves none)."""
    if step.kind not in _TRANSFER_KIND:
        return False
    if step.kind is StepKind.PERMUTE:
        return _without_trivial(step.before.layout, mesh_shape) != _without_trivial(step.after.layout, mesh_shape)
    return shard_count(mesh_shape, step.mesh_axes) > 1


def permute_pairs(step: Step, mesh_shape: Mapping[str, int]) -> tuple[tuple[int, int], ...]:
    """``(source, destination)`` pairs for ``lax.ppermute`` over ``step.mesh_axes``: device numbers are linear
    indices over those axes, major first. Each device receives the block it wants from a device holding it; one
    already holding its block sends to itself (XLA keeps such pairs as local copies), so the pairs are a
    bijection and no device is left with zeros.

    >>> s = Step(StepKind.PERMUTE, ("i", "j"), ValueType((("i",), ("j",))), ValueType((("j",), ("i",))))
    >>> permute_pairs(s, {"i": 2, "j": 2})
    ((0, 0), (1, 2), (2, 1), (3, 3))
    """
    return _pairs(step.mesh_axes, step.before.layout, step.after.layout, tuple(mesh_shape.items()))


@functools.lru_cache(maxsize=4096)
def _pairs(names: tuple[str, ...], have: Layout, want: Layout, mesh: tuple[tuple[str, int], ...]):
    sizes = dict(mesh)
    devices = list(itertools.product(*(range(sizes[n]) for n in names)))

    def block(layout: Layout, coords: tuple[int, ...]) -> tuple[int, ...]:
        at = dict(zip(names, coords, strict=True))
        return tuple(_linear(m, at, sizes) for m in layout)

    holders: dict[tuple[int, ...], list[int]] = {}
    needers: dict[tuple[int, ...], list[int]] = {}
    pairs = []
    for d, coords in enumerate(devices):
        held, wanted = block(have, coords), block(want, coords)
        if held == wanted:
            pairs.append((d, d))
        else:
            holders.setdefault(held, []).append(d)
            needers.setdefault(wanted, []).append(d)
    for key, to in needers.items():
        pairs += zip(holders[key], to, strict=True)
    return tuple(sorted(pairs))


def _linear(mesh_axes: tuple[str, ...], at: Mapping[str, int], sizes: Mapping[str, int]) -> int:
    index = 0
    for name in mesh_axes:
        index = index * sizes[name] + at[name]
    return index


def _without_trivial(layout: Layout, mesh_shape: Mapping[str, int]) -> Layout:
    """``layout`` without its mesh axes of size 1 (which select nothing)."""
    return tuple(tuple(n for n in m if mesh_shape[n] > 1) for m in layout)


def _as_dtype(dtype):
    return dtype if jx.is_extended_dtype(dtype) else np.dtype(dtype)


# --- the search -----------------------------------------------------------------------------------------------

State = tuple[Layout, tuple[str, ...]]  # (layout, partial in mesh order): partial sums are a set of mesh axes
Edge = tuple[StepKind, tuple[str, ...], "int | None", "int | None"]  # (kind, mesh_axes, axis, to_axis)


@functools.lru_cache(maxsize=65536)
def _plan(shape: tuple[int, ...], have: ValueType, want: ValueType,
          mesh: tuple[tuple[str, int], ...]) -> tuple[Step, ...]:
    sizes = dict(mesh)
    _check(shape, have, sizes, "have")
    _check(shape, want, sizes, "want")
    search = _Search(shape, sizes, have, want)
    path = search.run()
    if not path:  # the same sums listed in another order
        return ()
    steps = _merge_slices([Step(kind, names or _permuted(before[0], after[0], sizes), ValueType(*before),
                                ValueType(*after), axis, to_axis)
                           for before, (kind, names, axis, to_axis), after in path])
    # The ends as the caller spelled them (the order of partial axes is immaterial, but callers compare types).
    steps[0] = replace(steps[0], before=have)
    steps[-1] = replace(steps[-1], after=want)
    return tuple(steps)


def _permuted(have: Layout, want: Layout, sizes: Mapping[str, int]) -> tuple[str, ...]:
    """The mesh axes a permute from ``have`` to ``want`` runs over: those either layout uses, in mesh order."""
    used = {n for m in have + want for n in m}
    return tuple(n for n in sizes if n in used)


def _merge_slices(steps: list[Step]) -> list[Step]:
    """Consecutive slices of one axis as one step (the search slices one mesh axis at a time)."""
    out: list[Step] = []
    for s in steps:
        if out and s.kind is StepKind.SLICE and out[-1].kind is StepKind.SLICE and out[-1].axis == s.axis:
            out[-1] = replace(out[-1], mesh_axes=out[-1].mesh_axes + s.mesh_axes, after=s.after)
        else:
            out.append(s)
    return out


def _check(shape: tuple[int, ...], vtype: ValueType, sizes: Mapping[str, int], what: str) -> None:
    """Raise ValueError unless a value of ``shape`` can be held as ``vtype`` on the mesh and moved."""
    if len(vtype.layout) != len(shape):
        raise ValueError(f"{what}: layout {vtype.layout} has {len(vtype.layout)} axes, the value has shape {shape}")
    names = [n for m in vtype.layout for n in m] + list(vtype.partial)
    unknown = [n for n in names if n not in sizes]
    if unknown:
        raise ValueError(f"{what}: {vtype} names mesh axes {unknown} the mesh {dict(sizes)} does not have")
    if len(set(names)) != len(names):
        raise ValueError(f"{what}: {vtype} uses a mesh axis twice (each one shards one axis, or sums, once)")
    for axis, (n, m) in enumerate(zip(shape, vtype.layout, strict=True)):
        if n % shard_count(sizes, m):
            raise ValueError(f"{what}: axis {axis} of shape {shape} (size {n}) cannot be laid out over {m}: "
                             f"{shard_count(sizes, m)} blocks do not divide it")
    if vtype.partial and vtype.reduction is not Reduction.SUM:
        raise ValueError(f"{what}: {vtype} is a partial {vtype.reduction}: only partial sums move (its collective "
                         "finishes it right after the op that computed it)")


class _Search:
    """A* over the value types of one value, joined by steps priced in whole units (bytes are the same for
    every dtype up to the item size, so the search counts elements).

    Only the mesh axes the two types name take part: slicing over an idle axis before a reduce and gathering it
    afterwards can move a few bytes fewer (a hierarchical all-reduce), but costs a collective more each time, and
    a plan over the axes a reader sees is one the reader can follow. Pruned without losing optimality (checked
    against a plain search in the tests): sums are only reduced if ``want`` does not hold them and only started
    if it does (reducing a sum to start it again buys nothing), and taking once is the last step (a whole value
    can do everything a partial one can, at the same prices).
    """

    def __init__(self, shape: tuple[int, ...], sizes: Mapping[str, int], have: ValueType, want: ValueType):
        named = {n for m in (*have.layout, *want.layout) for n in m} | set(have.partial) | set(want.partial)
        self.shape, self.sizes, self.names = shape, sizes, tuple(n for n in sizes if n in named)
        self.total = math.prod(shape)
        # Every group size divides the mesh's device count: ring prices times it are whole numbers, which
        # compare exactly (a tie must fall to the collective count, not to rounding).
        self.scale = shard_count(sizes, self.names)
        self.start, self.goal = self.state(have), self.state(want)
        self.reduce = frozenset(have.partial) - set(want.partial)
        self.trivial = any(sizes[n] == 1 for n in self.names)
        self.goal_layout = _without_trivial(want.layout, sizes)
        self.goal_partial = frozenset(n for n in want.partial if sizes[n] > 1)
        self.goal_sizes = block_shape(shape, want.layout, sizes)
        self.goal_block = math.prod(self.goal_sizes)
        self.group = shard_count(sizes, tuple(self.goal_partial))
        self.rates: dict[tuple[StepKind, int], int] = {}
        self.counts: dict[tuple[str, ...], int] = {}
        self.bounds: dict[State, int] = {}

    def state(self, vtype: ValueType) -> State:
        return vtype.layout, tuple(n for n in self.names if n in vtype.partial)

    def run(self) -> list[tuple[State, Edge, State]]:
        """The cheapest path from ``have`` to ``want``: ``(before, edge, after)`` per step, in order. Costs are
        ``(bytes, collectives, steps)``, compared in that order; the heap orders by cost plus :meth:`bound`."""
        start, goal = self.start, self.goal
        best = {start: (0, 0, 0)}
        came_from: dict[State, tuple[State, Edge]] = {}
        order = itertools.count()  # ties pop in the order found: plans are deterministic
        frontier = [((self.bound(start), 0, 0), next(order), (0, 0, 0), start)]
        while frontier and frontier[0][3] != goal:
            _, _, cost, state = heapq.heappop(frontier)
            if cost > best[state]:
                continue
            for edge, nxt, price, collectives in self.edges(state):
                new = (cost[0] + price, cost[1] + collectives, cost[2] + 1)
                if nxt not in best or new < best[nxt]:
                    best[nxt], came_from[nxt] = new, (state, edge)
                    heapq.heappush(frontier, ((new[0] + self.bound(nxt), new[1], new[2]), next(order), new, nxt))
        if start != goal and goal not in came_from:  # cannot happen for checked types: gathering everything,
            # reducing every sum, slicing and taking once always gets there
            raise ValueError(f"no move from {start} to {goal}")
        path = []
        state = goal
        while state != start:
            before, edge = came_from[state]
            path.append((before, edge, state))
            state = before
        return path[::-1]

    def count(self, mesh_axes: tuple[str, ...]) -> int:
        found = self.counts.get(mesh_axes)
        if found is None:
            found = self.counts[mesh_axes] = shard_count(self.sizes, mesh_axes)
        return found

    def price(self, kind: StepKind, n: int, elements: int) -> int:
        """:func:`~shardprop.core.transfers.moved` for a result of ``elements``, times ``scale`` (moved is linear
        in the size, and its rate times ``scale`` is whole)."""
        rate = self.rates.get((kind, n))
        if rate is None:
            rate = self.rates[kind, n] = round(moved(_TRANSFER_KIND[kind], n, self.scale))
        return rate * elements

    def bound(self, state: State) -> int:
        """A lower bound on the price of reaching the goal from ``state`` (A*'s heuristic).

        Nothing if slices and taking once get there. Otherwise at least one collective, and each moves at least
        half its operand's and half its result's block (a ring of two devices): the last one's result is no
        smaller than the goal's block (only slices follow it), the next one's operand no smaller than a block
        sharded over every mesh axis that does not sum ``state``. And a step's price is at least what a device
        receives in it: the first device and those it sums the goal with (whose blocks all start at the origin)
        must receive every element of their goal block none of them holds now — every element, while they hold
        a sum the goal does not."""
        found = self.bounds.get(state)
        if found is not None:
            return found
        layout, partial = state
        if self.trivial:  # mesh axes of size 1 move for free
            layout, partial = _without_trivial(layout, self.sizes), tuple(n for n in partial if self.sizes[n] > 1)
        if set(partial) <= self.goal_partial and all(g[:len(m)] == m for m, g in zip(layout, self.goal_layout,
                                                                                     strict=True)):
            found = 0
        else:
            smallest = self.total * self.count(partial) // self.scale
            held = 0 if not set(partial) <= self.goal_partial else min(self.goal_block, self.group * math.prod(
                min(n // self.count(m), g) for n, m, g in zip(self.shape, layout, self.goal_sizes, strict=True)))
            found = max(self.scale * max(self.goal_block, smallest) // 2,
                        self.scale * (self.goal_block - held) // self.group)
        self.bounds[state] = found
        return found

    def edges(self, state: State) -> Iterator[tuple[Edge, State, int, int]]:
        """``(edge, next state, price, collectives)`` for every step out of ``state``. A permute's edge leaves its
        mesh axes out (None): they are worked out for the one permute the plan keeps."""
        layout, partial = state
        shape, sizes, count, price = self.shape, self.sizes, self.count, self.price
        counts = [count(m) for m in layout]
        block = self.total // math.prod(counts)
        used = {n for m in layout for n in m}
        free = [n for n in self.names if n not in used and n not in partial]
        for a, m in enumerate(layout):
            for name in free:  # one mesh axis at a time; consecutive slices are merged afterwards
                if shape[a] % (counts[a] * sizes[name]) == 0:
                    yield (StepKind.SLICE, (name,), a, None), (_put(layout, a, m + (name,)), partial), 0, 0
            for k in range(1, len(m) + 1):
                names, kept = m[-k:], m[:-k]
                n = count(names)
                gathered = _put(layout, a, kept)
                yield ((StepKind.ALL_GATHER, names, a, None), (gathered, partial),
                       price(StepKind.ALL_GATHER, n, block * n), int(n > 1))
                a2a = price(StepKind.ALL_TO_ALL, n, block)
                for b, mb in enumerate(layout):
                    if b != a and shape[b] % (counts[b] * n) == 0:
                        yield ((StepKind.ALL_TO_ALL, names, a, b), (_put(gathered, b, mb + names), partial), a2a,
                               int(n > 1))
        permute = price(StepKind.PERMUTE, 2, block)  # the whole block, whatever the group
        for other in _same_counts(tuple(counts), tuple((n, sizes[n]) for n in self.names if n not in partial)):
            if other != layout:
                if self.trivial and _without_trivial(other, sizes) == _without_trivial(layout, sizes):
                    yield (StepKind.PERMUTE, None, None, None), (other, partial), 0, 0  # renames size-1 axes
                else:
                    yield (StepKind.PERMUTE, None, None, None), (other, partial), permute, 1
        for names in _subsets([n for n in partial if n in self.reduce]):
            rest = tuple(n for n in partial if n not in names)
            n = count(names)
            yield (StepKind.PSUM, names, None, None), (layout, rest), price(StepKind.PSUM, n, block), int(n > 1)
            scattered = price(StepKind.PSUM_SCATTER, n, block // n)
            for a, m in enumerate(layout):
                if shape[a] % (counts[a] * n) == 0:
                    for order in itertools.permutations(names):
                        yield ((StepKind.PSUM_SCATTER, order, a, None), (_put(layout, a, m + order), rest),
                               scattered, int(n > 1))
        if layout == self.goal[0] and partial != self.goal[1] and set(partial) <= set(self.goal[1]):
            names = tuple(n for n in self.goal[1] if n not in partial)
            yield (StepKind.TAKE_ONCE, names, None, None), self.goal, 0, 0


def _put(layout: Layout, axis: int, mesh_axes: tuple[str, ...]) -> Layout:
    return layout[:axis] + (mesh_axes,) + layout[axis + 1:]


def _subsets(items: list[str]) -> Iterator[tuple[str, ...]]:
    """Non-empty subsets, each in the order of ``items``."""
    for k in range(1, len(items) + 1):
        yield from itertools.combinations(items, k)


@functools.lru_cache(maxsize=4096)
def _same_counts(counts: tuple[int, ...], available: tuple[tuple[str, int], ...]) -> tuple[Layout, ...]:
    """Every layout over the ``available`` mesh axes (name, size) whose axes have ``counts`` blocks each: the
    layouts a permute reaches (equal blocks, so every wanted block is one some device holds)."""

    def fill(axis: int, left: tuple[tuple[str, int], ...]) -> Iterator[Layout]:
        if axis == len(counts):
            yield ()
            return
        for k in range(len(left) + 1):
            for chosen in itertools.permutations(left, k):
                if math.prod(s for _, s in chosen) == counts[axis]:
                    rest = tuple(x for x in left if x not in chosen)
                    for tail in fill(axis + 1, rest):
                        yield (tuple(n for n, _ in chosen),) + tail

    return tuple(fill(0, available))
