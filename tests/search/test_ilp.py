"""The layout choice as an integer program (``shardprop/search/problem.py``, ``shardprop/search/ilp.py``): on random
small problems the solver's assignment costs exactly the minimum found by trying every assignment (priced by
``evaluate``, written apart from the solver), within the usage limit, and the bound it states is at most that
minimum; the contest's own example (google/iopddl's ``example.json``, Apache-2.0, in ``data/``) solves to the cost
enumeration finds."""

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardprop.errors import OptionError
from shardprop.search.ilp import solve
from shardprop.search.problem import Problem, evaluate, least_peak, peak_usage, read_problem

EXAMPLE = Path(__file__).parent / "data" / "iopddl_example.json"


def _enumerated(problem: Problem) -> tuple[float | None, tuple | None]:
    """The cheapest feasible assignment by trying every one (the oracle)."""
    best = (None, None)
    for assignment in itertools.product(*(range(len(c)) for c in problem.costs)):
        cost = evaluate(problem, assignment)
        if cost is not None and (best[0] is None or cost < best[0]):
            best = (cost, assignment)
    return best


@st.composite
def problems(draw) -> Problem:
    nodes = draw(st.integers(1, 6))
    counts = [draw(st.integers(1, 3)) for _ in range(nodes)]
    starts = [draw(st.integers(0, 8)) for _ in range(nodes)]
    intervals = [(s, s + draw(st.integers(0, 5))) for s in starts]
    money = st.integers(0, 20)
    costs = [[draw(money) for _ in range(k)] for k in counts]
    usages = [[draw(st.integers(0, 10)) for _ in range(k)] for k in counts]
    pairs = draw(st.lists(st.tuples(st.integers(0, nodes - 1), st.integers(0, nodes - 1)), max_size=8))
    edge_costs = [[draw(st.sampled_from([0, 0, 1, 7, 30])) for _ in range(counts[u] * counts[v])] for u, v in pairs]
    limit = draw(st.one_of(st.none(), st.integers(0, 40)))
    return Problem.from_lists(intervals=intervals, costs=costs, usages=usages, edges=pairs, edge_costs=edge_costs,
                              usage_limit=limit)


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(problem=problems())
def test_the_solver_finds_the_cheapest_assignment_every_enumeration_finds(problem):
    want, _ = _enumerated(problem)
    got = solve(problem)
    if want is None:
        assert got.cost is None and got.status == "infeasible", got
        return
    assert got.status == "optimal", got
    assert got.cost == pytest.approx(want), (got, want)
    assert evaluate(problem, got.strategies) == pytest.approx(want)
    assert got.bound <= want + 1e-6 and got.gap == 0.0
    if problem.usage_limit is not None:
        assert peak_usage(problem, got.strategies) <= problem.usage_limit


def test_the_contest_example_solves_to_its_optimum():
    problem = read_problem(EXAMPLE)
    want, assignment = _enumerated(problem)
    got = solve(problem)
    assert (got.cost, got.strategies, got.status) == (want, assignment, "optimal") == (445, (0, 0, 2, 1, 0), "optimal")
    assert got.summary().startswith("optimal: cost 445 (")


def test_usage_is_live_over_half_open_intervals():
    # [0, 2) and [2, 4) never overlap: both may take their large strategy under a limit of one of them
    problem = Problem.from_lists(intervals=[(0, 2), (2, 4)], costs=[[0, 5], [0, 5]], usages=[[10, 1], [10, 1]],
                                 edges=[], edge_costs=[], usage_limit=10)
    assert peak_usage(problem, (0, 0)) == 10
    assert solve(problem).strategies == (0, 0)
    overlapping = Problem.from_lists(intervals=[(0, 3), (2, 4)], costs=[[0, 5], [0, 6]], usages=[[10, 1], [10, 1]],
                                     edges=[], edge_costs=[], usage_limit=11)
    assert solve(overlapping).strategies == (1, 0)  # one of them small: the cheaper one to shrink


def test_a_problem_file_that_is_not_one_says_so(tmp_path):
    path = tmp_path / "nothing.json"
    path.write_text(json.dumps({"graph": {}}))
    with pytest.raises(OptionError, match="not an IOPDDL problem file"):
        read_problem(path)
    with pytest.raises(OptionError, match="node 0 has 2 costs and 1 usages"):
        Problem.from_lists(intervals=[(0, 1)], costs=[[1, 2]], usages=[[1]], edges=[], edge_costs=[],
                           usage_limit=None)


