"""Real-library models: flax (linen), equinox, haiku and optax, written as their documentation writes them.

Each ``build`` imports its libraries when it runs (they are the optional ``bench`` extra) and returns a training
step ``f(*args)`` with its arguments and input specs. Parameters are replicated under data parallelism; under
2-D the last axis of every weight matrix (and kernel) is split over ``model`` where it divides, the rest left to
adopt what it meets. The same builders back ``tests/test_libraries.py`` at smaller sizes (``small=True``).
"""

from __future__ import annotations

import numpy as np
from jax.sharding import PartitionSpec as P

from .workloads import DATA, MODEL, MESHES, Case, Workload, arrays

FLAX, EQUINOX, HAIKU, OPTAX = "flax", "equinox", "haiku", "optax"


def split_last_axis(tree, axis: str | None):
    """Specs for a tree of parameters: each array of rank ≥ 2 whose last axis divides by ``axis``'s size has that
    axis split over it; every other leaf (and every leaf when ``axis`` is None) replicated."""
    import jax

    sizes, names = MESHES["2-D"]
    size = dict(zip(names, sizes, strict=True)).get(axis, 1)

    def spec(x):
        if axis is None or np.ndim(x) < 2 or np.shape(x)[-1] % size:
            return P()
        return P(*([None] * (np.ndim(x) - 1)), axis)

    return jax.tree_util.tree_map(spec, tree)


def numpy_init(shapes, seed: int, fan_in=lambda shape: int(np.prod(shape[:-1]))):
    """Concrete values for the abstract parameters ``shapes`` (``jax.eval_shape`` of a model's init, so nothing
    is computed or compiled: an eager init dispatches and compiles op by op, seconds on a small CPU): weights
    normal with variance 1/``fan_in(shape)``, scales and variances ones, biases and means zeros."""
    import jax

    rng = np.random.default_rng(seed)

    def leaf(path, s):
        if len(s.shape) >= 2:
            return (rng.normal(size=s.shape) / np.sqrt(fan_in(s.shape))).astype(s.dtype)
        name = str(getattr(path[-1], "key", getattr(path[-1], "name", ""))) if path else ""
        return (np.ones if name in ("scale", "var") else np.zeros)(s.shape, s.dtype)

    return jax.tree_util.tree_map_with_path(leaf, shapes)


def optimizer_state(tx, params):
    """``tx.init(params)`` without running it: every optimizer here starts from zeros (momenta, counts)."""
    import jax

    return jax.tree_util.tree_map(lambda s: np.zeros(s.shape, s.dtype), jax.eval_shape(tx.init, params))


def _specs(parallel: str, params, *rest_batch):
    """(params' specs, then ``P(DATA)`` for each batch argument) for ``parallel`` "data" or "2-D"."""
    return (split_last_axis(params, MODEL if parallel == "2-D" else None), *(P(DATA) for _ in rest_batch))


# -- flax linen: a CNN with BatchNorm ---------------------------------------------------------------------------
def flax_cnn(parallel: str, optimizer: str = "sgd", small: bool = False):
    def build() -> Case:
        import flax.linen as nn
        import jax
        import optax

        class CNN(nn.Module):
            @nn.compact
            def __call__(self, x):
                # No bias before BatchNorm (as usual): its gradient is zero in exact arithmetic, and adam would turn
                # the rounding noise into updates of ±lr that no tolerance could compare.
                x = nn.relu(nn.BatchNorm(use_running_average=False)(nn.Conv(8, (3, 3), use_bias=False)(x)))
                x = nn.relu(nn.Conv(16, (3, 3), strides=2)(x)).mean(axis=(1, 2))
                return nn.Dense(10)(x)

        model = CNN()
        tx = optax.sgd(0.1, momentum=0.9) if optimizer == "sgd" else optax.adam(1e-3)
        normal, _ = arrays()
        batch, side = (16, 8) if small else (64, 16)
        x, y = normal(batch, side, side, 3), (np.arange(batch) % 10).astype(np.int32)
        variables = numpy_init(jax.eval_shape(model.init, jax.random.PRNGKey(0), x[:2]), 0)

        def train_step(params, batch_stats, opt_state, x, y):
            def loss_fn(p):
                logits, new = model.apply({"params": p, "batch_stats": batch_stats}, x, mutable=["batch_stats"])
                return optax.softmax_cross_entropy(logits, jax.nn.one_hot(y, 10)).mean(), new

            (loss, new), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), new["batch_stats"], opt_state, loss

        params, stats = variables["params"], variables["batch_stats"]
        param_specs, x_spec, y_spec = _specs(parallel, params, x, y)
        return Case(train_step, (params, stats, optimizer_state(tx, params), x, y),
                    (param_specs, None, None, x_spec, y_spec))

    return build


