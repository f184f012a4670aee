"""``shardprop.search.reduce``: shrinking a problem keeps its optimum (against trying every assignment), and the
dominance it prunes by sees past a strategy dearer on one edge and cheaper on another."""

import numpy as np
from hypothesis import HealthCheck, given, settings

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
