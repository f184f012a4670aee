"""The search under ``memory_limit=`` (``shardprop.search.limited``), table-driven on a one-node problem whose
"compiled" memory is its usage plus what each strategy holds beyond the problem's memory: the calibration the solves
keep, when a plan confirms it, how many plans are compiled, and the certificate. The end-to-end case (a KV-cache
decode compiled by XLA) is ``tests/search/test_search.py``'s."""

from dataclasses import dataclass, field

import pytest
from jax.sharding import PartitionSpec as P

import shardprop as sp
from shardprop.search.ilp import solve
from shardprop.search.limited import fitting_unbound, solved_within
from shardprop.search.problem import Problem
from shardprop.search.solve import Candidate
from shardprop.splitting.cost import Footprint

# one value, four layouts: the cheaper, the fatter (cost 1..4, usage 100..40 bytes)
_PROBLEM = Problem.from_lists(intervals=[(0, 1)], costs=[[1, 2, 3, 4]], usages=[[100, 80, 60, 40]], edges=[],
                              edge_costs=[], usage_limit=None)


@dataclass
class _Built:
    problem: Problem


@dataclass
class _Session:
    """What ``limited`` asks of a search session: solves, plans (here the strategy itself), Candidates, and a compiled
    check holding each strategy's usage plus ``beyond[strategy]``."""

    beyond: tuple[int, ...]
    built: _Built = field(default_factory=lambda: _Built(_PROBLEM))
    compiled_memory: object = True
    compiles: list[int] = field(default_factory=list)
    solves: list[float] = field(default_factory=list)

    def solved(self, usage_limit):
        self.solves.append(usage_limit)
        return solve(Problem(**{**_PROBLEM.__dict__, "usage_limit": usage_limit}))

    def planned(self, solution):
        return solution.strategies[0]

    def candidate(self, plan, limit):
        usage = int(_PROBLEM.usages[0][plan])
        return Candidate((P(),), 1.0 + plan, 0.0, Footprint(usage, 0, 0), 0 if limit is None else max(0, usage - limit))

    def compiled(self, plan):
        self.compiles.append(plan)
        return int(_PROBLEM.usages[0][plan]) + self.beyond[plan]

    def leanest(self):
        return solve(Problem(**{**_PROBLEM.__dict__, "costs": _PROBLEM.usages}))


# (what each strategy holds beyond the problem's memory, the limit) -> (the strategy chosen, the calibration it was
# solved with, the strategies compiled in turn, the status)
CASES = {
    "a constant beyond: the first calibrated solve fits and confirms it":
        ((30, 30, 30, 30), 100, (2, 30, (0, 2), "optimal")),
    "a plan holding less beyond than the unlimited optimum loosens the next solve":
        ((30, 10, 10, 10), 100, (1, 10, (0, 2, 1), "optimal")),
    "a plan still over the limit tightens the next solve":
        ((10, 30, 30, 30), 100, (2, 30, (0, 1, 2), "optimal")),
    "never confirmed: the cheapest plan that fit, held to the least bound found; no calibration solved with twice":
        ((50, 50, 50, 0), 100, (3, 50, (0, 3, 0), "tightened to fit as compiled")),
}


@pytest.mark.parametrize("beyond, limit, want", CASES.values(), ids=CASES.keys())
def test_the_limit_kept_is_calibrated_by_what_the_compiled_plans_held_beyond_the_problem(beyond, limit, want):
    session = _Session(beyond)
    found, held = fitting_unbound(session, limit)
    assert found is None and held == beyond[0]
    solution, plan, candidate, calibration = solved_within(session, limit, (), (), held)
    chosen, calibrated, compiled, status = want
    assert (plan, calibration, tuple(session.compiles), solution.status) == (chosen, calibrated, compiled, status)
    assert candidate.compiled_memory == _PROBLEM.usages[0][plan] + beyond[plan] <= limit
    assert solution.gap == 0 if status == "optimal" else solution.gap > 0


def test_a_limit_the_unlimited_optimum_keeps_is_not_calibrated():
    session = _Session((0, 0, 0, 0))
    (solution, plan, candidate), held = fitting_unbound(session, 100)
    assert plan == 0 and held == 0 and session.compiles == [0]


def test_nothing_fitting_as_compiled_names_the_smallest_footprint_found():
    session = _Session((100, 100, 100, 100))
    _, held = fitting_unbound(session, 100)
    with pytest.raises(sp.MemoryLimitError, match="smallest footprint found is 140 B as compiled"):
        solved_within(session, 100, (), (), held)