# -- flax linen: an embedding classifier with integer labels ----------------------------------------------------
def flax_embedding(parallel: str, small: bool = False):
    def build() -> Case:
        import flax.linen as nn
        import jax
        import optax

        vocab, classes = (64, 8) if small else (512, 16)

        class Classifier(nn.Module):
            @nn.compact
            def __call__(self, ids):
                h = nn.Embed(vocab, 32)(ids).mean(axis=1)
                return nn.Dense(classes)(nn.tanh(nn.Dense(64)(h)))

        model, tx = Classifier(), optax.adam(1e-3)
        _, rng = arrays(1)
        batch = 32 if small else 256
        ids = rng.integers(0, vocab, size=(batch, 16)).astype(np.int32)
        labels = rng.integers(0, classes, size=batch).astype(np.int32)
        params = numpy_init(jax.eval_shape(model.init, jax.random.PRNGKey(1), ids[:2]), 1)["params"]

        def train_step(params, opt_state, ids, labels):
            def loss_fn(p):
                logits = model.apply({"params": p}, ids)
                return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

            loss, grads = jax.value_and_grad(loss_fn)(params)
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss

        param_specs, id_spec, label_spec = _specs(parallel, params, ids, labels)
        return Case(train_step, (params, optimizer_state(tx, params), ids, labels),
                    (param_specs, None, id_spec, label_spec))

    return build


# -- flax linen: an MLP with dropout (random bits inside the step) ----------------------------------------------
def flax_dropout(parallel: str, small: bool = False):
    def build() -> Case:
        import flax.linen as nn
        import jax
        import optax

        class MLP(nn.Module):
            @nn.compact
            def __call__(self, x):
                x = nn.Dropout(0.2, deterministic=False)(nn.gelu(nn.Dense(128)(x)))
                return nn.Dense(10)(x)

        model, tx = MLP(), optax.sgd(0.05)
        normal, _ = arrays(2)
        batch = 32 if small else 256
        x, y = normal(batch, 64), (np.arange(batch) % 10).astype(np.int32)
        params = numpy_init(jax.eval_shape(model.init, jax.random.PRNGKey(2), x[:2]), 2)["params"]
        key = np.array([0, 3], np.uint32)  # jax.random.PRNGKey(3)'s data: a raw threefry key

        def train_step(params, opt_state, key, x, y):
            def loss_fn(p):
                logits = model.apply({"params": p}, x, rngs={"dropout": key})
                return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

            loss, grads = jax.value_and_grad(loss_fn)(params)
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss

        param_specs, x_spec, y_spec = _specs(parallel, params, x, y)
        return Case(train_step, (params, optimizer_state(tx, params), key, x, y),
                    (param_specs, None, P(), x_spec, y_spec))

    return build


# -- equinox: an MLP trained with optax's adam ------------------------------------------------------------------
def equinox_mlp(parallel: str, small: bool = False):
    def build() -> Case:
        import equinox as eqx
        import jax
        import jax.numpy as jnp
        import optax

        width = 64 if small else 256
        abstract = eqx.filter_eval_shape(eqx.nn.MLP, 32, 8, width, depth=2, key=jax.random.PRNGKey(4))
        shapes, static = eqx.partition(abstract, lambda leaf: isinstance(leaf, jax.ShapeDtypeStruct))
        params = numpy_init(shapes, 4, fan_in=lambda shape: shape[-1])  # equinox's Linear is (out, in)
        tx = optax.adam(1e-3)
        normal, _ = arrays(4)
        batch = 32 if small else 256
        x, y = normal(batch, 32), normal(batch, 8)

        def train_step(params, opt_state, x, y):
            def loss_fn(p):
                pred = jax.vmap(eqx.combine(p, static))(x)
                return jnp.mean((pred - y) ** 2)

            loss, grads = jax.value_and_grad(loss_fn)(params)
            updates, opt_state = tx.update(grads, opt_state, params)
            return eqx.apply_updates(params, updates), opt_state, loss

        param_specs, x_spec, y_spec = _specs(parallel, params, x, y)
        return Case(train_step, (params, optimizer_state(tx, params), x, y), (param_specs, None, x_spec, y_spec))

    return build


