"""A ``Problem`` solved exactly as an integer program by HiGHS (``highspy``), with the bound it proves.

The formulation is XLA's auto-sharding solver's (``auto_sharding_solver.cc``) and Alpa's: a binary ``x[v, i]`` per
node strategy, one per node; per edge a ``y[e, r, c]`` in ``[0, 1]`` per pair of classes of strategies (the strategies
of an endpoint whose rows, or columns, of the edge's matrix are equal), whose row sums are the classes' sums of
``x[u, :]`` and column sums of ``x[v, :]`` — with one-hot margins the only such matrix is their outer product, so ``y``
needs no integrality; and the usage of the live nodes' chosen strategies at most the limit at every moment, kept as
a running total over the moments something starts or ends (``.rows.memory_rows``: its size is the strategies', not the
strategies' times the moments they live over). Without memory rows the relaxation is solved first: where it is
integral it is the optimum, proved — and of its optima the one holding the fewest bytes is taken
(``_leanest_optimum``: a second objective over the optimal face, not the simplex's last vertex). The matrices are
built by numpy, not a modelling loop. Before solving, what cannot change the optimum is folded away: an edge whose
matrix is zero, an edge into a node with one strategy (its row or column joins the other node's costs), edges
between the same two nodes (summed), and a limit no assignment can break; a forbidden strategy or pair (a cost of at
least ``FORBIDDEN``) is a variable held at 0.

The same problem gives the same answer on every run, however busy the machine: HiGHS's presolve stops its search for
dependent equations by the clock, and the LP left then differs, and with it which of equally cheap vertices the
simplex ends at; that reduction is off (``_DETERMINISTIC``; the Llama step's relaxation also 8 -> 5 s). The relaxation
is solved without presolve (``_RELAXATION``): it finds little there and costs more than it saves (the Llama step's
5.3 -> 3.9 s, a stack of 8 blocks 11.6 -> 10.8 s), and nothing in a simplex without it looks at the clock.

>>> from shardprop.search.problem import Problem
>>> p = Problem.from_lists(intervals=[(0, 2), (1, 3)], costs=[[1, 3], [2, 0]], usages=[[4, 1], [4, 1]],
...                        edges=[(0, 1)], edge_costs=[[0, 5, 5, 0]], usage_limit=5)
>>> s = solve(p)
>>> s.strategies, s.cost, s.status
((1, 1), 3, 'optimal')
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import highspy
import numpy as np
from scipy import sparse

from .problem import FORBIDDEN, TOLERANCE, Problem, evaluate, least_peak, peak_usage
from .rows import folded, memory_rows, one_hot_rows, pair_rows
from .alike import aggregated_lp, alike_classes
from .canonical import canonical
from .dual import AT_LEAST as DUAL_AT_LEAST, dual_bound
from .lagrange import relaxed
from .reduce import Reduced, restrict, shrink

_STATUS = {highspy.HighsModelStatus.kOptimal: "optimal", highspy.HighsModelStatus.kTimeLimit: "time limit",
           highspy.HighsModelStatus.kInfeasible: "infeasible", highspy.HighsModelStatus.kUnbounded: "unbounded"}
# presolve_rule_off's bit for "Dependent equations" (HiGHS logs the rules it switches off: bit 10 = 1024); the bits
# move between HiGHS releases, so highspy is pinned and tests/search/test_ilp.py reads the installed HiGHS's log to
# check that this bit names that rule, and only it
_DETERMINISTIC = {"presolve_rule_off": 1 << 10, "output_flag": False}
_RELAXATION = {**_DETERMINISTIC, "presolve": "off"}  # the relaxation's options (the module's docstring says why)
# the classes of alike nodes are tried where the core's nodes repeat: at least this many nodes a class on average. The
# aggregated program solves in about 2 s on stacks of transformer blocks whatever their number, where the whole core
# took 3.3 s at 4 blocks, 9 s at 8 and 42 s at 24; on Llama-style layers it is as tight but fractional and slow to
# solve (14-20 s), and the strategies its reduced costs leave many: at 4 layers 19.6 s against the whole core's
# 6.6 s, at 16 layers 42.6 s against 40 s. A measured break-even, not a proof: the blocks repeat eight times or more
ALIKE_AT_LEAST = 8


@dataclass(frozen=True)
class Solution:
    """The strategies chosen (one per node), their exact cost (``evaluate``; None when the solver found no feasible
    assignment), the lower bound the solver proved on every assignment's cost, and how it ended."""

    strategies: tuple[int, ...]
    cost: float | None
    bound: float
    status: str
    seconds: float

    @property
    def gap(self) -> float | None:
        """``(cost - bound) / cost``: 0 when proved optimal; None without a solution."""
        if self.cost is None:
            return None
        if self.status == "optimal":  # proved, to the solver's tolerance (rounding may leave the bound a hair apart)
            return 0.0
        return 0.0 if self.cost <= self.bound else (self.cost - self.bound) / max(abs(self.cost), 1e-12)

    def summary(self) -> str:
        """``optimal: cost 3 (0.01 s)`` or ``cost 10.5, within 0.4% of the bound 10.46 (time limit, 60 s)``."""
        if self.cost is None:
            return f"no feasible assignment found ({self.status}, {self.seconds:.2f} s)"
        if self.status == "optimal":
            return f"optimal: cost {self.cost:,.6g} ({self.seconds:.2f} s)"
        return (f"cost {self.cost:,.6g}, within {100 * self.gap:.2g}% of the bound {self.bound:,.6g} "
                f"({self.status}, {self.seconds:.2f} s)")


