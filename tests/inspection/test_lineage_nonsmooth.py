"""Lineage of non-smooth functions against a perturbation oracle.

The Jacobian pattern (``test_lineage.py``) cannot judge exactness where a derivative vanishes although the
input matters: ``max`` and ``sort`` differentiate only the winning element, ``floor`` nothing at all. Here an
input element is a dependency of an output box when pushing it far up, far down, or setting it to zero
changes some element of the box, at one of several random points (compared with the unpushed point evaluated
the same way, so that batching does not change rounding). That set is always a subset of the true
dependencies (sound lineage must cover it), and for these functions, with large pushes and several points, it
is all of them (exact lineage must equal it).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import shardprop as sp
from shardprop.inspect.lineage import dependencies, mask

from .test_lineage import random_box

PUSH = 1e3
POINTS = 6


def perturbation_dependencies(f, shapes, out_box, seed=0):
    """Per input, the elements whose push (±PUSH, or to 0) changes the ``out_box`` of ``f``'s first output at
    one of POINTS random points."""
    rng = np.random.default_rng(seed)
    index = tuple(slice(s, e) for s, e in out_box)
    first = lambda *xs: jax.tree_util.tree_leaves(f(*xs))[0]  # noqa: E731
    deps = [np.zeros(s, bool) for s in shapes]
    for _ in range(POINTS):
        base = [rng.normal(size=s).astype(np.float32) for s in shapes]
        for i, shape in enumerate(shapes):
            size = int(np.prod(shape))
            flat = base[i].reshape(1, size)
            eye = np.eye(size, dtype=np.float32)
            for pushed in (flat + PUSH * eye, flat - PUSH * eye, flat * (1 - eye)):
                batch = np.concatenate([flat, pushed]).reshape((size + 1, *shape))  # row 0: the point itself
                outs = np.asarray(jax.vmap(lambda x, i=i, b=base: first(*b[:i], x, *b[i + 1:]))(batch))
                block = outs[(slice(None), *index)]
                want = block[:1]
                changed = ~np.all((block[1:] == want) | (np.isnan(block[1:]) & np.isnan(want)),
                                  axis=tuple(range(1, block.ndim)))
                deps[i] |= changed.reshape(shape)
    return deps


NONSMOOTH = {
    "relu_matmul": (lambda a, w: jax.nn.relu(a @ w), [(6, 4), (4, 5)]),
    "floor_round_sign": (lambda a: jnp.floor(a) + jnp.round(a * 3) - jnp.sign(a), [(5, 4)]),
    "max_and_argmax": (lambda a: (jnp.max(a, axis=1), jnp.argmax(a, axis=0)), [(6, 5)]),
    "where": (lambda a, b: jnp.where(a > 0, a, b) * 2.0, [(5, 4), (5, 4)]),
    "clip_abs": (lambda a, b: jnp.abs(jnp.clip(a, -0.5, 0.5)) + jnp.max(b, axis=1, keepdims=True), [(4, 6), (4, 3)]),
    "sort_rows": (lambda a: jnp.sort(a, axis=1), [(4, 6)]),
    "top_k": (lambda a: lax.top_k(a, 2)[0], [(5, 6)]),
    "cummax": (lambda a: lax.cummax(a, axis=0), [(6, 3)]),
    "window_max": (lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (2, 2), (1, 1), ((1, 0), (0, 1))), [(6, 5)]),
    "tile": (lambda a: jnp.maximum(jnp.tile(a, (2, 3)), 0.0), [(3, 4)]),
    "stack_unstack": (lambda a, b: jnp.abs(jnp.stack([a, b], 1)) + jnp.unstack(b, axis=0)[1], [(4, 5), (4, 5)]),
    "split": (lambda a: jnp.maximum(*jnp.split(a, 2, axis=1)), [(3, 8)]),
}


@pytest.mark.parametrize("name", sorted(NONSMOOTH))
def test_lineage_of_non_smooth_functions_against_pushes(name):
    f, shapes = NONSMOOTH[name]
    graph = sp.trace(f, *[jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes])
    out = graph.outputs[0]
    rng = np.random.default_rng(5)
    exact_boxes = 0
    for trial in range(4):
        box = random_box(rng, graph.avals[out].shape)
        found, exact = dependencies(graph, out, [box])
        want = perturbation_dependencies(f, shapes, box, seed=trial)
        for index, shape in enumerate(shapes):
            got = mask(shape, found[index])
            assert not (want[index] & ~got).any(), f"{name} box {box}: lineage misses part of input {index}"
            if exact:
                np.testing.assert_array_equal(got, want[index], err_msg=f"{name} box {box} input {index}")
        exact_boxes += exact
    assert exact_boxes, f"{name}: no box was exact, so exactness was never checked"
