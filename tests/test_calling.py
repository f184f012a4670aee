"""jax.jit's calling conventions on autoshard functions: donation and static arguments named either way
(issue #14; keyword and static arguments are also in tests/test_steering.py)."""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardprop as sp

X = np.linspace(-1, 2, 128, dtype=np.float32).reshape(16, 8)
W0 = np.linspace(0, 1, 64, dtype=np.float32).reshape(8, 8)


def sgd_step(w, x, lr=0.1):
    return w - lr * (x.T @ jnp.tanh(x @ w)), jnp.sum(x)


WANT = sgd_step(W0, X)
SPECS = (P(None, "j"), P("i"))


def placed(mesh, value, spec):
    return jax.device_put(jnp.asarray(value), NamedSharding(mesh, spec))


def test_a_donated_argument_is_invalid_after_the_call_as_under_jit(mesh):
    fs = sp.autoshard(sgd_step, mesh=mesh, in_specs=SPECS, donate_argnums=0)
    w, x = placed(mesh, W0, SPECS[0]), placed(mesh, X, SPECS[1])
    new_w, total = fs(w, x)
    np.testing.assert_allclose(np.asarray(new_w), WANT[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(total), float(WANT[1]), rtol=1e-6)
    assert w.is_deleted() and not x.is_deleted()
    assert "jax.buffer_donor = true" in fs.lower(new_w, x).as_text().split("func.func public @main")[1].split("\n")[0]
    w = new_w
    for _ in range(2):  # the training-loop idiom: the output takes the donated input's place
        w, _ = fs(w, x)
    with pytest.raises(RuntimeError, match="deleted"):
        np.asarray(new_w)


def test_a_donated_array_copied_into_place_is_invalid_too(mesh):
    fs = sp.autoshard(sgd_step, mesh=mesh, in_specs=SPECS, donate_argnums=(0,))
    w = jnp.asarray(W0)  # on one device: the program reads a copy laid out P(None, 'j')
    new_w, _ = fs(w, X)
    np.testing.assert_allclose(np.asarray(new_w), WANT[0], rtol=1e-5, atol=1e-6)
    assert w.is_deleted()


def test_donation_by_name_positionally_or_by_keyword(mesh):
    fs = sp.autoshard(sgd_step, mesh=mesh, in_specs=SPECS, donate_argnames="w")
    w = placed(mesh, W0, SPECS[0])
    np.testing.assert_allclose(np.asarray(fs(w, X)[0]), WANT[0], rtol=1e-5, atol=1e-6)
    assert w.is_deleted()
    by_keyword = sp.autoshard(sgd_step, mesh=mesh, in_specs=SPECS[:1], donate_argnames="x")
    w, x = placed(mesh, W0, SPECS[0]), jnp.asarray(X)
    np.testing.assert_allclose(np.asarray(by_keyword(w, x=x)[0]), WANT[0], rtol=1e-5, atol=1e-6)
    assert x.is_deleted() and not w.is_deleted()


def test_an_argument_passed_twice_survives_when_donated_once(mesh):
    fs = sp.autoshard(lambda a, b: a * 2 + b, mesh=mesh, in_specs=(P("i"), P("i")), donate_argnums=0)
    x = jnp.asarray(X)  # copied into place for both: the undonated copy is not the donated one
    np.testing.assert_allclose(np.asarray(fs(x, x)), 3 * X, rtol=1e-6)
    assert x.is_deleted()
    y = placed(mesh, X, P("i"))  # passed as it is to both
    with pytest.raises(sp.InputMismatchError, match="donated, and the same array is also passed"):
        fs(y, y)  # jax.jit refuses f(donate(a), a) too
    assert not y.is_deleted()


def test_static_argnames_also_apply_positionally_as_in_jit(mesh):
    def rows(x, n):
        return x.reshape(n, -1).sum(1)

    fs = sp.autoshard(rows, mesh=mesh, in_specs=(P("i"),), static_argnames="n")
    np.testing.assert_allclose(np.asarray(fs(X, 4)), X.reshape(4, -1).sum(1), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(fs(X, n=8)), X.reshape(8, -1).sum(1), rtol=1e-5)
    by_position = sp.autoshard(rows, mesh=mesh, in_specs=(P("i"),), static_argnums=1)
    np.testing.assert_allclose(np.asarray(by_position(X, n=4)), X.reshape(4, -1).sum(1), rtol=1e-5)


@pytest.mark.parametrize("options,call,message", [
    (dict(donate_argnums=2), (X, X), r"donate_argnums has 2, but the call at test_calling.py:\d+ has 2 positional"),
    (dict(donate_argnums="0"), (X, X), "donate_argnums='0': expected argument positions"),
    (dict(donate_argnums=1, static_argnums=1), (X, 4), "argument .b. is both static and donated"),
    (dict(donate_argnames="b", static_argnames="b"), (X, 4), "argument 'b' is both static and donated"),
])
def test_bad_donation(mesh, options, call, message):
    with pytest.raises(sp.OptionError, match=message):
        sp.autoshard(lambda a, b: a * b, mesh=mesh, in_specs=(P("i"),), **options)(*call)


@pytest.mark.parametrize("options,call,error,message", [
    (dict(static_argnames="m"), (X, 3), sp.OptionError,
     r"static_argnames names 'm' \(at test_calling.py:\d+\), but <lambda> has no such parameter; its parameters: a, n"),
    (dict(donate_argnames="b"), (X, 3), sp.OptionError, "donate_argnames names 'b'"),
    (dict(), (X, 3), sp.UnknownMeshAxisError, r"names mesh axis 'k'.*\(call at test_calling.py:\d+\)"),
])
def test_option_and_spec_mistakes_name_the_call(mesh, options, call, error, message):
    in_specs = (P("k") if error is sp.UnknownMeshAxisError else P("i"), None)
    with pytest.raises(error, match=message):
        sp.autoshard(lambda a, n: a * n, mesh=mesh, in_specs=in_specs, **options)(*call)


def test_an_annotated_argument_passed_by_keyword_is_refused_as_jit_refuses_it(mesh):
    fs = sp.autoshard(lambda a, n: a * n, mesh=mesh, in_specs=(P("i"),), static_argnames="n")
    with pytest.raises(sp.SpecTreeError, match=r"the call at test_calling.py:\d+ passes 0 positionally"):
        fs(a=X, n=2)
    np.testing.assert_allclose(np.asarray(fs(X, n=2)), X * 2)


# -- the hot path (issue #17): a cached call goes straight into jax.jit with in_shardings -------------------------

def _counting_checked_calls(monkeypatch):
    from shardprop.program import Program

    calls = []
    real = Program.call_checked
    monkeypatch.setattr(Program, "call_checked",
                        lambda self, args, kwargs: calls.append(1) or real(self, args, kwargs))
    return calls


def test_a_call_as_traced_takes_the_hot_path_and_equals_the_unsharded_function(monkeypatch, mesh):
    calls = _counting_checked_calls(monkeypatch)
    fs = sp.autoshard(sgd_step, mesh=mesh, in_specs=SPECS)
    w, x = placed(mesh, W0, SPECS[0]), placed(mesh, X, SPECS[1])
    prog = fs.trace(w, x)
    for f, args in ((fs, (w, x)), (fs, (W0, X)), (prog, (w, x)), (prog, (W0, X))):
        for _ in range(2):
            new_w, total = f(*args)
            np.testing.assert_allclose(np.asarray(new_w), WANT[0], rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(float(total), float(WANT[1]), rtol=1e-6)
            assert new_w.sharding.spec == P(None, "j")
    assert calls == []  # NumPy or placed arrays: JAX's dispatch places them; no Python checks


def test_on_an_explicit_mesh_calls_take_the_hot_path_and_come_back_typed_on_it(monkeypatch):
    """jax.make_mesh's default (Explicit axes): the hot path takes the arguments typed on the user's mesh, runs the
    program on its axes made Auto and gives the outputs back on the user's mesh, as the checked path does — also
    under jax.set_mesh (the checked path, 1.8x jax.jit's per-call time there before)."""
    calls = _counting_checked_calls(monkeypatch)
    explicit = jax.make_mesh((4, 2), ("i", "j"))
    fs = sp.autoshard(sgd_step, mesh=explicit, in_specs=SPECS)
    w, x = placed(explicit, W0, SPECS[0]), placed(explicit, X, SPECS[1])
    for context in (contextlib.nullcontext(), jax.set_mesh(explicit)):
        with context:
            for args in ((w, x), (W0, X)):
                new_w, total = fs(*args)
                np.testing.assert_allclose(np.asarray(new_w), WANT[0], rtol=1e-5, atol=1e-6)
                np.testing.assert_allclose(float(total), float(WANT[1]), rtol=1e-6)
                assert new_w.sharding == jax.sharding.NamedSharding(explicit, P(None, "j"))
    assert calls == []  # NumPy or placed arrays, with or without the mesh set: no Python checks


def test_calls_the_hot_path_cannot_take_are_checked_and_still_right(monkeypatch, mesh):
    calls = _counting_checked_calls(monkeypatch)
    fs = sp.autoshard(sgd_step, mesh=mesh, in_specs=SPECS)
    prog = fs.trace(W0, X)
    transposed = placed(mesh, X, P("j", "i"))  # laid out otherwise: jax.jit refuses it, the checked path moves it
    np.testing.assert_allclose(np.asarray(prog(W0, transposed)[0]), WANT[0], rtol=1e-5, atol=1e-6)
    assert len(calls) == 1
    with pytest.raises(sp.InputMismatchError, match=r"argument leaf 1: got f32\[8,8\], traced with f32\[16,8\]"):
        prog(W0, X[:8])  # another shape: the same error as before there was a hot path
    np.testing.assert_allclose(np.asarray(fs(W0, X[:8])[0]), np.asarray(sgd_step(W0, X[:8])[0]), rtol=1e-5,
                               atol=1e-6)  # the autoshard function traces the new shape
    assert np.asarray(jax.grad(lambda w: fs(w, X)[1] + jnp.sum(fs(w, X)[0]))(W0)).shape == (8, 8)  # tracers


def test_the_hot_path_keeps_weak_types_apart_as_jit_does(mesh):
    fs = sp.autoshard(lambda x, s: x * s, mesh=mesh, in_specs=(P("i"), None))
    x = np.ones(16, np.float32)
    weak = fs(x, 2.0)  # a Python float is weakly typed: its own program
    strong = fs(x, np.float32(2.0))
    again = fs(x, 3.0)
    assert len(fs._programs) == 2
    np.testing.assert_allclose(np.asarray(again), 3.0 * x)
    assert weak.dtype == strong.dtype == again.dtype == jnp.float32
    assert jax.typeof(strong).weak_type == jax.typeof(jax.jit(lambda x, s: x * s)(x, np.float32(2.0))).weak_type


def test_a_donating_training_loop_takes_the_hot_path_with_jits_donation(monkeypatch, mesh):
    calls = _counting_checked_calls(monkeypatch)
    fs = sp.autoshard(sgd_step, mesh=mesh, in_specs=SPECS, donate_argnums=0)
    w, x = placed(mesh, W0, SPECS[0]), placed(mesh, X, SPECS[1])
    want_w = W0
    for _ in range(3):  # the output takes the donated input's place, laid out as the program takes it
        previous, (w, _) = w, fs(w, x)
        want_w = sgd_step(want_w, X)[0]
        assert previous.is_deleted() and not x.is_deleted()
    np.testing.assert_allclose(np.asarray(w), want_w, rtol=1e-5, atol=1e-6)
    assert calls == []  # placed as the program takes them: every call, the first too, on the hot path
    with pytest.raises(sp.InputMismatchError, match="donated, and the same array is also passed"):
        sp.autoshard(lambda a, b: a * 2 + b, mesh=mesh, in_specs=(P("i"), P("i")), donate_argnums=0)(x, x)


def test_a_donating_loop_on_an_explicit_mesh_takes_the_hot_path_too(monkeypatch):
    """Found by review: the donated leaf's sharding was compared with the program's (Auto) mesh, so donated calls
    on jax.make_mesh's default (Explicit) mesh never took the hot path."""
    calls = _counting_checked_calls(monkeypatch)
    explicit = jax.make_mesh((4, 2), ("i", "j"))
    fs = sp.autoshard(sgd_step, mesh=explicit, in_specs=SPECS, donate_argnums=0)
    w, x = placed(explicit, W0, SPECS[0]), placed(explicit, X, SPECS[1])
    want_w = W0
    for _ in range(3):
        previous, (w, _) = w, fs(w, x)
        want_w = sgd_step(want_w, X)[0]
        assert previous.is_deleted() and not x.is_deleted()
    np.testing.assert_allclose(np.asarray(w), want_w, rtol=1e-5, atol=1e-6)
    assert calls == []


def test_a_failure_after_the_donated_buffers_were_consumed_is_reported_not_run_again(mesh):
    """The hot path retries a failed call on the checked path, unless the failure came after the call consumed its
    donated buffers: then it is reported as the checked path reports a failure (a LoweringError naming it)."""
    fs = sp.autoshard(sgd_step, mesh=mesh, in_specs=SPECS, donate_argnums=0)
    w, x = placed(mesh, W0, SPECS[0]), placed(mesh, X, SPECS[1])
    prog = fs.trace(w, x)
    prog(placed(mesh, W0, SPECS[0]), x)  # makes the hot path's jitted call

    def consumed_then_failed(*args):  # what a run-time failure after donation leaves behind
        args[0].delete()
        raise RuntimeError("failed at run time")

    prog._hot[False] = consumed_then_failed
    with pytest.raises(sp.LoweringError, match="RuntimeError: failed at run time"):
        prog(w, x)


def test_an_autoshard_function_compiles_its_program_once_for_its_first_and_later_calls(mesh):
    fs = sp.autoshard(sgd_step, mesh=mesh, in_specs=SPECS)
    for _ in range(3):
        np.testing.assert_allclose(np.asarray(fs(W0, X)[0]), WANT[0], rtol=1e-5, atol=1e-6)
    program = fs.trace(W0, X)
    assert [jitted._cache_size() for jitted in program._hot.values()] == [1]  # one variant, one compile
