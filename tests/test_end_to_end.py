"""End-to-end equivalence: every function, under several specs and meshes, equals the unsharded result."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from tests.functions import mlp, nx_example
from tests.conftest import assert_same_as_unsharded, covering, random_args


def normalize_rows(a, b):
    x = a * b
    mu = jnp.mean(x, axis=1, keepdims=True)
    var = jnp.mean((x - mu) ** 2, axis=1, keepdims=True)
    return (x - mu) / jnp.sqrt(var + 1e-5)


def softmax_columns(a, b):
    return jax.nn.softmax(a - b, axis=0)


def gated(a, b):
    return jnp.where(a > b, jnp.tanh(a) * jax.nn.sigmoid(b), jnp.exp(-jnp.abs(b)))


def argmax_and_max(a, b):
    s = a + 2.0 * b
    return jnp.argmax(s, axis=1), jnp.max(s, axis=0), jnp.argmin(s, axis=0)


def transpose_mix(a, b):
    return jnp.sum(a.T * 3.0, axis=0)[:, None] + (a - b) / 2


def casts_and_logic(a, b):
    mask = (a > 0) & ~(b > 0.5)
    return jnp.any(mask, axis=0), mask.astype(jnp.int32).sum(axis=1), jnp.prod(jnp.cos(a), axis=1)


def matmul_chain(a, b):
    return jnp.tanh(a @ b.T) @ b


FUNCTIONS = [nx_example, normalize_rows, softmax_columns, gated, argmax_and_max, transpose_mix, casts_and_logic,
             matmul_chain]

SPECS = {
    "8": [(P("i"), P("i")), (P("i", None), None), (P(None, "i"), None), (P(), None), (None, P(None, "i")),
          (P("i"), P())],
    "4x2": [(P("i", "j"), P("i", "j")), (P("i", "j"), None), (P("i", None), None), (P(None, "j"), P(None, "j")),
            (P(("i", "j")), None), (None, None), (P(), P())],
    "2x2x2": [(P(("i", "j"), "k"), None), (P("i", ("j", "k")), P("i", ("j", "k"))), (P("k", "i"), P()),
              (None, P(("i", "j", "k")))],
}
STRATEGIES = ("gather", "collective", "auto")
# Every layout (mesh and specs) with a strategy, cycling so that each function meets all three; every function
# under every layout with -m slow, a covering sample by default (every function and every layout once).
LAYOUTS = [(m, s, STRATEGIES[k % 3]) for k, (m, s) in enumerate((m, s) for m, specs in SPECS.items() for s in specs)]
CASES = covering([(f,) for f in FUNCTIONS], LAYOUTS, ids=lambda row: row[0].__name__)


@pytest.mark.parametrize("f,layout", CASES)
def test_function_equals_unsharded(f, layout, meshes):
    mesh_name, specs, strategy = layout
    a, b = random_args([((16, 8), np.float32)] * 2, seed=sum(map(ord, f.__name__)))
    assert_same_as_unsharded(f, (a, b), mesh=meshes[mesh_name], in_specs=specs, strategy=strategy,
                             rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("mesh_name", ["8", "4x2", "2x2x2"])
def test_pytree_arguments_and_outputs(mesh_name, meshes):
    rng = np.random.default_rng(1)
    params = {"w1": rng.normal(size=(32, 64)).astype(np.float32) / 6,
              "b1": rng.normal(size=(64,)).astype(np.float32),
              "w2": rng.normal(size=(64, 16)).astype(np.float32) / 8,
              "b2": rng.normal(size=(16,)).astype(np.float32)}
    x = rng.normal(size=(16, 32)).astype(np.float32)
    specs = {"8": ({"w1": P(None, "i"), "b1": None, "w2": P("i"), "b2": P()}, None),
             "4x2": ({"w1": P(None, "j"), "b1": None, "w2": P("j"), "b2": P()}, P("i")),
             "2x2x2": (None, P(("i", "j")))}[mesh_name]
    assert_same_as_unsharded(mlp, (params, x), mesh=meshes[mesh_name], in_specs=specs, rtol=1e-4, atol=1e-4)


def test_nx_example_output_is_sharded_like_its_inputs(mesh):
    a, b = random_args([((16, 8), np.float32)] * 2)
    prog = assert_same_as_unsharded(nx_example, (a, b), mesh=mesh, in_specs=(P("i", "j"), P("i", "j")),
                                    strategy="gather")
    assert prog.out_specs == (P("i", "j"),)
    assert len(prog.stages) == 2


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.int32])
def test_python_scalar_arguments_are_weakly_typed_like_under_jit(dtype, mesh):
    """``f(x, 2.0, 3)`` works as under ``jax.jit``: the scalars are weakly typed, so ``x``'s dtype wins."""
    import shardprop as sp

    (x,) = random_args([((16, 8), dtype)])

    def f(x, scale, shift, flag):
        return jnp.where(flag, x * scale + shift, x)

    args = (x, 2.0, 3, True)
    prog = assert_same_as_unsharded(f, args, mesh=mesh, in_specs=(P("i", "j"), None, None, None),
                                    rtol=1e-3, atol=1e-3)
    want = jax.jit(f)(*args).dtype
    assert prog(*args).dtype == want
    assert want == (dtype if np.dtype(dtype).kind == "f" else np.float32)  # int * 2.0 promotes, f16 stays
    assert "f32[]" in str(prog.graph).split("\n  let")[0]  # the arguments' lines
    # a strongly typed scalar is a different signature: autoshard retraces instead of reusing the weak plan
    fs = sp.autoshard(f, mesh=mesh, in_specs=(P("i", "j"), None, None, None))
    assert fs.trace(*args) is not fs.trace(x, np.float32(2.0), 3, True)
    assert fs.lower(*args).compile().as_text()


