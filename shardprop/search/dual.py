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
at least the bound plus its slack. So an assignment found among the strategies of slack within ``gap`` of nothing,
costing ``c``, is the optimum once every strategy left out has a slack above ``c - bound`` (reduced-cost fixing);
where one has not, the strategies within that are solved again: exact either way (``.ilp._solve_by_dual``). On the
benchmark's layout problems the bound meets the optimum and a few strategies in ten are left: the solve over them
takes hundredths of a second where the whole relaxation took seconds.

>>> from shardprop.search.problem import Problem
>>> p = Problem.from_lists(intervals=[(0, 1), (0, 1)], costs=[[1, 3], [2, 0]], usages=[[1, 1], [1, 1]],
...                        edges=[(0, 1)], edge_costs=[[0, 5, 5, 0]], usage_limit=None)
>>> found = dual_bound(p)
>>> found.bound, [s.tolist() for s in found.slack]
(3.0, [[0.0, 0.0], [0.0, 0.0]])
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .problem import FORBIDDEN, Problem

# the most sweeps (forward or backward) the bound climbs for; it stops sooner once a forward-and-backward pair has
# raised it by at most STALL (relative) over the last STALL_PAIRS pairs. A bound short of the optimum costs time (the
# second solve is larger), never the optimum
MAX_SWEEPS = 400
STALL = 1e-6
STALL_PAIRS = 5
# the fewest strategies a core has for the bound to be tried: below, HiGHS's relaxation takes hundredths of a second
# and the passes as long or longer (the MLP step on 8 devices: 0.07 -> 0.23 s), a measured break-even
AT_LEAST = 2000
# a slack within this of the gap (relative to the bound) is kept: the reparametrisation's rounding, far above it
TOLERANCE = 1e-7


@dataclass(frozen=True)
class DualBound:
    """A lower bound on every assignment's cost, and per node, per strategy, what choosing it adds to the bound at
    the least (``np.inf`` for a strategy no assignment can use: one an edge forbids with every strategy of the
    other node)."""

    bound: float
    slack: tuple[np.ndarray, ...]
    sweeps: int

    def within(self, gap: float) -> list[np.ndarray]:
        """Per node, the strategies whose slack is at most ``gap`` (and the rounding tolerance): every assignment
        costing at most ``bound + gap`` uses only these."""
        tolerance = TOLERANCE * max(1.0, abs(self.bound))
        return [np.flatnonzero(s <= gap + tolerance) for s in self.slack]

    def meets(self, cost: float) -> bool:
        """``cost`` is at the bound (within the rounding tolerance)."""
        return cost - self.bound <= TOLERANCE * max(1.0, abs(self.bound))

    def least(self) -> list[np.ndarray]:
        """Per node, its strategies of least slack (with the bound at the optimum: those of no slack)."""
        tolerance = TOLERANCE * max(1.0, abs(self.bound))
        return [np.flatnonzero(s <= s.min() + tolerance) for s in self.slack]


def dual_bound(problem: Problem, *, max_sweeps: int = MAX_SWEEPS, seconds: float | None = None) -> DualBound | None:
    """The message-passing bound on ``problem`` (its usage limit left out) and every strategy's slack; None where
    no assignment avoids a forbidden strategy or pair (a node with every strategy ruled out). ``seconds``: sweep no
    longer than this (a bound short of its best leaves more strategies to the solve, never a wrong one)."""
    usable = _usable(problem)
    if usable is None:
        return None
    start = time.perf_counter()
    terms, edges, plans = _reparametrisation(problem, usable)
    history: list[float] = []
    sweeps = 0
    while sweeps < max_sweeps and (seconds is None or time.perf_counter() - start < seconds):
        for plan in plans:
            _sweep(terms, plan)
        sweeps += 2
        history.append(_bound(terms, edges))
        if len(history) > STALL_PAIRS and history[-1] - history[-1 - STALL_PAIRS] <= STALL * max(1.0, abs(history[-1])):
            break
    bound = _bound(terms, edges)
    slack = []
    for v, (t, (_, views, _, _)) in enumerate(zip(terms, plans[0], strict=True)):  # (forward: in node order)
        within = t[:, 0] - t.min()
        for view in views:
            within = within + (view.min(axis=1) - view.min())
        full = np.full(len(problem.costs[v]), np.inf)
        full[usable[v]] = within
        slack.append(full)
    return DualBound(float(bound), tuple(slack), sweeps)


