"""The layout choice as a plain optimization problem: every node picks one of its strategies, every edge costs what
its two endpoints' picks cost together, and the memory live at any moment stays under a limit.

This is the form of the ASPLOS 2025 / EuroSys 2025 contest on intra-operator parallelism (IOPDDL, public instances in
google/iopddl's ``benchmarks/``), which XLA's auto-sharding, Alpa and PyTorch's AutoParallel solve too: a node's
strategies each carry a cost (its work and collectives) and a usage (bytes it keeps live over its interval, half-open
``[start, end)``); an edge's cost matrix, row-major over its endpoints' strategies, is the price of moving a value from
the layout its producer's strategy leaves it in to the layout its user's strategy reads. ``evaluate`` prices a
solution exactly — the oracle every solver is checked against — and ``read_problem`` reads a contest file.

>>> p = Problem.from_lists(intervals=[(0, 2), (1, 3)], costs=[[1, 3], [2, 0]], usages=[[4, 1], [4, 1]],
...                        edges=[(0, 1)], edge_costs=[[0, 5, 5, 0]], usage_limit=None)
>>> evaluate(p, [0, 0]), evaluate(p, [1, 1]), evaluate(p, [0, 1])
(3, 3, 6)
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import OptionError


# The contest's files mark a strategy or a pair of strategies that must not be chosen with a cost of 1e18 (and an
# infinite cost says the same): left in, such coefficients would swamp the solver's tolerances
FORBIDDEN = 1e18
# an assignment within this of a bound (relative to it) is at the bound: the simplex's own tolerance, every solver's
TOLERANCE = 1e-7


@dataclass(frozen=True, eq=False)
class Problem:
    """Nodes with strategies (``costs[v][i]``, ``usages[v][i]``, live over ``intervals[v]``), edges between two nodes
    with a cost per pair of their strategies (``edge_costs[e]``, shape ``(len(costs[u]), len(costs[v]))``), and an
    optional bound on the usage live at any moment."""

    name: str
    intervals: np.ndarray  # (nodes, 2) int64: [start, end)
    costs: tuple[np.ndarray, ...]  # per node, one float64 per strategy
    usages: tuple[np.ndarray, ...]  # per node, one float64 per strategy
    edges: np.ndarray  # (edges, 2) int64: producer and user
    edge_costs: tuple[np.ndarray, ...]  # per edge, (strategies of its first node, strategies of its second)
    usage_limit: float | None

    @staticmethod
    def from_lists(*, intervals, costs, usages, edges, edge_costs, usage_limit, name: str = "problem") -> Problem:
        """A problem from plain lists, each edge's costs flat and row-major (as the contest's files hold them)."""
        costs = tuple(np.asarray(c, np.float64) for c in costs)
        usages = tuple(np.asarray(u, np.float64) for u in usages)
        edges = np.asarray(edges, np.int64).reshape(-1, 2)
        matrices = tuple(np.asarray(m, np.float64).reshape(len(costs[u]), len(costs[v]))
                         for m, (u, v) in zip(edge_costs, edges, strict=True))
        problem = Problem(name, np.asarray(intervals, np.int64).reshape(-1, 2), costs, usages, edges, matrices,
                          None if usage_limit is None else float(usage_limit))
        problem.check()
        return problem

    @property
    def node_count(self) -> int:
        return len(self.costs)

    @property
    def strategy_count(self) -> int:
        return sum(len(c) for c in self.costs)

    def check(self) -> None:
        """Raise ``OptionError`` naming the first node or edge whose arrays disagree."""
        if len(self.intervals) != self.node_count or len(self.usages) != self.node_count:
            raise OptionError(f"problem {self.name!r}: {self.node_count} nodes' costs, {len(self.usages)} usages and "
                              f"{len(self.intervals)} intervals")
        for v, (c, u) in enumerate(zip(self.costs, self.usages, strict=True)):
            if len(c) == 0 or c.shape != u.shape:
                raise OptionError(f"problem {self.name!r}: node {v} has {len(c)} costs and {len(u)} usages")
        if len(self.edges) and (self.edges.min() < 0 or self.edges.max() >= self.node_count):
            raise OptionError(f"problem {self.name!r}: an edge names a node outside 0..{self.node_count - 1}")


def read_problem(path: str | Path) -> Problem:
    """A contest instance (``.json`` or ``.json.gz``: ``{"problem": {"name", "nodes": {"intervals", "costs",
    "usages"}, "edges": {"nodes", "costs"}, "usage_limit"}}``)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt") as f:
            doc = json.load(f)["problem"]
    except (OSError, ValueError, KeyError) as err:
        raise OptionError(f"{path}: not an IOPDDL problem file ({err})") from None
    nodes, edges = doc["nodes"], doc.get("edges", {"nodes": [], "costs": []})
    return Problem.from_lists(intervals=nodes["intervals"], costs=nodes["costs"], usages=nodes["usages"],
                              edges=edges["nodes"], edge_costs=edges["costs"], usage_limit=doc.get("usage_limit"),
                              name=doc.get("name", path.stem))


