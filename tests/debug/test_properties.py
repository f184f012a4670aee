"""Property: on random programs (the differential fuzzer's), random meshes, specs and strategies, stepping the
debugger reproduces the program, every value agrees with the unsharded reference, every promise holds and
every value's blocks are the slices their shard ranges name."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import shardprop as sp
from tests.fuzzing import random_inputs
from tests.conftest import on_more_examples
from tests.fuzz_oracle import program_functions, reproducer
from tests.test_fuzz import cases


@settings(max_examples=6, deadline=None, derandomize=True, print_blob=True,  # 25 more in the slow set (below)
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.filter_too_much, HealthCheck.data_too_large])
@given(case=cases(), keep=st.sampled_from(["outputs", "all"]))
def test_the_debugger_agrees_with_the_program_and_the_reference(case, keep, meshes):
    program, mesh_name, specs, options = case
    note(reproducer(program, mesh_name, specs, options))
    f, unconstrained = program_functions(program, meshes[mesh_name])
    args = random_inputs(program)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", sp.FallbackWarning)
            warnings.simplefilter("ignore", sp.ReshardWarning)
            prog = sp.autoshard(f, mesh=meshes[mesh_name], in_specs=specs, **options).trace(*args)
    except (sp.IndivisibleAxisError, sp.ShardingConflictError):
        return  # bad inputs, as the fuzzer counts them
    dbg = sp.Debugger(prog, *args, keep=keep)
    dbg.run()
    for g, w in zip(jax.tree_util.tree_leaves(dbg.outputs), jax.tree_util.tree_leaves(prog(*args)), strict=True):
        assert g.sharding.is_equivalent_to(w.sharding, g.ndim)
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)
    table = dbg.compare()
    assert table.agree, str(table)
    assert dbg.check() == []
    want = unconstrained(*map(jnp.asarray, args))
    for g, w in zip(jax.tree_util.tree_leaves(dbg.outputs), jax.tree_util.tree_leaves(want), strict=True):
        w = np.asarray(w)
        np.testing.assert_allclose(np.asarray(g), w, rtol=2e-4, atol=1e-4 * (1 + float(np.max(np.abs(w), initial=0))))


test_the_debugger_on_more_examples = on_more_examples(test_the_debugger_agrees_with_the_program_and_the_reference, 25,
                                                     49_104, case=cases(), keep=st.sampled_from(["outputs", "all"]))
