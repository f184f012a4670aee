"""Run by tests/test_distributed.py under ``shardprop launch -n 2 --devices-per-process 4``: the debugger steps the
same programs on both processes of an 8-device mesh. Each process reads its own blocks; ``check``, ``compare``,
``first_divergence`` and ``first_nonfinite`` gather the others' and must give the same answer on every process,
checked here against the unsharded function (and against planted bugs, as tests/debug/test_faults.py plants them).
Prints ``ok <name>`` per check and ``debugger all ok`` at the end; ``argv[1]`` is where stage 1 is saved."""

import dataclasses
import sys

import shardprop as sp

sp.distributed.initialize()

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from shardprop.examples import recurrent  # noqa: E402
from shardprop.backends import evaluate  # noqa: E402
from shardprop.debug import FindingKind  # noqa: E402
from tests.functions import nx_example  # noqa: E402

me = jax.process_index()
mine = {int(d.id) for d in jax.local_devices()}
everyone = {int(d.id) for d in jax.devices()}
mesh = sp.make_mesh((4, 2), ("i", "j"))
rng = np.random.default_rng(0)  # the same seed everywhere: every process holds the same global inputs
a, b = rng.normal(size=(16, 8)).astype(np.float32), rng.normal(size=(16, 8)).astype(np.float32)


def unsharded(f, *args):
    with jax.default_device(jax.local_devices()[0]):
        return jax.tree_util.tree_map(np.asarray, f(*args))


def ok(name):
    print(f"ok {name}", flush=True)


# 1. Stepping a program of several stages (gather: every reduction its own stage), stage by stage.
prog = sp.autoshard(nx_example, mesh=mesh, in_specs=(P("i", "j"), None), strategy="gather").trace(a, b)
dbg = sp.Debugger(prog, a, b)
reports = []
while not dbg.done:
    reports.append(dbg.step())
assert [r.stage for r in reports] == list(range(len(prog.stages))) and len(reports) >= 2, reports
ok(f"stepped {len(reports)} stages")

want = unsharded(nx_example, a, b)
own = dbg.blocks("i")  # the output: this process's devices only
assert {blk.device for blk in own} == mine, own
for blk in own:
    np.testing.assert_allclose(blk.data, want[blk.slices], rtol=1e-5, atol=1e-5)
every = dbg.blocks("i", all_processes=True)
assert {blk.device for blk in every} == everyone
for blk in every:
    np.testing.assert_allclose(blk.data, want[blk.slices], rtol=1e-5, atol=1e-5)
np.testing.assert_allclose(sp.distributed.fetch(dbg.value("i")), want, rtol=1e-5, atol=1e-5)
np.testing.assert_allclose(sp.distributed.fetch(dbg.outputs), want, rtol=1e-5, atol=1e-5)
ok("own blocks, every block and the value equal the unsharded function")

assert dbg.check() == []
table = dbg.compare()
assert table.agree and len(table.rows) == 7, str(table)
assert dbg.first_divergence() is None and dbg.first_nonfinite() is None
ok("check, compare, first_divergence and first_nonfinite find nothing")

script = dbg.save_stage(1, sys.argv[1])
ok(f"stage 1 saved as {script.name}")

profile = dbg.profile(repeats=2)
assert [row.stage for row in profile.rows] == list(range(len(prog.stages)))
ok("profile")

# 2. A loop: the RNN's gradient (a scan whose carry is a partial sum, finished after the loop).
xs, h0 = rng.normal(size=(6, 8, 16)).astype(np.float32), rng.normal(size=(8, 16)).astype(np.float32)
rnn = (recurrent.init_rnn(16), xs, h0)
grad = jax.grad(recurrent.rnn_loss)
loop = sp.autoshard(grad, mesh=mesh, in_specs=(None, P(None, "i"), P("i"))).trace(*rnn)
dbg = sp.Debugger(loop, *rnn)
dbg.run()
for got, w in zip(jax.tree_util.tree_leaves(sp.distributed.fetch(dbg.outputs)),
                  jax.tree_util.tree_leaves(unsharded(grad, *rnn)), strict=True):
    np.testing.assert_allclose(got, w, rtol=2e-4, atol=2e-5)
assert dbg.compare().agree and dbg.check() == [] and dbg.first_divergence() is None
ok("rnn gradient (a scan) stepped and compared")

