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
takes hundredths of a second where the whole relaxation took seconds.

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

from .problem import FORBIDDEN, Problem, summed_pairs

# the most sweeps (forward or backward) the bound climbs for, and the most node visits (a node and its edges) all the
# sweeps make together — a deterministic budget, not the clock's (the answer's ties must not depend on a busy machine):
# the Llama step's core takes 150 sweeps of 369 nodes, a stack of 8 blocks' 56 of 786. It stops sooner once a
# forward-and-backward pair has raised the bound by at most STALL (relative) over the last STALL_PAIRS pairs. A bound
# short of the optimum costs time (the restricted solves are larger), never the optimum
MAX_SWEEPS = 400
MAX_VISITS = 1_000_000
STALL = 1e-6
STALL_PAIRS = 5
# the fewest strategies a core has for the bound to be tried: below, HiGHS's relaxation takes hundredths of a second
# and the passes as long or longer (the MLP step on 8 devices: 0.07 -> 0.23 s), a measured break-even
AT_LEAST = 2000
# an assignment within this of the bound (relative to it) is at the bound: the simplex's own tolerance, as ``.alike``'s
TOLERANCE = 1e-7
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
    terms, edges, plans = _reparametrisation(terms, pairs, usable)
    scale = float(sum(np.abs(t).max() for t in terms) + sum(np.abs(m[np.isfinite(m)]).max(initial=0.0) for m in edges))
    most = min(MAX_SWEEPS if max_sweeps is None else max_sweeps, 2 * (MAX_VISITS // (2 * max(1, len(terms)))))
    history: list[float] = []
    sweeps = 0
    while sweeps < most:
        for plan in plans:
            _sweep(terms, plan)
        sweeps += 2
        history.append(_bound(terms, edges))
        if len(history) > STALL_PAIRS and history[-1] - history[-1 - STALL_PAIRS] <= STALL * max(1.0, abs(history[-1])):
            break
    slack = []
    for v, (t, (_, views, _, _)) in enumerate(zip(terms, plans[0], strict=True)):  # (forward: in node order)
        within = t[:, 0] - t.min()
        for view in views:
            within = within + (view.min(axis=1) - view.min())
        full = np.full(len(problem.costs[v]), np.inf)
        full[usable[v]] = within
        slack.append(full)
    return DualBound(_bound(terms, edges), tuple(slack), sweeps, scale)


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
    allowed = [(u, v, np.isfinite(pairs[u, v])) for u, v in sorted(pairs)]
    changed = True
    while changed:
        changed = False
        for u, v, ok in allowed:
            within = ok[np.ix_(kept[u], kept[v])]
            rows, columns = within.any(axis=1), within.any(axis=0)
            if not rows.all() or not columns.all():
                kept[u], kept[v] = kept[u][rows], kept[v][columns]
                changed = True
        if any(len(k) == 0 for k in kept):
            return None
    return kept


def _reparametrisation(terms, pairs, usable: list[np.ndarray]):
    """The terms the passes work on, among the usable strategies: node terms (as columns: see ``_sweep``), one matrix
    per pair of nodes (forbidden pairs infinite), and per direction the nodes in order, each with its edges as views
    whose first axis is its own strategies, those towards later nodes, and the share of its total each of those takes
    (``1 / max(earlier, later)``, TRW-S's weights for the chains of a monotone order)."""
    n = len(terms)
    terms = [t[usable[v]].reshape(-1, 1) for v, t in enumerate(terms)]
    edges = [pairs[u, v][np.ix_(usable[u], usable[v])] for u, v in sorted(pairs)]
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
    return terms, edges, plans


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

