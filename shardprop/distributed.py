"""Multi-process runs (JAX's multi-controller model): one process per host, a global mesh over every process's
devices, every process running the same program on its own shards.

    import shardprop as sp
    sp.distributed.initialize()                  # join the cluster: a no-op in a single process
    mesh = sp.make_mesh((4, 2), ("i", "j"))      # over the devices of all processes
    out = sp.autoshard(f, mesh=mesh, in_specs=(P("i", "j"), None))(a, b)   # a global jax.Array
    full = sp.distributed.fetch(out)             # the whole value, as NumPy, on every process

``shardprop launch -n 2 --devices-per-process 4 -- python script.py`` starts such a script as a local cluster
(``shardprop/cli/launch.py``): it sets the variables :func:`initialize` reads. On a real cluster (SLURM, Open MPI,
...) ``initialize()`` lets ``jax.distributed.initialize`` detect it.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

# What `shardprop launch` sets for each process.
COORDINATOR = "SHARDPROP_COORDINATOR"
NUM_PROCESSES = "SHARDPROP_NUM_PROCESSES"
PROCESS_ID = "SHARDPROP_PROCESS_ID"
DEVICES_PER_PROCESS = "SHARDPROP_DEVICES_PER_PROCESS"
INIT_TIMEOUT = "SHARDPROP_INIT_TIMEOUT"
# Set by the cluster managers jax.distributed.initialize() detects by itself (more than one task).
_CLUSTERS = {"SLURM_NTASKS": "SLURM", "OMPI_COMM_WORLD_SIZE": "Open MPI", "PMI_SIZE": "MPI"}


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, devices_per_process: int | None = None,
               timeout: int | None = None) -> bool:
    """Join the cluster this process belongs to; True when it did, False in a single process (a no-op).

    Arguments left out are read from what ``shardprop launch`` sets (``SHARDPROP_COORDINATOR``, ...); without
    them, a cluster manager's variables (SLURM, Open MPI) let ``jax.distributed.initialize()`` detect the rest.
    ``devices_per_process`` sets the number of virtual CPU devices (CPU clusters); their collectives use gloo.
    Call it before any other JAX call, as ``jax.distributed.initialize``.

    >>> sp.distributed.initialize()      # doctest: +SKIP
    True
    """
    import jax

    if jax.distributed.is_initialized():
        return True
    env = os.environ
    coordinator_address = coordinator_address or env.get(COORDINATOR)
    num_processes = num_processes or _int(env.get(NUM_PROCESSES))
    process_id = process_id if process_id is not None else _int(env.get(PROCESS_ID))
    devices_per_process = devices_per_process or _int(env.get(DEVICES_PER_PROCESS))
    timeout = timeout or _int(env.get(INIT_TIMEOUT)) or 300
    detected = [name for var, name in _CLUSTERS.items() if (_int(env.get(var)) or 0) > 1]
    if coordinator_address is None and not detected:
        return False  # one process: nothing to join
    if devices_per_process:
        jax.config.update("jax_num_cpu_devices", devices_per_process)
    # CPU devices talk through gloo across processes (no effect on GPU/TPU backends).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address, num_processes, process_id, initialization_timeout=timeout)
    _exit_at_once_on_error()
    return True


def _exit_at_once_on_error() -> None:
    """An uncaught exception ends the process at once with code 1, after its traceback: JAX's exit handler would
    wait for the other processes at a shutdown barrier (they, meanwhile, wait for this one in a collective), so
    a crash would take minutes to surface; ended at once, the launcher (or the cluster manager) sees it and stops
    the rest."""
    import sys

    previous = sys.excepthook

    def hook(kind, value, traceback):
        previous(kind, value, traceback)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)

    sys.excepthook = hook


def _int(text: str | None) -> int | None:
    return int(text) if text not in (None, "") else None


def is_multiprocess() -> bool:
    """True when this program runs as one of several processes (after :func:`initialize`)."""
    import jax

    return jax.process_count() > 1


def fetch(tree: Any) -> Any:
    """Every array of ``tree`` whole, as NumPy, on every process (a global ``jax.Array`` holds only this process's
    shards: its other shards are gathered from the processes that hold them). Every process must call it.

    >>> full = sp.distributed.fetch(out)   # doctest: +SKIP
    """
    import jax
    from jax.experimental import multihost_utils

    def whole(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return np.asarray(x)

    return jax.tree_util.tree_map(whole, tree)


def process_local(rows: Any, mesh, spec) -> Any:
    """A global array from the rows this process holds: ``rows`` (each array of a pytree) is this process's part
    along the axes ``spec`` lays out over processes, in process order (``jax.make_array_from_process_local_data``).
    Each process loads only its own rows of a batch.

    >>> x = sp.distributed.process_local(my_rows, mesh, P("i"))   # doctest: +SKIP
    """
    import jax
    from jax.sharding import NamedSharding

    sharding = NamedSharding(mesh, spec)
    return jax.tree_util.tree_map(lambda r: jax.make_array_from_process_local_data(sharding, np.asarray(r)), rows)


def stage_fingerprints(plan) -> list[int]:
    """One number per stage of ``plan`` that two processes agree on exactly when they made the same stage: its
    ops and their params, the layouts it consumes and holds, its collectives and its loops' bodies' decisions,
    its inputs and outputs — nothing that depends on where the process runs (no source paths, object ids or
    hash seeds)."""
    import hashlib

    from .expr.graph import format_params

    def decisions_text(view, node_ids) -> list[str]:
        out = []
        for n in node_ids:
            node = view.graph.nodes[n]
            out.append(f"{node.op}{format_params(node)} {node.operands}->{node.outputs} "
                       f"{view.needs(n) if node.operands else ()} {[view.layout(v) for v in node.outputs]} "
                       f"{view.collective(n)} {sorted(view.deferred.get(n, ()))}")
            for body_plan in view.body_plans(n) or ():
                inner = body_plan.decisions
                out.append(f"body {body_plan.body.name} {sorted(inner.partial_inputs.items())}")
                out += decisions_text(inner, [m.id for m in inner.graph.nodes])
        return out

    prints = []
    for stage in plan.stages:
        lines = [f"in {i.value} {i.layout} {i.source}" for i in stage.inputs]
        lines += decisions_text(plan, stage.nodes)
        lines += [f"out {v} {layout}" for v, layout in zip(stage.outputs, stage.out_layouts, strict=True)]
        digest = hashlib.sha256("\n".join(lines).encode()).digest()
        prints.append(int.from_bytes(digest[:8], "little", signed=True))
    return prints


def check_same_plan(plan) -> None:
    """On a multi-process run, raise :class:`~shardprop.PlanMismatchError` on every process unless all made the
    same plan (the stages' collectives would otherwise not match: a deadlock). Every process must call it."""
    import jax
    from jax.experimental import multihost_utils

    from .errors import PlanMismatchError

    if jax.process_count() == 1:
        return
    mine = np.asarray(stage_fingerprints(plan), np.int64)
    counts = np.asarray(multihost_utils.process_allgather(np.asarray([len(mine)], np.int64))).reshape(-1)
    padded = np.zeros(int(counts.max()), np.int64)
    padded[:len(mine)] = mine
    table = np.asarray(multihost_utils.process_allgather(padded)).reshape(len(counts), -1)
    me = jax.process_index()
    for k in range(table.shape[1]):
        column = [int(table[p, k]) if k < counts[p] else None for p in range(len(counts))]  # None: no stage k
        if len(set(column)) > 1:
            other = next((p for p, c in enumerate(column) if c != column[me]), None)
            other = other if other is not None else next(p for p in range(len(counts)) if p != me)
            sizes = ", ".join(f"process {p}: {int(c)}" for p, c in enumerate(counts))
            raise PlanMismatchError(
                f"the processes made different plans, so their collectives would not match (a deadlock): stage {k} "
                f"of process {me} differs from process {other}'s (stages per process — {sizes}). Every process "
                "must trace the same function on the same argument shapes with the same in_specs, mesh, strategy "
                "and options", stage=k)
