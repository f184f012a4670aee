"""Differential fuzzing of programs shaped as users write them (``tests/fuzzing_users.py``) on every test mesh — 1-D,
4×2, 2×4, 2×2×2 — with compound specs in either order on arguments, constraints and ``out_specs``, and uneven sizes.
Each program runs sharded and is compared with the unsharded function; then it is differentiated both ways —
``jax.grad`` of the sharded program, and the sharded ``jax.grad`` — and each gradient is compared with the unsharded
gradient (a NaN or an infinity only where it has one). The unsharded reference is jitted, and evaluated eagerly too
where a result differs from it (``tests/fuzz_oracle.Unsharded``: XLA may round one value two ways in a jitted
maximum's derivative).

The only acceptable outcomes are *equal* and a typed refusal of what ``jax.jit`` refuses too: ``out_specs`` that do
not divide an output (no JAX array is laid out so), and a conflict of the specs under ``conflicts="error"``. A
``LoweringError``, a raw exception, a wrong number or shape fails, and Hypothesis shrinks it to its smallest program,
printed as a script (``tests/fuzz_oracle.reproducer``).

Budgets: 192 programs in sixteen parts of 12 from fixed seeds (a run is repeatable): the first part in the default
run, the other fifteen in the ``slow`` set; and a long run from a random seed, which the session header prints
(``SHARDPROP_FUZZ_SEED`` replays it), of ``SHARDPROP_FUZZ_PROGRAMS`` programs (1,000 by default, in the ``slow`` set
that CI runs: two parts of 500, about 5 minutes each on one process). The proof of a change to the generator or the
oracle is ``SHARDPROP_FUZZ_PROGRAMS=10000 python -m pytest -m slow tests/test_fuzz_users.py`` (about an hour on two
processes; docs/reliability.md records its runs).
"""

from __future__ import annotations

import os
import warnings

import jax
import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import seed as with_seed
from hypothesis import strategies as st
from jax.sharding import NamedSharding

import shardprop as sp
from shardprop.splitting.split import STRATEGIES
from tests.conftest import MESH_SHAPES
from tests.fuzz_oracle import Unsharded, program_functions, reproducer, weighted
from tests.fuzz_specs import divides, permuted_spec, related_spec, specs_for
from tests.fuzzing import random_inputs
from tests.fuzzing_users import user_programs

