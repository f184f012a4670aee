"""``shardprop.search.lagrange``: a limit priced into the costs gives a lower bound on every assignment within the
limit and, where its solves meet one, an assignment within it, exactly priced (oracle: every assignment enumerated);
``ilp.solve`` keeps the cheaper of it and the integer program's answer and states the higher bound."""

import pytest
from hypothesis import HealthCheck, given, settings

from shardprop.search import ilp
from shardprop.search.lagrange import relaxed
from shardprop.search.problem import Problem, evaluate
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
    within = ilp.solve(problem, relative_gap=0.1)  # (the integer program may stop within 10% of its bound)
    assert within.bound <= want + 1e-6 and want - 1e-6 <= within.cost <= 1.1 * want + 1e-6


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
    found = relaxed(_ONE, _unlimited)
    assert found.strategies == (1,) and found.cost == 1 and 0.7 < found.bound <= 0.8 + 1e-9


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
    assert 0.7 < got.bound <= 0.8 + 1e-9 and got.gap == pytest.approx(1 - got.bound)
    monkeypatch.setattr(ilp, "relaxed", lambda p, solve: relaxed(p, solve, rounds=1))  # (one solve: it does not fit)
    nothing = ilp.solve(_ONE)
    assert nothing.cost is None and nothing.status == "time limit" and nothing.bound == 0.5


def test_an_answer_of_the_prices_near_enough_to_their_bound_stands_without_the_integer_program(monkeypatch, patient):
    solved = ilp._solved

    def unlimited_only(p, **kwargs):
        assert p.usage_limit is None, "the integer program with memory rows was run"
        return solved(p, **kwargs)

    monkeypatch.setattr(ilp, "_solved", unlimited_only)
    monkeypatch.setattr(ilp, "PRICED_ENOUGH", 0.25)  # (_ONE's prices leave 20%)
    got = ilp.solve(_ONE)
    assert got.status == "priced limit" and got.cost == 1 and got.gap == pytest.approx(1 - got.bound)
    assert got.gap < 0.25


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
