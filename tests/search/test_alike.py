"""Layers alike solved once (``shardprop/search/alike.py`` and ``ilp._solve_alike``): on random stacks of a random
block (the blocks chained, a head apart, now and then one block's node changed), under classes of any refinement, the
aggregated program's optimum is at most the minimum found by trying every assignment, and the alike solve returns
that minimum (through the strategies the program uses, then those its reduced costs leave); on a stack whose core
repeats, the whole core's integer program is never run; a searched stack of blocks equals the unsharded step."""

import itertools

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardprop.search import ilp
from shardprop.search.alike import aggregated_lp, alike_classes
from shardprop.search.problem import Problem, evaluate
from tests.search.stacks import assert_equals_unsharded, searched_stack


def _enumerated(problem: Problem) -> float:
    """The least cost of any assignment, by trying every one (the oracle)."""
    return min(evaluate(problem, a) for a in itertools.product(*(range(len(c)) for c in problem.costs)))


def _stacked(block_costs, inner, link, blocks: int, head, changed: int | None) -> Problem:
    """``blocks`` copies of a block (its nodes' ``block_costs``, its ``inner`` edges ``(u, v, matrix)``), block
    ``i``'s last node linked to block ``i + 1``'s first by ``link``, a head node (``head``: its costs and matrix)
    feeding the first block; node 0 of block ``changed`` costs one more in its first strategy."""
    k = len(block_costs)
    costs, edges, matrices = [], [], []
    for b in range(blocks):
        costs += [list(c) for c in block_costs]
        edges += [(b * k + u, b * k + v) for u, v, _ in inner]
        matrices += [m for _, _, m in inner]
        if b:
            edges.append((b * k - 1, b * k))
            matrices.append(link)
    if changed is not None:
        costs[changed * k][0] += 1
    if head is not None:
        costs.append(list(head[0]))
        edges.append((len(costs) - 1, 0))
        matrices.append(head[1])
    n = len(costs)
    return Problem.from_lists(intervals=[(0, 1)] * n, costs=costs, usages=[[0] * len(c) for c in costs],
                              edges=edges, edge_costs=matrices, usage_limit=None)


@st.composite
def stacks(draw) -> Problem:
    k = draw(st.integers(1, 3))
    counts = [draw(st.integers(1, 3)) for _ in range(k)]
    money = st.integers(0, 9)
    block_costs = [[draw(money) for _ in range(c)] for c in counts]
    prices = st.sampled_from([0, 0, 1, 4, 9])
    pairs = draw(st.lists(st.tuples(st.integers(0, k - 1), st.integers(0, k - 1)).filter(lambda t: t[0] != t[1]),
                          max_size=3))
    inner = [(u, v, [draw(prices) for _ in range(counts[u] * counts[v])]) for u, v in pairs]
    link = [draw(prices) for _ in range(counts[-1] * counts[0])]
    blocks = draw(st.integers(2, max(2, 8 // k)))
    head = None
    if draw(st.booleans()):
        head_count = draw(st.integers(1, 3))
        head = ([draw(money) for _ in range(head_count)], [draw(prices) for _ in range(head_count * counts[0])])
    changed = draw(st.one_of(st.none(), st.integers(0, blocks - 1)))
    return _stacked(block_costs, inner, link, blocks, head, changed)


@settings(max_examples=80, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(problem=stacks(), rounds=st.integers(0, 2))
def test_the_aggregated_bound_is_at_most_the_least_cost_and_an_alike_solve_is_the_least_cost(problem, rounds):
    # any classes of nodes with equal costs give a bound (fewer rounds: coarser classes, more nodes kept apart)
    want = _enumerated(problem)
    classes = alike_classes(problem, rounds)
    for v in range(problem.node_count):  # a class's nodes are alike: the program prices them by one of them
        first = int(np.flatnonzero(classes == classes[v])[0])
        assert np.array_equal(problem.costs[v], problem.costs[first])
    lp = aggregated_lp(problem, classes)
    bounded = ilp._highs(lp.objective, lp.blocks, lp.upper, None, time_limit=None, options=ilp._RELAXATION)
    assert bounded.status == "optimal"
    assert bounded.bound <= want + 1e-6, (bounded.bound, want)
    solved = ilp._solve_through(problem, classes, time_limit=None)
    assert solved is not None and solved.status == "optimal" and solved.cost == pytest.approx(want), (solved, want)
    assert evaluate(problem, solved.strategies) == pytest.approx(want) and solved.bound <= want + 1e-6
    assert ilp.solve(problem).cost == pytest.approx(want)


def _ring_block_stack(blocks: int, seed: int) -> Problem:
    """Blocks of a 4-node ring (every node of three neighbours or more once linked: elimination leaves them)."""
    rng = np.random.default_rng(seed)
    block_costs = [list(rng.integers(0, 20, 4)) for _ in range(4)]
    inner = [(u, (u + 1) % 4, list(rng.choice([0, 0, 3, 8, 20], 16))) for u in range(4)] + \
        [(0, 2, list(rng.choice([0, 5, 12], 16)))]
    return _stacked(block_costs, inner, list(rng.choice([0, 0, 6, 15], 16)), blocks, None, None)


def test_a_core_that_repeats_is_proved_optimal_without_its_whole_integer_program(monkeypatch):
    """The route through the classes, on a ring of alike blocks (asked directly: ``solve`` shrinks this one away
    before any bound is needed): HiGHS's optimum of the whole, found solving only restricted problems far smaller."""
    problem = _ring_block_stack(40, seed=3)
    classes = alike_classes(problem)
    assert (classes.max() + 1) * ilp.ALIKE_AT_LEAST <= problem.node_count  # it repeats enough to be tried
    want = ilp._solve_core(problem, time_limit=None, relative_gap=0.0)
    sizes = []
    core = ilp._solve_core

    def recorded(p, **kw):
        sizes.append(p.node_count)
        return core(p, **kw)

    monkeypatch.setattr(ilp, "_solve_core", recorded)
    got = ilp._solve_alike(problem, time_limit=None)
    assert got is not None and got.status == "optimal" and got.cost == want.cost and got.gap == 0.0
    assert all(n < problem.node_count // 2 for n in sizes), sizes  # only the restricted problem's small core
    assert ilp.solve(problem).cost == want.cost


@pytest.mark.slow
def test_a_searched_stack_of_blocks_equals_the_unsharded_step(monkeypatch):
    monkeypatch.setattr(ilp, "ALIKE_AT_LEAST", 2)  # four blocks: tried (by default, from about eight)
    monkeypatch.setattr(ilp, "DUAL_AT_LEAST", 10 ** 9)  # (tried first, where the core is large enough)
    program, proved, args = searched_stack(monkeypatch, "_solve_alike", 4)
    assert proved and proved[0], "the stack's core was not proved through its alike blocks"
    assert program.search.certificate == "optimal"
    got = assert_equals_unsharded(program, args)
    assert jnp.isfinite(got[1])