def solve(problem: Problem, *, time_limit: float | None = None, relative_gap: float = 0.0, priced_gap: float = 0.0,
          unlimited: Solution | None = None, probe: bool = False) -> Solution:
    """The cheapest assignment of ``problem`` within its usage limit, proved optimal (or, stopped at ``time_limit``
    seconds or within ``relative_gap`` of the bound, the best found and the bound). Shrunk exactly (``.reduce``), the
    core is, without a limit, bounded first — by message passing (``.dual``), else through its classes of alike nodes
    (``.alike``) — and solved on the strategies the bound leaves (reduced-cost fixing: exact); else as one integer
    program. Under a limit, the limit is priced into the costs first (``.lagrange``; ``unlimited``: ``problem``'s solve
    without it, where known) and the integer program with memory rows solved over the strategies the prices' solves
    chose (during the pricing too, where nothing the prices returned fits closely: ``relaxed``'s ``solve_among``;
    each set of strategies solved once): the cheaper answer stands where it meets the prices' bound, or is within
    ``priced_gap`` of it (status ``"priced limit"``); else the integer program over every strategy is solved too (to
    ``relative_gap``) — the cheapest answer kept, the higher bound stated. ``probe``: the priced answers' cheapest
    stands whatever its gap (stated), the integer program over every strategy run only where they found none — an
    answer to measure, not yet to certify."""
    if problem.usage_limit is None:
        return _solved(problem, time_limit=time_limit, relative_gap=relative_gap, bounded=True)
    start = time.perf_counter()
    if least_peak(problem) > problem.usage_limit:  # (each node at its leanest breaks it: HiGHS took 9 s to say so)
        return Solution((), None, -np.inf, "infeasible", time.perf_counter() - start)

    def left() -> float | None:  # (one deadline for every solve this one makes)
        return None if time_limit is None else max(1.0, time_limit - (time.perf_counter() - start))

    among_solved: dict[tuple, tuple | None] = {}  # (the strategies the prices chose, where asked again unchanged)

    def among_used(used) -> tuple[tuple[int, ...], float] | None:
        key = tuple(map(tuple, used))
        if key not in among_solved:
            among_solved[key] = _restricted_solve(problem, used, time_limit=left())
        return among_solved[key]

    # (the prices go on to a tenth of the gap allowed: the cheaper answer then found is worth the few solves more)
    priced = relaxed(problem, lambda free: _solved(free, time_limit=left(), relative_gap=0.0, bounded=True),
                     enough=priced_gap / 10, first=unlimited, solve_among=among_used)
    found = [(priced.cost, priced.strategies)] if priced.cost is not None else []
    if not _within(found, priced.bound, 0.0) and priced.used:
        among = among_used(priced.used)
        if among is not None:  # (made the leanest of as cheap over every strategy, and priced again)
            lean = canonical(problem, among[0])
            found.append((evaluate(problem, lean), lean))
    best = min(found, key=lambda f: f[0], default=(None, None))
    if _within(found, priced.bound, priced_gap) or (probe and found):
        return _at_bound(Solution(best[1], best[0], priced.bound, "priced limit", 0.0), start)
    exact = _solved(problem, time_limit=left(), relative_gap=relative_gap, bounded=True)
    if best[0] is not None and (exact.cost is None or best[0] < exact.cost):
        exact = Solution(best[1], best[0], exact.bound, exact.status, 0.0)
    return _at_bound(replace(exact, bound=max(exact.bound, priced.bound)), start)