def test_outputs_keep_the_weak_types_jit_gives_them(mesh):
    """A result computed only from Python scalars is weakly typed under ``jax.jit``; so is ours, and a
    program keeps its traced weak types when called with a strongly typed scalar (as a compiled jit does)."""
    import shardprop as sp

    (x,) = random_args([((16, 8), np.float16)])

    def f(x, s):
        return x * s, s * 2, s, jnp.float32(1.5) * s

    fs = sp.autoshard(f, mesh=mesh, in_specs=(P("i", "j"), None))
    ours, want = fs(x, 3.0), jax.jit(f)(x, 3.0)
    for o, w in zip(ours, want, strict=True):
        np.testing.assert_allclose(np.asarray(o), np.asarray(w), rtol=1e-3)
        assert (o.dtype, o.weak_type) == (w.dtype, w.weak_type)
    assert [o.weak_type for o in ours] == [False, True, True, False]

    prog, compiled = fs.trace(x, 3.0), jax.jit(f).lower(x, 3.0).compile()
    strong = np.float32(3.0)
    for o, w in zip(prog(x, strong), compiled(x, strong), strict=True):
        np.testing.assert_allclose(np.asarray(o), np.asarray(w), rtol=1e-3)
        assert (o.dtype, o.weak_type) == (w.dtype, w.weak_type)


def test_numpy_int64_arguments_are_canonicalized_like_under_jit(mesh):
    """Without ``jax_enable_x64``, ``jax.jit`` turns a numpy int64 argument into int32; so do we."""
    import shardprop as sp

    assert not jax.config.jax_enable_x64
    x = np.arange(16 * 8, dtype=np.int64).reshape(16, 8)
    fs = sp.autoshard(lambda x: jnp.cumsum(x * 3, axis=0), mesh=mesh, in_specs=(P("i", "j"),))
    out, want = fs(x), jax.jit(lambda x: jnp.cumsum(x * 3, axis=0))(x)
    assert out.dtype == want.dtype == np.int32
    np.testing.assert_array_equal(np.asarray(out), np.asarray(want))
    assert fs.trace(x)(x.astype(np.int32)).dtype == np.int32  # the same signature


def test_prng_keys_as_arguments_and_constants(mesh):
    import warnings

    (x,) = random_args([((16, 8), np.float32)])
    typed_key, raw_key = jax.random.key(1), jax.random.PRNGKey(2)

    def f(x, key):
        return jax.random.uniform(key, x.shape) * x + jax.random.normal(raw_key, x.shape)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # each device draws its block: nothing falls back
        assert_same_as_unsharded(f, (x, typed_key), mesh=mesh, in_specs=(P("i", "j"), None), rtol=1e-6, atol=1e-6)
