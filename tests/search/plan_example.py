"""A training step for ``shardprop plan`` (tests/search/test_cli_plan.py)."""

import jax
import jax.numpy as jnp

from shardprop.bench import models


def step(params, x, labels):
    return models.mlp_train_step(params, x, labels)


def example():
    params = models.init_mlp((64, 128, 64))
    return params, jax.ShapeDtypeStruct((16, 64), jnp.float32), jax.ShapeDtypeStruct((16,), jnp.int32)


def matmul(a, b):
    return jnp.tanh(a @ b)
