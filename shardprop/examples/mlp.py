"""A multi-layer perceptron: forward pass, cross-entropy loss, and an SGD training step."""

import jax
import jax.numpy as jnp
import numpy as np


def init_params(sizes=(32, 64, 10), seed=0):
    rng = np.random.default_rng(seed)
    return [{"w": (rng.normal(size=(m, n)) / np.sqrt(m)).astype(np.float32),
             "b": (rng.normal(size=(n,)) * 0.1).astype(np.float32)}
            for m, n in zip(sizes[:-1], sizes[1:], strict=True)]


def forward(params, x):
    for layer in params[:-1]:
        x = jax.nn.relu(x @ layer["w"] + layer["b"])
    return x @ params[-1]["w"] + params[-1]["b"]


def loss(params, x, labels):
    logits = forward(params, x)
    log_probs = logits - jax.nn.logsumexp(logits, axis=-1, keepdims=True)
    targets = jax.nn.one_hot(labels, logits.shape[-1])
    return -jnp.mean(jnp.sum(targets * log_probs, axis=-1))


def train_step(params, x, labels, lr=0.1):
    value, grads = jax.value_and_grad(loss)(params, x, labels)
    new_params = jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads)
    return new_params, value
