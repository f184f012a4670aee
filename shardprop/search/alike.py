"""Layers alike solved once: a ``Problem`` whose nodes repeat (the blocks of a stack, forward and backward) bounded
by one small linear program over its classes of alike nodes, and solved on the strategies that program uses.

Alike nodes (``alike_classes``) have the same costs and usages and, two rounds of colour refinement deep, the same
edges to alike neighbours. The aggregated program (``aggregated_lp``) has, per class ``C`` and strategy ``i``, a
variable ``s[C, i]``: how many of ``C``'s nodes pick ``i`` (their sum ``|C|``); per class ``E`` of alike edges (the
same matrix between the same two classes) and pair of strategy classes ``(r, c)``, ``Y[E, r, c]``: how many of
``E``'s edges pair them. Its rows are the sums of the integer program's rows over each class: ``E``'s row sums
``sum_c Y[E, r, c]`` equal ``sum_u deg_E(u) x[u, r]``, which is ``d * s[C, r]`` where every node of ``C`` has ``d``
edges of ``E`` — and the few nodes that have another number (a stack's first and last block) keep their own
one-hot ``x[u, :]`` beside the class's sum. Every assignment of the problem maps onto a point of this program at
the same cost, so its optimum is a **lower bound** on the problem's: a bound proved from a program the size of a
few blocks, whatever the number of blocks.

The assignment comes from the strategies the aggregated optimum uses (``AggregatedLP.kept``): the problem restricted to
them is mostly nodes of one strategy, which ``reduce.eliminate`` folds away, and its optimum costs at least the bound.
Where it costs no more, it is the problem's optimum, proved; where it costs more, every cheaper assignment uses only
strategies whose reduced cost is within the difference (``AggregatedLP.within``), and the problem restricted to those
is solved too (``ilp._solve_through``). On a stack of 24 transformer blocks' training step (2,386 nodes left after
elimination, 1.7 M columns) the aggregated program has 166 K columns and the two solves prove the same optimum.

>>> classes = alike_classes(problem)          # doctest: +SKIP
>>> lp = aggregated_lp(problem, classes)      # doctest: +SKIP
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

import numpy as np
from scipy import sparse

from .problem import FORBIDDEN, Problem, classed

# colour refinement's rounds: one round leaves the bound below the optimum on stacked blocks (nodes alike by their
# own costs but not by their neighbours'), two met it on every stack measured; more only split the blocks by their
# distance from the ends, which the exceptions already take
REFINEMENT_ROUNDS = 2


def alike_classes(problem: Problem, rounds: int = REFINEMENT_ROUNDS) -> np.ndarray:
    """One class index per node (numbered in order of first appearance): nodes with equal costs and usages, and
    after ``rounds`` rounds of colour refinement over the edges (labelled by their matrices) equal neighbourhoods."""
    colours = _numbered([(c.tobytes(), u.tobytes(), len(c)) for c, u in zip(problem.costs, problem.usages,
                                                                             strict=True)])
    labels: dict[tuple, int] = {}
    around: list[list[tuple[int, int]]] = [[] for _ in range(problem.node_count)]
    for (u, v), m in zip(problem.edges.tolist(), problem.edge_costs, strict=True):
        label = labels.setdefault((m.shape, m.tobytes()), len(labels))
        around[u].append((label, v))
        around[v].append((-1 - label, u))  # the edge seen from its second node: its matrix transposed
    for _ in range(rounds):
        refined = _numbered([(colours[v], tuple(sorted((label, colours[w]) for label, w in around[v])))
                             for v in range(problem.node_count)])
        if refined.max(initial=-1) == colours.max(initial=-1):  # stable: no class split
            break
        colours = refined
    return colours


def _numbered(keys: list) -> np.ndarray:
    index: dict = {}
    return np.array([index.setdefault(k, len(index)) for k in keys], np.int64)


@dataclass(frozen=True)
class AggregatedLP:
    """The aggregated program as ``ilp._highs`` takes it (``objective``, ``blocks``, ``upper``), where each class's
    count variables start (``class_offsets``: class ``C``'s strategy ``i`` is column ``class_offsets[C] + i``) and
    where the nodes kept apart (their number of some class of edges not their class's) have their own one-hot
    variables (``apart``: node -> first column)."""

    objective: np.ndarray
    blocks: list
    upper: np.ndarray
    classes: np.ndarray
    class_offsets: np.ndarray
    apart: dict[int, int]

    def kept(self, x: np.ndarray, tolerance: float = 1e-7) -> tuple[np.ndarray, ...]:
        """Per node, the strategies ``x`` uses for it: its class's, and a node kept apart its own too."""
        used = [np.flatnonzero(x[a:b] > tolerance) for a, b in zip(self.class_offsets[:-1], self.class_offsets[1:],
                                                                   strict=True)]
        kept = [used[k] for k in self.classes]
        for v, start in self.apart.items():
            own = np.flatnonzero(x[start:start + self.class_offsets[self.classes[v] + 1]
                                   - self.class_offsets[self.classes[v]]] > tolerance)
            kept[v] = np.union1d(kept[v], own)
        return tuple(kept)

    def within(self, reduced: np.ndarray, gap: float) -> tuple[np.ndarray, ...]:
        """Per node, the strategies whose count (and, for a node kept apart, own variable) has a reduced cost of at
        most ``gap`` in the program's optimum: an assignment picking another costs more than the bound plus ``gap``."""
        allowed = (reduced <= gap) & (self.upper > 0)
        kept = [np.flatnonzero(allowed[a:b]) for a, b in zip(self.class_offsets[:-1], self.class_offsets[1:],
                                                             strict=True)]
        kept = [kept[k] for k in self.classes]
        for v, start in self.apart.items():
            count = self.class_offsets[self.classes[v] + 1] - self.class_offsets[self.classes[v]]
            kept[v] = np.intersect1d(kept[v], np.flatnonzero(allowed[start:start + count]))
        return tuple(kept)


def aggregated_lp(problem: Problem, classes: np.ndarray) -> AggregatedLP:
    """The problem's integer program summed over ``classes`` (the module's docstring): its optimum is a lower bound on
    the problem's. Usage limits are left out (a bound without them is a bound with them)."""
    count = int(classes.max()) + 1
    size = np.bincount(classes, minlength=count)
    first = np.full(count, -1)
    for v in range(problem.node_count - 1, -1, -1):
        first[classes[v]] = v
    strategies = np.array([len(problem.costs[v]) for v in first])
    offsets = np.concatenate([[0], np.cumsum(strategies)])
    edge_classes: dict[tuple, list[int]] = defaultdict(list)
    for e, ((u, v), m) in enumerate(zip(problem.edges.tolist(), problem.edge_costs, strict=True)):
        edge_classes[(classes[u], classes[v], m.shape, m.tobytes())].append(e)
    sides, apart = [], {}  # (edge class, side, the class's degree, {node: its other degree}); node -> its columns
    for key, members in edge_classes.items():
        for side in (0, 1):
            degree, odd = _degrees(problem.edges[members, side], classes, key[side], size[key[side]])
            for v in odd:
                apart.setdefault(v, None)
            sides.append((key, side, degree, odd))
    column = int(offsets[-1])
    for v in apart:
        apart[v], column = column, column + len(problem.costs[v])
    objective = [np.concatenate([problem.costs[v] for v in first]), np.zeros(column - int(offsets[-1]))]
    pairs: dict[tuple, tuple[int, tuple]] = {}
    for key, members in edge_classes.items():
        u, v = problem.edges[members[0]]
        found = classed(u, v, problem.edge_costs[members[0]])
        pairs[key] = (column, found)
        column += found[2].size
        objective.append(found[2].ravel())
    rows = _Rows()
    for k in range(count):
        rows.add(offsets[k] + np.arange(strategies[k]), np.ones(strategies[k]), size[k])
    for v, start in apart.items():
        rows.add(start + np.arange(len(problem.costs[v])), np.ones(len(problem.costs[v])), 1)
    for k, nodes in _by_class(apart, classes).items():  # a class counts its nodes kept apart too
        for i in range(strategies[k]):
            rows.add([offsets[k] + i] + [apart[v] + i for v in nodes], [1.0] + [-1.0] * len(nodes), 0, np.inf)
    for key, side, degree, odd in sides:
        start, (_, _, matrix, row_of, col_of) = pairs[key]
        ys = start + np.arange(matrix.size).reshape(matrix.shape)
        of, along = (row_of, ys) if side == 0 else (col_of, ys.T)
        for r in range(along.shape[0]):
            picked = np.flatnonzero(of == r)
            cols = [along[r], offsets[key[side]] + picked] + [apart[v] + picked for v in odd]
            vals = [np.ones(along.shape[1]), np.full(len(picked), -float(degree))] + \
                [np.full(len(picked), -float(d - degree)) for d in odd.values()]
            rows.add(np.concatenate(cols), np.concatenate(vals), 0)
    objective = np.concatenate(objective)
    upper = np.full(column, np.inf)
    upper[objective >= FORBIDDEN] = 0  # a forbidden strategy or pair: never counted
    for v, start in apart.items():
        upper[start:start + len(problem.costs[v])][problem.costs[v] >= FORBIDDEN] = 0
    objective[objective >= FORBIDDEN] = 0
    return AggregatedLP(objective, [rows.block(column)], upper, classes, offsets, apart)


def _by_class(nodes, classes: np.ndarray) -> dict[int, list[int]]:
    grouped: dict[int, list[int]] = defaultdict(list)
    for v in nodes:
        grouped[int(classes[v])].append(v)
    return grouped


def _degrees(ends: np.ndarray, classes: np.ndarray, k: int, size: int) -> tuple[int, dict[int, int]]:
    """The number of an edge class's edges most of class ``k``'s nodes have at this end, and the nodes with another
    number (a node with none counted too)."""
    have = Counter(ends.tolist())
    tally = Counter(have.values())
    if len(have) < size:
        tally[0] += size - len(have)
    degree = max(tally.items(), key=lambda t: (t[1], -t[0]))[0]
    if len(have) < size and degree != 0:
        nodes = np.flatnonzero(classes == k).tolist()
    else:
        nodes = list(have)
    return degree, {v: have.get(v, 0) for v in nodes if have.get(v, 0) != degree}


class _Rows:
    """Equality rows gathered one by one, as one sparse block."""

    def __init__(self):
        self.cols, self.vals, self.lower, self.upper = [], [], [], []

    def add(self, cols, vals, rhs: float, upper: float | None = None) -> None:
        """``sum vals * x[cols]`` equal to ``rhs`` (or between ``rhs`` and ``upper``)."""
        self.cols.append(np.asarray(cols, np.int64))
        self.vals.append(np.asarray(vals, np.float64))
        self.lower.append(float(rhs))
        self.upper.append(float(rhs) if upper is None else float(upper))

    def block(self, columns: int):
        lengths = [len(c) for c in self.cols]
        rows = np.repeat(np.arange(len(self.cols)), lengths)
        a = sparse.csr_array((np.concatenate(self.vals), (rows, np.concatenate(self.cols))),
                             shape=(len(self.cols), columns))
        return a, np.array(self.lower), np.array(self.upper)
