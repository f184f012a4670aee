"""Differential fuzzing: random programs, shapes, meshes, in_specs and strategies through ``sp.autoshard``,
compared with the unsharded function. The only acceptable outcomes are *equal* and a typed shardprop error for a
genuinely bad input (a sharding conflict under ``conflicts="error"``, an indivisible spec); anything else
fails, and hypothesis shrinks it to a minimal program printed as plain jax.numpy code. Programs carry sharding
constraints and ``out_specs`` too (outputs must come back with exactly those shardings). Conflicts resolved by
moving an operand (the default) and conflicts refused under ``conflicts="error"`` are counted
(``--hypothesis-show-statistics``); a refused conflict fails when one layout refines the other (a local slice
resolves those: they are not bad inputs).

Gradients too: ``jax.grad`` through the sharded program equals ``jax.grad`` of the unsharded function.

Budgets: the default run checks 15 programs per property (10 conflicts, 4 gradients; derandomised, so a run is
repeatable); the ``slow`` set runs each property again with the budgets it had before the default run's five minutes
(100 programs, from a fixed seed of its own: ``test_*_on_more_programs``). Set
``SHARDPROP_FUZZ_EXAMPLES=10000`` for the long run (random seeds); docs/reliability.md records its figures.
"""

import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, event, given, note, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardprop as sp
from shardprop.core.layouts import is_refinement
from shardprop.core.transfers import total_moved
from shardprop.splitting.cost import estimate
from shardprop.splitting.split import STRATEGIES
from tests.conftest import MESH_SHAPES, on_more_examples
from tests.fuzz_specs import permuted_spec, related_spec, specs_for
from tests.fuzz_oracle import (Unsharded, finite_magnitude, loss_weights, namespace_for, program_functions, reproducer,
                               weighted)
from tests.fuzzing import programs, random_inputs

LONG = int(os.environ.get("SHARDPROP_FUZZ_EXAMPLES", "0"))
EXAMPLES = LONG or 15
SLOW_EXAMPLES = 100  # the slow set's budget (the test_*_on_more_programs twins at the end)


@st.composite
def cases(draw):
    mesh_name = draw(st.sampled_from(sorted(MESH_SHAPES)))
    shape = dict(zip(MESH_SHAPES[mesh_name][1], MESH_SHAPES[mesh_name][0], strict=True))
    program = draw(programs(mesh_shape=shape))
    specs: list = []
    for v in program.inputs:
        earlier = [(u, spec) for u, spec in zip(program.inputs[: len(specs)], specs, strict=True)
                   if spec is not None and u.shape == v.shape]
        how = draw(st.integers(0, 3)) if earlier else 3
        if how == 0:  # a layout related to another input's: they must never conflict
            specs.append(draw(related_spec(draw(st.sampled_from(earlier))[1], v.shape, shape)))
        elif how == 1:  # another input's layout on other axes: a conflict where they meet
            specs.append(draw(permuted_spec(draw(st.sampled_from(earlier))[1], v.shape, shape)))
        else:
            specs.append(draw(specs_for(v.shape, shape)))
    specs = tuple(specs)
    strategy = draw(st.sampled_from(STRATEGIES))
    shapes = {v.name: v.shape for v in program.values}
    out_specs = None
    if draw(st.integers(0, 3)) == 0:
        out_specs = tuple(draw(specs_for(shapes[name], shape)) for name in program.outputs)
    options = {"strategy": strategy, "out_specs": out_specs,
               "conflicts": draw(st.sampled_from(["reshard", "reshard", "reshard", "error"]))}
    return program, mesh_name, specs, options


