"""The programs the Model Explorer tests draw: the Nx example, a loop, a partial sum, a transformer training step,
ranged rows realigned, a pending maximum."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import shardprop as sp
from shardprop.examples import attention, inspect_example
from tests.inspection.nx_example import f as nx_f

RNG = np.random.default_rng(0)


def _normal(*shape):
    return jnp.asarray(RNG.normal(size=shape), jnp.float32)


def transformer_step(params, x, lr=0.01):
    """One SGD step of a transformer block on a squared-activation loss: forward, backward and update."""
    def loss(params):
        return jnp.mean(attention.transformer_block(params, x) ** 2)

    grads = jax.grad(loss)(params)
    return jax.tree.map(lambda p, g: p - lr * g, params, grads)


def sorted_product(x, w):
    """A contraction over a sharded axis (a partial sum, finished by a psum), sorted along another sharded axis (an
    all-gather first)."""
    return jnp.sort(x @ w, axis=0)


def glu(x, w):
    """A gated linear unit: the halves of a product over a sharded axis are ranged rows, realigned to be multiplied."""
    a, b = jnp.split(x @ w, 2, axis=1)
    return a * jax.nn.sigmoid(b)


def column_maximum(x):
    """A maximum over a sharded axis: a pending maximum (``{max i}``), finished by a pmax."""
    return jnp.max(jnp.tanh(x), axis=0)


def block_specs(hidden):
    col, row = P(None, hidden), P(hidden, None)
    return {"wq": col, "wk": col, "wv": col, "wo": row, "w1": col, "b1": P(hidden), "w2": row, "b2": None,
            "ln1_g": None, "ln1_b": None, "ln2_g": None, "ln2_b": None}


def program(name: str):
    """``name``'s Program on a 4x2 mesh."""
    mesh = sp.make_mesh((4, 2), ("i", "j"))
    if name == "nx":
        a, b = jnp.arange(128.0).reshape(16, 8), jnp.ones((16, 8))
        return sp.autoshard(nx_f, mesh=mesh, in_specs=(P("i", "j"), None), strategy="gather").trace(a, b)
    if name == "scan":
        args = (_normal(16, 16), _normal(6, 8, 16), _normal(8, 16))
        return sp.autoshard(inspect_example.rnn_grad, mesh=mesh, in_specs=(None, P(None, "i"), P("i"))).trace(*args)
    if name == "partial":
        specs = (P("i", "j"), P("j", None))
        return sp.autoshard(sorted_product, mesh=mesh, in_specs=specs).trace(_normal(16, 8), _normal(8, 8))
    if name == "transformer":
        block = attention.init_block()
        x = _normal(8, 16, 32)
        return sp.autoshard(transformer_step, mesh=mesh, in_specs=(block_specs("j"), P("i"))).trace(block, x)
    if name == "ranged":
        return sp.autoshard(glu, mesh=mesh, in_specs=(P("i"), P(None, "j"))).trace(_normal(16, 32), _normal(32, 64))
    if name == "maximum":
        return sp.autoshard(column_maximum, mesh=mesh, in_specs=(P("i", "j"),)).trace(_normal(16, 8))
    raise KeyError(name)


NAMES = ("nx", "scan", "partial", "transformer", "ranged", "maximum")