def _within(found: list, bound: float, gap: float) -> bool:
    """The cheapest of ``found`` (costs and assignments) meets ``bound``, or is within ``gap`` of it (relative)."""
    cost = min((f[0] for f in found), default=None)
    return cost is not None and cost - bound <= max(gap * abs(cost), TOLERANCE * max(1.0, abs(cost)))


def _at_bound(found: Solution, start: float) -> Solution:
    """``found`` timed from ``start``, its bound capped by its cost (rounding), and optimal where it meets it."""
    if found.cost is not None:
        found = replace(found, bound=min(found.bound, found.cost))
        if found.cost - found.bound <= TOLERANCE * max(1.0, abs(found.cost)):
            found = replace(found, status="optimal")
    return replace(found, seconds=time.perf_counter() - start)


def _solved(problem: Problem, *, time_limit: float | None, relative_gap: float, bounded: bool) -> Solution:
    """``solve``; ``bounded``: through a bound first (whose restricted solves are not)."""
    start = time.perf_counter()
    shrunk = shrink(problem)
    core = None
    if bounded:
        # the passes first: compiled, they bound a stack of 24 blocks' core in half a second, where the program over
        # its classes of alike nodes took 3.4 s (HiGHS's), which stays for where the bound leaves too much
        core = _solve_by_dual(shrunk.problem, time_limit=time_limit) or _solve_alike(shrunk.problem,
                                                                                   time_limit=time_limit)
    if core is None:
        if time_limit is not None:  # what the bound's solves took is the whole core's less
            time_limit = max(1.0, float(time_limit) - (time.perf_counter() - start))
        core = _solve_core(shrunk.problem, time_limit=time_limit, relative_gap=relative_gap)
    if core.cost is None:
        return Solution((), None, core.bound + shrunk.offset, core.status, time.perf_counter() - start)
    strategies = canonical(problem, shrunk.recover(core.strategies))
    cost = evaluate(problem, strategies)
    bound = core.bound + shrunk.offset
    if cost is not None and core.status == "optimal":
        bound = min(bound, cost)
    return Solution(strategies, cost, bound, core.status, time.perf_counter() - start)


def _solve_alike(problem: Problem, *, time_limit: float | None) -> Solution | None:
    """The optimum of ``problem`` proved through its classes of alike nodes (``.alike``), or None where they are too
    few to pay for the solves (fewer than ``ALIKE_AT_LEAST`` nodes a class), under a usage limit (the bound leaves
    memory out), or where HiGHS does not finish them."""
    if problem.usage_limit is not None or problem.node_count == 0:
        return None
    classes = alike_classes(problem)
    if (int(classes.max()) + 1) * ALIKE_AT_LEAST > problem.node_count:
        return None
    return _solve_through(problem, classes, time_limit=time_limit)


