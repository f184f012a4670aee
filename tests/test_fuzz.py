"""Differential fuzzing: random programs, shapes, meshes, in_specs and strategies through ``sp.autoshard``,
compared with the unsharded function. The only acceptable outcomes are *equal* and a typed shardprop error for a
genuinely bad input (a sharding conflict, an indivisible spec); anything else fails, and hypothesis shrinks
it to a minimal program printed as plain jax.numpy code. Conflicts are counted (``--hypothesis-show-statistics``)
and fail when one layout refines the other (a local slice resolves those: they are not bad inputs).

Budgets: the default run checks 100 programs (derandomised, so CI is repeatable). Set
``SHARDPROP_FUZZ_EXAMPLES=10000`` for the long run (random seeds); docs/reliability.md records its figures.
"""

import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st
from jax import lax

import shardprop as sp
from shardprop.propagation.sharding import is_refinement
from shardprop.splitting.split import STRATEGIES
from tests.conftest import MESH_SHAPES
from tests.fuzzing import programs, random_inputs, related_spec, specs_for

LONG = int(os.environ.get("SHARDPROP_FUZZ_EXAMPLES", "0"))
EXAMPLES = LONG or 100


@st.composite
def cases(draw):
    program = draw(programs())
    mesh_name = draw(st.sampled_from(sorted(MESH_SHAPES)))
    shape = dict(zip(MESH_SHAPES[mesh_name][1], MESH_SHAPES[mesh_name][0], strict=True))
    specs: list = []
    for v in program.inputs:
        earlier = [(u, spec) for u, spec in zip(program.inputs[: len(specs)], specs, strict=True)
                   if spec is not None and u.shape == v.shape]
        if earlier and draw(st.integers(0, 2)) == 0:  # a layout related to another input's
            specs.append(draw(related_spec(draw(st.sampled_from(earlier))[1], v.shape, shape)))
        else:
            specs.append(draw(specs_for(v.shape, shape)))
    specs = tuple(specs)
    strategy = draw(st.sampled_from(STRATEGIES))
    return program, mesh_name, specs, strategy


def reproducer(program, mesh_name, specs, strategy) -> str:
    """The failing case as a script a user can run."""
    shape, names = MESH_SHAPES[mesh_name]
    args = ", ".join(f"rng.normal(size={v.shape}).astype(np.float32)" for v in program.inputs)
    return "\n".join([
        "import jax", 'jax.config.update("jax_num_cpu_devices", 8)',
        "import jax.numpy as jnp, numpy as np", "from jax import lax",
        "from jax.sharding import PartitionSpec as P", "import shardprop as sp", "", program.source,
        "rng = np.random.default_rng(0)", f"args = ({args},)", f"mesh = sp.make_mesh({shape}, {names})",
        f"got = sp.autoshard(f, mesh=mesh, in_specs={specs!r}, strategy={strategy!r})(*args)",
        "want = f(*map(jnp.asarray, args))",
        "for g, w in zip(got, want):", "    np.testing.assert_allclose(g, w, rtol=2e-4, atol=1e-4)", ""])


@settings(max_examples=EXAMPLES, deadline=None, derandomize=not LONG, print_blob=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.filter_too_much, HealthCheck.data_too_large])
@given(case=cases())
def test_random_programs_equal_the_unsharded_result(case, meshes):
    program, mesh_name, specs, strategy = case
    note(reproducer(program, mesh_name, specs, strategy))
    namespace = {"jnp": jnp, "np": np, "lax": lax}
    exec(program.source, namespace)  # noqa: S102  the generated program
    f = namespace["f"]
    args = random_inputs(program)
    want = f(*map(jnp.asarray, args))
    for kind in set(program.ops):
        event(f"op: {kind}")
    event(f"strategy: {strategy}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", sp.FallbackWarning)
            got = sp.autoshard(f, mesh=meshes[mesh_name], in_specs=specs, strategy=strategy)(*args)
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
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        w = np.asarray(w)
        # float32 sums reassociated across blocks: tolerance relative to the result's magnitude.
        np.testing.assert_allclose(np.asarray(g), w, rtol=2e-4, atol=1e-4 * (1 + float(np.max(np.abs(w), initial=0))))
