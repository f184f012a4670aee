"""The message-passing bound (``shardprop/search/dual.py``) and the solve through it (``ilp._solve_by_dual``): on
random dense problems — parallel edges, edges within a node, forbidden strategies and pairs — the bound is at most
the minimum found by trying every assignment, every assignment using a strategy costs at least the bound plus that
strategy's slack, and the solve through the bound returns that minimum (or, where the bound leaves half the
strategies or more, hands the problem back whole); on larger random problems it returns what HiGHS's integer program
over the whole problem returns, without running it — through a second restricted solve where the first costs more
than the bound; edges whose sum forbids what each allows leave the bound finite; a searched stack of blocks is solved
through the bound, and equals the unsharded step."""

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardprop.search import ilp
from shardprop.search.dual import dual_bound
from shardprop.search.problem import FORBIDDEN, Problem, evaluate
from shardprop.search.reduce import shrink
from tests.search.stacks import assert_equals_unsharded, searched_stack


@pytest.fixture(autouse=True)
def _every_core_bounded(monkeypatch):
    """The bound is tried on cores of every size here (by default from ``DUAL_AT_LEAST`` strategies)."""
    monkeypatch.setattr(ilp, "DUAL_AT_LEAST", 0)


def _assignments(problem: Problem):
    """Every assignment and its cost (None where it uses a forbidden strategy or pair): the oracle."""
    for assignment in itertools.product(*(range(len(c)) for c in problem.costs)):
        cost = evaluate(problem, assignment)
        yield assignment, (None if cost is None or cost >= FORBIDDEN else cost)


@st.composite
def dense_problems(draw) -> Problem:
    """Every pair of nodes joined (so the shrinking leaves a core), some pairs twice, some nodes to themselves."""
    nodes = draw(st.integers(3, 5))
    counts = [draw(st.integers(1, 3)) for _ in range(nodes)]
    money = st.sampled_from([0, 1, 2, 5, 9, 20])
    costs = [[draw(st.one_of(money, st.just(FORBIDDEN)) if k else money) for k in range(c)] for c in counts]
    pairs = list(itertools.combinations(range(nodes), 2))
    pairs += draw(st.lists(st.tuples(st.integers(0, nodes - 1), st.integers(0, nodes - 1)), max_size=3))
    priced = st.sampled_from([0, 0, 1, 3, 7, 30, FORBIDDEN])
    edge_costs = [[draw(priced) for _ in range(counts[u] * counts[v])] for u, v in pairs]
    return Problem.from_lists(intervals=[(0, 1)] * nodes, costs=costs, usages=[[0] * c for c in counts],
                              edges=pairs, edge_costs=edge_costs, usage_limit=None)


@settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(problem=dense_problems())
def test_every_assignment_costs_at_least_the_bound_plus_the_slack_of_each_strategy_it_uses(problem):
    found = dual_bound(problem)
    priced = [(a, c) for a, c in _assignments(problem) if c is not None]
    if found is None:  # no assignment avoids the forbidden
        assert not priced
        return
    tolerance = 1e-7 * max(1.0, abs(found.bound))
    for assignment, cost in priced:
        assert found.bound <= cost + tolerance
        for v, s in enumerate(assignment):
            assert found.bound + found.slack[v][s] <= cost + tolerance, (v, s, cost, found)


@settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(problem=dense_problems())
def test_the_solve_through_the_bound_finds_the_cheapest_assignment_every_enumeration_finds(problem):
    priced = [c for _, c in _assignments(problem) if c is not None]
    got = ilp._solve_by_dual(problem, time_limit=None)
    if not priced:
        assert got is None or got.cost is None
        return
    if got is None:  # handed back (every strategy left): solved whole
        got = ilp.solve(problem)
    assert got.status == "optimal" and got.gap == 0.0
    assert got.cost == pytest.approx(min(priced)) == evaluate(problem, got.strategies)
    assert ilp.solve(problem).cost == pytest.approx(min(priced))


def _random_core(nodes: int, strategies: int, degree: int, seed: int, most: int = 400) -> Problem:
    """A random graph whose nodes all have ``degree`` neighbours or more (nothing the shrinking eliminates), its
    matrices the bytes of moving between random layouts (zero on agreeing ones), a few pairs forbidden, its node costs
    below ``most`` (the dearer the nodes against the moves, the tighter the relaxation)."""
    rng = np.random.default_rng(seed)
    layouts = rng.integers(0, 6, size=(nodes, strategies))
    pairs = {(v, int(w)) for v in range(nodes) for w in rng.choice(nodes, degree, replace=False) if w != v}
    edges = sorted({(min(p), max(p)) for p in pairs})
    sizes = rng.integers(1, 50, size=nodes) * 64
    matrices = []
    for u, v in edges:
        m = np.where(layouts[u][:, None] == layouts[v][None, :], 0, sizes[u]).astype(float)
        m[rng.random(m.shape) < 0.05] = FORBIDDEN
        matrices.append(m.ravel())
    costs = rng.integers(0, most, size=(nodes, strategies))
    return Problem.from_lists(intervals=[(0, 1)] * nodes, costs=costs, usages=np.zeros((nodes, strategies)),
                              edges=edges, edge_costs=matrices, usage_limit=None)