def test_a_stopped_solve_states_its_bound_and_gap():
    rng = np.random.default_rng(0)
    nodes, k = 60, 4
    pairs = [(v, w) for v in range(nodes) for w in (v + 1, v + 7) if w < nodes]
    problem = Problem.from_lists(intervals=[(v, v + 10) for v in range(nodes)],
                                 costs=rng.integers(0, 100, (nodes, k)).tolist(),
                                 usages=rng.integers(1, 10, (nodes, k)).tolist(), edges=pairs,
                                 edge_costs=rng.integers(0, 100, (len(pairs), k * k)).tolist(), usage_limit=45)
    got = solve(problem, time_limit=0.05)
    assert got.bound <= (got.cost if got.cost is not None else np.inf)
    if got.status != "optimal" and got.cost is not None:
        assert "of the bound" in got.summary() and got.gap > 0


def test_of_equal_optima_differing_at_one_node_the_first_strategy_is_chosen():
    """Where optima cost alike (a bias laid out two ways at one price) which one the solver returns is its own affair;
    each node then takes its leanest strategy, the first of equals, that costs no more with its neighbours as chosen,
    so the answer does not depend on it."""
    from shardprop.search.canonical import canonical

    problem = Problem.from_lists(intervals=[(0, 1), (0, 1), (0, 1)], costs=[[1, 0], [2, 2], [3, 3]],
                                 usages=[[0, 0], [0, 0], [0, 0]], edges=[(0, 1), (1, 2)],
                                 edge_costs=[[0, 0, 7, 0], [0, 0, 0, 0]], usage_limit=None)
    optima = [a for a in itertools.product(range(2), repeat=3) if evaluate(problem, a) == _enumerated(problem)[0]]
    assert len(optima) > 1 and {canonical(problem, a) for a in optima} == {(1, 1, 0)}
    assert solve(problem).strategies == (1, 1, 0)


def test_of_equal_optima_the_one_holding_least_is_chosen():
    """Two layouts at one price, one holding twice the bytes: the leaner, whichever the solver found (with a limit
    too: a node only ever moves to a strategy holding no more, so no moment's usage grows)."""
    from shardprop.search.canonical import canonical

    for limit in (None, 10):
        problem = Problem.from_lists(intervals=[(0, 2), (1, 3)], costs=[[5, 5], [1, 4]], usages=[[4, 2], [3, 3]],
                                     edges=[(0, 1)], edge_costs=[[0, 0, 0, 0]], usage_limit=limit)
        assert canonical(problem, (0, 0)) == canonical(problem, (1, 0)) == (1, 0)
        assert solve(problem).strategies == (1, 0)
        assert peak_usage(problem, (1, 0)) <= peak_usage(problem, (0, 0))


def test_of_optima_tied_only_together_the_one_holding_least_is_chosen():
    """Four nodes that must agree (a kernel, its two moments and the gradient reading them: the README's NNX example),
    all laid out one way or all the other at one price, the other way holding a fifth of the bytes. No node alone
    can move (``canonical``: each move breaks an agreement) and neither way dominates the other: among the
    relaxation's optima, the one holding least is taken (``_leanest_optimum``), whichever the simplex ended at."""
    from shardprop.search.canonical import canonical

    agree = [0, 5, 5, 0]
    for usages in ([[10, 2]] * 4, [[2, 10]] * 4):
        problem = Problem.from_lists(intervals=[(0, 1)] * 4, costs=[[0, 0]] * 4, usages=usages,
                                     edges=list(itertools.combinations(range(4), 2)), edge_costs=[agree] * 6,
                                     usage_limit=None)
        lean = (1,) * 4 if usages[0][1] < usages[0][0] else (0,) * 4
        fat = tuple(1 - s for s in lean)
        assert canonical(problem, fat) == fat  # the local pass cannot find it
        got = solve(problem)
        assert got.strategies == lean and got.cost == 0 and got.status == "optimal"


def test_the_leanest_optimum_keeps_to_the_usage_limit():
    """Of two optima tied only together, the one holding fewer bytes summed holds more at one moment, over the
    limit: the leanest is taken only within it (``_leanest_optimum`` minimises the sum; the limit is a peak)."""
    agree = [0, 5, 5, 0]
    heavy_early, even = [6, 6, 0.5, 0.5], [4, 4, 3, 3]  # summed 13 (peak 12) and 14 (peak 8)
    for flipped in (False, True):
        usages = [[b, a] if flipped else [a, b] for a, b in zip(heavy_early, even, strict=True)]
        problem = Problem.from_lists(intervals=[(0, 1), (0, 1), (1, 2), (1, 2)], costs=[[0, 0]] * 4, usages=usages,
                                     edges=list(itertools.combinations(range(4), 2)), edge_costs=[agree] * 6,
                                     usage_limit=10)
        got = solve(problem)
        assert got.cost == 0 and peak_usage(problem, got.strategies) <= 10


