"""The search behind ``shardprop.core.moves.plan_move``: A* over the value types of one value, joined by steps
priced in whole units, with a lower bound that never overestimates (``Search``)."""

from __future__ import annotations

import functools
import heapq
import itertools
import math
from collections.abc import Iterator, Mapping


from .layouts import Layout, block_shape, shard_count
from .transfers import moved
from .types import ValueType



from .steps import TRANSFER_KIND, StepKind, without_trivial

State = tuple[Layout, tuple[str, ...]]  # (layout, partial in mesh order): partial sums are a set of mesh axes
Edge = tuple[StepKind, tuple[str, ...], "int | None", "int | None"]  # (kind, mesh_axes, axis, to_axis)


class Search:
    """A* over the value types of one value, joined by steps priced in whole units (bytes are the same for
    every dtype up to the item size, so the search counts elements).

    Only the mesh axes the two types name take part: slicing over an idle axis before a reduce and gathering it
    afterwards can move a few bytes fewer (a hierarchical all-reduce), but costs a collective more each time, and
    a plan over the axes a reader sees is one the reader can follow. Pruned without losing optimality (checked
    against a plain search in the tests): sums are only reduced if ``want`` does not hold them and only started
    if it does (reducing a sum to start it again buys nothing), and taking once is the last step (a whole value
    can do everything a partial one can, at the same prices).

    A permute costs the whole block whichever of the many layouts with the same block counts it reaches, so it is
    two edges through a *hub* per (block counts, sums), ``("permute", counts, partial)``: the hub is reached at a
    block's price and reaches each of those layouts for nothing, and the layouts are pushed once per hub rather
    than once per state that can permute (most of the edges of a search over four or more mesh axes).
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
        self.goal_layout = without_trivial(want.layout, sizes)
        self.goal_partial = frozenset(n for n in want.partial if sizes[n] > 1)
        self.goal_sizes = block_shape(shape, want.layout, sizes)
        self.goal_block = math.prod(self.goal_sizes)
        self.rates: dict[tuple[StepKind, int], int] = {}
        self.counts: dict[tuple[str, ...], int] = {}
        self.bounds: dict[State, int] = {}
        self.leasts: dict[tuple[tuple[int, ...], tuple[str, ...]], int] = {}
        self.hubs: dict[tuple, tuple[Layout, ...]] = {}
        # per tensor axis, the block counts of the prefixes of the goal's layout (a hub's check)
        self.prefix_counts = tuple({shard_count(sizes, g[:k]) for k in range(len(g) + 1)} for g in self.goal_layout)

    def state(self, vtype: ValueType) -> State:
        return vtype.layout, tuple(n for n in self.names if n in vtype.partial)

    def run(self, limit: tuple[int, int] | None = None) -> list[tuple[State, Edge, State]] | None:
        """The cheapest path from ``have`` to ``want``: ``(before, edge, after)`` per step, in order. Costs are
        ``(bytes, collectives, steps)``, compared in that order; the heap orders by cost plus ``bound``.
        With a ``limit`` (bytes, collectives), only a path cheaper than it, None if there is none. The cost of
        the path found is left in ``cost``."""
        start, goal, bound, push, pop = self.start, self.goal, self.bound, heapq.heappush, heapq.heappop
        best = {start: (0, 0, 0)}
        came_from: dict[State, tuple[State, Edge]] = {}
        order = itertools.count()  # ties pop in the order found: plans are deterministic
        frontier = [((bound(start), 0, 0), next(order), (0, 0, 0), start)]
        while frontier and frontier[0][3] != goal:
            _, _, cost, state = pop(frontier)
            if cost > best[state]:
                continue
            hub = len(state) == 3  # its edges finish a permute: no step more
            spent, collectives_so_far, steps = cost[0], cost[1], cost[2] + (not hub)
            for edge, nxt, price, collectives in self.edges(state) if not hub else self.permuted(state):
                new = (spent + price, collectives_so_far + collectives, steps)
                known = best.get(nxt)
                if known is None or new < known:
                    rest = bound(nxt)
                    # no path through here gets under the limit (one that has to move more takes a collective more)
                    if limit is not None and (new[0] + rest, new[1] + (rest > 0)) >= limit:
                        continue
                    best[nxt], came_from[nxt] = new, (state, edge)
                    push(frontier, ((new[0] + rest, new[1], steps), next(order), new, nxt))
        if start != goal and goal not in came_from:
            if limit is not None:
                return None
            # cannot happen for checked types: gathering everything, reducing every sum, slicing and taking once
            # always gets there
            raise ValueError(f"no move from {start} to {goal}")
        self.cost = best[goal]
        path = []
        state = goal
        while state != start:
            before, edge = came_from[state]
            if len(before) == 3:  # through a hub: one permute
                before, edge = came_from[before]
            path.append((before, edge, state))
            state = before
        return path[::-1]

    def count(self, mesh_axes: tuple[str, ...]) -> int:
        found = self.counts.get(mesh_axes)
        if found is None:
            found = self.counts[mesh_axes] = shard_count(self.sizes, mesh_axes)
        return found

    def price(self, kind: StepKind, n: int, elements: int) -> int:
        """``shardprop.core.transfers.moved`` for a result of ``elements``, times ``scale`` (moved is linear
        in the size, and its rate times ``scale`` is whole)."""
        rate = self.rates.get((kind, n))
        if rate is None:
            rate = self.rates[kind, n] = round(moved(TRANSFER_KIND[kind], n, self.scale))
        return rate * elements

    def bound(self, state: State) -> int:
        """A lower bound on the price of reaching the goal from ``state`` (A*'s heuristic).

        Nothing if slices and taking once get there. Otherwise at least one collective, and each moves at least
        half its operand's and half its result's block (a ring of two devices): the last one's result is no
        smaller than the goal's block (only slices follow it), the next one's operand no smaller than a block
        sharded over every mesh axis that does not sum ``state``. And a step's price is at least what a device
        receives in it: the first device (whose blocks all start at the origin) must receive every element of its
        goal block it does not hold now — every element, while it holds a sum the goal does not. It must hold the
        whole of it before the last step: the sums the goal keeps are never touched, and those it starts are
        started last, by taking once. Past the first check, the bound depends on the blocks' counts and the sums
        alone, as does a hub's (the least of the layouts it reaches)."""
        found = self.bounds.get(state)
        if found is not None:
            return found
        if len(state) == 3:  # a hub: one of its layouts is a prefix of the goal's if their counts are
            _, counts, partial = state
            partial = self._nontrivial(partial)
            done = set(partial) <= self.goal_partial and all(c in p for c, p in zip(counts, self.prefix_counts,
                                                                                     strict=True))
        else:
            layout, partial = state
            counts = tuple(self.count(m) for m in layout)
            if self.trivial:  # mesh axes of size 1 move for free
                layout, partial = without_trivial(layout, self.sizes), self._nontrivial(partial)
            done = set(partial) <= self.goal_partial and all(g[:len(m)] == m for m, g in zip(layout, self.goal_layout,
                                                                                            strict=True))
        found = self.bounds[state] = 0 if done else self.least(counts, partial)
        return found

    def least(self, counts: tuple[int, ...], partial: tuple[str, ...]) -> int:
        """``bound`` of a state that slices and taking once do not finish: a function of its blocks' counts
        and its sums (without mesh axes of size 1)."""
        key = counts, partial
        found = self.leasts.get(key)
        if found is None:
            # (the smallest operand times scale, undivided: a bound proportional to the element count, as every
            # price is — a value's plan is its canonical shape's, ``moves._plan``)
            smallest = self.total * self.count(partial)
            held = 0 if not set(partial) <= self.goal_partial else math.prod(
                min(n // c, g) for n, c, g in zip(self.shape, counts, self.goal_sizes, strict=True))
            found = self.leasts[key] = max(max(self.scale * self.goal_block, smallest) // 2,
                                           self.scale * (self.goal_block - held))
        return found

    def _nontrivial(self, partial: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(n for n in partial if self.sizes[n] > 1) if self.trivial else partial

    def permuted(self, hub: tuple) -> Iterator[tuple[Edge, State, int, int]]:
        """The edges out of a permute's hub: to every layout it reaches, for nothing (the price was paid on the
        way in)."""
        for other in self.hubs[hub]:
            yield (StepKind.PERMUTE, None, None, None), (other, hub[2]), 0, 0

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
        hub = ("permute", tuple(counts), partial)
        if hub not in self.hubs:
            self.hubs[hub] = tuple(_same_counts(hub[1], tuple((n, sizes[n]) for n in self.names if n not in partial)))
        if len(self.hubs[hub]) > 1:
            yield (StepKind.PERMUTE, None, None, None), hub, price(StepKind.PERMUTE, 2, block), 1  # the whole block
        if self.trivial:
            for other in self.hubs[hub]:
                if other != layout and without_trivial(other, sizes) == without_trivial(layout, sizes):
                    yield (StepKind.PERMUTE, None, None, None), (other, partial), 0, 0  # renames size-1 axes
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
