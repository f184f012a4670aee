"""A lower bound on a ``Problem``'s cost without a solver, and what it proves can be left out of the solve.

Without a memory limit a layout problem is a pairwise energy — node costs plus edge costs — and the bound its linear
relaxation gives (the one ``.ilp`` solves with HiGHS) is the optimum of a dual that message passing climbs:
sequential tree-reweighted message passing (Kolmogorov's TRW-S, here in the reparametrisation form of his SRMP).
Each node in turn collects what its edges can give it — every edge's least cost for each of the node's strategies,
moved from the edge onto the node — and hands its total back in equal shares to the edges towards the nodes after it;
forward through the nodes, then backward. Each step leaves every assignment's cost as it was and never lowers the sum
of the terms' least values, which is a lower bound on every assignment's cost: the ``bound``.

Where that bound has stopped rising, a strategy's ``slack`` — its node term above the node's least, plus, for each
edge, its row's least above the edge's least — is what choosing it adds at the least: every assignment using it costs
at least the bound plus its slack. So the cheapest assignment among each node's strategies of least slack, costing
``c``, is the optimum where ``c`` meets the bound; else every cheaper assignment uses only strategies whose slack is at
most ``c - bound``, and those are solved again (reduced-cost fixing): exact either way (``.ilp._solve_by_dual``). On the
benchmark's layout problems the bound meets the optimum and a few strategies in ten are left: the solve over them
takes hundredths of a second where the whole relaxation took seconds. The passes run compiled (numba, ``_climb``).

>>> from shardprop.search.problem import Problem
>>> p = Problem.from_lists(intervals=[(0, 1), (0, 1)], costs=[[1, 3], [2, 0]], usages=[[1, 1], [1, 1]],
...                        edges=[(0, 1)], edge_costs=[[0, 5, 5, 0]], usage_limit=None)
>>> found = dual_bound(p)
>>> found.bound, [s.tolist() for s in found.slack]
(3.0, [[0.0, 0.0], [0.0, 0.0]])
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .kernels import compiled
from .problem import FORBIDDEN, TOLERANCE, Problem, summed_pairs

# the most sweeps (forward or backward) the bound climbs for, and the most node visits (a node and its edges) all the
# sweeps make together — a deterministic budget, not the clock's (the answer's ties must not depend on a busy machine):
# the Llama step's core takes 150 sweeps of 369 nodes, a stack of 8 blocks' 56 of 786. It stops sooner once a
# forward-and-backward pair has raised the bound by at most STALL (relative) over the last STALL_PAIRS pairs. A bound
# short of the optimum costs time (the restricted solves are larger), never the optimum
MAX_SWEEPS = 400
MAX_VISITS = 1_000_000
STALL = 1e-6
STALL_PAIRS = 5
# the fewest strategies a core has for the bound to be tried: below, HiGHS's relaxation takes a few hundredths of a
# second, and a process's first passes load their compiled code (a quarter of a second, once). Above, the passes
# win: the flax step's core of 612 strategies 0.24 -> 0.16 s, the KV decode's of 655 0.18 -> 0.15 s (the MLP's of 297:
# 0.07 -> 0.05 s, not worth the load). A measured break-even
AT_LEAST = 500
# the reparametrisation's rounding, relative to the sum of the terms' largest magnitudes: a strategy within it of a
# threshold is kept (keeping one more costs time, dropping one an optimum uses would cost the optimum)
ROUNDING = 1e-9


@dataclass(frozen=True)
class DualBound:
    """A lower bound on every assignment's cost, and per node, per strategy, what choosing it adds to the bound at
    the least (``np.inf`` for a strategy no assignment can use: one an edge forbids with every strategy of the
    other node)."""

    bound: float
    slack: tuple[np.ndarray, ...]
    sweeps: int
    scale: float  # the terms' largest magnitudes summed: what rounding is relative to

    @property
    def tolerance(self) -> float:
        return max(TOLERANCE * max(1.0, abs(self.bound)), ROUNDING * self.scale)

    def within(self, gap: float) -> list[np.ndarray]:
        """Per node, the strategies whose slack is at most ``gap`` (and the tolerance): every assignment costing at
        most ``bound + gap`` uses only these."""
        return [np.flatnonzero(s <= gap + self.tolerance) for s in self.slack]

    def meets(self, cost: float) -> bool:
        """``cost`` is at the bound (within the tolerance)."""
        return cost - self.bound <= self.tolerance

    def least(self) -> list[np.ndarray]:
        """Per node, its strategies of least slack (and within the tolerance of it): where an assignment among them
        meets the bound, they hold every optimum."""
        return [np.flatnonzero(s <= s.min() + self.tolerance) for s in self.slack]


def dual_bound(problem: Problem, *, max_sweeps: int | None = None) -> DualBound | None:
    """The message-passing bound on ``problem`` (its usage limit left out) and every strategy's slack; None where
    no assignment avoids a forbidden strategy or pair (a node with every strategy ruled out). ``max_sweeps``: at most
    this many passes (default ``MAX_SWEEPS``, and ``MAX_VISITS`` node visits in all)."""
    terms, pairs = _merged(problem)
    usable = _usable(terms, pairs)
    if usable is None:
        return None
    flat = _Flat.of(terms, pairs, usable)
    scale = float(sum(np.abs(t).max() for t in flat.terms()) + sum(
        np.abs(m[np.isfinite(m)]).max(initial=0.0) for m in flat.matrices()))
    most = min(MAX_SWEEPS if max_sweeps is None else max_sweeps, 2 * (MAX_VISITS // (2 * max(1, len(terms)))))
    sweeps = compiled(_climb)(flat.t, flat.t_at, flat.e, flat.e_at, flat.columns, flat.incident_at,
                              flat.incident_edge, flat.incident_rows, flat.incident_other, flat.shares, most, STALL,
                              STALL_PAIRS)
    terms, matrices = flat.terms(), flat.matrices()
    slack = [t - t.min() for t in terms]
    for (u, v), m in zip(flat.pairs, matrices, strict=True):
        least = m.min()
        slack[u] = slack[u] + (m.min(axis=1) - least)
        slack[v] = slack[v] + (m.min(axis=0) - least)
    full = []
    for v, within in enumerate(slack):
        kept = np.full(len(problem.costs[v]), np.inf)
        kept[usable[v]] = within
        full.append(kept)
    return DualBound(float(sum(t.min() for t in terms) + sum(m.min() for m in matrices)), tuple(full), int(sweeps),
                     scale)


def _merged(problem: Problem) -> tuple[list[np.ndarray], dict[tuple[int, int], np.ndarray]]:
    """Node terms and one matrix per pair of nodes (``problem.summed_pairs``), forbidden entries infinite."""
    costs, pairs = summed_pairs(problem)
    return ([np.where(c < FORBIDDEN, c, np.inf) for c in costs],
            {key: np.where(m < FORBIDDEN, m, np.inf) for key, m in pairs.items()})


def _usable(terms: list[np.ndarray], pairs: dict[tuple[int, int], np.ndarray]) -> list[np.ndarray] | None:
    """Per node, the strategies some assignment free of forbidden choices may use (arc consistency on the summed
    matrices: a strategy every one of whose pairs with another node is forbidden is dropped, until none is); None
    where a node has none left. The terms are then finite, and no step subtracts one infinity from another."""
    kept = [np.flatnonzero(np.isfinite(t)) for t in terms]
    # the pairs forbidding some choice (the others take nothing away)
    allowed = [(u, v, ok) for u, v in sorted(pairs) if not (ok := np.isfinite(pairs[u, v])).all()]
    changed = True
    while changed:
        changed = False
        for u, v, ok in allowed:
            within = ok.take(kept[u], 0).take(kept[v], 1)
            rows, columns = within.any(axis=1), within.any(axis=0)
            if not rows.all() or not columns.all():
                kept[u], kept[v] = kept[u][rows], kept[v][columns]
                changed = True
        if any(len(k) == 0 for k in kept):
            return None
    return kept


@dataclass(frozen=True)
class _Flat:
    """The terms the passes work on, among the usable strategies, in flat arrays (compiled code walks them): node
    ``v``'s terms ``t[t_at[v]:t_at[v + 1]]``; pair ``k``'s matrix (rows: its first node's strategies)
    ``e[e_at[k]:e_at[k + 1]]`` row by row, ``columns[k]`` wide; node ``v``'s pairs ``incident_edge[incident_at[v]:
    incident_at[v + 1]]``, whether its strategies are their rows, and the node at their other end; ``shares[d, v]``,
    what each of its pairs towards later nodes takes of its total in direction ``d`` (0: by index, 1: the reverse):
    ``1 / max(earlier, later)``, TRW-S's weights for the chains of a monotone order."""

    t: np.ndarray
    t_at: np.ndarray
    e: np.ndarray
    e_at: np.ndarray
    columns: np.ndarray
    incident_at: np.ndarray
    incident_edge: np.ndarray
    incident_rows: np.ndarray
    incident_other: np.ndarray
    shares: np.ndarray
    pairs: tuple[tuple[int, int], ...]

    @staticmethod
    def of(terms, pairs, usable) -> _Flat:
        n = len(terms)
        terms = [t[k] for t, k in zip(terms, usable, strict=True)]
        keys = tuple(sorted(pairs))
        matrices = [pairs[u, v].take(usable[u], 0).take(usable[v], 1) for u, v in keys]
        incident: list[list[tuple[int, bool, int]]] = [[] for _ in range(n)]
        for k, (u, v) in enumerate(keys):
            incident[u].append((k, True, v))
            incident[v].append((k, False, u))
        shares = np.zeros((2, n))
        for v, around in enumerate(incident):
            later = sum(w > v for _, _, w in around)
            for d, ahead in enumerate((later, len(around) - later)):
                shares[d, v] = 1.0 / max(ahead, len(around) - ahead) if ahead else 0.0
        flat = [entry for around in incident for entry in around]
        return _Flat(np.concatenate(terms or [np.zeros(0)]).astype(np.float64), _offsets(len(t) for t in terms),
                     np.concatenate([m.ravel() for m in matrices] or [np.zeros(0)]).astype(np.float64),
                     _offsets(m.size for m in matrices), np.array([m.shape[1] for m in matrices], np.int64),
                     _offsets(len(around) for around in incident), np.array([k for k, _, _ in flat], np.int64),
                     np.array([rows for _, rows, _ in flat], np.bool_), np.array([w for _, _, w in flat], np.int64),
                     shares, keys)

    def terms(self) -> list[np.ndarray]:
        return [self.t[a:b] for a, b in zip(self.t_at, self.t_at[1:], strict=False)]

    def matrices(self) -> list[np.ndarray]:
        return [self.e[a:b].reshape(-1, c) for a, b, c in zip(self.e_at, self.e_at[1:], self.columns, strict=False)]


