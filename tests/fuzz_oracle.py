"""The fuzzers' oracle: a generated program (``tests.fuzzing.Program``) as two functions — with its sharding
constraints on the mesh, and without them (the unsharded reference: JAX refuses eagerly a constraint that does not
divide its axis, which ``jax.jit`` pads) — a scalar loss to differentiate, the comparison with its tolerance, and a
failing case as a script a user can run."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from tests.conftest import MESH_SHAPES

CONSTRAIN = "def constrain(x, spec):\n    return jax.lax.with_sharding_constraint(x, NamedSharding(MESH, spec))\n"
WEIGHTED = ("def weighted(g):\n    def loss(*xs):\n        outs = jax.tree_util.tree_leaves(g(*xs))\n"
            "        return sum(jnp.sum(o * jnp.cos(jnp.arange(o.size, dtype=o.dtype).reshape(o.shape)))\n"
            "                   for o in outs)\n"
            "    return loss\n")


def finite_magnitude(x) -> float:
    """The largest finite magnitude in ``x``: the scale of the tolerance (a "fill" gather gives NaN)."""
    a = np.abs(np.asarray(x))
    return float(np.max(a[np.isfinite(a)], initial=0))


def assert_matches(got, want) -> None:
    """``got`` equals the unsharded ``want`` leaf by leaf: shape, dtype, and values to float32 sums reassociated across
    blocks (a tolerance relative to the result's magnitude); a NaN or an infinity only where ``want`` has one."""
    got_leaves, want_leaves = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
    assert len(got_leaves) == len(want_leaves)
    for g, w in zip(got_leaves, want_leaves, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        w = np.asarray(w)
        np.testing.assert_allclose(np.asarray(g), w, rtol=2e-4, atol=1e-4 * (1 + finite_magnitude(w)))


def matches(got, want) -> bool:
    """Whether ``assert_matches(got, want)`` passes."""
    got_leaves, want_leaves = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
    return len(got_leaves) == len(want_leaves) and all(
        g.shape == w.shape and g.dtype == w.dtype and np.allclose(
            np.asarray(g), np.asarray(w), rtol=2e-4, atol=1e-4 * (1 + finite_magnitude(w)), equal_nan=True)
        for g, w in zip(got_leaves, want_leaves, strict=True))


def unsharded(reference, args, *, eager: bool = True):
    """``(outputs, gradients)`` of the unsharded ``reference`` on ``args``: its outputs, and the gradient of their
    ``weighted`` loss with respect to every argument — run eagerly, one ``jax.numpy`` call at a time, or with
    ``eager=False`` under one ``jax.jit`` (one compile rather than one per op: a third of the time). The two can
    differ: XLA computes a cheap value again in every kernel that reads it, and the copies can differ in their last
    bit (a fused multiply-add in one kernel, another summation order in another), so that ``x == max(x)`` in a
    maximum's derivative misses the maximum — a jitted reference's gradient of ``jnp.max(|x| + |x|.mean(0), axis=2)``
    is off by a third where eager evaluation and the sharded program agree (shardprop holds such values once:
    ``shardprop/backends/evaluate.py``). ``Unsharded`` reads both."""
    def loss(*xs):
        outs = reference(*xs)
        return weighted(lambda *_: outs)(*xs), outs

    step = jax.value_and_grad(loss, argnums=tuple(range(len(args))), has_aux=True)
    (_, outs), grads = (step if eager else jax.jit(step))(*(jnp.asarray(a) for a in args))
    return outs, grads


class Unsharded:
    """The unsharded reference's outputs and gradients on ``args``, jitted (``unsharded(eager=False)``), and eagerly
    only when a result differs from the jitted ones: a sharded result passes if it equals either. Both are the
    unsharded function evaluated by JAX without shardprop; eagerly is the last word where the jitted reference
    computes a maximum's tie test from two roundings of one value."""

    def __init__(self, reference, args):
        self.reference, self.args = reference, args
        self.jitted = unsharded(reference, args, eager=False)
        self._eager = None

    def assert_matches(self, got, part: int) -> None:
        """``got`` equals the reference's outputs (``part`` 0) or gradients (``part`` 1)."""
        if matches(got, self.jitted[part]):
            return
        if self._eager is None:
            self._eager = unsharded(self.reference, self.args)
        assert_matches(got, self._eager[part])

    @property
    def rechecked(self) -> bool:
        """Whether a result differed from the jitted reference (and equalled the eager one)."""
        return self._eager is not None


def namespace_for(mesh, *, reference: bool = False) -> dict:
    """What a generated program's source refers to: ``constrain`` a sharding constraint on ``mesh`` — or, for
    the unsharded reference, nothing at all."""
    namespace = {"jnp": jnp, "np": np, "lax": lax, "jax": jax, "NamedSharding": NamedSharding, "P": P, "MESH": mesh}
    if reference:
        namespace["constrain"] = lambda x, spec: x
    else:
        exec(CONSTRAIN, namespace)  # noqa: S102
    return namespace


def program_functions(program, mesh):
    """``(f, unconstrained f)``: the generated program, and the same without its sharding constraints."""
    sharded, reference = namespace_for(mesh), namespace_for(mesh, reference=True)
    exec(program.source, sharded)  # noqa: S102  the generated program
    exec(program.source, reference)  # noqa: S102
    return sharded["f"], reference["f"]


def weighted(g):
    """The scalar loss of ``g``'s outputs, each weighted elementwise (so that every element's gradient differs)."""
    namespace = {"jax": jax, "jnp": jnp}
    exec(WEIGHTED, namespace)  # noqa: S102  (the reproducer prints the same definition)
    return namespace["weighted"](g)


def loss_weights(output):
    """The cotangent ``weighted``'s loss gives ``output``: ``cos(0, 1, 2, ...)`` in its shape, counted and rounded in
    its dtype as the loss does (a derivative of an integer output is float0)."""
    if not jnp.issubdtype(output.dtype, jnp.inexact):
        return np.zeros(output.shape, jax.dtypes.float0)
    counted = np.arange(output.size).astype(output.dtype)
    return np.cos(counted.astype(np.float32)).astype(output.dtype).reshape(output.shape)


def reproducer(program, mesh_name, specs, options, *, gradients: bool = False) -> str:
    """The failing case as a script a user can run; with ``gradients``, checking both derivatives too: ``jax.grad``
    of the sharded program, and the sharded ``jax.grad``."""
    shape, names = MESH_SHAPES[mesh_name]
    args = ", ".join(f"rng.normal(size={v.shape}).astype(np.float32)" for v in program.inputs)
    def call(skip=()):
        return f"mesh=MESH, in_specs={specs!r}, " + ", ".join(f"{k}={v!r}" for k, v in options.items() if k not in skip)
    lines = [
        "import jax", 'jax.config.update("jax_num_cpu_devices", 8)',
        "import jax.numpy as jnp, numpy as np", "from jax import lax",
        "from jax.sharding import NamedSharding, PartitionSpec as P", "import shardprop as sp",
        f"MESH = sp.make_mesh({shape}, {names})", "", CONSTRAIN, program.source,
        "rng = np.random.default_rng(0)", f"args = ({args},)",
        f"got = sp.autoshard(f, {call()})(*args)",
        "sharded_f = f", "constrain = lambda x, spec: x  # the unsharded reference",
        "want = f(*map(jnp.asarray, args))",
        "for g, w in zip(got, want):", "    np.testing.assert_allclose(g, w, rtol=2e-4, atol=1e-4)", ""]
    if gradients:
        lines += [WEIGHTED, "argnums = tuple(range(len(args)))",
                  "want = jax.grad(weighted(f), argnums=argnums)(*map(jnp.asarray, args))",
                  f"through = jax.grad(weighted(sp.autoshard(sharded_f, {call()})), argnums=argnums)(*args)",
                  f"sharded_grad = sp.autoshard(jax.grad(weighted(sharded_f), argnums=argnums), "
                  f"{call(skip=('out_specs',))})(*args)",
                  "for got in (through, sharded_grad):", "    for g, w in zip(got, want):",
                  "        np.testing.assert_allclose(g, w, rtol=2e-4, atol=1e-4)", ""]
    return "\n".join(lines)
