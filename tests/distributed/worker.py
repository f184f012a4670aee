"""Run by tests/test_distributed.py under ``shardprop launch -n 2 --devices-per-process 4``: the Nx example, the
MLP training step (its parameters laid out by hand and by ``sp.AUTO``) and loop workloads through
``sp.autoshard`` on an 8-device mesh spanning both processes, with
inputs as global NumPy arrays and as each process's own rows; every result compared on every process with the
unsharded function. Prints ``ok <name>`` per check, ``all ok`` at the end; ``--crash K`` makes process K raise
after the cluster formed, ``--exit K`` makes it call ``sys.exit(3)`` (the others must not wait for it)."""

import sys

import shardprop as sp

sp.distributed.initialize()

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from shardprop.examples import mlp, recurrent  # noqa: E402
from tests.functions import nx_example  # noqa: E402

me = jax.process_index()
if "--crash" in sys.argv and me == int(sys.argv[sys.argv.index("--crash") + 1]):
    raise RuntimeError(f"process {me} crashes on purpose")
if "--exit" in sys.argv and me == int(sys.argv[sys.argv.index("--exit") + 1]):
    sys.exit(3)  # a failure that is not an exception: JAX's exit handler alone would wait for the others
assert jax.process_count() == 2 and jax.device_count() == 8, (jax.process_count(), jax.device_count())
mesh = sp.make_mesh((4, 2), ("i", "j"))
rng = np.random.default_rng(0)  # the same seed everywhere: every process holds the same global inputs

if "--mismatch" in sys.argv:  # process 1 plans with another strategy: both must refuse, naming the stage
    a = rng.normal(size=(16, 8)).astype(np.float32)
    try:
        sp.autoshard(nx_example, mesh=mesh, in_specs=(P("i", "j"), None),
                     strategy="gather" if me == 1 else "auto")(a, a)
    except sp.PlanMismatchError as err:
        print(f"refused at stage {err.stage}: {err}", flush=True)
        raise SystemExit(0) from None
    raise SystemExit("a mismatched plan ran")


def check(name, f, args, whole_args, in_specs, rtol=1e-5, atol=1e-5):
    """``f`` sharded on the global mesh against ``f`` run plainly on this process, on the whole inputs."""
    got = sp.distributed.fetch(sp.autoshard(f, mesh=mesh, in_specs=in_specs)(*args))
    with jax.default_device(jax.local_devices()[0]):
        want = jax.tree_util.tree_map(np.asarray, jax.jit(f)(*whole_args))  # (one compile, not one per op)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=name)
    print(f"ok {name}", flush=True)


a, b = rng.normal(size=(16, 8)).astype(np.float32), rng.normal(size=(16, 8)).astype(np.float32)
check("nx global numpy", nx_example, (a, b), (a, b), (P("i", "j"), None))
# Each process holds its own half of the rows (process 0 owns mesh rows 0-1 of axis i, process 1 rows 2-3).
rows = slice(8 * me, 8 * me + 8)
local_a = sp.distributed.process_local(a[rows], mesh, P("i", "j"))
check("nx process-local rows", nx_example, (local_a, b), (a, b), (P("i", "j"), None))

params = mlp.init_params((16, 32, 4))
x, labels = rng.normal(size=(16, 16)).astype(np.float32), (np.arange(16) % 4).astype(np.int32)
check("mlp train step", mlp.train_step, (params, x, labels), (params, x, labels), (P(), P("i"), P("i")),
      rtol=1e-4, atol=1e-5)
# the layout search decides the same on both processes (their plans are fingerprinted and compared on the first call)
check("mlp train step, sp.AUTO", mlp.train_step, (params, x, labels), (params, x, labels), (sp.AUTO, P("i"), P("i")),
      rtol=1e-4, atol=1e-5)
chosen = sp.autoshard(mlp.train_step, mesh=mesh, in_specs=(sp.AUTO, P("i"), P("i"))).trace(params, x, labels)
print(f"chose {chosen.sharded.in_specs}", flush=True)
local_batch = (sp.distributed.process_local(x[rows], mesh, P("i")),
               sp.distributed.process_local(labels[rows], mesh, P("i")))
check("mlp train step, process-local batch", mlp.train_step, (params, *local_batch), (params, x, labels),
      (P(), P("i"), P("i")), rtol=1e-4, atol=1e-5)

xs, h0 = rng.normal(size=(6, 8, 16)).astype(np.float32), rng.normal(size=(8, 16)).astype(np.float32)
rnn = (recurrent.init_rnn(16), xs, h0)
check("rnn gradient (a scan)", jax.grad(recurrent.rnn_loss), rnn, rnn, (None, P(None, "i"), P("i")),
      rtol=2e-4, atol=2e-5)
check("while loop on data", recurrent.grow_until, (a,), (a,), (P("i", "j"),))
print("all ok", flush=True)