@pytest.mark.parametrize("seed, restricted_solves", [(0, 2), (2, 1), (3, 1)])
def test_on_larger_problems_it_returns_the_whole_integer_programs_optimum_without_running_it(
        seed, restricted_solves, monkeypatch):
    """Seed 0's first restricted solve costs more than the bound: the strategies within the difference are solved
    too; seeds 2 and 3 meet the bound at once."""
    problem = _random_core(60, 6, 4, seed, most=40000)
    core = shrink(problem).problem
    want = ilp._solve_core(problem, time_limit=None, relative_gap=0.0)
    sizes, routed, restricted = [], [], []
    whole, route, restrict = ilp._solve_core, ilp._solve_by_dual, ilp._restricted_solve
    monkeypatch.setattr(ilp, "_solve_core", lambda p, **kw: (sizes.append(p.strategy_count), whole(p, **kw))[1])
    monkeypatch.setattr(ilp, "_solve_by_dual", lambda p, **kw: (routed.append(route(p, **kw)), routed[-1])[1])
    monkeypatch.setattr(ilp, "_restricted_solve", lambda *a, **kw: (restricted.append(1), restrict(*a, **kw))[1])
    got = ilp.solve(problem)
    assert got.status == "optimal" and got.cost == pytest.approx(want.cost) and got.gap == 0.0
    assert evaluate(problem, got.strategies) == pytest.approx(want.cost)
    assert routed and routed[0] is not None and len(restricted) == restricted_solves
    assert all(n < core.strategy_count for n in sizes), (sizes, core.strategy_count)  # restricted cores only


def test_where_the_bound_leaves_every_strategy_the_problem_is_handed_back_whole():
    problem = shrink(_random_core(60, 6, 4, 1, most=40000)).problem
    assert ilp._solve_by_dual(problem, time_limit=None) is None
    assert ilp.solve(problem).cost == ilp._solve_core(problem, time_limit=None, relative_gap=0.0).cost


def test_where_the_bound_leaves_most_strategies_those_are_solved_not_the_whole(monkeypatch):
    # 265 of 316 strategies within the first answer's difference from the bound: far fewer pairs of them than the
    # whole program has (the columns a relaxation pays for), and every optimum among them
    problem = shrink(_random_core(60, 6, 4, 10, most=10000)).problem
    want = ilp._solve_core(problem, time_limit=None, relative_gap=0.0)
    sizes, whole = [], ilp._solve_core
    monkeypatch.setattr(ilp, "_solve_core", lambda p, **kw: (sizes.append(p.strategy_count), whole(p, **kw))[1])
    got = ilp._solve_by_dual(problem, time_limit=None)
    assert got is not None and got.status == "optimal" and got.cost == pytest.approx(want.cost)
    assert evaluate(problem, got.strategies) == pytest.approx(want.cost)
    assert sizes and max(sizes) < problem.strategy_count and 2 * max(sizes) > problem.strategy_count


def test_edges_each_allowing_what_their_sum_forbids_leave_the_bound_finite():
    """Two edges between the same nodes, either way round: each allows every row and column, their sum forbids a
    strategy of node 0 with every one of node 1's — it is dropped before the passes (no infinity less infinity)."""
    problem = Problem.from_lists(intervals=[(0, 1)] * 2, costs=[[0, 5], [1, 0]], usages=[[0, 0], [0, 0]],
                                 edges=[(0, 1), (1, 0)], edge_costs=[[0, 0, 0, FORBIDDEN], [0, FORBIDDEN, 0, 0]],
                                 usage_limit=None)
    with np.errstate(all="raise"):
        found = dual_bound(problem)
    assert found.bound == 0.0 and np.isinf(found.slack[0][1]) and list(found.slack[1]) == [1.0, 0.0]
    assert evaluate(problem, (0, 1)) == 0 and ilp._solve_by_dual(problem, time_limit=None).cost == 0


def test_a_small_core_is_solved_whole(monkeypatch):
    monkeypatch.setattr(ilp, "DUAL_AT_LEAST", 151)
    assert ilp._solve_by_dual(_random_core(30, 5, 3, 0), time_limit=None) is None  # 150 strategies


def test_under_a_usage_limit_the_bound_is_not_the_route():
    problem = _random_core(12, 3, 3, 0)
    limited = Problem(problem.name, problem.intervals, problem.costs, problem.usages, problem.edges,
                      problem.edge_costs, 1.0)
    assert ilp._solve_by_dual(limited, time_limit=None) is None


def test_a_searched_stack_of_blocks_is_proved_through_the_bound_and_equals_the_unsharded_step(monkeypatch):
    program, proved, args = searched_stack(monkeypatch, "_solve_by_dual", 2)
    assert proved == [True] and program.search.certificate == "optimal"
    assert_equals_unsharded(program, args)


def test_a_bound_stopped_short_is_a_bound_still():
    problem = _random_core(30, 5, 3, 1)
    best = ilp._solve_core(problem, time_limit=None, relative_gap=0.0)
    found = dual_bound(problem, max_sweeps=0)
    assert found.sweeps == 0 and found.bound <= best.cost
    assert all(found.bound + found.slack[v][s] <= best.cost + 1e-6 for v, s in enumerate(best.strategies))
