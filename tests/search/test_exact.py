"""The solve over every value's layout (``shardprop/search/build.py``, ``realize.py``) against oracles written apart
from it: on tiny programs every assignment of the ``sp.AUTO`` arguments' layouts is priced through the fixed-spec
pipeline (propagate with its backward pass, split, the cost model) — the solve's plan is no dearer than the cheapest
of them, it is realized exactly (every node consumes and holds what the solution chose, the plan's price is the
solution's), and the program it builds returns what the unsharded function returns."""

import itertools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import shardprop as sp
from shardprop.mesh import as_auto_mesh
from shardprop.program import lower
from shardprop.search import AUTO, candidate_specs
from shardprop.search.build import build_problem
from shardprop.search.ilp import solve
from shardprop.search.problem import FORBIDDEN, evaluate
from shardprop.search.realize import mismatches, realize
from shardprop.splitting import split
from shardprop.splitting.cost import price


def _mlp(w1, w2, x):
    return jax.grad(lambda w1, w2: jnp.mean(jnp.tanh(x @ w1) @ w2) ** 2, (0, 1))(w1, w2)


def _self_product(x):
    return jax.grad(lambda x: jnp.sum((x.T @ x) ** 2))(x)


def _broadcast_chain(a, b, v):
    return jnp.sum(jnp.exp(a + v[None, :]) * b, axis=0) + (a @ b.T).sum()


def _attention(q, k, v):
    s = jax.nn.softmax(q @ k.T / 4.0, axis=-1)
    return (s @ v).sum(axis=0)


rng = np.random.default_rng(0)
CASES = {
    "mlp gradient": (_mlp, (rng.normal(size=(16, 32)), rng.normal(size=(32, 8)), rng.normal(size=(8, 16))),
                     (AUTO, AUTO, P("i"))),
    "self-product gradient": (_self_product, (rng.normal(size=(8, 16)),), (AUTO,)),
    "broadcast chain": (_broadcast_chain, (rng.normal(size=(16, 8)), rng.normal(size=(16, 8)), rng.normal(size=8)),
                        (AUTO, P("i"), AUTO)),
    "attention": (_attention, (rng.normal(size=(16, 8)), rng.normal(size=(16, 8)), rng.normal(size=(16, 8))),
                  (P("i"), AUTO, AUTO)),
}


MESHES = {"8": ((8,), ("i",)), "4x2": ((4, 2), ("i", "j"))}


@pytest.mark.parametrize("mesh_name", sorted(MESHES))
@pytest.mark.parametrize("name", sorted(CASES))
def test_the_solve_is_no_dearer_than_any_assignment_the_pipeline_prices(name, mesh_name):
    mesh = sp.make_mesh(*MESHES[mesh_name])
    f, args, specs = CASES[name]
    args = tuple(np.asarray(a, np.float32) for a in args)
    graph = sp.trace(f, *args)
    flat = list(specs)
    built = build_problem(graph, flat, as_auto_mesh(mesh))
    solution = solve(built.problem)
    assert solution.status == "optimal"
    sharded = realize(built, solution.strategies, as_auto_mesh(mesh))
    assert mismatches(built, solution.strategies, sharded) == []
    plan = split(sharded)
    assert price(plan) <= solution.cost * (1 + 1e-9) == pytest.approx(evaluate(built.problem, solution.strategies))
    searched = [k for k, s in enumerate(flat) if s is AUTO]
    options = [candidate_specs(args[k].shape, dict(mesh.shape)) for k in searched]
    cheapest = float("inf")
    for choice in itertools.product(*options):
        trial = list(flat)
        for k, spec in zip(searched, choice, strict=True):
            trial[k] = spec
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (a conflict between the trial's layouts is resolved: priced)
            pipeline = split(sp.propagate(graph, tuple(trial), mesh=mesh))
        cheapest = min(cheapest, price(pipeline))
    assert price(plan) <= cheapest * (1 + 1e-9), (price(plan), cheapest)
    program = lower(plan, mesh)
    for got, want in zip(jax.tree_util.tree_leaves(program(*args)), jax.tree_util.tree_leaves(jax.jit(f)(*args)),
                         strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5, atol=2e-5)


def test_a_contraction_finished_by_a_collective_reads_a_value_it_takes_twice_alike():
    """``x @ x`` finished by a psum: a strategy consuming ``x`` otherwise on each side (its contracting axis is the
    first operand's second and the second's first) cannot be realized as decided — the finish reads one value in one
    layout — so every pairing with it is forbidden. The solve's plan is realized exactly and computes the unsharded
    product."""
    mesh = as_auto_mesh(sp.make_mesh((4, 2), ("i", "j")))
    x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8)
    graph = sp.trace(lambda x: x @ x, x)
    built = build_problem(graph, [AUTO], mesh)
    dot = next(n for n in graph.nodes if n.op == "dot_general")
    assert dot.operands[0] == dot.operands[1]
    strategies = built.menus[dot.id]
    apart = [k for k, s in enumerate(strategies) if s.collective is not None and s.handed[0] != s.handed[1]]
    assert apart
    (edge,) = [m for m, (u, v) in zip(built.problem.edge_costs, built.problem.edges.tolist(), strict=True)
               if v == dot.id]
    assert (edge[:, apart] >= FORBIDDEN).all() and (edge[:, [k for k in range(len(strategies)) if k not in apart]]
                                                     < FORBIDDEN).any()
    solution = solve(built.problem)
    sharded = realize(built, solution.strategies, mesh)
    assert mismatches(built, solution.strategies, sharded) == []
    plan = split(sharded)
    assert price(plan) <= solution.cost * (1 + 1e-9)
    np.testing.assert_allclose(np.asarray(lower(plan, mesh)(x)), x @ x, rtol=1e-5, atol=1e-5)


