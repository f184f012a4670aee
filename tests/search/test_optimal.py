"""``strategy="optimal"``: with every argument's spec fixed, the layout search's one solve chooses where every
intermediate's layout changes — the multi-node choices the forward walk cannot make.

Oracles: the unsharded function on the same inputs (values and gradients); the compiled HLO's collectives (bytes,
equal to the plan's estimate); the plan ``strategy="auto"`` makes from the same specs (bytes, never fewer on these
programs); the solver's certificate.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import shardprop as sp
from shardprop.bench.workloads import LOOPS, MESHES, OWN
from shardprop.core.transfers import total_moved
from tests.conftest import assert_differentiates_as_unsharded, assert_like_unsharded


def _self_product_gradient(a):
    return jax.grad(lambda a: jnp.sum(jax.lax.dot_general(a, a, (((0,), (1,)), ((), ()))) * jnp.cos(
        jnp.arange(4.0).reshape(2, 2))) + jnp.sum((a + a) * jnp.sin(jnp.arange(4.0).reshape(2, 2))))(a)


def _moved(prog) -> float:
    return total_moved(prog.communication())


def test_the_gradient_of_a_self_product_moves_what_the_one_solve_finds():
    # (was a strict xfail in tests/propagation/test_uses.py: the seed's layout feeding both contractions is a choice
    # across several nodes; the walk moves 16 B, laid out like x the plan moves 12 B, the solve finds 8 B)
    mesh = sp.make_mesh((2, 2, 2), ("i", "j", "k"))
    x = np.random.default_rng(4).normal(size=(2, 2)).astype(np.float32)
    walked = sp.autoshard(_self_product_gradient, mesh=mesh, in_specs=(P("i"),)).trace(x)
    solved = sp.autoshard(_self_product_gradient, mesh=mesh, in_specs=(P("i"),), strategy="optimal").trace(x)
    assert_like_unsharded(solved(x), _self_product_gradient, (x,))
    assert _moved(solved) == total_moved(solved.estimated_communication()) == 8 < _moved(walked) == 16
    assert solved.search.certificate == "optimal" and solved.search.searched == ()
    assert str(solved.search).startswith("strategy='optimal' solved every value's layout around the arguments' specs")


def test_an_optimal_program_differentiates_as_unsharded(meshes):
    x = np.random.default_rng(5).normal(size=(16, 8)).astype(np.float32)
    w = np.random.default_rng(6).normal(size=(8, 8)).astype(np.float32)
    assert_differentiates_as_unsharded(lambda x, w: jnp.tanh(x @ w) @ w.T, (x, w), mesh=meshes["4x2"],
                                       in_specs=(P("i"), P(None, "j")), strategy="optimal", rtol=1e-4, atol=1e-4)


# bench rows where the walk's plan moves more than the solve's (docs/benchmarks.md rows, their own specs)
ROWS = {"transformer_block/tensor": OWN, "mlp_train_step/data": OWN, "mlp fori_loop training/data": LOOPS}


@pytest.mark.parametrize("label", [pytest.param(k, marks=() if k == "transformer_block/tensor" else pytest.mark.slow)
                                   for k in ROWS])
def test_a_bench_row_moves_fewer_bytes_than_the_walk_and_computes_the_same(label):
    row = next(w for w in ROWS[label] if f"{w.name}/{w.parallel}" == label)
    case = row.build()
    mesh = sp.make_mesh(*MESHES[row.parallel])
    walked = sp.autoshard(case.f, mesh=mesh, in_specs=case.in_specs).trace(*case.args)
    with warnings.catch_warnings():  # its moves are the solve's priced choices, not a clash of the row's specs
        warnings.simplefilter("error", sp.ReshardWarning)
        solved = sp.autoshard(case.f, mesh=mesh, in_specs=case.in_specs, strategy="optimal").trace(*case.args)
    assert_like_unsharded(solved(*case.args), case.f, case.args, rtol=row.rtol, atol=row.atol,
                          atol_per_magnitude=True)
    assert _moved(solved) == total_moved(solved.estimated_communication()) < _moved(walked)
    assert solved.search.certificate == "optimal"


def test_an_uneven_fixed_argument_is_refused_by_the_search_and_planned_by_propagation_under_optimal():
    mesh = sp.make_mesh((8,), ("i",))
    x, w = np.random.default_rng(8).normal(size=(4, 8)).astype(np.float32), np.eye(8, dtype=np.float32)
    said = r"argument x \(f32\[4,8\]\) is fixed as P\('i',\): axis 0 \(4\) in 8 blocks that do not divide it"
    with pytest.raises(sp.SearchError, match=said):
        sp.autoshard(lambda x, w: x @ w, mesh=mesh, in_specs=(P("i"), sp.AUTO)).trace(x, w)
    with pytest.warns(sp.StrategyWarning, match="strategy='optimal' planned as 'auto': " + said) as caught:
        prog = sp.autoshard(lambda x, w: x @ w, mesh=mesh, in_specs=(P("i"), P()), strategy="optimal").trace(x, w)
    assert caught[0].filename == __file__ and prog.search is None
    assert_like_unsharded(prog(x, w), lambda x, w: x @ w, (x, w))


def test_an_unknown_strategy_names_the_optimal_one():
    with pytest.raises(sp.OptionError, match="'optimal'"):
        sp.autoshard(lambda x: x, mesh=sp.make_mesh((8,), ("i",)), in_specs=P("i"), strategy="best")(np.ones(8))


def test_where_the_walk_defers_a_sum_the_solve_cannot_its_plan_is_kept_and_said_so():
    # the contraction's psum waits for the sum (a scalar all-reduced): a move the solve does not model, so its
    # optimum all-reduces the product; the one cost model prices the walk's plan lower, and that plan runs
    mesh = sp.make_mesh((8,), ("model",))
    rng = np.random.default_rng(7)
    x, w = rng.normal(size=(64, 32)).astype(np.float32), rng.normal(size=(32, 64)).astype(np.float32) / 20

    def loss(x, w):
        return jnp.sum(jnp.tanh(x) @ w) / x.shape[0]

    specs = (P(None, "model"), P("model"))
    walked = sp.autoshard(loss, mesh=mesh, in_specs=specs).trace(x, w)
    prog = sp.autoshard(loss, mesh=mesh, in_specs=specs, strategy="optimal").trace(x, w)
    assert_like_unsharded(prog(x, w), loss, (x, w), rtol=1e-4, atol=1e-5)
    assert prog.search.walked and _moved(prog) == _moved(walked) == 7  # 4 B all-reduced (ring)
    assert prog.search.chosen.price < prog.search.solution.cost
    assert "propagation's plan kept: price" in str(prog.search)
    assert sp.to_json(prog)["search"]["walked"] is True


def test_explain_of_a_value_the_solve_laid_out_lists_its_layouts_each_solved_again():
    mesh = sp.make_mesh((2, 2, 2), ("i", "j", "k"))
    x = np.random.default_rng(4).normal(size=(2, 2)).astype(np.float32)
    prog = sp.autoshard(_self_product_gradient, mesh=mesh, in_specs=(P("i"),), strategy="optimal").trace(x)
    out = prog.plan.graph.outputs[0]
    alternatives = prog.search.value_alternatives(out)
    assert len(alternatives) > 2 and alternatives[0].candidate is prog.search.chosen
    assert all(a.candidate is None or a.candidate.price >= prog.search.chosen.price for a in alternatives)
    text = str(sp.explain(prog, out))
    assert f"held so by the layout solve (optimal); its {len(alternatives)} layouts" in text and "(chosen)" in text
    # the moves the solution hands an op are said to be the solve's, not a lookup's or a use's
    assert "the layout solve's choice" in text and "table's whole window" not in text


def test_state_mirroring_its_arguments_comes_back_in_their_layouts_even_where_the_walk_is_cheaper():
    # (a new-user pass: the walk's plan, kept as cheaper, returned the gradients in other layouts than their
    # arguments'; the solve had priced them back)
    mesh = sp.make_mesh((4, 2), ("data", "model"))
    rng = np.random.default_rng(0)
    args = tuple(rng.normal(size=s).astype(np.float32) for s in ((8, 16), (16, 8), (8, 8)))
    grads = jax.grad(lambda a, b, c: jnp.sum(jnp.sin(a @ b @ c) ** 2), argnums=(0, 1, 2))
    specs = (P(None, "data"), P("model", "data"), P())
    prog = sp.autoshard(grads, mesh=mesh, in_specs=specs, strategy="optimal").trace(*args)
    assert prog.out_specs == prog.in_specs == specs
    assert_like_unsharded(prog(*args), grads, args, rtol=1e-4, atol=1e-4)
    free = sp.autoshard(grads, mesh=mesh, in_specs=specs, strategy="optimal", mirror_state=False).trace(*args)
    assert free.out_specs != specs and free.search.chosen.price < prog.search.chosen.price


def test_x_plus_its_transpose_under_optimal_moves_as_the_solve_chose_without_a_warning():
    mesh = sp.make_mesh((8,), ("i",))
    square = np.random.default_rng(9).normal(size=(16, 16)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", sp.ReshardWarning)
        prog = sp.autoshard(lambda x: x + x.T, mesh=mesh, in_specs=(P("i"),), strategy="optimal").trace(square)
    np.testing.assert_allclose(np.asarray(prog(square)), square + square.T, rtol=1e-6)
    assert _moved(prog) <= 192


def _row_parallel_then_norm(x, w1, w2):
    h = (x @ w1) @ w2  # the second contraction's rows laid out as w2's: a sum over `j`
    return jnp.sum(jnp.tanh(h) * h, axis=-1)


def test_a_sum_read_sliced_is_reduce_scattered_where_an_all_reduce_would_move_twice_as_much():
    # Megatron's sequence parallelism: the row-parallel product's sum held finer, over `j` along its rows (a
    # reduce-scatter, half an all-reduce's bytes), the ops after it on those blocks — where the walk all-reduces it
    mesh = sp.make_mesh((4, 2), ("i", "j"))
    rng = np.random.default_rng(7)
    x, w1, w2 = (rng.normal(size=s).astype(np.float32) for s in ((16, 32), (32, 64), (64, 32)))
    specs = (P("i"), P(None, "j"), P("j", None))
    walked = sp.autoshard(_row_parallel_then_norm, mesh=mesh, in_specs=specs).trace(x, w1, w2)
    solved = sp.autoshard(_row_parallel_then_norm, mesh=mesh, in_specs=specs, strategy="optimal").trace(x, w1, w2)
    assert_like_unsharded(solved(x, w1, w2), _row_parallel_then_norm, (x, w1, w2), rtol=1e-4, atol=1e-4)
    kinds = {t.kind.value: t.shape for t in solved.communication()}
    assert kinds == {"reduce-scatter": (2, 32)}, kinds  # 16 rows over i*j: 2 each
    assert _moved(solved) == total_moved(solved.estimated_communication()) < _moved(walked)
    assert solved.search.certificate == "optimal" and not solved.search.walked
