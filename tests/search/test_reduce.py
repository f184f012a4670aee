"""``shardprop.search.reduce``: shrinking a problem keeps its optimum (against trying every assignment), and the
dominance it prunes by sees past a strategy dearer on one edge and cheaper on another."""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardprop.search.problem import Problem, evaluate
from shardprop.search.reduce import prune, shrink
from tests.search.test_ilp import _enumerated, problems


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(problem=problems())
def test_shrinking_keeps_the_optimum_and_recovers_an_optimal_assignment(problem):
    want, _ = _enumerated(problem)
    shrunk = shrink(problem)
    core_cost, core_assignment = _enumerated(shrunk.problem)
    if want is None:
        assert core_cost is None
        return
    assert core_cost + shrunk.offset == want
    assert evaluate(problem, shrunk.recover(core_assignment)) == want


def test_a_strategy_dearer_whatever_the_neighbours_choose_is_pruned():
    """Node 0's strategy 1 is cheaper than strategy 0 with one of node 1's strategies (by 1) and dearer with every
    strategy of node 2 (by 5 at least): price by price neither is below the other, yet strategy 0 is no dearer
    whatever the neighbours choose."""
    p = Problem.from_lists(intervals=[(0, 1)] * 3, costs=[[0, 0], [0, 0], [0, 0]], usages=[[0, 0]] * 3,
                           edges=[(0, 1), (0, 2)], edge_costs=[[1, 0, 0, 0], [0, 0, 5, 6]], usage_limit=None)
    assert prune(p).kept[0].tolist() == [0]  # (and then its neighbours' choices are plain: one each)
    # under a limit, a strategy holding more is never taken for one holding less
    limited = Problem.from_lists(intervals=[(0, 1)] * 3, costs=[[0, 0], [0, 0], [0, 0]],
                                 usages=[[9, 1], [0, 0], [0, 0]], edges=[(0, 1), (0, 2)],
                                 edge_costs=[[1, 0, 0, 0], [0, 0, 5, 6]], usage_limit=20)
    assert [k.tolist() for k in prune(limited).kept][0] == [0, 1]


def test_shrinking_goes_round_while_pruning_leaves_more_to_eliminate():
    """A triangle with a pendant: pruning leaves node 0 one strategy, which eliminating then folds away, and the
    rest with it; one round of each would have left the triangle."""
    costs = [[0, 9], [0, 1], [0, 1], [0, 1]]
    edges = [(0, 1), (1, 2), (2, 0), (0, 3)]
    equal = [0, 3, 3, 0]
    p = Problem.from_lists(intervals=[(0, 1)] * 4, costs=costs, usages=[[0, 0]] * 4, edges=edges,
                           edge_costs=[equal] * 4, usage_limit=None)
    shrunk = shrink(p)
    assert shrunk.problem.node_count == 0 and len(shrunk.steps) >= 1
    assert evaluate(p, shrunk.recover(())) == _enumerated(p)[0] == 0
    assert np.isclose(shrunk.offset, 0)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_the_compiled_pruning_drops_exactly_the_strategies_numpy_drops(data):
    """``_dominated`` (compiled, a bound ruling pairs out before their margins are summed) against ``_undominated``
    (numpy, every margin summed): the same survivors, with usages or without, forbidden prices among them, and ties."""
    from shardprop.search.problem import FORBIDDEN
    from shardprop.search.reduce import _undominated, _undominated_compiled

    n = data.draw(st.integers(1, 7))
    price = st.sampled_from([0.0, 1.0, 2.0, 3.0, 0.5, FORBIDDEN, np.inf])
    cost = np.array(data.draw(st.lists(price, min_size=n, max_size=n)))
    usage = data.draw(st.none() | st.lists(st.sampled_from([0.0, 1.0, 2.0]), min_size=n, max_size=n))
    usage = None if usage is None else np.array(usage)
    blocks = [np.array(data.draw(st.lists(price, min_size=n * w, max_size=n * w))).reshape(n, w)
              for w in data.draw(st.lists(st.integers(1, 5), max_size=3))]
    with np.errstate(invalid="ignore"):  # (inf - inf: the NaN both must treat alike)
        assert np.array_equal(_undominated_compiled(cost, usage, blocks), _undominated(cost, usage, blocks))


def test_large_problems_are_pruned_compiled_and_small_ones_in_numpy(monkeypatch):
    """The pruning's choice of kernel is by the problem's size (``COMPILED_AT_LEAST``): the answer is the same."""
    import shardprop.search.reduce as reduce

    problem = _enumerated_free_problem()
    called = []
    monkeypatch.setattr(reduce, "_undominated_compiled", lambda *a: called.append(a) or reduce._undominated(*a))
    small = prune(problem)
    assert not called
    monkeypatch.setattr(reduce, "COMPILED_AT_LEAST", 1)
    large = prune(problem)
    assert called and [k.tolist() for k in large.kept] == [k.tolist() for k in small.kept]


def _enumerated_free_problem() -> Problem:
    return Problem.from_lists(intervals=[(0, 3)] * 3, costs=[[1, 3, 1], [2, 0], [0, 0]], usages=[[1, 1, 1], [1, 1],
                              [1, 2]], edges=[(0, 1), (1, 2)], edge_costs=[[0, 5, 5, 0, 0, 5], [1, 1, 0, 2]],
                              usage_limit=None)
