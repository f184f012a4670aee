"""A usage-limited problem's memory moved into its costs (Lagrangian relaxation): a lower bound on every assignment
within the limit, and the strategies cheap assignments use, from solves without a limit — which shrinking and the
message-passing bound make fast.

The limit says that at every moment ``t`` the usage of the nodes live then is at most ``K``. Priced instead —
``mu[t]`` per byte at moment ``t`` — it leaves a problem without a limit whose node ``v`` costs
``usage[v] * sum(mu over v's interval)`` more per strategy; its optimum less ``K * sum(mu)``, ``L(mu)``, is a lower
bound on every assignment within the limit, whatever ``mu >= 0`` (at ``mu = 0``: the unlimited optimum). ``L`` is
concave, and each assignment ``x`` a solve returns is a plane over it: ``L(mu) <= cost(x) + mu @ (usage(x) - K)``.
The prices are chosen by the cutting-plane method with a box (Kelley's, a trust region around the best prices met):
a small linear program over the planes so far gives the prices where they promise most, within the box; a solve there
adds its plane; prices that raise ``L`` by half of what was promised become the centre and the box doubles, else it
halves. It stops where the planes promise nothing more within the box — ``L``'s maximum, the best bound prices give
(at least the linear relaxation's: on a KV decode's problem 15,044 in ten solves, where subgradient steps reached
14,561 in twenty) — or where an assignment within the limit meets the bound.

Every assignment a solve returns that fits is a candidate, priced by ``evaluate``; the strategies the solves chose
(``Relaxed.used``) are where ``.ilp`` looks for a cheaper one that fits (an integer program over a few strategies a
node: on the KV decode, 281 of 3,115, solved in 0.03 s, met its optimum).

>>> found = relaxed(problem, solve_unlimited)   # doctest: +SKIP
>>> found.cost, found.bound, found.used         # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import linprog

from .canonical import canonical
from .problem import FORBIDDEN, TOLERANCE, Problem, evaluate, usage_profile

# the most solves: a deterministic budget (no clock). The bench's problems whose limit binds end sooner: a Llama
# step's in 4, a KV decode's in 10
ROUNDS = 20
# after TRIAL solves the prices go on only where the cheapest answer that fits — theirs, or the one the strategies they
# chose hold (``solve_among``, asked once there) — is within PROMISING of their bound, or where their bound is within
# PROMISING of the unlimited optimum (a limit that changes the answer little: the priced solves stay as fast as the
# first). Elsewhere (an equinox MLP under a scan: nothing fits after three solves of 1.5 s, the bound 13% above the
# unlimited optimum; the prices' maximum, after seventeen, leaves 11-15%) the integer program decides, and more solves
# only cost time. The KV decode's leave 6% there, and 0.4% after ten. An unseen GPT block's at 83-87% of its memory
# fit nothing in three solves, their bound 0.2% above the unlimited optimum: eleven more (0.7 s) reach the integer
# program's root bound (1-3.4% above it) with a fit within 0.5% of it, where HiGHS took 13-25 s to prove as much
TRIAL = 3
PROMISING = 0.1
# the first box's reach: prices that would raise the first plane by this share of the bound (relative); a scale found
# from the problem, not guessed in bytes
REACH = 0.05
# planes that promise at most this much more than the centre's bound (relative) within the box: the maximum is met
CONVERGED = 1e-6
# a step that raises the bound by at least this share of what the planes promised moves the centre
SERIOUS = 0.5


@dataclass(frozen=True)
class Relaxed:
    """The cheapest assignment within the limit the solves met (None: none fit) and its cost; a lower bound on every
    assignment within the limit; per node, the strategies the solves chose (sorted)."""

    strategies: tuple[int, ...] | None
    cost: float | None
    bound: float
    used: tuple[np.ndarray, ...] = ()


def relaxed(problem: Problem, solve_unlimited: Callable, *, rounds: int = ROUNDS, enough: float = 0.0,
            first=None, solve_among: Callable | None = None) -> Relaxed:
    """``problem``'s limit priced into its costs (see the module), ``rounds`` solves at most: ``solve_unlimited``
    solves a problem without a limit (a ``Solution``: its strategies, cost and bound); ``first``, where given, is its
    solve of ``problem`` without the limit (the prices at 0; an ``.ilp.Solution``, which this module cannot import:
    ``.ilp`` imports it); ``solve_among(used)``, where given, the cheapest assignment within the limit among the
    strategies ``used`` per node (strategies and cost, or None): asked once, where the prices' own answers leave too
    much after ``TRIAL`` solves. Stops where an assignment within the limit is within ``enough`` of the bound
    (relative; at 0, where it meets it). The assignment returned is made the leanest of as cheap (``canonical``)."""
    limit = float(problem.usage_limit)
    planes = _Planes(problem, limit)
    centre = np.zeros(int(problem.intervals[:, 1].max(initial=0)))
    found = first if first is not None else solve_unlimited(replace(problem, usage_limit=None))
    if found.cost is None:
        return Relaxed(None, None, -np.inf)
    centre_value = found.bound
    planes.add(found.strategies, centre_value)
    box = _first_box(planes, centre_value)
    # box 0: nothing is over the limit, the first answer fits; a bound that is not finite (a solve stopped before
    # proving one) gives the planes no scale: its answer is all there is, and the integer program decides
    priceable = box > 0 and np.isfinite(centre_value)
    unlimited_bound = centre_value
    for done in range(1, rounds if priceable else 1):
        gap = planes.gap()
        if done >= TRIAL and (gap is None or gap > PROMISING) and solve_among is not None:
            planes.offer(solve_among(planes.used()))  # (once: a fit no solve returned may be close to the bound)
            gap, solve_among = planes.gap(), None
        if gap is not None and gap <= max(enough, TOLERANCE):
            break
        near = planes.bound - unlimited_bound <= PROMISING * max(1.0, abs(planes.bound))
        if done >= TRIAL and not near and (gap is None or gap > PROMISING):
            break
        step = planes.most_promising(centre, box)
        if step is None:
            break
        prices, promised = step
        if promised - centre_value <= CONVERGED * max(1.0, abs(centre_value)):
            break
        found = solve_unlimited(priced(problem, prices))
        if found.cost is None:
            break
        value = found.bound - limit * prices.sum()
        planes.add(found.strategies, value)
        if value >= centre_value + SERIOUS * (promised - centre_value):
            centre, centre_value, box = prices, value, 2 * box
        else:
            box = box / 2
    best = planes.best
    if best is not None:  # of as cheap, the leaner (as every solve's answer is made: the usage never grows)
        best = canonical(problem, best)
    return Relaxed(best, None if best is None else evaluate(problem, best), planes.bound, planes.used())


def priced(problem: Problem, prices: np.ndarray) -> Problem:
    """``problem`` without its limit, each node's strategies costing their usage times the prices over its interval
    more."""
    charged = np.concatenate([[0.0], np.cumsum(prices)])
    per_byte = charged[problem.intervals[:, 1]] - charged[problem.intervals[:, 0]]
    return replace(problem, usage_limit=None, costs=tuple(_priced(c, w * u) for c, w, u in zip(
        problem.costs, per_byte, problem.usages, strict=True)))


class _Planes:
    """The assignments the solves returned, as planes over the prices (``cost + prices @ (usage profile - limit)``),
    the best bound met, the cheapest that fits, and the strategies used."""

    def __init__(self, problem: Problem, limit: float):
        self.problem, self.limit = problem, limit
        self.costs: list[float] = []
        self.slopes: list[np.ndarray] = []
        self.assignments: list[tuple[int, ...]] = []
        self.bound, self.best, self.best_cost = -np.inf, None, None

    def add(self, strategies: tuple[int, ...], value: float) -> None:
        """A solve's assignment, and ``value``: the bound its solve proved, less the limit times its prices."""
        cost = evaluate(replace(self.problem, usage_limit=None), strategies)
        slope = usage_profile(self.problem, strategies) - self.limit
        self.costs.append(cost)
        self.slopes.append(slope)
        self.assignments.append(strategies)
        self.bound = max(self.bound, value)
        if slope.max(initial=-1) <= 0 and (self.best_cost is None or cost < self.best_cost):
            self.best, self.best_cost = strategies, cost

    def offer(self, found: tuple[tuple[int, ...], float] | None) -> None:
        """An assignment within the limit found otherwise (strategies and cost; None: none), the cheapest that fits
        where it is."""
        if found is not None and (self.best_cost is None or found[1] < self.best_cost):
            self.best, self.best_cost = found

    def most_promising(self, centre: np.ndarray, box: float) -> tuple[np.ndarray, float] | None:
        """The prices within ``box`` of ``centre`` (and at least 0) where the least of the planes is largest, and
        that least: at most ``L`` anywhere (None where HiGHS fails). Prices at a moment no plane is over the limit
        and the centre charges nothing stay 0 (raising them only lowers every plane)."""
        slopes, costs = np.array(self.slopes), np.array(self.costs)
        moving = np.flatnonzero((slopes > 0).any(axis=0) | (centre > 0))
        prices = np.zeros_like(centre)
        # theta below every plane, as large as the box lets it be: a linear program of a few hundred prices and one
        # row per solve (milliseconds), where the planes' least is what the prices can at most give
        a = np.hstack([-slopes[:, moving], np.ones((len(costs), 1))])
        bounds = [(max(0.0, centre[t] - box), centre[t] + box) for t in moving] + [(None, None)]
        answer = linprog(np.r_[np.zeros(len(moving)), -1.0], A_ub=a, b_ub=costs, bounds=bounds, method="highs")
        if answer.status != 0:  # (bounded and feasible; HiGHS fails on boxes grown past its scale: nothing fits)
            return None
        prices[moving] = np.maximum(answer.x[:len(moving)], 0.0)  # (HiGHS's tolerances: a price never below 0)
        return prices, -float(answer.fun)

    def gap(self) -> float | None:
        """How far the cheapest assignment that fits is above the bound, relative to it (None: none fits yet)."""
        if self.best_cost is None:
            return None
        return max(0.0, self.best_cost - self.bound) / max(1.0, abs(self.best_cost))

    def used(self) -> tuple[np.ndarray, ...]:
        """Per node, the strategies the solves chose."""
        chosen = np.array(self.assignments)
        return tuple(np.unique(chosen[:, v]) for v in range(chosen.shape[1]))


def _first_box(planes: _Planes, bound: float) -> float:
    """The box within which the first plane, priced uniformly over its moments over the limit, would rise by
    ``REACH`` of the bound; 0 where nothing is over the limit."""
    over = np.maximum(planes.slopes[0], 0.0).sum()
    return REACH * max(1.0, abs(bound)) / over if over > 0 else 0.0


def _priced(cost: np.ndarray, charge: np.ndarray) -> np.ndarray:
    """``cost`` plus the limit's ``charge``, a forbidden strategy left so and an allowed one kept below forbidden (the
    solvers take a cost of ``FORBIDDEN`` as a choice ruled out: a problem with fewer choices, whose optimum may exceed
    the relaxation's — lowered instead, every value is still a lower bound)."""
    return np.where(cost >= FORBIDDEN, cost, np.minimum(cost + charge, FORBIDDEN / 2))