def _solve_through(problem: Problem, classes: np.ndarray, *, time_limit: float | None) -> Solution | None:
    """``problem``'s optimum, proved by the program aggregated over ``classes`` (of nodes with equal costs): the
    problem restricted to the strategies the aggregated optimum uses gives an assignment; where it costs more than the
    bound, every assignment cheaper than it uses only strategies whose reduced cost is within the difference (an
    assignment's cost is at least the bound plus the reduced costs of the counts it sets), and the problem restricted
    to those is solved too: the cheaper of the two is the optimum. None where HiGHS does not solve the program."""
    start = time.perf_counter()
    lp = aggregated_lp(problem, classes)
    bounded = _highs(lp.objective, lp.blocks, lp.upper, None, time_limit=time_limit, options=_RELAXATION)
    if bounded.x is None or bounded.status != "optimal":
        return None
    best = _restricted_solve(problem, lp.kept(bounded.x), time_limit=time_limit)
    if best is None:
        return None
    slack = TOLERANCE * max(1.0, abs(best[1]))
    if best[1] <= bounded.bound + slack:  # it meets the aggregated bound
        return Solution(best[0], best[1], min(bounded.bound, best[1]), "optimal", time.perf_counter() - start)
    if bounded.reduced is None:
        return None
    kept = lp.within(bounded.reduced, best[1] - bounded.bound + slack)
    if all(len(k) for k in kept):  # (a node with none: nothing is cheaper than what was found)
        other = _restricted_solve(problem, kept, time_limit=time_limit)
        if other is None:
            return None
        best = min(best, other, key=lambda found: found[1])
    # nothing cheaper exists: the optimum is its own bound
    return Solution(best[0], best[1], best[1], "optimal", time.perf_counter() - start)


def _solve_by_dual(problem: Problem, *, time_limit: float | None) -> Solution | None:
    """``problem``'s optimum, proved by the message-passing bound (``.dual``): solved among each node's strategies of
    least slack; where that costs more than the bound, among every strategy whose slack is within the difference —
    every assignment using another costs more than the one found, and those left hold every optimum. None for a
    core of fewer than ``DUAL_AT_LEAST`` strategies (solved whole faster), under a usage limit (the bound leaves
    memory out), where no assignment avoids the forbidden, where the bound leaves every strategy, or where a
    restricted solve does not end optimal (the whole core is solved then)."""
    start = time.perf_counter()
    found = dual_bound(problem) if problem.usage_limit is None and problem.strategy_count >= DUAL_AT_LEAST else None
    best = found and _restricted_solve(problem, found.least(), time_limit=time_limit)
    if best and not found.meets(best[1]):
        # (even most of the strategies make far fewer pairs of them: a GPT block's core kept 1,614 of 2,685, its
        # program solved in 0.22 s where the whole one's relaxation, 69,949 columns, took 0.67 s)
        kept = found.within(best[1] - found.bound)
        wider = _restricted_solve(problem, kept, time_limit=time_limit) if sum(map(len, kept)) < \
            problem.strategy_count else None
        best = wider and min(wider, best, key=lambda found: found[1])  # (of equals, the one among every optimum)
    return Solution(best[0], best[1], best[1], "optimal", time.perf_counter() - start) if best else None


def _restricted_solve(problem: Problem, kept, *, time_limit: float | None) -> tuple[tuple[int, ...], float] | None:
    """The cheapest assignment of ``problem`` among the strategies ``kept`` (per node) and its cost, or None."""
    if any(len(k) == 0 for k in kept):
        return None
    restricted = Reduced(restrict(problem, kept), tuple(kept))
    found = _solved(restricted.problem, time_limit=time_limit, relative_gap=0.0, bounded=False)
    if found.cost is None or found.status != "optimal":
        return None
    strategies = restricted.expand(found.strategies)
    cost = evaluate(problem, strategies)
    return None if cost is None else (strategies, cost)


