"""``shardprop.search.lagrange``: a limit priced into the costs gives a lower bound on every assignment within the
limit and, where its solves meet one, an assignment within it, exactly priced (oracle: every assignment enumerated);
the prices reach the best bound prices can give (oracle: the cheapest mix of enumerated assignments within the limit
on average, a linear program of its own); ``ilp.solve`` keeps the cheapest of its answer, the integer program's over
the strategies its solves chose, and the integer program's over every strategy, and states the higher bound."""

import itertools
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from shardprop.search import ilp
from shardprop.search.lagrange import relaxed
from shardprop.search.problem import Problem, evaluate, peak_usage, usage_profile
from tests.search.test_ilp import _enumerated, problems


def _unlimited(problem):
    return ilp._solved(problem, time_limit=None, relative_gap=0.0, bounded=True)


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(problem=problems())
def test_the_priced_limit_bounds_every_assignment_within_it_and_what_it_finds_fits(problem):
    if problem.usage_limit is None:
        return
    want, _ = _enumerated(problem)
    found = relaxed(problem, _unlimited)
    if want is None:  # nothing fits: nothing is found, and the bound proves nothing false
        assert found.cost is None
        return
    assert found.bound <= want + 1e-6
    if found.cost is not None:
        assert evaluate(problem, found.strategies) == pytest.approx(found.cost) and found.cost >= want - 1e-6

    def loose(free):  # a solve stopped short of its proof: its bound below its answer
        done = _unlimited(free)
        return ilp.Solution(done.strategies, done.cost, done.bound - 1.0, "time limit", 0.0)

    assert relaxed(problem, loose).bound <= want + 1e-6
    within = ilp.solve(problem, relative_gap=0.1)  # (it may stop within 10% of a true bound, stating its gap)
    assert within.bound <= want + 1e-6 and want - 1e-6 <= within.cost <= 1.1 * want + 1e-6
    assert evaluate(problem, within.strategies) == pytest.approx(within.cost) and within.gap <= 0.1 + 1e-9
    assert within.status == "optimal" and within.cost == pytest.approx(want) or within.gap > 0


def _best_mix(problem: Problem) -> float:
    """The cheapest mix of assignments (weights summing to 1) whose usage, mixed, is within the limit at every moment:
    by linear programming duality, the largest bound any prices give (``max over mu >= 0 of L(mu)``)."""
    unlimited = Problem.from_lists(intervals=problem.intervals.tolist(), costs=[c.tolist() for c in problem.costs],
                                   usages=[u.tolist() for u in problem.usages], edges=problem.edges.tolist(),
                                   edge_costs=[m.ravel().tolist() for m in problem.edge_costs], usage_limit=None)
    every = [a for a in itertools.product(*(range(len(c)) for c in problem.costs))
             if evaluate(unlimited, a) is not None]
    costs = np.array([evaluate(unlimited, a) for a in every])
    over = np.array([usage_profile(problem, a) - problem.usage_limit for a in every]).reshape(len(every), -1)
    mix = linprog(costs, A_ub=over.T, b_ub=np.zeros(over.shape[1]), A_eq=np.ones((1, len(every))), b_eq=[1.0],
                  bounds=(0, None), method="highs")
    return mix.fun if mix.status == 0 else np.inf


@st.composite
def binding(draw) -> Problem:
    """A problem whose limit binds: below the peak usage of every optimum without it, at least the least peak."""
    problem = draw(problems())
    every = list(itertools.product(*(range(len(c)) for c in problem.costs)))
    free = replace(problem, usage_limit=None)
    cheapest = min(c for a in every if (c := evaluate(free, a)) is not None)
    optimal_peak = min(peak_usage(free, a) for a in every if evaluate(free, a) == cheapest)
    least_peak = min(peak_usage(free, a) for a in every)
    assume(least_peak < optimal_peak)
    return replace(problem, usage_limit=float(draw(st.integers(int(least_peak), int(optimal_peak) - 1))))


@settings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow,
                                                                                    HealthCheck.filter_too_much])