PARTS, EXAMPLES = 32, 6  # part 0 in the default run, the others in the slow set
LONG_PROGRAMS = int(os.environ.get("SHARDPROP_FUZZ_PROGRAMS", "1000"))
LONG_EXAMPLES = 125  # parts short enough that the two workers share them to the end (500: one ran alone 8 minutes)
LONG_PARTS = -(-LONG_PROGRAMS // LONG_EXAMPLES)


@st.composite
def user_cases(draw):
    mesh_name = draw(st.sampled_from(sorted(MESH_SHAPES)))
    mesh_shape = dict(zip(MESH_SHAPES[mesh_name][1], MESH_SHAPES[mesh_name][0], strict=True))
    program = draw(user_programs(mesh_shape))
    specs: list = []
    for v in program.inputs:
        earlier = [spec for u, spec in zip(program.inputs, specs, strict=False) if spec is not None
                   and len(u.shape) == len(v.shape)]
        how = draw(st.sampled_from(["related", "fresh", "related", "permuted"])) if earlier else "fresh"
        if how == "related":  # x: P('i', 'j') meeting y: P(('k', 'i'), 'j')
            specs.append(draw(related_spec(draw(st.sampled_from(earlier)), v.shape, mesh_shape)))
        elif how == "permuted":
            specs.append(draw(permuted_spec(draw(st.sampled_from(earlier)), v.shape, mesh_shape)))
        else:
            specs.append(draw(specs_for(v.shape, mesh_shape, sharded=8)))
    shapes = {v.name: v.shape for v in program.values}
    out_specs = None
    if draw(st.integers(0, 2)) == 1:
        out_specs = tuple(draw(specs_for(shapes[name], mesh_shape, sharded=6)) for name in program.outputs)
    options = {"strategy": draw(st.sampled_from(STRATEGIES)), "out_specs": out_specs,
               "conflicts": draw(st.sampled_from(["reshard"] * 7 + ["error"]))}
    return program, mesh_name, tuple(specs), options


def check_case(case, meshes) -> None:
    """The case's program, and both its gradients, equal the unsharded ones; or it is refused as ``jax.jit`` refuses
    it."""
    program, mesh_name, specs, options = case
    mesh = meshes[mesh_name]
    note(reproducer(program, mesh_name, specs, options, gradients=True))
    for kind in set(program.ops):
        event(f"op: {kind}")
    event(f"mesh: {mesh_name}")
    f, reference = program_functions(program, mesh)
    args = random_inputs(program)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", sp.ReshardWarning)
            fs = sp.autoshard(f, mesh=mesh, in_specs=specs, **options)
            got = fs(*args)
    except sp.IndivisibleAxisError:
        shapes = {v.name: v.shape for v in program.values}
        out_specs = options["out_specs"] or (None,) * len(program.outputs)
        assert not all(divides(spec, shapes[name], dict(mesh.shape)) for spec, name in
                       zip(out_specs, program.outputs, strict=True)), "an IndivisibleAxisError jax.jit would not raise"
        event("outcome: out_specs that do not divide")
        return
    except sp.ShardingConflictError:
        assert options["conflicts"] == "error", "a conflict refused under conflicts='reshard'"
        event("outcome: conflict refused (conflicts='error')")
        return
    want = Unsharded(reference, args)
    want.assert_matches(got, 0)
    for g, spec in zip(jax.tree_util.tree_leaves(got), options["out_specs"] or (), strict=False):
        if spec is not None:
            assert g.sharding.is_equivalent_to(NamedSharding(mesh, spec), g.ndim), (g.sharding, spec)
    argnums = tuple(range(len(args)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sp.ReshardWarning)
        # (jitted: the loss's ops compile with it, once, rather than each on its own)
        want.assert_matches(jax.jit(jax.grad(weighted(fs), argnums=argnums))(*args), 1)
        sharded_grad = sp.autoshard(jax.grad(weighted(f), argnums=argnums), mesh=mesh, in_specs=specs,
                                    strategy=options["strategy"], conflicts=options["conflicts"])
        try:
            got = sharded_grad(*args)
        except sp.ShardingConflictError:  # the backward pass meets the specs where the forward did not
            assert options["conflicts"] == "error", "a conflict refused under conflicts='reshard'"
            event("outcome: equal, jax.grad through it too; its sharded gradient refused (conflicts='error')")
            return
        want.assert_matches(got, 1)
    if want.rechecked:
        event("reference: differed from the jitted one, equal to the eager one")
    event("outcome: equal, both gradients too")


_HEALTH = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.filter_too_much,
           HealthCheck.data_too_large]


def fuzz(meshes, examples: int, seed: int, origin: str) -> None:
    """``examples`` cases drawn from Hypothesis seed ``seed``; a failure is shrunk to its smallest program and reported
    with its script and ``origin`` (how to replay it)."""
    @with_seed(seed)
    @settings(max_examples=examples, deadline=None, derandomize=False, database=None, print_blob=True,
              suppress_health_check=_HEALTH)
    @given(case=user_cases())
    def run(case):
        note(origin)
        check_case(case, meshes)

    run()


@pytest.mark.parametrize("part", [pytest.param(k, marks=() if k == 0 else pytest.mark.slow) for k in range(PARTS)])
def test_user_programs_and_their_gradients_equal_the_unsharded_ones(part, meshes):
    """``PARTS`` parts of ``EXAMPLES`` programs each, from fixed seeds (a run is repeatable): the first in the default
    run, the others in the slow set, where the workers share them."""
    fuzz(meshes, EXAMPLES, 48_000 + part, f"default run, part {part}")


@pytest.mark.slow
@pytest.mark.parametrize("part", range(LONG_PARTS))
def test_a_long_run_of_user_programs(part, meshes):
    """``SHARDPROP_FUZZ_PROGRAMS`` programs in parts of ``LONG_EXAMPLES``, from the session's seed (printed in the
    session header; ``SHARDPROP_FUZZ_SEED`` with the same ``SHARDPROP_FUZZ_PROGRAMS`` replays a run)."""
    session = int(os.environ["SHARDPROP_FUZZ_SEED"])
    examples = min(LONG_EXAMPLES, LONG_PROGRAMS - part * LONG_EXAMPLES)
    fuzz(meshes, examples, session * LONG_PARTS + part,
         f"SHARDPROP_FUZZ_SEED={session} SHARDPROP_FUZZ_PROGRAMS={LONG_PROGRAMS}, part {part}")
