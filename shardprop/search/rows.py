"""The integer program's rows, built by numpy (not a modelling loop): one strategy a node, the pair variables of an
edge tied to its two nodes' choices over classes of strategies, and the usage at every moment kept as a running total
within the limit (the formulation ``.ilp`` describes and solves).
"""

from __future__ import annotations

import numpy as np
from scipy import sparse

from .problem import Problem, classed, summed_pairs


def folded(problem: Problem) -> tuple[list[np.ndarray], list[tuple]]:
    """The node costs with every edge into a one-strategy node (or within one node) added to them, and the remaining
    edges' matrices, those between the same two nodes summed and those all zero dropped, over classes of strategies
    (``problem.classed``)."""
    costs, pairs = summed_pairs(problem)
    merged = []
    for (u, v), m in pairs.items():
        if not m.any():
            continue
        if len(costs[u]) == 1:
            costs[v] += m[0]
        elif len(costs[v]) == 1:
            costs[u] += m[:, 0]
        else:
            merged.append(classed(u, v, m))
    return costs, merged


def one_hot_rows(problem: Problem, offsets: np.ndarray, n: int):
    """``sum_i x[v, i] = 1`` for every node."""
    counts = np.diff(offsets)
    rows = np.repeat(np.arange(problem.node_count), counts)
    a = sparse.csr_array((np.ones(len(rows)), (rows, np.arange(offsets[-1]))), shape=(problem.node_count, n))
    return a, np.ones(problem.node_count), np.ones(problem.node_count)


def pair_rows(pairs, offsets: np.ndarray, pair_offsets: np.ndarray, n: int):
    """Per edge ``(u, v)`` over classes of strategies (``problem.classed``): for each class ``r`` of ``u``'s,
    ``sum_c y[r, c] - sum_{i in r} x[u, i] = 0``, and for each class ``c`` of ``v``'s,
    ``sum_r y[r, c] - sum_{j in c} x[v, j] = 0``."""
    rows, cols, vals, row = [], [], [], 0
    for e, (u, v, m, row_of, col_of) in enumerate(pairs):
        ku, kv = m.shape
        ys = pair_offsets[e] + np.arange(ku * kv).reshape(ku, kv)
        rows += [row + np.repeat(np.arange(ku), kv), row + row_of,
                 row + ku + np.tile(np.arange(kv), ku), row + ku + col_of]
        cols += [ys.ravel(), offsets[u] + np.arange(len(row_of)), ys.ravel(), offsets[v] + np.arange(len(col_of))]
        vals += [np.ones(ku * kv), -np.ones(len(row_of)), np.ones(ku * kv), -np.ones(len(col_of))]
        row += ku + kv
    if not rows:
        return sparse.csr_array((0, n)), np.zeros(0), np.zeros(0)
    a = sparse.csr_array((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(row, n))
    return a, np.zeros(row), np.zeros(row)


def memory_rows(problem: Problem, offsets: np.ndarray, n: int):
    """The usage live at every moment at most the limit, kept as a running total: a variable per moment something
    starts or ends, each the one before plus the usage of the nodes starting then less that of the nodes ending,
    bounded by the limit (usages in units of the limit: the coefficients stay near 1). Twice as many coefficients as
    the nodes' strategies, where a row per moment over every live node's strategies grows with how long values live
    (a contest instance of 28,526 nodes: 323 million). ``(rows over the n variables and k totals, lower, upper, k,
    the totals' bound)``, or None without a limit or where no assignment can break it."""
    if problem.usage_limit is None:
        return None
    starts, ends = problem.intervals[:, 0], problem.intervals[:, 1]
    live = np.flatnonzero((ends > starts) & np.array([bool(u.any()) for u in problem.usages], bool))
    if not len(live):
        return None
    events = np.unique(np.concatenate([starts[live], ends[live]]))
    begin, end = np.searchsorted(events, starts[live]), np.searchsorted(events, ends[live])
    largest = np.array([problem.usages[v].max() for v in live])
    worst = np.zeros(len(events))  # every live node at its largest usage: more than any assignment holds
    np.add.at(worst, begin, largest)
    np.add.at(worst, end, -largest)
    if np.cumsum(worst).max() <= problem.usage_limit:
        return None
    k = len(events)
    scale = 1.0 / problem.usage_limit if problem.usage_limit > 0 else 1.0
    rows, cols, vals = [np.arange(k), np.arange(1, k)], [n + np.arange(k), n + np.arange(k - 1)], [np.ones(k),
                                                                                                    -np.ones(k - 1)]
    for v, b, e in zip(live, begin, end, strict=True):  # total[b] takes the node's usage on, total[e] off
        used = np.flatnonzero(problem.usages[v])
        for at, sign in ((b, -scale), (e, scale)):
            rows.append(np.full(len(used), at))
            cols.append(offsets[v] + used)
            vals.append(sign * problem.usages[v][used])
    a = sparse.csr_array((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(k, n + k))
    return a, np.zeros(k), np.zeros(k), k, problem.usage_limit * scale
