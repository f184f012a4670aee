"""Functions several tests shard: the Nx design note's example (its one copy in the tests, which the golden
outputs pin to its source lines) and a small MLP — kept here so that the tests do not depend on the
command-line application's demo."""

import jax
import jax.numpy as jnp

from tests.inspection.nx_example import f as nx_example  # noqa: F401  (re-exported for the other tests)


def mlp(params, x):
    """A two-layer MLP returning its logits and the mean of squared logits."""
    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    logits = h @ params["w2"] + params["b2"]
    return logits, jnp.mean(logits**2)