def usage_profile(problem: Problem, solution) -> np.ndarray:
    """The usage live at each moment ``0 .. max end - 1`` under ``solution`` (a node counts over ``[start, end)``)."""
    return _profile(problem, np.array([u[s] for u, s in zip(problem.usages, solution, strict=True)], np.float64))


def _profile(problem: Problem, used: np.ndarray) -> np.ndarray:
    """The usage live at each moment, node ``v`` holding ``used[v]`` over its interval."""
    moments = int(problem.intervals[:, 1].max(initial=0))
    change = np.zeros(moments + 1)
    np.add.at(change, problem.intervals[:, 0], used)
    np.add.at(change, problem.intervals[:, 1], -used)
    return np.cumsum(change)[:moments]


def peak_usage(problem: Problem, solution) -> float:
    """The most usage live at one moment under ``solution`` (a node counts over ``[start, end)``)."""
    return float(max(0.0, usage_profile(problem, solution).max(initial=0.0)))


def least_peak(problem: Problem) -> float:
    """A floor under every assignment's peak usage: the most live at one moment with each node at its leanest
    strategy. Where it is over the limit, nothing fits (``evaluate`` says None for every assignment)."""
    return float(max(0.0, _profile(problem, np.array([float(u.min()) if len(u) else 0.0 for u in problem.usages]))
                     .max(initial=0.0)))


def evaluate(problem: Problem, solution) -> float | None:
    """The total cost of ``solution`` (one strategy index per node), or None when it is out of range or its peak
    usage is over the limit. Written plainly, apart from any solver: the oracle they are checked against."""
    solution = [int(s) for s in solution]
    if len(solution) != problem.node_count:
        return None
    if any(not 0 <= s < len(c) for s, c in zip(solution, problem.costs, strict=True)):
        return None
    if problem.usage_limit is not None and peak_usage(problem, solution) > problem.usage_limit:
        return None
    total = sum(float(c[s]) for c, s in zip(problem.costs, solution, strict=True))
    total += sum(float(m[solution[u], solution[v]])
                 for m, (u, v) in zip(problem.edge_costs, problem.edges, strict=True))
    return int(total) if float(total).is_integer() else total


def summed_pairs(problem: Problem) -> tuple[list[np.ndarray], dict[tuple[int, int], np.ndarray]]:
    """The node costs with every edge within a node added on its diagonal, and one matrix per pair of nodes
    ``u < v`` (``u``'s strategies by ``v``'s): the edges between them summed, either way round. Fresh arrays."""
    costs = [c.astype(np.float64) for c in problem.costs]
    pairs: dict[tuple[int, int], np.ndarray] = {}
    for (u, v), m in zip(problem.edges.tolist(), problem.edge_costs, strict=True):
        if u == v:
            costs[u] += np.diagonal(m)
            continue
        key, m = ((u, v), m) if u < v else ((v, u), m.T)
        pairs[key] = pairs[key] + m if key in pairs else np.array(m, np.float64)
    return costs, pairs


def classed(u: int, v: int, m: np.ndarray) -> tuple[int, int, np.ndarray, np.ndarray, np.ndarray]:
    """An edge's matrix over classes of strategies: ``u``'s strategies with equal rows are one class, and ``v``'s with
    equal columns — ``(u, v, matrix over the classes, u's class of each strategy, v's class of each strategy)``. Pair
    variables per pair of classes are as exact (a class's variable sums its strategies') and far fewer: a strategy's
    row is set by the type it holds the value in, its column by the type it reads it in."""
    rows, row_of = np.unique(m, axis=0, return_inverse=True)
    classes, col_of = np.unique(rows, axis=1, return_inverse=True)
    return u, v, classes, row_of.ravel(), col_of.ravel()
