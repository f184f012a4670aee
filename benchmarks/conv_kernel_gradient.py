"""Bytes per device that a data-parallel convolution's kernel gradient moves, shardprop ("auto") against jax.jit on
the same mesh, from both compiled HLOs; each result checked against the unsharded function.

    python benchmarks/conv_kernel_gradient.py      # the flax row needs `pip install flax optax`
"""

from __future__ import annotations

import jax

jax.config.update("jax_num_cpu_devices", 8)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import shardprop as sp  # noqa: E402


def lax_conv():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 12, 12, 3)).astype(np.float32)
    k = (rng.normal(size=(3, 3, 3, 8)) * 0.3).astype(np.float32)

    def loss(k, x):
        y = lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return jnp.mean(jnp.tanh(y) ** 2)

    return "lax conv, kernel gradient", jax.grad(loss), (k, x), (P(), P("i")), 1e-6


def flax_train_step():
    import flax.linen as nn
    import optax

    class CNN(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.relu(nn.BatchNorm(use_running_average=False)(nn.Conv(8, (3, 3))(x)))
            x = nn.relu(nn.Conv(16, (3, 3), strides=2)(x)).mean(axis=(1, 2))
            return nn.Dense(10)(x)

    model, tx = CNN(), optax.sgd(0.1)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 16, 16, 3)).astype(np.float32)
    y = (np.arange(32) % 10).astype(np.int32)
    variables = model.init(jax.random.PRNGKey(0), x[:2])

    def step(params, stats, opt, x, y):
        def loss_fn(p):
            logits, new = model.apply({"params": p, "batch_stats": stats}, x, mutable=["batch_stats"])
            return optax.softmax_cross_entropy(logits, jax.nn.one_hot(y, 10)).mean(), new
        (loss, new), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), new["batch_stats"], opt, loss

    args = (variables["params"], variables["batch_stats"], tx.init(variables["params"]), x, y)
    return "flax BatchNorm+conv train step (sgd)", step, args, (P(), P(), P(), P("i"), P("i")), 1e-5


def main() -> None:
    mesh = sp.make_mesh((8,), ("i",))
    cases = [lax_conv]
    try:
        import flax  # noqa: F401
        import optax  # noqa: F401

        cases.append(flax_train_step)
    except ImportError:
        print("(flax or optax not installed: the flax row is left out)")
    print(f"mesh {dict(mesh.shape)}, data parallel over i; bytes per device from the compiled HLOs\n")
    print(f"{'workload':40} {'max abs error':>14} {'bytes shardprop':>16} {'bytes jit':>10}")
    for case in cases:
        name, f, args, specs, atol = case()
        got = jax.tree_util.tree_leaves(sp.autoshard(f, mesh=mesh, in_specs=specs)(*args))
        want = jax.tree_util.tree_leaves(f(*args))
        error = max(float(np.max(np.abs(np.asarray(g) - np.asarray(w)))) for g, w in zip(got, want, strict=True))
        comparison = sp.compare_with_jit(f, mesh, specs, *args)
        print(f"{name:40} {error:>14.2g} {comparison.shardprop_bytes:>16.0f} {comparison.jit_bytes:>10.0f}")


if __name__ == "__main__":
    main()
