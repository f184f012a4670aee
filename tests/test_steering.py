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
