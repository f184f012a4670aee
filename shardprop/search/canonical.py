"""The leanest of equally cheap assignments, one node at a time: what a solve's answer is made into before it is
returned (``.ilp.solve``).

>>> canonical(problem, solution.strategies)   # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np

from .problem import Problem


def canonical(problem: Problem, strategies: tuple[int, ...]) -> tuple[int, ...]:
    """``strategies`` with each node in turn moved to its leanest strategy (its values' bytes per device; the first of
    equals) that costs no more with its neighbours as chosen and holds no more: the total never grows, no moment's
    usage grows, and where the solver's answer held a value fatter than an equally cheap choice beside it, the
    leaner is taken (a user asks for the cheaper program and, between two as cheap, expects the smaller). A local
    pass, one node at a time, for the nodes the core's solve did not see (eliminated, recovered) and the integer
    program's answers: the relaxation's optima tied only together are ``.ilp``'s ``_leanest_optimum``'s. The
    plan's footprint also holds what moves hold, which the problem's usages leave out. Only nodes with a leaner
    strategy than their own, or one as lean and earlier, can move (``_may_lean``): the others are not visited."""
    chosen = list(strategies)
    if not strategies:
        return ()
    incident: list[list[tuple[int, bool]]] = [[] for _ in range(problem.node_count)]
    own = [np.zeros(len(c)) for c in problem.costs]  # edges within a node: their diagonal
    edges = problem.edges.tolist()
    for e, (u, v) in enumerate(edges):
        if u == v:
            own[u] += np.diag(problem.edge_costs[e])
            continue
        incident[u].append((e, True))
        incident[v].append((e, False))
    for v in _may_lean(problem.usages, chosen):
        total = problem.costs[v] + own[v]
        for e, first in incident[v]:
            u, w = edges[e]
            m = problem.edge_costs[e]
            total = total + (m[:, chosen[w]] if first else m[chosen[u], :])
        now, usage = total[chosen[v]], problem.usages[v]
        fits = np.flatnonzero((total <= now + 1e-9 * max(1.0, abs(now))) & (usage <= usage[chosen[v]]))
        chosen[v] = int(fits[np.argmin(usage[fits])])  # (argmin: the first of the leanest)
    return tuple(chosen)


def _may_lean(usages: tuple[np.ndarray, ...], chosen: list[int]) -> list[int]:
    """The nodes with a strategy leaner than their chosen one, or as lean and earlier (the only nodes ``canonical``
    may move), in order: found at once over every node's usages."""
    sizes = np.array([len(u) for u in usages])
    flat = np.concatenate(usages)
    node = np.repeat(np.arange(len(usages)), sizes)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    index = np.arange(len(flat)) - offsets[node]
    mine = flat[offsets + np.asarray(chosen)][node]
    lean = (flat < mine) | ((flat == mine) & (index < np.asarray(chosen)[node]))
    return np.unique(node[lean]).tolist()
