"""The first hour of a user who knows jax.jit's sharding, as issue #14 saw it: every case either runs and
equals the unsharded function, or is refused with a typed ShardingError that is not a LoweringError (which is
reserved for shardprop's own bugs)."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardprop as sp

RNG = np.random.default_rng(7)
X = RNG.normal(size=(16, 8)).astype(np.float32)
W = RNG.normal(size=(8, 8)).astype(np.float32)
SQ = RNG.normal(size=(16, 16)).astype(np.float32)
CUBE = RNG.normal(size=(16, 16)).astype(np.float32)


def auto_mesh():
    return jax.make_mesh((4, 2), ("i", "j"), axis_types=(jax.sharding.AxisType.Auto,) * 2)


def constrained(x, w):
    h = jnp.tanh(x @ w)
    return jax.lax.with_sharding_constraint(h, NamedSharding(auto_mesh(), P("i", "j"))) * 2


def bare_constrained(x, w):
    return jax.lax.with_sharding_constraint(jnp.tanh(x @ w), P("i", "j")) * 2


def softmax_xent(x, w):
    logits = x @ w
    return jnp.mean(jax.nn.logsumexp(logits, -1) - logits[:, 0])


def loop(x):
    return jax.lax.fori_loop(0, 3, lambda i, c: c * 0.5 + 1.0, x)


def _run(f, args, **options):
    return sp.autoshard(f, mesh=auto_mesh(), **options)(*args)


# name -> (thunk returning (sharded result, unsharded result))
RUNS = {
    "constraint (NamedSharding)": lambda: (_run(constrained, (X, W), in_specs=(P("i"), None)), constrained(X, W)),
    "constraint is the only hint": lambda: (_run(constrained, (X, W), in_specs=(None, None)), constrained(X, W)),
    "constraint under strict=True": lambda: (_run(constrained, (X, W), in_specs=(None, None), strict=True),
                                             constrained(X, W)),
    "bare P under jax.set_mesh": lambda: _under_set_mesh(auto_mesh(), bare_constrained, (X, W)),
    "Explicit mesh context": lambda: _under_set_mesh(jax.make_mesh((4, 2), ("i", "j")), softmax_xent, (X, W)),
    "keyword argument": lambda: (sp.autoshard(lambda x, w, scale=1.0: (x @ w) * scale, mesh=auto_mesh(),
                                              in_specs=(P("i"), None))(X, W, scale=2.0), (X @ W) * 2.0),
    "static shape argument": lambda: (_run(lambda x, n: x.reshape(n, -1).sum(1), (X, 4), in_specs=(P("i"),),
                                           static_argnums=1), X.reshape(4, -1).sum(1)),
    "donated argument": lambda: (_run(lambda w, x: w - 0.1 * (x.T @ x), (jnp.asarray(W), X),
                                      in_specs=(None, P("i")), donate_argnums=0), W - 0.1 * (X.T @ X)),
    "refinement P('i',('j','k')) + P(None,'j')": lambda: (
        sp.autoshard(jnp.add, mesh=sp.make_mesh((2, 2, 2), ("i", "j", "k")),
                     in_specs=(P("i", ("j", "k")), P(None, "j")))(SQ, CUBE), SQ + CUBE),
    "refinement P(('i','j')) + P('i')": lambda: (_run(jnp.add, (SQ, CUBE), in_specs=(P(("i", "j")), P("i"))),
                                                 SQ + CUBE),
    "x + x.T": lambda: (_run(lambda x: x + x.T, (SQ,), in_specs=(P("i"),)), SQ + SQ.T),
    "transposed specs": lambda: (_run(jnp.add, (SQ, CUBE), in_specs=(P("i", "j"), P("j", "i"))), SQ + CUBE),
    "jax.vmap of an autoshard function": lambda: (
        jax.vmap(sp.autoshard(jnp.tanh, mesh=auto_mesh(), in_specs=(P("i"),)))(np.stack([X, X, X])),
        np.tanh(np.stack([X, X, X]))),
    "sharded PRNG keys": lambda: (
        jax.random.key_data(_run(lambda k: jax.vmap(lambda kk: jax.random.split(kk, 2))(k),
                                 (jax.random.split(jax.random.key(0), 8),), in_specs=(P("i"),))),
        jax.random.key_data(jax.vmap(lambda kk: jax.random.split(kk, 2))(jax.random.split(jax.random.key(0), 8)))),
    "jax.grad, class axis sharded (pmax)": lambda: (
        jax.grad(sp.autoshard(softmax_xent, mesh=auto_mesh(), in_specs=(None, P(None, "i"))), argnums=1)(X, W),
        jax.grad(softmax_xent, argnums=1)(X, W)),
    "jax.jit of an autoshard function": lambda: (
        jax.jit(sp.autoshard(softmax_xent, mesh=auto_mesh(), in_specs=(P("i"), None)))(X, W), softmax_xent(X, W)),
    "a while loop": lambda: (_run(loop, (X,), in_specs=(P("i"),)), loop(X)),
    "constraint that does not divide (uneven blocks, as jax.jit pads it)": lambda: (
        _run(lambda x: jax.lax.with_sharding_constraint(x[:6], NamedSharding(auto_mesh(), P("i"))) * 2.0, (X,),
             in_specs=(None,)), X[:6] * 2.0),
}


def _under_set_mesh(mesh, f, args):
    with jax.set_mesh(mesh):
        return sp.autoshard(f, mesh=auto_mesh(), in_specs=(P("i"), None))(*args), f(*args)


@pytest.mark.parametrize("name", sorted(RUNS))
def test_a_new_users_program_runs_as_unsharded(name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sp.ReshardWarning)
        warnings.simplefilter("ignore", sp.FallbackWarning)
        try:
            got, want = RUNS[name]()
        except sp.LoweringError as err:  # pragma: no cover - the failure this test exists for
            pytest.fail(f"{name}: a LoweringError in ordinary use: {err}")
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5, atol=2e-5)


# name -> (thunk, the typed error it must raise)
REFUSALS = {
    "constraint on an unknown axis": (lambda: _run(
        lambda x: jax.lax.with_sharding_constraint(x, NamedSharding(sp.make_mesh((8,), ("k",)), P("k"))),
        (X,), in_specs=(None,)), sp.UnknownMeshAxisError),
    "out_specs that do not divide": (lambda: _run(lambda x: x[:6] * 2.0, (X,), in_specs=(None,),
                                                  out_specs=P("i")), sp.IndivisibleAxisError),
    "out_specs not a prefix": (lambda: _run(lambda x: (x, x), (X,), in_specs=(None,), out_specs=(P("i"),)),
                               sp.SpecTreeError),
    "unhashable static argument": (lambda: _run(lambda x, n: x.reshape(n, -1), (X, [4]), in_specs=(P("i"),),
                                                static_argnums=1), sp.OptionError),
    "donate_argnums out of range": (lambda: _run(jnp.tanh, (X,), in_specs=(P("i"),), donate_argnums=1),
                                    sp.OptionError),
    "conflicts='error'": (lambda: _run(lambda x: x + x.T, (SQ,), in_specs=(P("i"),), conflicts="error"),
                          sp.ShardingConflictError),
}


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_bad_input_is_a_typed_error_naming_it(name):
    thunk, error = REFUSALS[name]
    with pytest.raises(error) as caught:
        thunk()
    assert not isinstance(caught.value, sp.LoweringError)
    assert "test_new_user_walk.py:" in str(caught.value)  # the user's line
