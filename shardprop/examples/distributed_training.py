"""A training loop on several processes, each feeding only its own rows of every batch.

    shardprop launch -n 2 --devices-per-process 4 -- python -m shardprop.examples.distributed_training

(or on a real cluster, one process per host: ``python -m shardprop.examples.distributed_training``). The batch is
sharded over ``i`` (data parallel) and the hidden layer over ``j`` (tensor parallel) on a mesh spanning every
process; each process reads its rows of each batch from its own slice of the data set and
``sp.distributed.process_local`` assembles the global batch. ``--check`` also trains unsharded on the whole
data on every process and compares the parameters.
"""

import sys

import shardprop as sp

sp.distributed.initialize()  # first: joins the cluster (a no-op in one process)

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from shardprop.examples import mlp  # noqa: E402

STEPS, BATCH, FEATURES, CLASSES = 5, 32, 16, 4


def dataset(seed=0):
    """The whole data set; a real loader would read only this process's part of it."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(STEPS, BATCH, FEATURES)).astype(np.float32)
    return x, (x.sum(axis=-1) > 0).astype(np.int32) + 2 * (x[..., 0] > 0).astype(np.int32)


def my_rows() -> slice:
    """This process's rows of each batch: the batch axis is laid out over ``i``, whose mesh rows each process
    holds in order (process 0 the first ones)."""
    per_process = BATCH // jax.process_count()
    return slice(per_process * jax.process_index(), per_process * (jax.process_index() + 1))


def train(mesh):
    params = mlp.init_params((FEATURES, 32, CLASSES))
    specs = ([{"w": P(None, "j"), "b": P("j")}, {"w": P("j", None), "b": P()}], P("i"), P("i"))
    step = sp.autoshard(mlp.train_step, mesh=mesh, in_specs=specs)
    xs, labels = dataset()
    rows = my_rows()
    for k in range(STEPS):
        x = sp.distributed.process_local(xs[k, rows], mesh, P("i"))       # only this process's rows
        y = sp.distributed.process_local(labels[k, rows], mesh, P("i"))
        params, value = step(params, x, y)
        if jax.process_index() == 0:
            print(f"step {k}: loss {float(sp.distributed.fetch(value)):.4f}", flush=True)
    return params


def train_unsharded():
    params = mlp.init_params((FEATURES, 32, CLASSES))
    xs, labels = dataset()
    with jax.default_device(jax.local_devices()[0]):
        for k in range(STEPS):
            params, _ = mlp.train_step(params, xs[k], labels[k])
    return params


if __name__ == "__main__":
    mesh = sp.make_mesh((4, 2), ("i", "j"))
    params = sp.distributed.fetch(train(mesh))
    if "--check" in sys.argv:
        for got, want in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(train_unsharded()),
                             strict=True):
            np.testing.assert_allclose(got, np.asarray(want), rtol=1e-4, atol=1e-5)
        print(f"process {jax.process_index()}: parameters equal the unsharded training's", flush=True)