@settings(max_examples=EXAMPLES, deadline=None, derandomize=not LONG, print_blob=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.filter_too_much, HealthCheck.data_too_large])
@given(case=cases())
def test_random_programs_equal_the_unsharded_result(case, meshes):
    program, mesh_name, specs, options = case
    mesh = meshes[mesh_name]
    note(reproducer(program, mesh_name, specs, options))
    f, unconstrained = program_functions(program, mesh)
    args = random_inputs(program)
    want = unconstrained(*map(jnp.asarray, args))
    for kind in set(program.ops):
        event(f"op: {kind}")
    event(f"strategy: {options['strategy']}")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("ignore", sp.FallbackWarning)
            warnings.simplefilter("always", sp.ReshardWarning)
            got = sp.autoshard(f, mesh=mesh, in_specs=specs, **options)(*args)
        resolved = sum(issubclass(w.category, sp.ReshardWarning) for w in caught)
        event(f"conflicts resolved: {min(resolved, 3)}{'+' if resolved > 3 else ''}")
    except sp.IndivisibleAxisError:
        event("outcome: IndivisibleAxisError")
        return
    except sp.ShardingConflictError as err:
        # Counted (see docs/reliability.md); a conflict between layouts one of which refines the other is a
        # bug, not a bad input: the coarser operand can be cut locally.
        event(f"outcome: ShardingConflictError ({err.kind}) at `{err.op}`")
        assert len(err.layouts) == 2, err
        coarse, fine = sorted(err.layouts, key=len)
        resolvable = err.kind is sp.ConflictKind.MISMATCH and is_refinement(coarse, fine)
        assert not resolvable, f"a local slice resolves this conflict:\n{err}"
        return
    event("outcome: equal")
    out_specs = options["out_specs"] or (None,) * len(program.outputs)
    for g, w, spec in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), out_specs, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        if spec is not None:  # out_specs: exactly that sharding
            assert g.sharding.is_equivalent_to(NamedSharding(mesh, spec), g.ndim), (g.sharding, spec)
        w = np.asarray(w)
        # float32 sums reassociated across blocks: tolerance relative to the result's magnitude.
        np.testing.assert_allclose(np.asarray(g), w, rtol=2e-4, atol=1e-4 * (1 + finite_magnitude(w)))


@st.composite
def conflicts(draw):
    """Two arguments of one shape whose layouts put the same mesh axes on other tensor axes, met elementwise
    (then reduced or contracted, so the resolution's layout flows on)."""
    mesh_name = draw(st.sampled_from(sorted(MESH_SHAPES)))
    mesh_shape = dict(zip(MESH_SHAPES[mesh_name][1], MESH_SHAPES[mesh_name][0], strict=True))
    shape = tuple(draw(st.sampled_from([8, 16])) for _ in range(draw(st.integers(2, 3))))
    names = draw(st.permutations(list(mesh_shape)))[: draw(st.integers(1, min(len(mesh_shape), len(shape))))]
    dims = draw(st.permutations(range(len(shape))))
    entries = [None] * len(shape)
    for d, name in zip(dims, names, strict=False):
        entries[d] = name
    turn = draw(st.integers(1, len(shape) - 1))  # the same entries on other axes (sizes 8, 16: they divide)
    spec, other = P(*entries), P(*(entries[turn:] + entries[:turn]))
    tail = draw(st.sampled_from(["v", "jnp.sum(v, axis=0)", "jnp.tanh(v) @ jnp.swapaxes(v, -1, -2)",
                                 "jnp.max(v, axis=-1)"]))
    return mesh_name, shape, (spec, other), tail, draw(st.sampled_from(STRATEGIES))


