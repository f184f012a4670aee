"""Run by tests/test_distributed.py under ``shardprop launch -n 2 --devices-per-process 4`` (issue #31): a script
that sets ``jax_num_cpu_devices`` as the README teaches for one process, after ``sp.distributed.initialize()`` (as a
model module imported there would), is refused by name; set back, ``sp.make_mesh`` spans both processes and the
computation equals the unsharded one; a mesh of the wrong size and ``process_local`` on a mesh without this
process's devices are typed errors. Prints ``refused ...`` / ``ok ...`` per check, ``device count all ok`` at the
end."""

import shardprop as sp

sp.distributed.initialize()

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)  # the README's single-process line, after the launcher set 4

import numpy as np  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from tests.functions import nx_example  # noqa: E402

try:
    sp.make_mesh((4, 2), ("i", "j"))
    raise SystemExit("a changed jax_num_cpu_devices was not refused")
except sp.MeshError as err:
    print(f"refused count: {err}", flush=True)
# make_mesh refused before JAX's backend started, so the launcher's count can still be put back.
jax.config.update("jax_num_cpu_devices", 4)

me = jax.process_index()
mesh = sp.make_mesh((4, 2), ("i", "j"))
held = [sum(d.process_index == p for d in mesh.devices.flat) for p in range(jax.process_count())]
assert held == [4, 4], held
print(f"ok the (4, 2) mesh holds {held} devices of processes 0 and 1", flush=True)

try:
    sp.make_mesh((2, 2), ("i", "j"))
    raise SystemExit("a mesh smaller than the global device count was made")
except sp.MeshError as err:
    print(f"refused size: {err}", flush=True)

rng = np.random.default_rng(0)  # the same seed everywhere: every process holds the same global inputs
a, b = rng.normal(size=(16, 8)).astype(np.float32), rng.normal(size=(16, 8)).astype(np.float32)
rows = slice(8 * me, 8 * me + 8)  # process 0 owns mesh rows 0-1 of i, process 1 rows 2-3
got = sp.distributed.fetch(sp.autoshard(nx_example, mesh=mesh, in_specs=(P("i", "j"), None))(
    sp.distributed.process_local(a[rows], mesh, P("i", "j")), b))
with jax.default_device(jax.local_devices()[0]):
    want = np.asarray(nx_example(a, b))
np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
print("ok equal to the unsharded function", flush=True)

process_0_only = sp.make_mesh((4,), ("i",), devices=[d for d in jax.devices() if d.process_index == 0])
try:
    local = sp.distributed.process_local(a[:4], process_0_only, P("i"))
    assert me == 0 and local.shape == (4, 8), (me, local.shape)
    print("ok process_local on a mesh of this process's devices", flush=True)
except sp.MeshError as err:
    print(f"refused process_local: {err}", flush=True)
print("device count all ok", flush=True)