def _usable(problem: Problem) -> list[np.ndarray] | None:
    """Per node, the strategies some assignment free of forbidden choices may use (arc consistency: a strategy every
    one of whose pairs across an edge is forbidden is dropped, until none is); None where a node has none left. The
    terms are then finite, and no step subtracts one infinity from another."""
    kept = [np.flatnonzero(c < FORBIDDEN) for c in problem.costs]
    edges = [(u, v, m < FORBIDDEN) for (u, v), m in zip(problem.edges.tolist(), problem.edge_costs, strict=True)]
    changed = True
    while changed:
        changed = False
        for u, v, allowed in edges:
            if u == v:
                now = kept[u][np.diagonal(allowed)[kept[u]]]
                changed |= len(now) < len(kept[u])
                kept[u] = now
                continue
            within = allowed[np.ix_(kept[u], kept[v])]
            rows, columns = within.any(axis=1), within.any(axis=0)
            if not rows.all() or not columns.all():
                kept[u], kept[v] = kept[u][rows], kept[v][columns]
                changed = True
        if any(len(k) == 0 for k in kept):
            return None
    return kept


def _reparametrisation(problem: Problem, usable: list[np.ndarray]):
    """The terms the passes work on, among the usable strategies: node terms (an edge within a node on its
    diagonal), one matrix per pair of nodes (parallel edges summed, forbidden pairs infinite), and per direction the
    nodes in order, each with its edges as views whose first axis is its own strategies, those towards later nodes,
    and the share of its total each of those takes (``1 / max(earlier, later)``, TRW-S's weights for the chains of
    a monotone order)."""
    n = problem.node_count
    terms = [problem.costs[v][usable[v]].astype(np.float64) for v in range(n)]
    pairs: dict[tuple[int, int], np.ndarray] = {}
    for (u, v), m in zip(problem.edges.tolist(), problem.edge_costs, strict=True):
        m = np.where(m < FORBIDDEN, m, np.inf)[np.ix_(usable[u], usable[v])]
        if u == v:
            terms[u] = terms[u] + np.diagonal(m)
            continue
        key, m = ((u, v), m) if u < v else ((v, u), m.T)
        pairs[key] = pairs[key] + m if key in pairs else np.array(m, np.float64)
    edges = [pairs[key] for key in sorted(pairs)]
    incident: list[list[tuple[np.ndarray, int]]] = [[] for _ in range(n)]
    for (u, v), m in zip(sorted(pairs), edges, strict=True):
        incident[u].append((m, v))
        incident[v].append((m.T, u))  # a view: what the pass does to it, it does to the matrix
    plans = []
    for order in (range(n), range(n - 1, -1, -1)):
        rank = np.empty(n, np.int64)
        rank[list(order)] = np.arange(n)
        plan = []
        for v in order:
            views = [view for view, _ in incident[v]]
            ahead = [view for view, w in incident[v] if rank[w] > rank[v]]
            share = 1.0 / max(len(ahead), len(views) - len(ahead)) if ahead else 0.0
            plan.append((v, views, ahead, share))
        plans.append(plan)
    return [t.reshape(-1, 1) for t in terms], edges, plans  # (columns: see _sweep)


def _sweep(terms: list[np.ndarray], plan) -> None:
    """One pass over the nodes in ``plan``'s order: collect, then hand the total on to the edges ahead (a node's
    terms are columns, which broadcast over its views' rows as they are)."""
    for v, views, ahead, share in plan:
        t = terms[v]
        for view in views:
            least = view.min(axis=1, keepdims=True)
            view -= least
            t += least
        if ahead:
            part = t * share
            for view in ahead:
                view += part
            t *= 1.0 - len(ahead) * share


def _bound(terms: list[np.ndarray], edges: list[np.ndarray]) -> float:
    return float(sum(t.min() for t in terms) + sum(m.min() for m in edges))