def _gram(xs, w):
    return jax.lax.scan(lambda a, x: (a + x.T @ jnp.tanh(x @ w), None), jnp.zeros_like(w), xs)[0]


def test_a_loop_whose_sums_wait_is_realized_only_where_its_operands_are_held_as_handed():
    """A scan summing ``x.T @ tanh(x @ w)`` over steps whose batch lies over ``i``: a strategy whose sums the loop
    keeps out of its body (one psum after it) is decided on the bodies as the loop was handed its operands
    (``NodeStrategy.tied``): every pairing with another held layout is forbidden. The solve's plan is realized
    exactly and equals the unsharded result."""
    mesh = as_auto_mesh(sp.make_mesh((4, 2), ("i", "j")))
    rng = np.random.default_rng(0)
    args = (rng.normal(size=(3, 16, 8)).astype(np.float32) / 4, rng.normal(size=(8, 8)).astype(np.float32) / 4)
    graph = sp.trace(_gram, *args)
    built = build_problem(graph, [P(None, "i"), AUTO], mesh)
    tied = {v: [k for k, s in enumerate(built.menus[v]) if s.tied] for v in range(len(graph.nodes))}
    tied = {v: ks for v, ks in tied.items() if ks}
    assert tied and all(graph.nodes[v].op == "scan" for v in tied)
    assert all(built.menus[v][k].collective is not None for v, ks in tied.items() for k in ks)
    forbidden = 0
    for matrix, (u, v) in zip(built.problem.edge_costs, built.problem.edges.tolist(), strict=True):
        if v not in tied or u == v:
            continue
        value = next(w for w in graph.nodes[v].operands if graph.producer[w] == u)
        slot = graph.nodes[v].operands.index(value)
        held = [s.outputs[graph.nodes[u].outputs.index(value)].even_layout for s in built.menus[u]]
        for k in tied[v]:
            otherwise = [r for r, layout in enumerate(held) if layout != built.menus[v][k].handed[slot]]
            assert (matrix[otherwise, k] >= FORBIDDEN).all()
            forbidden += len(otherwise)
    assert forbidden
    solution = solve(built.problem)
    sharded = realize(built, solution.strategies, mesh)
    assert mismatches(built, solution.strategies, sharded) == []
    plan = split(sharded)
    assert price(plan) <= solution.cost * (1 + 1e-9)
    np.testing.assert_allclose(np.asarray(lower(plan, mesh)(*args)), np.asarray(jax.jit(_gram)(*args)), rtol=1e-5,
                               atol=1e-5)