# -- haiku: a conv net trained with optax's sgd -----------------------------------------------------------------
def haiku_convnet(parallel: str, small: bool = False):
    def build() -> Case:
        import haiku as hk
        import jax
        import optax

        def net(x):
            x = jax.nn.relu(hk.Conv2D(8, 3)(x))
            x = hk.max_pool(x, window_shape=(1, 2, 2, 1), strides=(1, 2, 2, 1), padding="VALID")
            x = jax.nn.relu(hk.Conv2D(16, 3)(x)).mean(axis=(1, 2))
            return hk.Linear(10)(x)

        model, tx = hk.without_apply_rng(hk.transform(net)), optax.sgd(0.1)
        normal, _ = arrays(5)
        batch, side = (16, 8) if small else (64, 16)
        x, y = normal(batch, side, side, 3), (np.arange(batch) % 10).astype(np.int32)
        params = numpy_init(jax.eval_shape(model.init, jax.random.PRNGKey(5), x[:2]), 5)

        def train_step(params, opt_state, x, y):
            def loss_fn(p):
                return optax.softmax_cross_entropy_with_integer_labels(model.apply(p, x), y).mean()

            loss, grads = jax.value_and_grad(loss_fn)(params)
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss

        param_specs, x_spec, y_spec = _specs(parallel, params, x, y)
        return Case(train_step, (params, optimizer_state(tx, params), x, y), (param_specs, None, x_spec, y_spec))

    return build


# -- optax: vocabulary-parallel cross-entropy (the logits' class axis sharded) ----------------------------------
def vocab_parallel_xent(parallel: str, small: bool = False):
    def build() -> Case:
        import jax
        import optax

        normal, rng = arrays(6)
        batch, features, vocab = (32, 16, 64) if small else (256, 128, 2048)
        x, w = normal(batch, features), normal(features, vocab, scale=features ** -0.5)
        labels = rng.integers(0, vocab, size=batch).astype(np.int32)
        tx = optax.sgd(0.1)

        def train_step(w, opt_state, x, labels):
            def loss_fn(w):
                return optax.softmax_cross_entropy_with_integer_labels(x @ w, labels).mean()

            loss, grads = jax.value_and_grad(loss_fn)(w)
            updates, opt_state = tx.update(grads, opt_state, w)
            return optax.apply_updates(w, updates), opt_state, loss

        batch_spec = P(DATA) if parallel == "2-D" else None
        return Case(train_step, (w, optimizer_state(tx, w), x, labels), (P(None, MODEL), None, batch_spec, batch_spec))

    return build


# Why rows miss a goal, as measured on the development machine (8 virtual CPU devices on 2 cores).
GATHERS_INSIDE_SHARD_MAP = (
    "its gathers run inside shard_map, as every planned move does (the same 13 collectives and 167.1 KiB as when "
    "XLA placed them between stages); XLA:CPU's layout assignment adds eight small transposing copies around them "
    "(f32[16,5] {1,0} to {0,1}): 1.10-1.11x in A/B runs against 1.08x with the gathers left to XLA")

LIBRARIES = [
    Workload("flax CNN+BatchNorm (sgd)", "library", "data", flax_cnn("data"), rtol=2e-4, atol=2e-5,
             requires=(FLAX, OPTAX)),
    Workload("flax CNN+BatchNorm (adam)", "library", "2-D", flax_cnn("2-D", "adam"), rtol=2e-4, atol=2e-5,
             requires=(FLAX, OPTAX), known_gap=GATHERS_INSIDE_SHARD_MAP),
    Workload("flax embedding classifier", "library", "data", flax_embedding("data"), rtol=2e-4, atol=2e-5,
             requires=(FLAX, OPTAX), quick=True),
    Workload("flax embedding classifier", "library", "2-D", flax_embedding("2-D"), rtol=2e-4, atol=2e-5,
             requires=(FLAX, OPTAX)),
    Workload("flax dropout MLP", "library", "data", flax_dropout("data"), rtol=2e-4, atol=2e-5,
             requires=(FLAX, OPTAX)),
    Workload("equinox MLP (adam)", "library", "data", equinox_mlp("data"), rtol=2e-4, atol=2e-5,
             requires=(EQUINOX, OPTAX), quick=True),
    Workload("equinox MLP (adam)", "library", "2-D", equinox_mlp("2-D"), rtol=2e-4, atol=2e-5,
             requires=(EQUINOX, OPTAX)),
    Workload("haiku convnet (sgd)", "library", "data", haiku_convnet("data"), rtol=2e-4, atol=2e-5,
             requires=(HAIKU, OPTAX)),
    Workload("haiku convnet (sgd)", "library", "2-D", haiku_convnet("2-D"), rtol=2e-4, atol=2e-5,
             requires=(HAIKU, OPTAX)),
    Workload("optax vocab-parallel xent", "library", "tensor", vocab_parallel_xent("tensor"), rtol=2e-4,
             atol=2e-5, requires=(OPTAX,)),
    Workload("optax vocab-parallel xent", "library", "2-D", vocab_parallel_xent("2-D"), rtol=2e-4, atol=2e-5,
             requires=(OPTAX,)),
]
