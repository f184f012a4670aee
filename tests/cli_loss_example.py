"""A small language-model loss over a dict of parameters, for the CLI's pytree arguments (``--args``):
tests/test_cli_arguments.py, tests/test_cli_inspect.py and tests/test_cli_debug.py."""

import jax
import jax.numpy as jnp
import numpy as np

VOCAB, DIM, HIDDEN, BATCH, LENGTH = 16, 8, 32, 8, 4


def loss_fn(params, tokens, targets):
    """Mean cross-entropy of next-token logits: an embedding, a tanh layer, an unembedding."""
    x = params["embed"][tokens]                                   # [BATCH, LENGTH, DIM]
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    logp = jax.nn.log_softmax(h @ params["w2"], axis=-1)          # [BATCH, LENGTH, VOCAB]
    return -jnp.mean(jnp.sum(jax.nn.one_hot(targets, VOCAB) * logp, axis=-1))


def nan_loss(params, tokens, targets):
    """A planted bug: a penalty taking the log of a negative number, NaN sharded and unsharded alike. A vector, not
    a scalar: debug's first_nonfinite misses a NaN in a 0-d value (np.argwhere of a 0-d array is empty)."""
    return loss_fn(params, tokens, targets) + jnp.mean(jnp.log(-1.0 - params["b1"] ** 2))


def make_params(seed=0):
    rng = np.random.default_rng(seed)
    shapes = {"embed": (VOCAB, DIM), "w1": (DIM, HIDDEN), "b1": (HIDDEN,), "w2": (HIDDEN, VOCAB)}
    return {name: (0.5 * rng.normal(size=shape)).astype(np.float32) for name, shape in shapes.items()}


def make_batch(seed=1):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, VOCAB, size=(BATCH, LENGTH)).astype(np.int32)
    return tokens, np.roll(tokens, -1, axis=1)


def make_args():
    """Every argument of ``loss_fn`` as arrays."""
    return (make_params(), *make_batch())


def make_shapes():
    """Only the shapes (``debug`` fills them from ``--seed``)."""
    return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), make_args())


def make_batch_only():
    """The two arguments after the parameters, for ``--args params.npz --args THIS``."""
    return make_batch()


def make_dict():
    return {"not": "a tuple"}


def make_fails():
    raise RuntimeError("no data here")