def _offsets(sizes) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(list(sizes), dtype=np.int64)]).astype(np.int64)


def _climb(t, t_at, e, e_at, columns, incident_at, incident_edge, incident_rows, incident_other, shares, most,
           stall, stall_pairs):
    """Forward and backward passes over the nodes (``_Flat``) until the bound stalls or ``most`` passes: each node in
    turn takes from each of its pairs the least of each of its strategies' rows (onto its terms), then hands its total
    on to its pairs towards later nodes in their shares. Returns the passes made; ``t`` and ``e`` are changed in
    place (every assignment's cost kept)."""
    n = len(t_at) - 1
    history = np.empty(most // 2 + 2)
    pairs = 0
    while 2 * pairs < most:
        for d in range(2):
            for step in range(n):
                v = step if d == 0 else n - 1 - step
                first, size = t_at[v], t_at[v + 1] - t_at[v]
                for k in range(incident_at[v], incident_at[v + 1]):
                    edge = incident_edge[k]
                    base, width = e_at[edge], columns[edge]
                    # the node's strategies are the rows (stride: the width) or the columns (stride 1 between them)
                    along, across = (width, 1) if incident_rows[k] else (1, width)
                    count = width if incident_rows[k] else (e_at[edge + 1] - base) // width
                    for a in range(size):
                        start = base + a * along
                        least = np.inf
                        for b in range(count):
                            least = min(least, e[start + b * across])
                        for b in range(count):
                            e[start + b * across] -= least
                        t[first + a] += least
                share = shares[d, v]
                if share > 0.0:
                    ahead = 0
                    for k in range(incident_at[v], incident_at[v + 1]):
                        if (incident_other[k] > v) == (d == 0):
                            ahead += 1
                            edge = incident_edge[k]
                            base, width = e_at[edge], columns[edge]
                            along, across = (width, 1) if incident_rows[k] else (1, width)
                            count = width if incident_rows[k] else (e_at[edge + 1] - base) // width
                            for a in range(size):
                                start, part = base + a * along, t[first + a] * share
                                for b in range(count):
                                    e[start + b * across] += part
                    for a in range(size):
                        t[first + a] *= 1.0 - ahead * share
        nodes, edges = 0.0, 0.0  # (summed as dual_bound sums them)
        for v in range(n):
            nodes += t[t_at[v]:t_at[v + 1]].min()
        for edge in range(len(e_at) - 1):
            edges += e[e_at[edge]:e_at[edge + 1]].min()
        bound = nodes + edges
        history[pairs] = bound
        pairs += 1
        if pairs > stall_pairs and bound - history[pairs - 1 - stall_pairs] <= stall * max(1.0, abs(bound)):
            break
    return 2 * pairs