@given(problem=binding())
def test_the_prices_reach_the_best_bound_prices_give(problem):
    """Given solves enough, the cutting planes stop at the maximum of ``L`` — the cheapest mix of assignments within
    the limit on average — or at an assignment within the limit that meets their bound (then it is that maximum)."""
    import shardprop.search.lagrange as lagrange

    best = _best_mix(problem)
    trial, lagrange.TRIAL = lagrange.TRIAL, 1000
    try:
        found = relaxed(problem, _unlimited, rounds=200)
    finally:
        lagrange.TRIAL = trial
    assert np.isfinite(best)  # (the least peak fits)
    assert found.bound <= best + 1e-6 * max(1.0, abs(best))
    assert found.bound >= best - 1e-4 * max(1.0, abs(best)), (found, best)
    want, _ = _enumerated(problem)
    for gap in (0.0, 0.01):  # optimal by default; asked, an answer within 1% of a true bound, its gap stated
        got = ilp.solve(problem, priced_gap=gap)
        assert evaluate(problem, got.strategies) == pytest.approx(got.cost)  # (None: over the limit)
        assert got.bound <= want + 1e-6 and want - 1e-6 <= got.cost and got.gap <= gap + 1e-9
        assert got.status == "optimal" and got.cost == pytest.approx(want) or gap and got.gap > 0


# one value, three layouts: the cheap one holds 10 bytes, the lean one 1 (and costs 3); a limit of 6 is met by the
# middle one. Priced, the limit bounds the cost by 0.8 (the prices' best: the cheap and the middle one tie there)
_ONE = Problem.from_lists(intervals=[(0, 1)], costs=[[0, 1, 3]], usages=[[10, 5, 1]], edges=[], edge_costs=[],
                          usage_limit=6)


@pytest.fixture
def patient(monkeypatch):
    """The prices go on past their trial solves, as where they come close (``_ONE``'s leave 20%)."""
    import shardprop.search.lagrange as lagrange

    monkeypatch.setattr(lagrange, "TRIAL", lagrange.ROUNDS)


def test_a_binding_limit_is_met_by_pricing_it_and_bounded_by_the_prices(patient):
    found = relaxed(_ONE, _unlimited)  # (the best prices: 0.2 a byte, the cheap and the middle layout tie there)
    assert found.strategies == (1,) and found.cost == 1 and found.bound == pytest.approx(0.8)
    assert [u.tolist() for u in found.used] == [[0, 1]]


def test_where_the_integer_program_finds_nothing_in_time_the_priced_answer_stands_with_its_bound(monkeypatch, patient):
    """A limit whose integer program runs out of time (a Llama step's did, a minute without an assignment): the
    priced limit's answer is returned, its bound the higher of the two, its status the integer program's."""
    solved = ilp._solved

    def no_time(p, **kwargs):
        if p.usage_limit is None:
            return solved(p, **kwargs)
        return ilp.Solution((), None, 0.5, "time limit", 60.0)

    monkeypatch.setattr(ilp, "_solved", no_time)
    got = ilp.solve(_ONE)
    assert got.strategies == (1,) and got.cost == 1 and got.status == "time limit"
    assert got.bound == pytest.approx(0.8) and got.gap == pytest.approx(1 - got.bound)
    monkeypatch.setattr(ilp, "relaxed", lambda p, solve, **kw: relaxed(p, solve, rounds=1))  # (one: it does not fit)
    nothing = ilp.solve(_ONE)
    assert nothing.cost is None and nothing.status == "time limit" and nothing.bound == 0.5


def test_an_answer_of_the_prices_near_enough_to_their_bound_stands_without_the_integer_program(monkeypatch, patient):
    solved = ilp._solved

    def unlimited_only(p, **kwargs):  # (the strategies the prices' solves chose: two of the three)
        assert p.usage_limit is None or p.strategy_count < _ONE.strategy_count, "the integer program was run"
        return solved(p, **kwargs)

    monkeypatch.setattr(ilp, "_solved", unlimited_only)
    got = ilp.solve(_ONE, priced_gap=0.25)  # (_ONE's prices leave 20%)
    assert got.status == "priced limit" and got.cost == 1 and got.gap == pytest.approx(1 - got.bound)
    assert got.gap < 0.25


def test_a_probe_takes_the_prices_answer_whatever_its_gap(monkeypatch, patient):
    """``probe=True``: the prices' answer stands 20% above their bound, its gap stated, and the integer program over
    every strategy is not run (a calibration's answer is compiled before it is certified)."""
    solved = ilp._solved

    def unlimited_only(p, **kwargs):
        assert p.usage_limit is None or p.strategy_count < _ONE.strategy_count, "the integer program was run"
        return solved(p, **kwargs)

    monkeypatch.setattr(ilp, "_solved", unlimited_only)
    got = ilp.solve(_ONE, priced_gap=0.01, probe=True)
    assert got.status == "priced limit" and got.cost == 1 and got.gap > 0.01 and got.gap == pytest.approx(1 - got.bound)