def _solve_core(problem: Problem, *, time_limit: float | None, relative_gap: float) -> Solution:
    """``solve`` on a problem as it is (no shrinking)."""
    start = time.perf_counter()
    if problem.node_count == 0:  # everything eliminated: the empty assignment, its cost 0
        return Solution((), 0.0, 0.0, "optimal", 0.0)
    node_costs, pairs = folded(problem)
    offsets = np.concatenate([[0], np.cumsum([len(c) for c in problem.costs])])
    n_x = int(offsets[-1])
    sizes = [p[2].size for p in pairs]
    pair_offsets = n_x + np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    n = int(pair_offsets[-1])
    objective = np.concatenate([np.concatenate(node_costs)] + [p[2].ravel() for p in pairs])
    blocks = [one_hot_rows(problem, offsets, n), pair_rows(pairs, offsets, pair_offsets, n)]
    memory = memory_rows(problem, offsets, n)  # (rows over n variables and k running totals, ...) or None
    upper = np.ones(n)
    upper[objective >= FORBIDDEN] = 0  # a forbidden strategy or pair of strategies: never chosen, not priced
    objective[objective >= FORBIDDEN] = 0
    integral = np.zeros(n, bool)
    integral[:n_x] = True
    # the relaxation first, without the memory rows: on layout problems it is integral already (PyTorch's
    # AutoParallel reports as much for LLaMA), and then it is the optimum, proved by itself, in about half the
    # integer program's time — within a limit too where its peak usage keeps to it (a limit that does not bind)
    relaxed = _highs(objective, blocks, upper, None, time_limit=time_limit, options=_RELAXATION, keep=True)
    if relaxed.x is not None and relaxed.status == "optimal" and _integral(relaxed.x[:n_x]) and (
            memory is None or peak_usage(problem, _picked(problem, offsets, relaxed.x)) <= problem.usage_limit):
        result = _leanest_optimum(relaxed, problem, offsets, upper)
    else:
        if time_limit is not None:
            time_limit = max(1.0, float(time_limit) - (time.perf_counter() - start))
        if memory is not None:  # the running totals: continuous, at most the limit (in their units)
            a, lower, upper_rows, k, most = memory
            blocks = [(sparse.hstack([b[0], sparse.csr_array((b[0].shape[0], k))], format="csr"), b[1], b[2])
                      for b in blocks] + [(a, lower, upper_rows)]
            objective, upper = np.concatenate([objective, np.zeros(k)]), np.concatenate([upper, np.full(k, most)])
            integral = np.concatenate([integral, np.zeros(k, bool)])
        result = _highs(objective, blocks, upper, integral, time_limit=time_limit, relative_gap=relative_gap)
    status, bound = result.status, result.bound
    if result.x is None:
        return Solution((), None, -np.inf, status, time.perf_counter() - start)
    strategies = _picked(problem, offsets, result.x)
    cost = evaluate(problem, strategies)
    if status == "optimal" and cost is not None:
        bound = min(bound, cost)  # the solver's tolerances: an optimum proved is its own bound
        if cost - bound > TOLERANCE * max(1.0, abs(cost)):  # (HiGHS's "optimal" within the relative gap asked)
            status = "relative gap"
    return Solution(strategies, cost, bound, status, time.perf_counter() - start)


@dataclass(frozen=True)
class _Run:
    """What one HiGHS run gave: the values (None without a feasible point), how it ended, the bound it proved."""

    x: np.ndarray | None
    status: str
    bound: float
    reduced: np.ndarray | None = None  # a linear program's reduced costs (the column duals), where HiGHS gives them
    solver: object = None  # the HiGHS instance holding the model, where asked to keep it (a follow-up solve)