def test_the_presolve_reduction_timed_by_the_clock_is_the_one_switched_off(tmp_path):
    """HiGHS stops its search for dependent equations when it expects it to run long, by the clock: under load the
    presolved LP differed and the Llama step's search chose another of its equal optima on a second run (CI). The
    option bit that switches it off must name that rule in the HiGHS installed (its rule numbering moves between
    releases): HiGHS's own log says which rules an option switched off."""
    import highspy

    from shardprop.search.ilp import _DETERMINISTIC

    log = tmp_path / "highs.log"
    h = highspy._core._Highs()
    for name, value in {**_DETERMINISTIC, "output_flag": True, "log_to_console": False,
                        "log_file": str(log)}.items():
        assert h.setOptionValue(name, value) == highspy.HighsStatus.kOk
    h.addVars(2, np.zeros(2), np.ones(2))
    h.addRow(1.0, 1.0, 2, np.arange(2, dtype=np.int32), np.ones(2))
    h.run()
    h.setOptionValue("log_file", "")  # (closes the log)
    switched_off = log.read_text().split("Presolve rules switched off:", 1)[1].splitlines()
    assert "Dependent equations" in switched_off[1], switched_off[:3]
    assert "Rule" not in switched_off[2], "one rule only: the others keep their reductions"


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_the_leanest_pass_visits_only_nodes_that_can_move_and_ends_where_visiting_all_does(data):
    """``canonical`` skips the nodes with no strategy leaner than their own (nor one as lean and earlier): the answer
    is the one a pass over every node gives (oracle: that pass, written out here) on random problems."""
    import numpy as np

    from shardprop.search.canonical import canonical
    from shardprop.search.problem import Problem

    n = data.draw(st.integers(1, 6))
    sizes = [data.draw(st.integers(1, 4)) for _ in range(n)]
    small = st.integers(0, 3)
    costs = [np.array(data.draw(st.lists(small, min_size=k, max_size=k)), float) for k in sizes]
    usages = [np.array(data.draw(st.lists(small, min_size=k, max_size=k)), float) for k in sizes]
    edges = [(u, v) for u in range(n) for v in range(u + 1, n) if data.draw(st.booleans())]
    matrices = [np.array(data.draw(st.lists(small, min_size=sizes[u] * sizes[v], max_size=sizes[u] * sizes[v])),
                         float).reshape(sizes[u], sizes[v]) for u, v in edges]
    problem = Problem("random", np.array([(0, n + 1)] * n), tuple(costs), tuple(usages),
                      np.array(edges, np.int64).reshape(-1, 2), tuple(matrices), None)
    start = tuple(data.draw(st.integers(0, k - 1)) for k in sizes)

    chosen = list(start)
    for v in range(n):  # every node in turn: the cheapest-or-as-cheap, leanest, first
        total = costs[v].copy()
        for (u, w), m in zip(edges, matrices, strict=True):
            if u == v:
                total += m[:, chosen[w]]
            elif w == v:
                total += m[chosen[u], :]
        fits = np.flatnonzero((total <= total[chosen[v]] + 1e-9 * max(1.0, abs(total[chosen[v]])))
                              & (usages[v] <= usages[v][chosen[v]]))
        chosen[v] = int(fits[np.argmin(usages[v][fits])])
    assert canonical(problem, start) == tuple(chosen)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(problem=problems())
def test_the_least_peak_is_the_least_any_assignment_holds(problem):
    """``least_peak`` (each node at its leanest) is the smallest peak usage of every assignment, enumerated."""
    every = itertools.product(*(range(len(c)) for c in problem.costs))
    assert least_peak(problem) == min(peak_usage(problem, a) for a in every)


def test_a_limit_below_the_least_peak_is_infeasible_without_a_solve(monkeypatch):
    """Each node at its leanest breaks the limit: nothing fits, said at once (an unseen Mixer block's calibrated limit
    took HiGHS 9 s to refuse)."""
    import shardprop.search.ilp as ilp

    problem = Problem.from_lists(intervals=[(0, 2), (1, 3)], costs=[[0, 1], [0, 1]], usages=[[8, 5], [9, 4]],
                                 edges=[(0, 1)], edge_costs=[[0, 1, 1, 0]], usage_limit=8)
    assert least_peak(problem) == 9 and _enumerated(problem) == (None, None)
    monkeypatch.setattr(ilp, "_highs", lambda *a, **k: pytest.fail("HiGHS was run"))
    monkeypatch.setattr(ilp, "relaxed", lambda *a, **k: pytest.fail("the limit was priced"))
    got = solve(problem)
    assert got.cost is None and got.status == "infeasible"
