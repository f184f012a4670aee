"""A gradient laid out by its use: two layers with equinox-style (out, in) weights, both ``P(None, 'model')``, trained
by ``p - 0.1 * g`` on a (4, 2) mesh. The second layer's gradient is computed in its parameter's layout (the backward
pass, docs/design.md); the first layer's is moved at the update, the priced cheapest way.

    python -m shardprop.examples.backward
"""

import jax

jax.config.update("jax_num_cpu_devices", 8)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import shardprop as sp  # noqa: E402


def loss(params, x, y):
    h = jax.nn.relu(x @ params[0].T)
    return jnp.mean((h @ params[1].T - y) ** 2)


def step(params, x, y):
    grads = jax.grad(loss)(params, x, y)
    return [p - 0.1 * g for p, g in zip(params, grads, strict=True)]


def arguments():
    rng = np.random.default_rng(0)
    params = [rng.normal(size=(16, 8)).astype(np.float32), rng.normal(size=(4, 16)).astype(np.float32)]
    return params, rng.normal(size=(32, 8)).astype(np.float32), rng.normal(size=(32, 4)).astype(np.float32)


SPECS = ([P(None, "model")] * 2, P("data"), P("data"))

if __name__ == "__main__":
    mesh = sp.make_mesh((4, 2), ("data", "model"))
    prog = sp.autoshard(step, mesh=mesh, in_specs=SPECS).trace(*arguments())
    print(sp.explain(prog, "t"))
    print(sp.compare_with_jit(step, mesh, SPECS, *arguments()))
