"""jax.jit's calling conventions on autoshard functions: donation and static arguments named either way
(issue #14; keyword and static arguments are also in tests/test_steering.py)."""

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
    first_argument = fs.lower(new_w, x).as_text().split("func.func public @main")[1].split("%arg1")[0]
    # donated: aliased to the output it has the layout of, as jax.jit does where the outputs' shardings are known
    # (or a buffer donor, where JAX cannot tell which output reuses it)
    assert "tf.aliasing_output = 0" in first_argument or "jax.buffer_donor = true" in first_argument
    w = new_w
    for _ in range(2):  # the training-loop idiom: the output takes the donated input's place
        w, _ = fs(w, x)
    # as jax.jit does on the same calls: its output is donated in turn (jax 0.11 keeps one whose value was read to
    # the host, as np.asarray(new_w) above did, under jax.jit too)
    jitted = jax.jit(sgd_step, donate_argnums=0)
    first, _ = jitted(placed(mesh, W0, SPECS[0]), x)
    np.asarray(first)
    again = first
    for _ in range(2):
        again, _ = jitted(again, x)
    assert new_w.is_deleted() == first.is_deleted()
    if first.is_deleted():
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
