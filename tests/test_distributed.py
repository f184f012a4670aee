"""Multi-process runs: ``shardprop launch`` starts 2 processes x 4 CPU devices on this machine, and the same
``sp.autoshard`` programs run on the 8-device mesh spanning them (tests/distributed/worker.py checks every result
against the unsharded function, on every process); a process that crashes stops the others at once.

Each run of two processes takes 6-20 s of the machine's two cores, so the default run keeps one of them — the programs
on a mesh spanning both processes — and the launcher's tests without JAX (a failing process stopping the other,
signals); the slow set (which CI runs) keeps the rest: the debugger across processes, the training-loop example, a
crash in a JAX worker, a device count set by the script, plans that differ, the hash seed, and a failing process
without the launcher."""

import os
import pathlib
import subprocess
import sys
import time

import pytest

import shardprop as sp
import shardprop.mesh as shardprop_mesh

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "distributed" / "worker.py"


def _launch(*worker_args, timeout=180, worker=WORKER):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.monotonic()
    script = [str(worker)] if worker is not None else []
    done = subprocess.run([sys.executable, "-m", "shardprop", "launch", "-n", "2", "--devices-per-process", "4",
                           "--timeout", "60", "--", sys.executable, *script, *worker_args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    return done, time.monotonic() - start


def test_programs_on_a_mesh_spanning_two_processes_equal_the_unsharded_result():
    done, _ = _launch()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    for k in (0, 1):
        for check in ("nx global numpy", "nx process-local rows", "mlp train step", "mlp train step, sp.AUTO",
                      "mlp train step, process-local batch", "rnn gradient (a scan)", "while loop on data",
                      "all ok"):
            assert f"[{k}] {'ok ' if check != 'all ok' else ''}{check}\n" in done.stdout, (k, check, done.stdout)
    chosen = {line[:3]: line[3:] for line in done.stdout.splitlines() if line[3:].startswith(" chose ")}
    assert len(chosen) == 2 and chosen["[0]"] == chosen["[1]"], chosen  # the search chose alike on both


@pytest.mark.slow  # two processes for 6-20 s: the slow set (module docstring)
def test_the_debugger_steps_the_same_programs_on_both_processes(tmp_path):
    """tests/distributed/debug_worker.py: each process reads its own blocks; check / compare / first_divergence /
    first_nonfinite gather the others' and agree on every process (a NaN only process 1 holds, a planted bug whose
    replicas differ across processes); the stage saved on the cluster replays on one process; calls made out of step
    are refused (OutOfStepError) instead of deadlocking."""
    done, _ = _launch(str(WORKER.parent / "debug_worker.py"), str(tmp_path), worker=None)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    for k in (0, 1):
        for check in ("ok stepped 2 stages", "ok own blocks, every block and the value equal the unsharded function",
                      "ok check, compare, first_divergence and first_nonfinite find nothing",
                      "ok rnn gradient (a scan) stepped and compared",
                      "ok first non-finite: `log` at debug_worker.py:", "d[13, 5] on device 2051 (i=3, j=1)",
                      "ok planted sub: first divergence d (`sub`), 8 blocks differ",
                      "replicas of f differ across processes",
                      "ok a global argument that differs between processes is an InputMismatchError",
                      "ok out of step: process", "debugger all ok"):
            assert any(line.startswith(f"[{k}] ") and check in line for line in done.stdout.splitlines()), (k, check)
    assert "[0] ok alone: process 0 made the call `check()`, but process 1 has not made it within 3 s" in done.stdout
    replay = subprocess.run([sys.executable, str(tmp_path / "run_stage_1.py")], capture_output=True, text=True,
                            timeout=120)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert "matches the saved output" in replay.stdout


@pytest.mark.slow  # two processes for 6-20 s: the slow set (module docstring)
def test_a_device_count_set_by_the_script_is_refused_and_a_mesh_spans_both_processes():
    """Issue #31, tests/distributed/device_count_worker.py: the README's jax_num_cpu_devices line run after
    initialize() is refused by name on both processes; set back, a (4, 2) mesh holds both processes' devices and
    the result equals the unsharded one; a mesh of the wrong size and process_local on a mesh without this
    process's devices are MeshErrors, not a wrong mesh or a StopIteration."""
    done, _ = _launch(str(WORKER.parent / "device_count_worker.py"), worker=None)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    for k in (0, 1):
        for line in (f"[{k}] refused count: jax_num_cpu_devices was set to 8 after sp.distributed.initialize() set it "
                     "to 4 for `shardprop launch --devices-per-process 4`",
                     f"[{k}] ok the (4, 2) mesh holds [4, 4] devices of processes 0 and 1",
                     f"[{k}] refused size: a (2, 2) mesh holds 4 devices, but the 2 processes have 8 (process 0: 4, "
                     "process 1: 4)",
                     f"[{k}] ok equal to the unsharded function", f"[{k}] device count all ok"):
            assert line in done.stdout, (line, done.stdout)
    assert "[0] ok process_local on a mesh of this process's devices" in done.stdout
    assert ("[1] refused process_local: process 1 holds no device of the mesh (the mesh's devices: 0, 1, 2, 3 "
            "(process 0))") in done.stdout


class _Device:
    """A stand-in for a jax Device: all the mesh helpers read is its id and process."""

    def __init__(self, id, process_index):
        self.id, self.process_index = id, process_index


def _devices(per_process, processes=2):
    return [_Device(2048 * p + k, p) for p in range(processes) for k in range(per_process)]


def test_process_local_on_a_mesh_without_this_process_names_the_process_and_the_devices():
    """JAX's make_array_from_process_local_data fails with a bare StopIteration there (RuntimeError out of
    tree_map); process_local picks this process's devices first."""
    process_0s = _devices(4)[:4]
    with pytest.raises(sp.MeshError, match=r"process 1 holds no device of the mesh \(the mesh's devices: 0, 1, 2, 3 "
                                           r"\(process 0\)\)"):
        sp.distributed.devices_of_process(process_0s, 1)
    assert [d.id for d in sp.distributed.devices_of_process(_devices(2), 1)] == [2048, 2049]
    many = sp.distributed.describe_devices(_devices(10))
    assert many.startswith("0, 1, 2, 3, 4, 5, 6, 7, ... (10 devices) (process 0); 2048,"), many


def test_a_mesh_across_processes_must_hold_every_processs_devices():
    from shardprop.mesh import check_spans_every_process

    check_spans_every_process((4, 2), _devices(4))
    with pytest.raises(sp.MeshError) as info:
        check_spans_every_process((4, 2), _devices(8))  # 8 per process, as with the README's line: 16 in all
    assert str(info.value) == (
        "a (4, 2) mesh holds 8 devices, but the 2 processes have 16 (process 0: 8, process 1: 8): on several "
        "processes a mesh spans every process's devices. Make the mesh hold 16, or give each process 4 devices "
        "(shardprop launch --devices-per-process 4)")


def test_a_device_count_changed_after_initialize_is_refused_naming_the_setting_and_the_flag(monkeypatch):
    import jax

    now = jax.config.jax_num_cpu_devices  # 8, set by conftest
    monkeypatch.setattr(shardprop_mesh, "_started_with", (now, f"shardprop launch --devices-per-process {now}"))
    shardprop_mesh.check_device_count()
    monkeypatch.setattr(shardprop_mesh, "_started_with", (4, "shardprop launch --devices-per-process 4"))
    with pytest.raises(sp.MeshError, match=f"jax_num_cpu_devices was set to {now} after .* set it to 4 for `shardprop "
                                           f"launch --devices-per-process 4`.*launch with --devices-per-process {now}"):
        sp.make_mesh((2,), ("i",))


def test_a_failing_process_stops_the_others_at_once():
    """The launcher's part of a crash, without JAX: process 1 exits with an error while process 0 would sleep for a
    minute; the launcher names the failure, stops process 0 and returns the failing code."""
    import io

    from shardprop.cli.launch import launch

    script = ("import os, sys, time\nif os.environ['SHARDPROP_PROCESS_ID'] == '1':\n"
              "    print('failing', flush=True); sys.exit(3)\ntime.sleep(60)")
    out, start = io.StringIO(), time.monotonic()
    assert launch([sys.executable, "-c", script], 2, 1, 10, out=out) == 3
    assert time.monotonic() - start < 20
    assert "[1] failing" in out.getvalue()
    assert "shardprop launch: process 1 exited with code 3; stopping process(es) 0" in out.getvalue()


@pytest.mark.slow  # two processes for ~10 s: the slow set (module docstring)
def test_a_crashing_process_stops_the_others_in_bounded_time():
    done, seconds = _launch("--crash", "1")
    assert done.returncode == 1
    assert "[1] RuntimeError: process 1 crashes on purpose" in done.stdout
    assert "shardprop launch: process 1 exited with code 1; stopping process(es) 0" in done.stdout
    assert seconds < 60


@pytest.mark.slow  # two processes for ~10 s: the slow set (module docstring)
@pytest.mark.parametrize("failure, code", [("--crash", 1), ("--exit", 3)])
def test_without_the_launcher_a_failing_process_ends_the_others_within_the_heartbeat_timeout(failure, code):
    """As on a real cluster (no launcher to stop anyone): process 1 fails after the cluster formed and leaves at
    once; process 0, waiting for it in a collective, ends with an error once the heartbeat timeout (5 s here) says
    process 1 is gone — not after JAX's five-minute shutdown barrier."""
    from shardprop.cli.launch import free_port

    env = {**os.environ, "PYTHONPATH": str(ROOT), "SHARDPROP_COORDINATOR": f"127.0.0.1:{free_port()}",
           "SHARDPROP_NUM_PROCESSES": "2", "SHARDPROP_DEVICES_PER_PROCESS": "4", "SHARDPROP_HEARTBEAT_TIMEOUT": "5"}
    start = time.monotonic()
    procs = [subprocess.Popen([sys.executable, str(WORKER), failure, "1"], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env={**env, "SHARDPROP_PROCESS_ID": str(k)})
             for k in (0, 1)]
    try:
        failed_output, _ = procs[1].communicate(timeout=120)
        failed_after = time.monotonic() - start
        procs[0].communicate(timeout=120)
    finally:
        for p in procs:
            p.kill()
    assert procs[1].returncode == code, failed_output[-2000:]
    assert procs[0].returncode != 0
    assert time.monotonic() - start - failed_after < 45  # the survivor's wait: the heartbeat timeout, and some


def test_the_launcher_leaves_out_gloos_connection_lines_unless_verbose():
    import io

    from shardprop.cli.launch import launch

    noise = "[Gloo] Rank 1 is connected to 7 peer ranks. Expected number of connected peer ranks is : 7"
    command = [sys.executable, "-c", f"import sys; print({noise!r}); print('[Gloo] Rank '); print(5); "
                                     "print('kept', file=sys.stderr)"]
    for verbose in (False, True):
        out = io.StringIO()
        assert launch(command, 1, 1, 10, out=out, verbose=verbose) == 0
        lines = sorted(out.getvalue().splitlines())
        assert lines == sorted(["[0] 5", "[0] kept"] + ([f"[0] {noise}", "[0] [Gloo] Rank "] if verbose else []))


@pytest.mark.parametrize("sig", ["SIGTERM", pytest.param("SIGINT", marks=pytest.mark.slow)])  # one in the default run
def test_a_launcher_stopped_by_a_signal_stops_its_processes(sig):
    import signal

    script = "import os, time; print(os.getpid(), flush=True); time.sleep(120)"
    launcher = subprocess.Popen([sys.executable, "-m", "shardprop", "launch", "-n", "2", "--", sys.executable, "-c",
                                 script], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pids = [int(launcher.stdout.readline().split()[1]) for _ in range(2)]  # "[k] <pid>"
    launcher.send_signal(getattr(signal, sig))
    _, err = launcher.communicate(timeout=30)
    assert launcher.returncode == 128 + getattr(signal, sig)
    assert f"shardprop launch: {sig}; stopping 2 process(es)" in err
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_launch_refuses_a_missing_command(capsys):
    from shardprop.cli import main

    assert main(["launch", "-n", "2"]) == 2
    assert "give the command to run after --" in capsys.readouterr().err
    assert main(["launch", "-n", "0", "--", "python", "-c", "pass"]) == 2
    assert "-n and --devices-per-process must be at least 1" in capsys.readouterr().err


def test_initialize_is_a_no_op_in_a_single_process(monkeypatch):
    for var in ("SHARDPROP_COORDINATOR", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        monkeypatch.delenv(var, raising=False)
    assert sp.distributed.initialize() is False
    assert not sp.distributed.is_multiprocess()


@pytest.mark.parametrize("value", [1.5, [1.0, 2.0]])
def test_fetch_of_single_process_values_is_numpy(value, mesh):
    import jax.numpy as jnp
    import numpy as np

    out = sp.autoshard(lambda x: x * 2.0, mesh=mesh, in_specs=(None,))(jnp.asarray(value))
    np.testing.assert_array_equal(sp.distributed.fetch(out), np.asarray(value) * 2.0)


@pytest.mark.slow  # two processes for 6-20 s: the slow set (module docstring)
def test_processes_with_different_plans_refuse_naming_the_stage():
    """Process 1 plans with another strategy: both refuse with PlanMismatchError instead of deadlocking."""
    done, _ = _launch("--mismatch")
    assert done.returncode == 0, done.stdout[-3000:]
    for k, other in ((0, 1), (1, 0)):
        assert f"[{k}] refused at stage 0: the processes made different plans" in done.stdout
        assert f"stage 0 of process {k} differs from process {other}'s" in done.stdout


@pytest.mark.slow  # two processes for 6-20 s: the slow set (module docstring)
def test_plans_do_not_depend_on_the_hash_seed():
    """Every process must make the same plan: propagation and splitting may not depend on Python's hash seed (set
    per process) — the stage fingerprints of a few programs, under every strategy, agree across seeds (an audit of
    every pass found nothing that depends on the seed, object ids or paths; this keeps it so)."""
    runs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": seed}
        done = subprocess.run([sys.executable, str(ROOT / "tests" / "distributed" / "fingerprints.py")], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        runs.append(done.stdout)
    assert runs[0] == runs[1] and runs[0].count("\n") == 18


@pytest.mark.slow  # two processes for 6-20 s: the slow set (module docstring)
def test_the_training_loop_example_feeds_each_process_its_rows_and_trains_as_unsharded():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "shardprop", "launch", "-n", "2", "--devices-per-process", "4", "--",
                           sys.executable, "-m", "shardprop.examples.distributed_training", "--check"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "[0] step 4: loss" in done.stdout
    for k in (0, 1):
        assert f"[{k}] process {k}: parameters equal the unsharded training's" in done.stdout
