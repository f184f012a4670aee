"""``shardprop launch -n 2 --devices-per-process 4 -- python script.py``: a local multi-process cluster.

Starts ``-n`` copies of the command, each told (``SHARDPROP_*`` variables, read by ``sp.distributed.initialize()``)
the coordinator on 127.0.0.1 and a free port, its process id and how many virtual CPU devices it has (a script that
changes ``jax_num_cpu_devices`` after ``initialize()`` is refused by ``sp.make_mesh``, naming both); forwards
every line they print prefixed with ``[k]`` (leaving out the lines gloo prints as it connects, unless
``--verbose``); and fails fast: when one process exits with an error (or the
cluster does not form within ``--timeout`` seconds, which makes ``initialize`` fail), the others are stopped —
terminated, then killed after a grace period — and the launcher exits with that process's code.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

from ..distributed import COORDINATOR, DEVICES_PER_PROCESS, INIT_TIMEOUT, NUM_PROCESSES, PROCESS_ID

GRACE_SECONDS = 5.0  # after a failure, how long the others may take to exit on SIGTERM before SIGKILL
# What gloo prints (on standard output) as its ranks connect ("[Gloo] Rank 1 is connected to 7 peer ranks.
# Expected ..."), a line per collective group, from several threads at once (so at times in pieces: "[Gloo] Rank ").
# A piece that is only a number is forwarded: it cannot be told from a user's own output.
BACKEND_NOISE = re.compile(r"connected peer ranks|^(\[Gloo\] Rank\s*)+$")


def add_parser(sub) -> None:
    p = sub.add_parser("launch", help="run a script as N processes of a local JAX cluster (CPU devices, gloo)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", "--processes", type=int, default=2, help="number of processes (default 2)")
    p.add_argument("--devices-per-process", type=int, default=4,
                   help="virtual CPU devices per process (default 4); a script may not change it "
                        "(jax_num_cpu_devices) after sp.distributed.initialize()")
    p.add_argument("--timeout", type=int, default=60,
                   help="seconds for the cluster to form before the processes give up (default 60)")
    p.add_argument("--verbose", action="store_true", help="also forward what gloo prints as its ranks connect")
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the command to run, after --")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _forward(k: int, stream, out, quiet: bool) -> None:
    for line in iter(stream.readline, ""):
        if quiet and BACKEND_NOISE.search(line):
            continue
        out.write(f"[{k}] {line}")
        out.flush()


def launch(command: list[str], processes: int, devices_per_process: int, timeout: int, out=None,
           verbose: bool = False) -> int:
    """Run ``command`` as ``processes`` processes of one cluster; the exit code of the first that failed, else 0.
    Both streams are forwarded without gloo's connection lines, unless ``verbose``."""
    out = out or sys.stdout
    port = free_port()
    procs, threads = [], []
    # Stopped itself (Ctrl-C, SIGTERM from a scheduler or a timeout), the launcher stops its processes first: each
    # runs in a session of its own, so nothing else would reach them.
    interrupted = _stop_children_on_signal(procs)
    for k in range(processes):
        env = {**os.environ, COORDINATOR: f"127.0.0.1:{port}", NUM_PROCESSES: str(processes), PROCESS_ID: str(k),
               DEVICES_PER_PROCESS: str(devices_per_process), INIT_TIMEOUT: str(timeout)}
        proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        procs.append(proc)
        for stream in (proc.stdout, proc.stderr):
            threads.append(threading.Thread(target=_forward, args=(k, stream, out, not verbose), daemon=True))
            threads[-1].start()
    failed = None
    while failed is None and any(p.poll() is None for p in procs):
        failed = next(((k, p.returncode) for k, p in enumerate(procs) if p.poll() not in (None, 0)), None)
        time.sleep(0.1)
    if failed is None:
        failed = next(((k, p.returncode) for k, p in enumerate(procs) if p.returncode != 0), None)
    if failed is not None:
        k, code = failed
        running = [j for j, p in enumerate(procs) if p.poll() is None]
        out.write(f"shardprop launch: process {k} exited with code {code}"
                  + (f"; stopping process(es) {', '.join(map(str, running))}\n" if running else "\n"))
        out.flush()
        _stop([procs[j] for j in running])
    for t in threads:
        t.join(timeout=2)
    interrupted()
    if failed is None:
        return 0
    return failed[1] if failed[1] > 0 else 1


def _stop_children_on_signal(procs: list):
    """Until the returned function is called: on SIGINT or SIGTERM, stop ``procs`` and exit with 128 + the signal
    (the handlers are only installed in the main thread, where Python allows them)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def handler(sig, _frame):
        running = [p for p in procs if p.poll() is None]
        sys.stderr.write(f"shardprop launch: {signal.Signals(sig).name}; stopping {len(running)} process(es)\n")
        _stop(running)
        sys.exit(128 + sig)

    for sig in previous:
        signal.signal(sig, handler)

    def restore():
        for sig, old in previous.items():
            signal.signal(sig, old)

    return restore


def _stop(procs) -> None:
    """SIGTERM to each process group, SIGKILL to whatever is left after the grace period (a process blocked in a
    collective with a dead peer may never return by itself)."""
    for p in procs:
        _signal(p, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_SECONDS
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal(p, signal.SIGKILL)
            p.wait()


def _signal(proc, sig) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def run(args) -> int:
    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not command:
        print("shardprop launch: give the command to run after --, e.g. -- python script.py", file=sys.stderr)
        return 2
    if args.processes < 1 or args.devices_per_process < 1:
        print("shardprop launch: -n and --devices-per-process must be at least 1", file=sys.stderr)
        return 2
    return launch(command, args.processes, args.devices_per_process, args.timeout, verbose=args.verbose)
