"""Steering as a jax.jit user expects (issue #14, in progress): sharded PRNG key arrays under every strategy,
warnings at the user's line (tests/propagation/test_rules.py), reprs and the CLI's conventions
(tests/test_errors.py, tests/test_cli_inspect.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import shardprop as sp
from shardprop.splitting.split import STRATEGIES

KEYS = jax.random.split(jax.random.key(0), 16)
X = np.ones((16, 8), np.float32)
PROGRAMS = {
    "per_example_noise": lambda keys, x: x + jax.vmap(lambda k: jax.random.normal(k, (8,)))(keys),
    "one_key_for_all": lambda keys, x: x + jax.random.normal(keys[0], (16, 8)),
    "reversed_keys": lambda keys, x: x + jax.vmap(lambda k: jax.random.normal(k, (8,)))(keys[::-1]),
    "split_per_example": lambda keys, x: jax.vmap(lambda k: jax.random.split(k, 3))(keys),
}


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_sharded_prng_key_arrays(name, strategy, mesh):
    f = PROGRAMS[name]
    got = sp.autoshard(f, mesh=mesh, in_specs=(P("i"), P("i")), strategy=strategy)(KEYS, X)
    want = f(KEYS, X)
    if jnp.issubdtype(want.dtype, jax.dtypes.prng_key):
        got, want = jax.random.key_data(got), jax.random.key_data(want)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)


def _scaled_matmul(x, w, scale=1.0):
    return (x @ w) * scale


def _rows(x, n, axis):
    return jnp.reshape(x, (n, -1)).sum(axis=axis)


A = np.arange(128, dtype=np.float32).reshape(16, 8)
W = np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8)


def test_keyword_arguments_as_jax_jit_takes_them(mesh):
    fs = sp.autoshard(_scaled_matmul, mesh=mesh, in_specs=(P("i", "j"), None))
    got = fs(A, W, scale=2.0)
    np.testing.assert_allclose(np.asarray(got), _scaled_matmul(A, W, 2.0), rtol=1e-5, atol=1e-4)
    assert got.sharding.spec == P("i", "j")  # shaped like x, returned laid out like it (a psum_scatter, no dearer)
    prog = fs.trace(A, W, scale=2.0)
    np.testing.assert_allclose(np.asarray(prog(A, W, scale=3.0)), _scaled_matmul(A, W, 3.0), rtol=1e-5, atol=1e-4)
    dbg = sp.Debugger(prog, A, W, scale=3.0)
    dbg.run()
    np.testing.assert_allclose(np.asarray(dbg.outputs), _scaled_matmul(A, W, 3.0), rtol=1e-5, atol=1e-4)
    positional = fs.trace(A, W)  # another call form, another program
    assert positional is not prog
    with pytest.raises(sp.InputMismatchError, match="traced without keyword arguments"):
        positional(A, W, scale=2.0)


def test_static_arguments_retrace_per_value(mesh):
    fs = sp.autoshard(_rows, mesh=mesh, in_specs=(P("i"), None, None), static_argnums=1, static_argnames="axis")
    for n, axis in ((16, 0), (8, 0), (8, 1)):
        np.testing.assert_allclose(np.asarray(fs(A, n, axis=axis)), _rows(A, n, axis), rtol=1e-5, atol=1e-4)
    assert "3 programs traced" in repr(fs)
    prog = fs.trace(A, 8, axis=0)
    with pytest.raises(sp.InputMismatchError, match="traced with static values"):
        prog(A, 16, axis=0)
    in_order = sp.autoshard(_rows, mesh=mesh, in_specs=(P("i"),), static_argnums=(1, 2))  # dynamic prefix
    np.testing.assert_allclose(np.asarray(in_order(A, 4, 1)), _rows(A, 4, 1), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("make,call,message", [
    (dict(static_argnums=1), (A, [8]), r"static argument 1 = \[8\] at test_steering.py:\d+ is not hashable"),
    (dict(static_argnums=3), (A, 8), "static_argnums has 3, but the call at test_steering.py:[0-9]+ has 2 positional"),
    (dict(static_argnums="1"), (A, 8), "expected argument positions"),
])
def test_bad_static_arguments(mesh, make, call, message):
    with pytest.raises(sp.OptionError, match=message):
        sp.autoshard(lambda x, n: x.reshape(n, -1), mesh=mesh, in_specs=(P("i"), None), **make)(*call)


def test_a_keyword_argument_cannot_be_annotated_by_position(mesh):
    fs = sp.autoshard(_scaled_matmul, mesh=mesh, in_specs=(P("i"), None, P()))
    with pytest.raises(sp.SpecTreeError, match="keyword arguments are unannotated"):
        fs(A, W, scale=2.0)


def test_a_constraint_as_the_only_hint_shards_the_program(mesh):
    def _constrained(x, w):
        h = jnp.tanh(x @ w)
        h = jax.lax.with_sharding_constraint(h, jax.sharding.NamedSharding(mesh, P("i", "j")))
        return h * 2 + 1

    prog = sp.autoshard(_constrained, mesh=mesh, in_specs=(None, None), strict=True).trace(A, W)
    (stage,) = prog.stages
    assert stage.in_specs == (P("i"), P(None, "j"))  # both arguments adopted the constraint, upstream
    assert stage.out_specs == (P("i", "j"),)
    out = prog(A, W)
    assert out.sharding.spec == P("i", "j")
    np.testing.assert_allclose(np.asarray(out), _constrained(A, W), rtol=1e-5, atol=1e-5)
    why = str(sp.explain(prog, "e"))
    assert "rule: placement.constraint" in why and "`sharding_constraint`" in why


def test_a_constraint_moves_a_value_that_arrives_otherwise(mesh):
    def transposed(x):
        return jax.lax.with_sharding_constraint(x + 1, jax.sharding.NamedSharding(mesh, P("j", "i")))

    prog = sp.autoshard(transposed, mesh=mesh, in_specs=(P("i", "j"),)).trace(A)
    assert "d:f32[16@j,8@i] = sharding_constraint c" in str(prog.graph)
    assert "all_to_all[i[minor 2] axis=0->1] c" in str(prog.graph)  # a permute and an all-to-all: nothing gathered
    assert {t.kind for t in prog.communication()} <= {"all-to-all", "collective-permute"}
    out = prog(A)
    assert out.sharding.spec == P("j", "i")
    np.testing.assert_array_equal(np.asarray(out), A + 1)


def test_a_bare_spec_under_set_mesh(mesh):
    def f(x):
        return jax.lax.with_sharding_constraint(x * 2, P("i", "j"))

    with jax.set_mesh(mesh):
        out = sp.autoshard(f, mesh=mesh, in_specs=(None,))(A)
    assert out.sharding.spec == P("i", "j")
    np.testing.assert_array_equal(np.asarray(out), A * 2)


def test_a_constraint_that_does_not_divide_runs_on_uneven_blocks_as_under_jit(mesh):
    """(It was an IndivisibleAxisError naming the op and line; jax.jit pads such an axis: tests/ops/test_constraints.py
    has the table.)"""
    def f(x):
        return jax.lax.with_sharding_constraint(x * 2, jax.sharding.NamedSharding(mesh, P("i"))) + 1

    x = np.arange(48, dtype=np.float32).reshape(6, 8)
    prog = sp.autoshard(f, mesh=mesh, in_specs=(None,)).trace(x)
    np.testing.assert_array_equal(np.asarray(prog(x)), np.asarray(jax.jit(f)(x)))
    assert "6@i[2k:2k+2]" in str(prog.graph)  # blocks of two rows, the last device's empty


def _two_outputs(x):
    return jnp.tanh(x) * 2, x.sum(0)


def test_out_specs_pin_the_outputs_and_propagate_backwards(mesh):
    fs = sp.autoshard(_two_outputs, mesh=mesh, in_specs=(None,), out_specs=(P("j", "i"), P("i")))
    a, b = fs(A)
    assert a.sharding.spec == P("j", "i") and b.sharding.spec == P("i")
    want_a, want_b = _two_outputs(A)
    np.testing.assert_allclose(np.asarray(a), want_a, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(b), want_b, rtol=1e-6)
    (stage,) = fs.trace(A).stages
    assert stage.in_specs == (P("j", "i"),)  # the unannotated argument adopted the first output's layout
    one = sp.autoshard(_two_outputs, mesh=mesh, in_specs=(P("i"),), out_specs=(None, P()))(A)
    assert one[0].sharding.spec == P("i") and one[1].sharding.spec == P()


@pytest.mark.parametrize("out_specs,error,message", [
    ((P("i"),), sp.SpecTreeError, "is not a pytree prefix of the outputs"),
    ((P("q"), None), sp.UnknownMeshAxisError,
     r"out_specs for output 0 \(call at test_steering.py:\d+\): spec P\('q',\) names mesh axis 'q'"),
    ((None, P("i", "j")), sp.SpecRankError, "out_specs for output 1"),
    ((P("i"), "i"), sp.SpecTreeError, "neither a PartitionSpec nor None"),
])
def test_bad_out_specs(mesh, out_specs, error, message):
    with pytest.raises(error, match=message):
        sp.autoshard(_two_outputs, mesh=mesh, in_specs=(None,), out_specs=out_specs)(A)


def test_calling_under_a_mesh_context_with_explicit_axes():
    explicit = jax.make_mesh((4, 2), ("i", "j"))  # jax.make_mesh's default: Explicit axes

    def f(x):
        return jnp.tanh(x).sum(1)

    fs = sp.autoshard(f, mesh=explicit, in_specs=(P("i", "j"),))
    with jax.set_mesh(explicit):
        out = fs(A)
        assert out.sharding.spec == P("i") and out.sharding.mesh.axis_types == explicit.axis_types
        np.testing.assert_allclose(np.asarray(out * 2), 2 * f(A), rtol=1e-5)  # usable in the user's context
        dbg = sp.Debugger(fs.trace(A), A)
        assert dbg.compare().agree and dbg.first_divergence() is None and dbg.check() == []


def test_an_autoshard_function_under_jax_jit(mesh):
    def f(x):
        return jnp.tanh(x).sum(1)

    fs = sp.autoshard(f, mesh=mesh, in_specs=(P("i", "j"),))
    np.testing.assert_allclose(np.asarray(jax.jit(fs)(A)), f(A), rtol=1e-5)


def _symmetrized(x):
    return x + x.T  # RESHARD_LINE


SQUARE = np.random.default_rng(9).normal(size=(16, 16)).astype(np.float32)


@pytest.mark.parametrize("strategy", [s for s in STRATEGIES if s != "optimal"])  # (optimal: the solve's own move)
def test_x_plus_its_transpose_is_resolved_by_moving_one_operand(mesh, strategy):
    import inspect

    fs = sp.autoshard(_symmetrized, mesh=mesh, in_specs=(P("i"),), strategy=strategy)
    with pytest.warns(sp.ReshardWarning, match="resolved a sharding conflict in `add`") as caught:
        out = fs(SQUARE)
    np.testing.assert_allclose(np.asarray(out), SQUARE + SQUARE.T, rtol=1e-6)
    (warning,) = [w for w in caught if issubclass(w.category, sp.ReshardWarning)]
    assert warning.filename.endswith("test_steering.py")
    assert warning.lineno == inspect.getsourcelines(_symmetrized)[1] + 1
    assert "mesh axis 'i' would shard both output axes" in str(warning.message)  # the conflict it resolved
    assert ("all-to-all over i from axis 1 to axis 0 moves it to the other operand's layout, P('i',), ~192 B per "
            "device") in str(warning.message)
    prog = fs.trace(SQUARE)
    assert out.sharding.spec == P("i")
    add = next(n for n in prog.sharded.graph.nodes if n.op == "add")
    assert add.id in prog.sharded.reshards
    with pytest.raises(sp.ShardingConflictError, match="fix: constrain one operand"):
        sp.autoshard(_symmetrized, mesh=mesh, in_specs=(P("i"),), conflicts="error")(SQUARE)
    with pytest.raises(sp.ShardingConflictError):
        sp.autoshard(_symmetrized, mesh=mesh, in_specs=(P("i"),), strict=True)(SQUARE)


def test_transposed_specs_are_resolved(mesh):
    with pytest.warns(sp.ReshardWarning):
        out = sp.autoshard(lambda a, b: a + b, mesh=mesh, in_specs=(P("i", "j"), P("j", "i")))(A, A * 2)
    np.testing.assert_allclose(np.asarray(out), A * 3, rtol=1e-6)


@pytest.mark.parametrize("specs", [(P("i", ("j", "k")), P(None, "j")), (P(("i", "j")), P("i"))])
def test_a_layout_that_refines_another_needs_no_communication(meshes, specs):
    import warnings

    x = np.random.default_rng(1).normal(size=(16, 16)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", sp.ReshardWarning)  # not a conflict at all
        fs = sp.autoshard(lambda a, b: a * b + 1, mesh=meshes["2x2x2"], in_specs=specs)
        out = fs(x, x)
    np.testing.assert_allclose(np.asarray(out), x * x + 1, rtol=1e-6)
    assert fs.trace(x, x).communication() == []  # the coarser operand is sliced locally


def test_bad_conflicts_option(mesh):
    with pytest.raises(sp.OptionError, match="conflicts='sometimes'"):
        sp.autoshard(_symmetrized, mesh=mesh, in_specs=(P("i"),), conflicts="sometimes")(SQUARE)


def test_a_constraint_under_jax_grad_and_inside_a_scan(mesh):
    import warnings

    ns = jax.sharding.NamedSharding

    def loss_grad(x):  # jax.grad binds `reshard` on the constrained value's cotangent (Auto axes: no placement)
        return jax.grad(lambda z: jnp.sum(jax.lax.with_sharding_constraint(jnp.tanh(z), ns(mesh, P("i", "j"))) ** 2))(x)

    with warnings.catch_warnings():
        warnings.simplefilter("error", sp.FallbackWarning)
        got = sp.autoshard(loss_grad, mesh=mesh, in_specs=(None,))(A / 100)
    np.testing.assert_allclose(np.asarray(got), loss_grad(A / 100), rtol=1e-5, atol=1e-6)

    def scanned(x):  # the body needs its rows gathered: the scan falls back and runs without its constraint
        def body(c, r):
            r = jax.lax.with_sharding_constraint(r, ns(mesh, P("j")))
            return c + r.sum(), r * 2
        return jax.lax.scan(body, 0.0, x)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sp.FallbackWarning)
        carry, ys = sp.autoshard(scanned, mesh=mesh, in_specs=(P("i"),))(A)
    want_carry, want_ys = scanned(A)
    np.testing.assert_allclose(float(carry), float(want_carry), rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(ys), np.asarray(want_ys))


def test_explain_names_the_constraint_an_unannotated_argument_adopted(mesh):
    def layer(x, w):
        h = jnp.tanh(x @ w)
        return jax.lax.with_sharding_constraint(h, jax.sharding.NamedSharding(mesh, P("i", "j")))  # PIN_LINE

    prog = sp.autoshard(layer, mesh=mesh, in_specs=(None, None)).trace(A, W)
    line = next(k for k, text in enumerate(open(__file__), 1) if text.rstrip().endswith("# PIN_LINE"))
    why = str(sp.explain(prog, prog.sharded.graph.inputs[0]))
    assert f"its axis 0 adopted i from the sharding constraint at test_steering.py:{line}" in why
    meet = sp.autoshard(jnp.add, mesh=mesh, in_specs=(None, P("i"))).trace(A, A)
    assert "adopted i where it meets a sharded operand of `add`" in str(sp.explain(meet, meet.sharded.graph.inputs[0]))


def test_out_specs_and_constraints_under_an_explicit_mesh_context():
    explicit = jax.make_mesh((4, 2), ("i", "j"))  # Explicit axes: constraints traced there would be asserts
    fs = sp.autoshard(lambda a: a * 2, mesh=explicit, in_specs=(P("i"),), out_specs=P("j", "i"))
    pinned = sp.autoshard(lambda a: jax.lax.with_sharding_constraint(a * 2, P("j")), mesh=explicit, in_specs=(None,))
    with jax.set_mesh(explicit):
        out = fs(A)
        assert out.sharding.spec == P("j", "i")
        np.testing.assert_array_equal(np.asarray(out), A * 2)
        assert pinned(A).sharding.spec == P("j")
        # transformed there, where shardings are types: the program runs on the axes made Auto (auto_axes)
        np.testing.assert_array_equal(np.asarray(jax.jit(fs)(A)), A * 2)
        np.testing.assert_allclose(np.asarray(jax.jit(jax.grad(lambda a: jnp.sum(fs(a) ** 2)))(A)), 8 * A)


def test_jit_and_grad_of_arguments_placed_on_an_explicit_mesh():
    """Found by a new-user pass: jax.jit of an autoshard function on arrays placed on a jax.make_mesh mesh (no
    set_mesh) raised a MeshError about set_mesh; it now works as on the unsharded function."""
    explicit = jax.make_mesh((4, 2), ("i", "j"))
    f = lambda x, w: jnp.tanh(x * w).sum(axis=1)  # noqa: E731
    fs = sp.autoshard(f, mesh=explicit, in_specs=(P("i"), P("i")))
    x = jax.device_put(A, jax.sharding.NamedSharding(explicit, P("i")))
    w = jax.device_put(A / 100, jax.sharding.NamedSharding(explicit, P("i")))
    np.testing.assert_allclose(np.asarray(jax.jit(fs)(x, w)), np.asarray(f(A, A / 100)), rtol=1e-6)
    grad = jax.jit(jax.grad(lambda x, w: fs(x, w).sum()))(x, w)
    np.testing.assert_allclose(np.asarray(grad), np.asarray(jax.grad(lambda x, w: f(x, w).sum())(A, A / 100)),
                               rtol=1e-5, atol=1e-6)


def test_a_cond_whose_branches_are_constrained_differently(mesh):
    ns = jax.sharding.NamedSharding

    def f(p, x):  # XLA refuses this even unsharded ("inconsistent conditional sharding"); the cond falls back
        return jax.lax.cond(p > 0, lambda x: jax.lax.with_sharding_constraint(x * 2, ns(mesh, P("i", "j"))),
                            lambda x: jax.lax.with_sharding_constraint(x.T, ns(mesh, P("j", "i"))), x)

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sp.FallbackWarning)
        fs = sp.autoshard(f, mesh=mesh, in_specs=(None, P("i")))
        np.testing.assert_array_equal(np.asarray(fs(np.float32(1), SQUARE)), SQUARE * 2)
        np.testing.assert_array_equal(np.asarray(fs(np.float32(-1), SQUARE)), SQUARE.T)
