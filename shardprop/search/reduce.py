"""Shrinking a ``Problem`` without losing its optimum: a node's strategy another of its strategies dominates — no
dearer, whatever its neighbours choose, and holding no more — is dropped (of equals, the first is kept). Dropping one
may let a neighbour's strategies dominate each other: repeated until nothing changes.

>>> shrunk = shrink(problem)                            # doctest: +SKIP
>>> shrunk.recover(solve(shrunk.problem).strategies)   # in the original's indices  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .kernels import compiled
from .problem import FORBIDDEN, Problem


@dataclass(frozen=True)
class Reduced:
    """``problem`` with only the strategies ``kept[v]`` (indices into the original node ``v``'s) left."""

    problem: Problem
    kept: tuple[np.ndarray, ...]

    def expand(self, solution) -> tuple[int, ...]:
        """A solution of the reduced problem as one of the original (the same strategies, their original indices)."""
        return tuple(int(k[s]) for k, s in zip(self.kept, solution, strict=True))


def prune(problem: Problem, *, max_rounds: int = 20) -> Reduced:
    """``problem`` without its dominated strategies (exact: some optimum of the original survives). Compiled
    (``_dominated``) on problems of at least ``COMPILED_AT_LEAST`` strategies."""
    undominated = _undominated if problem.strategy_count < COMPILED_AT_LEAST else _undominated_compiled
    kept = [np.arange(len(c)) for c in problem.costs]
    incident: list[list[tuple[int, bool]]] = [[] for _ in range(problem.node_count)]
    for e, (u, v) in enumerate(problem.edges.tolist()):
        incident[u].append((e, True))
        incident[v].append((e, False))
    dirty = set(range(problem.node_count))
    answers: dict[tuple, np.ndarray] = {}  # context -> survivors: the layers of a model are pruned alike
    for _ in range(max_rounds):
        if not dirty:
            break
        changed = set()
        for v in sorted(dirty):
            if len(kept[v]) < 2:
                continue
            cost, usage, blocks = _context(problem, kept, incident, v)
            key = (cost.tobytes(), None if usage is None else usage.tobytes(),
                   tuple((b.shape, b.tobytes()) for b in blocks))
            if key not in answers:
                answers[key] = undominated(cost, usage, blocks)
            survivors = answers[key]
            if len(survivors) < len(kept[v]):
                kept[v] = kept[v][survivors]
                changed.add(v)
        dirty = {w for v in changed for e, first in incident[v] for w in problem.edges[e] if w != v}
    return Reduced(restrict(problem, kept), tuple(kept))


def _context(problem: Problem, kept, incident, v: int):
    """``v``'s kept strategies' costs (an edge within ``v`` on its diagonal), their usages (where a limit makes them
    matter, else None), and per edge to another node their prices with its kept strategies (one row each)."""
    rows = kept[v]
    cost = problem.costs[v][rows].copy()
    blocks = []
    for e, first in incident[v]:
        u, w = problem.edges[e]
        matrix = problem.edge_costs[e]
        if u == w:
            if first:
                cost += np.diag(matrix)[rows]
        elif first:
            blocks.append(matrix.take(rows, 0).take(kept[w], 1))
        else:
            blocks.append(matrix.take(kept[u], 0).take(rows, 1).T)
    return cost, problem.usages[v][rows] if problem.usage_limit is not None else None, blocks


# the fewest strategies a problem has for its pruning to run compiled: numba's load (once per process, a few tenths of
# a second) is repaid there, and the bound's passes load it anyway on such problems' cores (every bench row of 2,000 or
# more). A transformer block on 4x2 (4,880 strategies): 182 comparisons in 30 ms of numpy, 3.5 ms compiled
COMPILED_AT_LEAST = 2000
# the most elements one step of ``_undominated`` compares at once (its pairs of strategies by a neighbour's)
_CHUNK_ELEMENTS = 1 << 22


def _undominated(cost: np.ndarray, usage: np.ndarray | None, blocks: list[np.ndarray]) -> np.ndarray:
    """The strategies no other is at least as good as — strictly somewhere, or as good everywhere and earlier.
    Strategy ``t`` is at least as good as ``s`` where, whatever the neighbours choose, it costs no more and holds no
    more: ``cost[s] - cost[t] + sum over edges of min over the neighbour's strategies w of (block[s, w] - block[t,
    w]) >= 0`` (Goldstein's dead-end elimination: the neighbours choose independently, so the worst case is the sum
    of each edge's; two edges to one neighbour make it only more cautious). It sees past a strategy dearer on one edge
    and cheaper on another, which comparing price by price cannot."""
    n = len(cost)
    margin = cost[:, None] - cost[None, :]  # margin[s, t]: how much more s costs than t, whatever the neighbours do
    for block in blocks:
        step = max(1, _CHUNK_ELEMENTS // max(1, n * block.shape[1]))
        for lo in range(0, n, step):
            margin[lo:lo + step] += (block[lo:lo + step, None, :] - block[None, :, :]).min(axis=2)
    covered = margin >= 0  # covered[s, t]: t is at least as good as s
    if usage is not None:
        covered &= usage[None, :] <= usage[:, None]
    equal = covered & covered.T
    strictly = covered & ~equal
    later = np.tril(np.ones((n, n), bool), -1)  # later[s, t]: t comes before s
    dominated = (strictly | (equal & later)).any(axis=1)
    return np.flatnonzero(~dominated)


def _undominated_compiled(cost: np.ndarray, usage: np.ndarray | None, blocks: list[np.ndarray]) -> np.ndarray:
    """``_undominated``, compiled (``_dominated``): the same strategies, the margins summed in the same order. Prices
    that are not finite (a contest file's infinities) are compared by numpy: its least of a NaN difference is NaN,
    the compiled ``min``'s the other operand."""
    flat = np.concatenate([b.ravel() for b in blocks]) if blocks else np.zeros(0)
    if not (np.isfinite(flat).all() and np.isfinite(cost).all()):
        return _undominated(cost, usage, blocks)
    widths = np.array([b.shape[1] for b in blocks], np.int64)
    dominated = compiled(_dominated)(cost.astype(np.float64), np.zeros(0) if usage is None else usage.astype(
        np.float64), usage is not None, flat.astype(np.float64), widths)
    return np.flatnonzero(~dominated)


def _dominated(cost, usage, has_usage, flat, widths):
    """Which strategies another covers strictly, or as well and earlier (``_undominated``); the blocks ``flat``,
    row-major one after another, ``widths`` wide. A pair's margin is summed only where an upper bound on it — each
    block's difference at the column where the covered strategy is least, or where the covering one is most, the
    lesser — is not below zero: floating-point sums are monotone in their terms, so that bound, summed in the same
    order as the margin, is no less than the margin as computed, and a pair it rules out is one the margin would."""
    n, count = len(cost), len(widths)
    starts = np.zeros(count + 1, np.int64)
    for k in range(count):
        starts[k + 1] = starts[k] + n * widths[k]
    low, high = np.zeros((count, n), np.int64), np.zeros((count, n), np.int64)
    for k in range(count):
        for s in range(n):
            row = starts[k] + s * widths[k]
            for w in range(1, widths[k]):
                if flat[row + w] < flat[row + low[k, s]]:
                    low[k, s] = w
                if flat[row + w] > flat[row + high[k, s]]:
                    high[k, s] = w
    dominated = np.zeros(n, np.bool_)
    for s in range(n):
        for t in range(n):
            if t == s or (has_usage and usage[t] > usage[s]):
                continue
            covers = False
            for back in range(2):  # t covers s; then, unless t is earlier or holds more, whether s covers t too
                a, b = (t, s) if back else (s, t)
                if back and (t < s or (has_usage and usage[s] > usage[t])):
                    break
                upper = cost[a] - cost[b]
                for k in range(count):
                    m, base, lo, hi = widths[k], starts[k], low[k, a], high[k, b]
                    upper += min(flat[base + a * m + lo] - flat[base + b * m + lo],
                                 flat[base + a * m + hi] - flat[base + b * m + hi])
                at_least = upper >= 0
                if at_least:
                    margin = cost[a] - cost[b]
                    for k in range(count):
                        m, base = widths[k], starts[k]
                        least = np.inf
                        for w in range(m):
                            least = min(least, flat[base + a * m + w] - flat[base + b * m + w])
                        margin += least
                    at_least = margin >= 0
                if not back:
                    covers = at_least
                    if not covers:
                        break
                elif at_least:
                    covers = False  # as good both ways, and s comes first: s stays
            if covers:
                dominated[s] = True
                break
    return dominated


def restrict(problem: Problem, kept) -> Problem:
    """``problem`` with node ``v``'s strategies ``kept[v]`` only (indices into its own)."""
    return Problem(problem.name, problem.intervals, tuple(c[k] for c, k in zip(problem.costs, kept, strict=True)),
                   tuple(u[k] for u, k in zip(problem.usages, kept, strict=True)), problem.edges,
                   tuple(m.take(kept[u], 0).take(kept[v], 1)
                         for m, (u, v) in zip(problem.edge_costs, problem.edges.tolist(), strict=True)),
                   problem.usage_limit)


@dataclass(frozen=True)
class Eliminated:
    """``problem`` with the nodes of at most two neighbours eliminated (series reduction): ``remaining[k]`` is the
    original node of reduced node ``k``; ``recover`` gives every original node's strategy from the reduced solution."""

    problem: Problem
    remaining: tuple[int, ...]
    offset: float = 0.0  # the cost of the nodes eliminated alone (no neighbour left): the reduced costs plus it
    _steps: tuple = ()  # (node, neighbours, table of its best strategy per neighbours' strategies), in order
    _node_count: int = 0

    def recover(self, solution) -> tuple[int, ...]:
        """A solution of the original problem, as cheap as ``solution`` is for the reduced one."""
        chosen = [-1] * self._node_count
        for k, s in zip(self.remaining, solution, strict=True):
            chosen[k] = int(s)
        for v, neighbours, table in reversed(self._steps):
            chosen[v] = int(table[tuple(chosen[w] for w in neighbours)])
        return tuple(chosen)


def eliminate(problem: Problem) -> Eliminated:
    """``problem`` with every node of one strategy folded into its neighbours, and every node with at most two
    neighbours eliminated: its best strategy for each choice of theirs priced onto them (a leaf onto its neighbour's
    costs, a link of a chain onto an edge between its two neighbours) — exact, and what is left is the graph's core.
    Under a usage limit only nodes whose usage is the same for every strategy are eliminated (their usage stays, as a
    node of one strategy)."""
    n = problem.node_count
    costs = [c.astype(np.float64).copy() for c in problem.costs]
    adj: list[dict[int, np.ndarray]] = [{} for _ in range(n)]
    for (u, v), m in zip(problem.edges.tolist(), problem.edge_costs, strict=True):
        if u == v:
            costs[u] += np.diag(m)
        else:
            _add_edge(adj, u, v, m)
    limited = problem.usage_limit is not None
    eligible = [not limited or np.ptp(u) == 0 for u in problem.usages]
    alive = [True] * n
    steps = []
    offset = 0.0
    queue = [v for v in range(n) if eligible[v]]
    while queue:
        v = queue.pop()
        if not alive[v] or not eligible[v]:
            continue
        neighbours = sorted(adj[v])
        if len(costs[v]) > 1 and len(neighbours) > 2:
            continue
        if len(neighbours) == 0:
            table = np.array(int(np.argmin(costs[v])))
            offset += float(costs[v][table])
        elif len(neighbours) == 1:
            (u,) = neighbours
            total = adj[u][v] + costs[v][None, :]  # (u's strategies, v's)
            table = np.argmin(total, axis=1)
            costs[u] += np.minimum(total.min(axis=1), FORBIDDEN)
        elif len(neighbours) == 2:
            u, w = neighbours
            total = adj[u][v][:, :, None] + costs[v][None, :, None] + adj[v][w][None, :, :]  # (u, v, w)
            table = np.argmin(total, axis=1)
            _add_edge(adj, u, w, np.minimum(total.min(axis=1), FORBIDDEN))
        else:  # one strategy, many neighbours: its column of each edge onto each of them
            table = np.array(0)
            offset += float(costs[v][0])
            for u in neighbours:
                costs[u] += adj[u][v][:, 0]
        for u in neighbours:
            del adj[u][v]
            queue.append(u)
        adj[v] = {}
        alive[v] = False
        steps.append((v, tuple(neighbours) if len(costs[v]) > 1 or len(neighbours) <= 2 else (), table))
    remaining = [v for v in range(n) if alive[v] or limited]
    index = {v: k for k, v in enumerate(remaining)}
    edges, matrices = [], []
    for u in remaining:
        for w, m in adj[u].items():
            if u < w:
                edges.append((index[u], index[w]))
                matrices.append(m)
    reduced = Problem(problem.name, problem.intervals[remaining],
                      tuple(costs[v] if alive[v] else np.zeros(1) for v in remaining),
                      tuple(problem.usages[v] if alive[v] else problem.usages[v][:1] for v in remaining),
                      np.asarray(edges, np.int64).reshape(-1, 2), tuple(matrices), problem.usage_limit)
    # (under a limit an eliminated node stays as a placeholder of one strategy, for its usage; recover overrides it)
    return Eliminated(reduced, tuple(remaining), offset, tuple(steps), n)


def _add_edge(adj, u: int, v: int, m: np.ndarray) -> None:
    """Add ``m`` (``u``'s strategies by ``v``'s) to the edge between ``u`` and ``v``."""
    if v in adj[u]:
        m = np.minimum(adj[u][v] + m, FORBIDDEN)
    adj[u][v] = m
    adj[v][u] = m.T


# the most rounds of elimination and pruning ``shrink`` runs (each lets the other find more; two or three suffice)
SHRINK_ROUNDS = 8


@dataclass(frozen=True)
class Shrunk:
    """``problem`` after rounds of ``eliminate`` and ``prune`` until neither finds more: ``problem`` is the core left,
    ``offset`` the cost of the nodes eliminated alone, ``recover`` a solution of the core as one of the original,
    as cheap."""

    problem: Problem
    steps: tuple[tuple[Eliminated, Reduced], ...]

    @property
    def offset(self) -> float:
        return sum(eliminated.offset for eliminated, _ in self.steps)

    def recover(self, solution) -> tuple[int, ...]:
        for eliminated, pruned in reversed(self.steps):
            solution = eliminated.recover(pruned.expand(solution))
        return tuple(solution)


def shrink(problem: Problem) -> Shrunk:
    """``problem`` shrunk exactly: nodes of at most two neighbours eliminated, dominated strategies pruned, again while
    pruning leaves nodes of one strategy, or links of chains, to eliminate (``Shrunk``)."""
    steps = []
    current = problem
    for _ in range(SHRINK_ROUNDS):
        eliminated = eliminate(current)
        if steps and (eliminated.problem.strategy_count, len(eliminated.problem.edges)) == (
                current.strategy_count, len(current.edges)):
            break  # nothing left to eliminate: the last prune found all it can
        pruned = prune(eliminated.problem)
        steps.append((eliminated, pruned))
        current = pruned.problem
    return Shrunk(current, tuple(steps))