def _highs(objective: np.ndarray, blocks: list, upper: np.ndarray, integral: np.ndarray | None, *,
           time_limit: float | None, relative_gap: float = 0.0, options: dict = _DETERMINISTIC,
           keep: bool = False) -> _Run:
    """``min objective @ x`` subject to each block's ``lower <= a @ x <= upper`` and ``0 <= x <= upper``, the
    ``integral`` variables integers (None: a linear program), by HiGHS with ``options``; ``keep``: the run holds the
    HiGHS instance (``_Run.solver``)."""
    a = sparse.vstack([b[0] for b in blocks if b[0].shape[0]], format="csc")
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = len(objective), a.shape[0]
    lp.col_cost_, lp.col_lower_, lp.col_upper_ = objective, np.zeros(len(objective)), upper
    lp.row_lower_ = np.concatenate([b[1] for b in blocks if b[0].shape[0]])
    lp.row_upper_ = np.concatenate([b[2] for b in blocks if b[0].shape[0]])
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = a.indptr, a.indices, a.data
    if integral is not None:
        lp.integrality_ = [highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous
                           for i in integral]
    # highspy's Highs wraps the core class with callbacks, and prints HiGHS's banner on stdout on its first making,
    # into the output of a user's program (the pinned highspy keeps the core class where it is)
    h = highspy._core._Highs()
    options = {**options, "mip_rel_gap": float(relative_gap)}
    if time_limit is not None:
        options["time_limit"] = float(time_limit)
    for name, value in options.items():
        if h.setOptionValue(name, value) != highspy.HighsStatus.kOk:
            raise RuntimeError(f"HiGHS refused its option {name}={value!r}")
    h.passModel(lp)
    h.run()
    status = _STATUS.get(h.getModelStatus(), "error")
    info, solution = h.getInfo(), h.getSolution()
    x = np.asarray(solution.col_value) if solution.value_valid else None
    if integral is None or not np.isfinite(info.mip_dual_bound):
        bound = info.objective_function_value if status == "optimal" else -np.inf
    else:
        bound = info.mip_dual_bound
    reduced = np.asarray(solution.col_dual) if integral is None and solution.dual_valid else None
    return _Run(x, status, float(bound), reduced, h if keep else None)


def _leanest_optimum(run: _Run, problem: Problem, offsets: np.ndarray, upper: np.ndarray) -> _Run:
    """Among the optima of ``run`` (an integral relaxation), one whose strategies hold the fewest bytes summed over
    the nodes: between two programs as cheap a user expects the smaller, and which vertex the simplex ends at is
    chance. Every optimum of the relaxation leaves at 0 each variable of a positive reduced cost and at its bound
    each of a negative one (complementary slackness: its rows are equations), and any point so is an optimum; the
    relaxation is solved again with those fixed and the bytes held for its objective. ``run`` itself where that
    point is fractional, or by ``evaluate`` dearer or over the usage limit at some moment."""
    h, reduced, x = run.solver, run.reduced, run.x
    if h is None or reduced is None:
        return run
    n, n_x = len(x), int(offsets[-1])
    slack = 1e-6  # HiGHS's dual feasibility tolerance is 1e-7: a reduced cost within this is taken for 0
    lower, high = np.where(reduced < -slack, upper, 0.0), np.where(reduced > slack, 0.0, upper)
    sizes = np.zeros(n)
    sizes[:n_x] = np.concatenate(problem.usages)
    columns = np.arange(n, dtype=np.int32)
    h.changeColsBounds(n, columns, lower, high)
    h.changeColsCost(n, columns, sizes)
    # from scratch with presolve, not from the optimal basis: with most variables fixed, presolve leaves a few dozen
    # pivots (Llama's step: 0.2 s, where the simplex from the basis took 3,700 pivots and 0.45 s)
    h.setOptionValue("presolve", "on")
    h.clearSolver()
    h.run()
    solution = h.getSolution()
    if _STATUS.get(h.getModelStatus()) != "optimal" or not solution.value_valid:
        return run
    lean = np.asarray(solution.col_value)
    if not _integral(lean[:n_x]):
        return run
    # (evaluate is None over the usage limit: fewer bytes summed may be more at one moment)
    first, second = (evaluate(problem, _picked(problem, offsets, v)) for v in (x, lean))
    if second is None or second > first + 1e-9 * max(1.0, abs(first)):
        return run
    return _Run(lean, run.status, run.bound, run.reduced)


def _picked(problem: Problem, offsets: np.ndarray, x: np.ndarray) -> tuple[int, ...]:
    """Each node's strategy: its variable of the largest value."""
    return tuple(int(np.argmax(x[offsets[v]:offsets[v + 1]])) for v in range(problem.node_count))


def _integral(x: np.ndarray) -> bool:
    """Every strategy variable 0 or 1 (within the solver's tolerance)."""
    return bool(np.all((x < 1e-6) | (x > 1 - 1e-6)))