# 3. A NaN in rows only process 1 holds: both processes name the same element, on process 1's device.
x = np.abs(a) + 0.5
x[13, 5] = -1.0


def log_sum(v):
    import jax.numpy as jnp

    return jnp.sum(jnp.log(v * 2.0), axis=0)


found = sp.Debugger(sp.autoshard(log_sum, mesh=mesh, in_specs=(P("i", "j"),)).trace(x), x).first_nonfinite()
assert found is not None and found.where.op == "log" and found.index == (13, 5), found
assert found.device not in mine if me == 0 else found.device in mine, (me, found.device)
assert found.coords == {"i": 3, "j": 1}
print(f"ok first non-finite: {found}", flush=True)

# 4. Planted bugs, on both processes: a wrong per-block `sub` (first_divergence names it, with every device's
# block), then a forgotten psum over i, the mesh axis that spans the processes (check sees the replicas differ
# between process 0's devices and process 1's).
real_lookup, real_step = evaluate.lookup, evaluate.apply_step
evaluate.lookup = lambda name: (dataclasses.replace(real_lookup(name), per_block=lambda node, invals, blocks:
                                                    [invals[0] + invals[1]]) if name == "sub" else real_lookup(name))
found = sp.Debugger(sp.autoshard(nx_example, mesh=mesh, in_specs=(P("i", "j"), None), strategy="collective")
                    .trace(a, b), a, b).first_divergence()
evaluate.lookup = real_lookup
assert found is not None and found.where.name == "d" and found.where.op == "sub", found
assert len(found.blocks) == 8, found.blocks
print(f"ok planted sub: first divergence {found.where.name} (`{found.where.op}`), {len(found.blocks)} blocks differ",
      flush=True)

evaluate.apply_step = lambda x, step, mesh_shape: x if step.kind == "psum" else real_step(x, step, mesh_shape)
dbg = sp.Debugger(sp.autoshard(nx_example, mesh=mesh, in_specs=(P("i", "j"), None), strategy="collective")
                  .trace(a, b), a, b)
dbg.run()
findings = dbg.check()
divergence = dbg.first_divergence()
evaluate.apply_step = real_step
across = [f for f in findings if f.kind is FindingKind.REPLICAS_DIFFER and f.where.name == "f"]
assert across and set(across[0].devices) & (everyone - mine) and set(across[0].devices) & mine, findings
assert "replicated over i" in across[0].detail, across[0].detail
assert divergence is not None and divergence.where.name == "e", divergence
print(f"ok planted missing psum: {len(findings)} findings, first {findings[0].where.name}; replicas of f differ "
      f"across processes (devices {sorted(across[0].devices)})", flush=True)
# 5. A "global" NumPy argument that is not the same on every process (an unseeded random batch): refused by name.
mine_only = np.random.default_rng(me).normal(size=(16, 8)).astype(np.float32)
try:
    sp.autoshard(nx_example, mesh=mesh, in_specs=(P("i", "j"), None))(a, mine_only)
    raise SystemExit("a differing global argument ran")
except sp.InputMismatchError as err:
    assert "argument leaf 1 (b:f32[16,8]) is a host array that differs between the processes" in str(err), err
ok("a global argument that differs between processes is an InputMismatchError")
# 6. Out of step: different calls at the same point are refused at once on both processes; a call made by process 0
# alone is refused after the call timeout (3 s here) instead of waiting for process 1 in a collective forever.
import os  # noqa: E402

os.environ["SHARDPROP_CALL_TIMEOUT"] = "3"
dbg = sp.Debugger(prog, a, b)
try:
    dbg.compare() if me == 0 else dbg.check()
    raise SystemExit("different debugger calls ran")
except sp.OutOfStepError as err:
    other = "check()" if me == 0 else "compare(rtol=None, atol=None)"
    assert f"where process {1 - me} made `{other}`" in str(err) and err.process == 1 - me, err
    print(f"ok out of step: {err}", flush=True)
if me == 0:
    try:
        dbg.check()
        raise SystemExit("a call made by one process ran")
    except sp.OutOfStepError as err:
        assert err.process == 1 and "has not made it within 3 s" in str(err), err
        print(f"ok alone: {err}", flush=True)
print("debugger all ok", flush=True)