def test_the_integer_program_proves_what_the_prices_cannot():
    """The prices' bound falls short of the optimum (0.8 < 1): the integer program proves it."""
    got = ilp.solve(_ONE)
    assert got.status == "optimal" and got.cost == 1 and got.bound == 1


def test_prices_leaving_much_stop_after_their_trial_solves():
    """Where the cheapest answer that fits is far from the bound after ``TRIAL`` solves, the prices stop there: the
    integer program decides (an equinox MLP under a scan spent 10 s a solve on twenty steps, 57% apart)."""
    import shardprop.search.lagrange as lagrange

    solves = []
    relaxed(_ONE, lambda p: solves.append(p) or _unlimited(p))
    assert len(solves) == lagrange.TRIAL


# two values live together, each fat and free, lean at 2, or lean at 3 and leaner; the limit holds one fat one.
# Priced, both turn lean at the same price (the leaner never pays), so no solve returns the mixed assignment; the
# integer program over the strategies they chose does, and the one over every strategy is not run
_TWO = Problem.from_lists(intervals=[(0, 1), (0, 1)], costs=[[0, 2, 3], [0, 2, 3]],
                          usages=[[10, 1, 0.5], [10, 1, 0.5]], edges=[], edge_costs=[], usage_limit=11)


def test_the_strategies_the_solves_chose_hold_a_cheaper_fit_than_any_solve_returned(monkeypatch, patient):
    found = relaxed(_TWO, _unlimited)
    assert found.cost == 4 and found.bound == pytest.approx(2) and [u.tolist() for u in found.used] == [[0, 1]] * 2
    solved = ilp._solved

    def restricted_only(p, **kwargs):
        assert p.usage_limit is None or p.strategy_count < _TWO.strategy_count, "the integer program was run"
        return solved(p, **kwargs)

    monkeypatch.setattr(ilp, "_solved", restricted_only)
    got = ilp.solve(_TWO)
    assert got.cost == 2 == _enumerated(_TWO)[0] and got.status == "optimal" and sorted(got.strategies) == [0, 1]
    assert evaluate(_TWO, got.strategies) == 2


def _lean_or_fat(step: float, n: int = 8) -> Problem:
    """``n`` values live together, each fat (10 bytes, cost 100) or lean (1 byte, cost 100 plus ``step`` times its
    place): the limit holds half of them fat."""
    return Problem.from_lists(intervals=[(0, 1)] * n, costs=[[100, 100 + (k + 1) * step] for k in range(n)],
                              usages=[[10, 1]] * n, edges=[], edge_costs=[], usage_limit=10 * (n // 2) + n // 2)


def test_prices_go_on_while_their_bound_is_near_the_unlimited_optimum(monkeypatch):
    """None of the first ``TRIAL`` solves fits, but the bound is within ``PROMISING`` of the unlimited optimum (a
    limit that changes the answer little: an unseen GPT block's at 87% of its memory, where HiGHS took 13-25 s): the
    prices go on, to the optimum (oracle: every assignment enumerated)."""
    import shardprop.search.lagrange as lagrange

    monkeypatch.setattr(lagrange, "TRIAL", 1)
    problem, solves = _lean_or_fat(0.5), []
    found = relaxed(problem, lambda p: solves.append(p) or _unlimited(p))
    assert len(solves) > 1 and found.cost == _enumerated(problem)[0] == pytest.approx(found.bound)


def test_where_none_fits_after_the_trial_solves_their_strategies_are_asked_once(monkeypatch):
    """The strategies the solves chose are asked for a fit (``solve_among``) once, where nothing the prices returned
    fits after ``TRIAL`` solves; what it finds stands where the prices find nothing cheaper."""
    import shardprop.search.lagrange as lagrange

    monkeypatch.setattr(lagrange, "TRIAL", 1)
    problem, asked = _lean_or_fat(50.0), []
    lean = (1,) * 8
    found = relaxed(problem, _unlimited, solve_among=lambda used: asked.append(used) or (lean, evaluate(problem, lean)))
    assert [[u.tolist() for u in used] for used in asked] == [[[0]] * 8]  # the unlimited optimum's: every value fat
    assert found.cost == evaluate(problem, lean) == 2600 and found.bound <= _enumerated(problem)[0]
