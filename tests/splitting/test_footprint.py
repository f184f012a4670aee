"""The cost model's memory (``footprint``) against ``compiled.memory_analysis()``: arguments and outputs exact, the
temporaries within the stated band (XLA's buffer assignment and fusion decide them; the layout search compiles
its finalists to check a limit, so the model only has to rank)."""

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import shardprop as sp
from shardprop.bench import experts as bench_experts
from shardprop.splitting.cost import footprint


@pytest.mark.parametrize("two_d", [False, True], ids=["8", "4x2"])
def test_footprint_of_the_mlp_experts_matches_memory_analysis(two_d):
    model = bench_experts.mlp(two_d, width=256, batch=32)
    mesh = sp.make_mesh(*model.mesh)
    for name, specs in model.experts.items():
        prog = sp.autoshard(model.f, mesh=mesh, in_specs=specs).trace(*model.args)
        stats = prog.lower(*model.args).compile().memory_analysis()
        estimate = footprint(prog.plan)
        assert estimate.arguments == stats.argument_size_in_bytes, name
        assert estimate.outputs == stats.output_size_in_bytes, name
        assert 0.7 <= estimate.total / prog.memory() <= 1.35, (name, estimate, prog.memory())


@pytest.mark.parametrize("donate", [(), (0,), (1,)], ids=["kept", "donated", "the unused one donated"])
def test_an_argument_nothing_reads_is_not_counted_and_least_is_a_floor_of_the_compiled(donate):
    # jax.jit leaves an argument nothing reads out of the compiled program; a donated one lends its buffer to an
    # output of its block. least (arguments + outputs, less what donation can lend) is what the limited search trusts
    # to skip compiling a plan that cannot fit
    x, unused, w = np.ones((64, 32), np.float32), np.ones((64, 32), np.float32), np.ones((32, 16), np.float32)
    mesh = sp.make_mesh((4, 2), ("i", "j"))
    fs = sp.autoshard(lambda x, unused, w: (jax.numpy.tanh(x @ w), x * 2), mesh=mesh, in_specs=(P("i"), P("i"), P()),
                      donate_argnums=donate)
    prog = fs.trace(x, unused, w)
    stats = prog.lower(x, unused, w).compile().memory_analysis()
    estimate = footprint(prog.plan, donate)
    assert (estimate.arguments, estimate.outputs) == (stats.argument_size_in_bytes, stats.output_size_in_bytes)
    assert estimate.aliased == stats.alias_size_in_bytes and estimate.lendable == (16 * 32 * 4 if donate == (0,) else 0)
    assert estimate.least <= prog.memory()


def test_a_gathered_argument_counts_from_the_start():
    # the weight's all-gather has no input but the argument: XLA schedules it first, so it is live the whole time
    w, x = np.ones((512, 512), np.float32), np.ones((64, 512), np.float32)
    mesh = sp.make_mesh((8,), ("i",))
    prog = sp.autoshard(lambda w, x: jax.numpy.tanh(x @ w) @ w, mesh=mesh, in_specs=(P("i"), P("i"))).trace(w, x)
    estimate = footprint(prog.plan)
    assert estimate.temporaries >= 512 * 512 * 4
    assert 0.7 <= estimate.total / prog.memory() <= 1.35


def test_elementwise_chains_take_no_memory_of_their_own():
    x = np.ones((256, 256), np.float32)
    prog = sp.autoshard(lambda x: jax.numpy.sin(jax.numpy.exp(x) * 2 + 1).sum(), mesh=sp.make_mesh((8,), ("i",)),
                        in_specs=P("i")).trace(x)
    assert footprint(prog.plan).temporaries < 256 * 256 * 4 // 8  # no block-sized intermediate: fused


@pytest.mark.parametrize("build", [lambda: bench_experts.mlp(True, width=64, batch=16),
                                   lambda: bench_experts.transformer(True, d_model=32, d_ff=64, batch=2, seq=8)])
def test_the_whole_work_is_what_a_replicated_plan_prices_beyond_its_moves(build):
    # the search's bound: the program's multiply-adds run whole (whole_work), spread evenly over the devices
    from shardprop.core.transfers import total_moved
    from shardprop.splitting.cost import estimate, price, whole_work

    model = build()
    mesh = sp.make_mesh(*model.mesh)
    graph = sp.trace(model.f, *model.args)
    replicated = jax.tree_util.tree_map(lambda _: P(), model.args)
    plan = sp.split(sp.propagate(graph, replicated, mesh=mesh))
    assert whole_work(graph) > 0
    assert whole_work(graph) == pytest.approx(price(plan) - total_moved(estimate(plan)))
