"""A usage-limited problem's memory moved into its costs (Lagrangian relaxation): a cheap assignment within the limit
and a lower bound, from solves without a limit, which shrinking and the message-passing bound make fast.

The limit says that at every moment ``t`` the usage of the nodes live then is at most ``K``. Priced instead —
``mu[t]`` per byte over the limit at moment ``t`` — it leaves a problem without a limit whose node ``v`` costs
``usage[v] * sum(mu over v's interval)`` more per strategy; its optimum less ``K * sum(mu)`` is a lower bound on every
assignment within the limit, whatever ``mu`` (at ``mu = 0``: the unlimited optimum). ``mu`` climbs by subgradient
steps (Polyak's, towards the cheapest assignment found within the limit) while each solve's assignment is a
candidate: where one fits, it is an assignment within the limit, exactly priced. Integer programs with memory rows
(``.ilp``) are the exact route; on a Llama step whose limit binds HiGHS found no assignment at all in its minute,
where twelve solves here (3.5 s) find one within 0.05% of the bound.

>>> found = relaxed(problem, solve_unlimited)   # doctest: +SKIP
>>> found.cost, found.bound                     # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from .canonical import canonical
from .problem import FORBIDDEN, TOLERANCE, Problem, evaluate, usage_profile

# the most solves, the first step (a share of the way to the target), how many solves without the bound rising (by
# RISE, relative) halve it, and the smallest step taken: a deterministic budget (no clock) — twelve solves of the
# Llama step's problem whose limit binds (3.5 s)
ROUNDS = 20
FIRST_STEP = 0.2
STALL = 3
RISE = 1e-6
LAST_STEP = FIRST_STEP / 8
# after TRIAL solves the prices go on only where their cheapest answer that fits is within PROMISING of their bound: a
# few more steps may bring it to what ``.ilp`` lets stand; where they leave more (an equinox MLP under a scan: 57%
# apart) the integer program decides, and more steps only cost time
TRIAL = 3
PROMISING = 0.01
# without an assignment within the limit yet, the step aims this far above the bound (relative), twice as far after
# each solve whose assignment does not fit either (the prices' scale found, not guessed)
AIM = 0.05


@dataclass(frozen=True)
class Relaxed:
    """The cheapest assignment within the limit the solves met (None: none fit) and its cost; a lower bound on every
    assignment within the limit."""

    strategies: tuple[int, ...] | None
    cost: float | None
    bound: float


def relaxed(problem: Problem, solve_unlimited: Callable, rounds: int = ROUNDS) -> Relaxed:
    """``problem``'s limit priced into its costs (see the module), ``rounds`` solves at most: ``solve_unlimited``
    solves a problem without a limit (a ``Solution``: its strategies, cost and bound). Stops where an assignment
    within the limit meets the bound. The assignment returned is made the leanest of as cheap (``canonical``)."""
    limit = float(problem.usage_limit)
    unlimited = replace(problem, usage_limit=None)
    starts, ends = problem.intervals[:, 0], problem.intervals[:, 1]
    prices = np.zeros(int(ends.max(initial=0)))
    best, best_cost, bound = None, None, -np.inf
    step, stalled = FIRST_STEP, 0
    for done in range(rounds):
        charged = np.concatenate([[0.0], np.cumsum(prices)])
        per_byte = charged[ends] - charged[starts]  # each node's price per byte held, over its interval
        found = solve_unlimited(replace(unlimited, costs=tuple(_priced(c, w * u) for c, w, u in zip(
            problem.costs, per_byte, problem.usages, strict=True))))
        if found.cost is None:
            break
        value = found.bound - limit * prices.sum()
        stalled = 0 if not np.isfinite(bound) or value > bound + RISE * max(1.0, abs(bound)) else stalled + 1
        bound = max(bound, value)
        cost = evaluate(problem, found.strategies)  # (None: over the limit)
        if cost is not None and (best_cost is None or cost < best_cost):
            best, best_cost = found.strategies, cost
        if best_cost is not None and best_cost <= bound + TOLERANCE * max(1.0, abs(best_cost)):
            break
        if done + 1 >= TRIAL and (best_cost is None or best_cost - bound > PROMISING * abs(best_cost)):
            break
        if stalled >= STALL:
            step, stalled = step / 2, 0
            if step < LAST_STEP:
                break
        over = usage_profile(problem, found.strategies) - limit
        moving = np.where((prices > 0) | (over > 0), over, 0.0)  # (a price at 0 cannot fall)
        if not moving.any():
            break
        aim = best_cost if best_cost is not None else bound + AIM * max(1.0, abs(bound)) * 2 ** done
        prices = np.maximum(0.0, prices + step * max(aim - value, 0.0) / float(moving @ moving) * moving)
    if best is not None:  # of as cheap, the leaner (as every solve's answer is made: the usage never grows)
        best = canonical(problem, best)
        best_cost = evaluate(problem, best)
    return Relaxed(best, best_cost, bound)


def _priced(cost: np.ndarray, charge: np.ndarray) -> np.ndarray:
    """``cost`` plus the limit's ``charge``, a forbidden strategy left so and an allowed one kept below forbidden (the
    solvers take a cost of ``FORBIDDEN`` as a choice ruled out: a problem with fewer choices, whose optimum may exceed
    the relaxation's — lowered instead, every value is still a lower bound)."""
    return np.where(cost >= FORBIDDEN, cost, np.minimum(cost + charge, FORBIDDEN / 2))