@settings(max_examples=max(EXAMPLES // 4, 5), deadline=None, derandomize=not LONG, print_blob=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.filter_too_much])
@given(case=conflicts())
def test_conflicts_are_resolved_by_moving_an_operand(case, meshes):
    mesh_name, shape, specs, tail, strategy = case
    source = f"def f(x0, x1):\n    v = x0 * x1\n    return {tail}\n"
    note(f"{source}\nmesh {mesh_name}, shape {shape}, in_specs {specs}, strategy {strategy}")
    namespace = namespace_for(meshes[mesh_name])
    exec(source, namespace)  # noqa: S102
    f = namespace["f"]
    rng = np.random.default_rng(0)
    args = [rng.normal(size=shape).astype(np.float32) for _ in range(2)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", sp.ReshardWarning)
        got = sp.autoshard(f, mesh=meshes[mesh_name], in_specs=specs, strategy=strategy)(*args)
    resolved = sum(issubclass(w.category, sp.ReshardWarning) for w in caught)
    event(f"conflicts resolved: {resolved}")
    want = np.asarray(f(*map(jnp.asarray, args)))
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-4, atol=1e-4 * (1 + finite_magnitude(want)))
    if resolved:  # the same program halts when asked to
        try:
            sp.autoshard(f, mesh=meshes[mesh_name], in_specs=specs, strategy=strategy, conflicts="error")(*args)
        except sp.ShardingConflictError:
            return
        raise AssertionError("a conflict resolved by default did not halt under conflicts='error'")


def assume_differentiable(program) -> None:
    """Skip programs JAX cannot (or does not rightly) reverse-differentiate."""
    assume(not any(op.startswith("while") for op in program.ops))  # JAX cannot reverse-differentiate a while loop
    # JAX's own derivative of a scatter-max/-min whose indices are clipped or dropped is wrong (jax-ml/jax#40626:
    # `x.at[[3]].max(1.5, mode='clip')` of a length-3 x has gradient 1 where its output is the constant 1.5), so
    # the unsharded reference is not an oracle there
    assume(not any(f".{how}(" in line and "mode='promise_in_bounds'" not in line
                   for line in program.lines for how in ("max", "min") if ".at[" in line))


def differentiable_case(case, meshes):
    """A drawn case JAX can differentiate, noted for its reproducer: (mesh, specs, options, the function, its
    unconstrained reference, random inputs)."""
    program, mesh_name, specs, options = case
    assume_differentiable(program)
    mesh = meshes[mesh_name]
    note(reproducer(program, mesh_name, specs, options))
    f, unconstrained = program_functions(program, mesh)
    return mesh, specs, options, f, unconstrained, random_inputs(program)


@settings(max_examples=max(EXAMPLES // 12, 2), deadline=None, derandomize=not LONG, print_blob=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.filter_too_much, HealthCheck.data_too_large])
@given(case=cases())
def test_random_programs_differentiate_as_unsharded(case, meshes):
    """jax.grad of a random program's weighted outputs through the sharded program (its stages, moves and
    collective finishes transposed by JAX) equals jax.grad of the unsharded function."""
    program, mesh_name, specs, options = case
    assume_differentiable(program)
    note(reproducer(program, mesh_name, specs, options))
    f, unconstrained = program_functions(program, meshes[mesh_name])
    args = random_inputs(program)
    want = Unsharded(unconstrained, args)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", sp.FallbackWarning)
            warnings.simplefilter("ignore", sp.ReshardWarning)
            fs = sp.autoshard(f, mesh=meshes[mesh_name], in_specs=specs, **options)
            got = jax.grad(weighted(fs), argnums=tuple(range(len(args))))(*args)
    except (sp.IndivisibleAxisError, sp.ShardingConflictError):
        return  # bad inputs, as the fuzzer counts them
    want.assert_matches(got, 1)


@settings(max_examples=EXAMPLES // 12 if LONG else 2, deadline=None, derandomize=not LONG, print_blob=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.filter_too_much, HealthCheck.data_too_large])
@given(case=cases())
def test_a_training_step_takes_each_gradient_in_its_arguments_layout_where_that_moves_no_more(case, meshes):
    """``step(*xs) = [x - 0.1 * g for x, g in zip(xs, grad(loss)(*xs))]`` of a random program's weighted outputs:
    sharded, it equals the unsharded step; with the backward pass (a gradient laid out by its update) its plan
    moves no more than with the forward walk alone (``walking=sp.Walking(backward=False)``), both priced by the
    cost model; and each update is counted: the gradient arriving in its argument's layout, moved there as a priced
    choice, or moved with a ReshardWarning (a clash of the specs)."""
    mesh, specs, options, f, unconstrained, args = differentiable_case(case, meshes)

    def stepping(g):
        def step(*xs):
            grads = jax.grad(weighted(g), argnums=tuple(range(len(xs))))(*xs)
            return [x - 0.1 * d for x, d in zip(xs, grads, strict=True)]
        return step

    step, reference = stepping(f), stepping(unconstrained)

    strategy = options["strategy"]  # the step returns the updated arguments: no out_specs of the program
    want = reference(*map(jnp.asarray, args))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", sp.FallbackWarning)
            warnings.simplefilter("ignore", sp.ReshardWarning)
            prog = sp.autoshard(step, mesh=mesh, in_specs=specs, strategy=strategy).trace(*args)
            got = prog(*args)
            graph = sp.trace(step, *args)
            forward = sp.propagate_with(graph, specs, mesh=mesh, strict=False, conflicts="reshard",
                                        walking=sp.Walking(backward=False))
    except (sp.IndivisibleAxisError, sp.ShardingConflictError):
        return  # bad inputs, as the fuzzer counts them
    for g, w in zip(got, want, strict=True):
        w = np.asarray(w)
        np.testing.assert_allclose(np.asarray(g), w, rtol=2e-4, atol=1e-4 * (1 + finite_magnitude(w)))
    sharded = prog.plan.sharded
    for value in sharded.graph.outputs:
        update = sharded.graph.nodes[sharded.graph.producer[value]]
        moved = update.id in sharded.reshards
        event("gradient moved at its update, priced" if moved and update.id in sharded.priced else
              "gradient moved at its update, warned" if moved else "gradient in its argument's layout")
    forward_only = total_moved(estimate(sp.split(forward, strategy=strategy)))
    event("the backward pass moved less" if total_moved(prog.estimated_communication()) < forward_only else
          "the backward pass moved as much")
    assert total_moved(prog.estimated_communication()) <= forward_only + 1e-6, forward_only


@settings(max_examples=LONG or 3, deadline=None, derandomize=not LONG, print_blob=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.filter_too_much, HealthCheck.data_too_large])
@given(case=cases())
def test_each_gradient_comes_out_in_its_arguments_layout_where_that_moves_no_more(case, meshes):
    """``autoshard(jax.grad(loss, argnums=all))`` of a random program's weighted outputs equals the unsharded
    gradient, and each gradient comes out laid out like its argument (a cotangent like its primal, as jax.jit's
    explicit mode types it) — or else pinning it there with ``out_specs`` makes the plan move more (the cost
    model's bytes), or the user's own constraint (transposed) lays it out, or the user's specs clash (the move is
    paid either way). Counted per gradient."""
    mesh, specs, options, f, unconstrained, args = differentiable_case(case, meshes)

    def gradient(g):
        return jax.grad(weighted(g), argnums=tuple(range(len(args))))

    want = Unsharded(unconstrained, args)
    strategy = options["strategy"]

    def traced(out_specs=None):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", sp.FallbackWarning)
            warnings.simplefilter("ignore", sp.ReshardWarning)
            return sp.autoshard(gradient(f), mesh=mesh, in_specs=specs, strategy=strategy,
                                out_specs=out_specs).trace(*args)
    try:
        prog = traced()
    except (sp.IndivisibleAxisError, sp.ShardingConflictError):
        return  # bad inputs, as the fuzzer counts them
    want.assert_matches(prog(*args), 1)
    sharded = prog.plan.sharded
    graph = sharded.graph
    moved = total_moved(prog.estimated_communication())
    for k, (argument, grad) in enumerate(zip(graph.inputs, graph.outputs, strict=True)):
        wanted = sharded.layout(argument)
        if not any(wanted):
            event("gradient of a replicated argument")
            continue
        if graph.nodes[graph.producer[grad]].op == "sharding_constraint":  # the user's constraint, transposed
            event("gradient laid out by a constraint of the user's")
            continue
        if sharded.output_layout(k) == wanted:
            event("gradient in its argument's layout")
            continue
        pinned = [None] * len(args)
        pinned[k] = sharded.spec(argument)
        there = total_moved(traced(tuple(pinned)).estimated_communication())
        if there <= moved + 1e-6 and sharded.reshards.keys() - sharded.priced:
            # the specs clash (x0 * x2 with x0 and x2 laid out crosswise): the move is paid either side of the
            # product, and the warned clash stays where the user's code meets it (propagation/uses.py)
            event("gradient in another layout, at a clash of the specs, as cheap either way")
            continue
        assert there > moved + 1e-6, (f"gradient {k} comes out {prog.out_specs[k]}, its argument is "
                                      f"{sharded.spec(argument)}: pinned there the plan moves {there} B, not more "
                                      f"than {moved} B")
        event("gradient in another layout, moving less")


# Each property again on the slow set's budget, from a seed of its own (not the default run's programs).
test_random_programs_on_more_programs = on_more_examples(
    test_random_programs_equal_the_unsharded_result, SLOW_EXAMPLES, 49_000, case=cases())
test_conflicts_on_more_programs = on_more_examples(
    test_conflicts_are_resolved_by_moving_an_operand, SLOW_EXAMPLES // 4, 49_000, case=conflicts())
test_derivatives_on_more_programs = on_more_examples(
    test_random_programs_differentiate_as_unsharded, SLOW_EXAMPLES // 12, 49_000, case=cases())
test_training_step_gradients_on_more_programs = on_more_examples(
    test_a_training_step_takes_each_gradient_in_its_arguments_layout_where_that_moves_no_more, 5, 49_000,
    case=cases())
test_gradient_layouts_on_more_programs = on_more_examples(
    test_each_gradient_comes_out_in_its_arguments_layout_where_that_moves_no_more, 5, 49_000, case=cases())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "int32"])
def test_the_loss_weights_are_the_weighted_loss_s_derivative_by_its_outputs(dtype):
    """``assert_differentiates_as_unsharded`` pulls these back through the sharded program instead of running the
    weighted loss op by op: they must be that loss's gradient with respect to its outputs, to a unit in the last
    place (numpy's cosine and XLA's may round apart)."""
    outputs = (jnp.ones((3, 5), dtype), jnp.ones((70,), dtype))
    if dtype == "int32":
        assert all(w.dtype == jax.dtypes.float0 for w in map(loss_weights, outputs))
        return
    want = jax.grad(weighted(lambda *xs: xs), argnums=(0, 1))(*outputs)
    for got, w in zip(map(loss_weights, outputs), want, strict=True):
        assert got.dtype == w.dtype and got.shape == w.shape
        g32, w32 = np.asarray(got, np.float32), np.asarray(w, np.float32)  # (a narrow float's ulp: equal)
        assert np.all(np.abs(g32 - w32) <= np.spacing(np.abs(w32))), (g32, w32)
