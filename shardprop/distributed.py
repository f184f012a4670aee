"""Multi-process runs (JAX's multi-controller model): one process per host, a global mesh over every process's
devices, every process running the same program on its own shards.

``shardprop launch -n 2 --devices-per-process 4 -- python script.py`` starts such a script as a local cluster
(``shardprop/cli/launch.py``): it sets the variables ``initialize`` reads. On a real cluster (SLURM, Open MPI,
...) ``initialize()`` lets ``jax.distributed.initialize`` detect it.

Examples:
    The same script runs on several processes or on one, where joining the cluster is a no-op:

    >>> sp.distributed.initialize()                  # join the cluster (False: a single process joins none)
    False
    >>> mesh = sp.make_mesh((4, 2), ("i", "j"))      # over the devices of all processes
    >>> a, b = jnp.arange(32.0).reshape(8, 4), jnp.ones((8, 4))
    >>> out = sp.autoshard(lambda a, b: a * b, mesh=mesh, in_specs=(P("i", "j"), None))(a, b)   # a global jax.Array
    >>> full = sp.distributed.fetch(out)             # the whole value, as NumPy, on every process
    >>> type(full).__name__, full.shape
    ('ndarray', (8, 4))
"""

from __future__ import annotations

import itertools
import math
import os
from typing import Any

import numpy as np

from .errors import MeshError, OutOfStepError, PlanMismatchError
from .expr import jax_adapter as jx
from .expr.graph import format_params
from .mesh import check_device_count, started_with
from .splitting.ir import Compute, Move

# What `shardprop launch` sets for each process.
COORDINATOR = "SHARDPROP_COORDINATOR"
NUM_PROCESSES = "SHARDPROP_NUM_PROCESSES"
PROCESS_ID = "SHARDPROP_PROCESS_ID"
DEVICES_PER_PROCESS = "SHARDPROP_DEVICES_PER_PROCESS"
INIT_TIMEOUT = "SHARDPROP_INIT_TIMEOUT"
HEARTBEAT_TIMEOUT = "SHARDPROP_HEARTBEAT_TIMEOUT"
# How long a debugger call that runs collectives waits for the other processes to make it too (see in_step).
CALL_TIMEOUT = "SHARDPROP_CALL_TIMEOUT"
DEFAULT_CALL_TIMEOUT = 300.0
# Set by the cluster managers jax.distributed.initialize() detects by itself (more than one task).
_CLUSTERS = {"SLURM_NTASKS": "SLURM", "OMPI_COMM_WORLD_SIZE": "Open MPI", "PMI_SIZE": "MPI"}


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, devices_per_process: int | None = None,
               timeout: int | None = None, heartbeat_timeout: int | None = None) -> bool:
    """Join the cluster this process belongs to; True when it did, False in a single process (a no-op).

    Arguments left out are read from what ``shardprop launch`` sets (``SHARDPROP_COORDINATOR``, ...); without
    them, a cluster manager's variables (SLURM, Open MPI) let ``jax.distributed.initialize()`` detect the rest.
    ``devices_per_process`` sets the number of virtual CPU devices (CPU clusters); their collectives use gloo.
    Once set, that count is the process's: a later ``jax.config.update("jax_num_cpu_devices", n)`` with another
    ``n`` is refused by ``shardprop.mesh.check_device_count`` (``sp.make_mesh``, ``process_local``).
    ``timeout``: seconds for the cluster to form (default 300); ``heartbeat_timeout``: seconds after which a
    process that stopped answering (crashed, killed) is declared dead and every other process ends with an error
    (``SHARDPROP_HEARTBEAT_TIMEOUT``; default JAX's 100). After it, a process that fails — an uncaught exception
    or ``sys.exit`` with a nonzero code — ends at once, so the others are not left waiting in a collective.
    Call it before any other JAX call, as ``jax.distributed.initialize``.

    Examples:
        >>> sp.distributed.initialize()      # a single process (no launcher, no cluster manager): nothing to join
        False
    """
    import jax

    if jax.distributed.is_initialized():
        return True
    env = os.environ
    coordinator_address = coordinator_address or env.get(COORDINATOR)
    num_processes = num_processes or _int(env.get(NUM_PROCESSES))
    process_id = process_id if process_id is not None else _int(env.get(PROCESS_ID))
    asked_by = f"sp.distributed.initialize(devices_per_process={devices_per_process})"
    if not devices_per_process and _int(env.get(DEVICES_PER_PROCESS)):
        devices_per_process = _int(env.get(DEVICES_PER_PROCESS))
        asked_by = f"shardprop launch --devices-per-process {devices_per_process}"
    timeout = timeout or _int(env.get(INIT_TIMEOUT)) or 300
    heartbeat_timeout = heartbeat_timeout or _int(env.get(HEARTBEAT_TIMEOUT)) or 100
    detected = [name for var, name in _CLUSTERS.items() if (_int(env.get(var)) or 0) > 1]
    if coordinator_address is None and not detected:
        return False  # one process: nothing to join
    if devices_per_process:
        jax.config.update("jax_num_cpu_devices", devices_per_process)
        started_with(devices_per_process, asked_by)
    # CPU devices talk through gloo across processes (no effect on GPU/TPU backends).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address, num_processes, process_id, initialization_timeout=timeout,
                               heartbeat_timeout_seconds=heartbeat_timeout)
    _exit_at_once_on_error()
    return True


def _exit_at_once_on_error() -> None:
    """A failing process ends at once: after an uncaught exception's traceback with code 1, and on ``sys.exit``
    with a nonzero code (or a message) with that code. JAX's exit handler would wait for the other processes at a
    shutdown barrier (up to five minutes) while they wait for this one in a collective; ended at once, the launcher
    (or the cluster manager) sees it and stops the rest, and without one the others' coordination service declares
    it dead after the heartbeat timeout. (``raise SystemExit(n)`` written out skips ``sys.exit``: it still takes
    JAX's way out.) A clean exit (code 0) still meets the others at the barrier."""
    import sys

    previous_hook, previous_exit = sys.excepthook, sys.exit

    def leave(code: int) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    def hook(kind, value, traceback):
        previous_hook(kind, value, traceback)
        leave(1)

    def exit_at_once(status=None):
        if status is None or status == 0:
            previous_exit(status)
        if not isinstance(status, int):
            print(status, file=sys.stderr)  # what sys.exit("message") prints
        leave(status if isinstance(status, int) and 0 < status < 256 else 1)

    sys.excepthook, sys.exit = hook, exit_at_once


def _int(text: str | None) -> int | None:
    return int(text) if text not in (None, "") else None


def describe_devices(devices) -> str:
    """``devices`` by process, for messages: ``0, 1, 2, 3 (process 0); 2048, 2049 (process 1)`` (at most 8 ids
    per process, then how many more)."""
    by_process: dict[int, list[int]] = {}
    for d in devices:
        by_process.setdefault(d.process_index, []).append(d.id)
    parts = []
    for process, ids in by_process.items():
        shown = ", ".join(map(str, ids[:8])) + (f", ... ({len(ids)} devices)" if len(ids) > 8 else "")
        parts.append(f"{shown} (process {process})")
    return "; ".join(parts)


def devices_of_process(devices, process: int) -> list:
    """The devices of ``devices`` (a mesh's, in mesh order) that process ``process`` holds; a
    ``shardprop.MeshError`` naming the process and the devices when it holds none. (JAX, asked to place
    this process's part on such a mesh, fails on the empty list with a bare ``StopIteration``.)"""
    devices = list(devices)
    mine = [d for d in devices if d.process_index == process]
    if not mine:
        raise MeshError(
            f"process {process} holds no device of the mesh (the mesh's devices: {describe_devices(devices)}), so "
            "it has no part of it to give: the mesh must span every process's devices (sp.make_mesh without "
            "devices= does)")
    return mine


def is_multiprocess() -> bool:
    """True when this program runs as one of several processes (after ``initialize``)."""
    import jax

    return jax.process_count() > 1


def fetch(tree: Any) -> Any:
    """Every array of ``tree`` whole, as NumPy, on every process (a global ``jax.Array`` holds only this process's
    shards: its other shards are gathered from the processes that hold them). Every process must call it.

    Examples:
        >>> mesh = sp.make_mesh((8,), ("i",))
        >>> out = jax.device_put(jnp.arange(8.0), jax.sharding.NamedSharding(mesh, P("i")))
        >>> sp.distributed.fetch({"out": out})
        {'out': array([0., 1., 2., 3., 4., 5., 6., 7.], dtype=float32)}
    """
    import jax
    from jax.experimental import multihost_utils

    def whole(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return np.asarray(x)

    return jax.tree_util.tree_map(whole, tree)


def whole(x: Any) -> Any:
    """``x`` whole on this process: a global ``jax.Array`` that spans other processes is gathered (as NumPy; a PRNG
    key array stays a key array), anything else is returned as it is. Every process must call it (a gather).

    Examples:
        >>> mesh = sp.make_mesh((8,), ("i",))
        >>> out = jax.device_put(jnp.arange(8.0), jax.sharding.NamedSharding(mesh, P("i")))
        >>> sp.distributed.whole(out) is out           # on one process every shard is this process's
        True
    """
    import jax

    if not isinstance(x, jax.Array) or x.is_fully_addressable:
        return x
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.extended):
        return jax.random.wrap_key_data(fetch(jax.random.key_data(x)), impl=jax.random.key_impl(x))
    return fetch(x)


def every_block(arrays: list, mesh) -> list[list[Any]]:
    """For each of ``arrays`` (laid out on ``mesh``, one equal block per device), every device's block in the order
    of ``mesh.devices.flat``, on every process: a process's own blocks as they are, the others' gathered from the
    processes that hold them (as NumPy), all arrays in one collective program. Every process must call it when an
    array spans several processes.

    Unlike ``fetch``, which assembles the global value, this keeps each device's own copy: two devices that
    should hold equal replicas can be compared (the debugger's ``check()``)."""
    import jax

    devices = list(mesh.devices.flat)
    out: list[list[Any] | None] = [None] * len(arrays)
    spanning = [k for k, x in enumerate(arrays) if not x.is_fully_addressable]
    for k, array in enumerate(arrays):
        if array.is_fully_addressable:
            held = {s.device: s.data for s in array.addressable_shards}
            out[k] = [held[d] for d in devices]
    if not spanning:
        return out
    impls = {k: jax.random.key_impl(arrays[k]) for k in spanning
             if jax.dtypes.issubdtype(arrays[k].dtype, jax.dtypes.extended)}
    plain = [jax.random.key_data(arrays[k]) if k in impls else arrays[k] for k in spanning]
    for k, x, rows in zip(spanning, plain, _every_row(plain, mesh), strict=True):
        held = {s.device: s.data for s in x.addressable_shards}
        blocks = [held[d] if d in held else rows[i] for i, d in enumerate(devices)]
        out[k] = [jax.random.wrap_key_data(b, impl=impls[k]) for b in blocks] if k in impls else blocks
    return out


def _every_row(arrays: list, mesh) -> list[np.ndarray]:
    """For each array, every device's block stacked along a new leading axis (row k: ``mesh.devices.flat[k]``'s), on
    every process. Each process packs the blocks of its devices, of all arrays, into one byte buffer, padded to a
    power of two so that the gather compiles once per size bucket, not once per set of shapes; one gather of the
    buffers does the rest."""
    import jax
    from jax.experimental import multihost_utils

    devices = list(mesh.devices.flat)
    mine = [d for d in devices if d.process_index == jax.process_index()]
    pieces, layout = [], []  # layout: per array, (dtype, block shape, bytes per block)
    for x in arrays:
        held = {s.device: np.asarray(s.data) for s in x.addressable_shards}
        # The layout from the sharding, not from a block of this process's: a process that holds no device of the
        # mesh has none, and it must still join the gather the others wait in.
        dtype, shape = np.dtype(x.dtype), tuple(x.sharding.shard_shape(x.shape))
        layout.append((dtype, shape, math.prod(shape) * dtype.itemsize))
        pieces += [np.ascontiguousarray(held[d]).view(np.uint8).reshape(-1) for d in mine]
    payload = np.concatenate(pieces) if pieces else np.zeros(0, np.uint8)
    padded = np.zeros(1 << max(int(payload.size - 1).bit_length(), 6), np.uint8)
    padded[:payload.size] = payload
    everyone = np.asarray(multihost_utils.process_allgather(padded))  # (processes, bytes): one collective
    # Unpack: process p's buffer holds, array after array, the blocks of its devices in mesh order.
    offsets = {p: 0 for p in range(everyone.shape[0])}
    rows = [[None] * len(devices) for _ in arrays]
    for k, (dtype, shape, nbytes) in enumerate(layout):
        for i, d in enumerate(devices):
            p = d.process_index
            start = offsets[p]
            rows[k][i] = everyone[p, start:start + nbytes].view(dtype).reshape(shape)
            offsets[p] = start + nbytes
    return [np.stack(r) for r in rows]


def assemble(array, blocks: list) -> np.ndarray:
    """The global value of ``array`` from its devices' ``blocks`` (in ``array.sharding``'s mesh order), each put
    where JAX's own index map for the array's sharding says: the whole value without another gather, and independent
    of shardprop's model of where blocks lie. Where replicas differ, the first in mesh order is taken, as
    ``np.asarray`` of the array takes it. PRNG keys as key data."""
    import jax

    keys = jax.dtypes.issubdtype(array.dtype, jax.dtypes.extended)
    data = [np.asarray(jax.random.key_data(b) if keys else b) for b in blocks]
    out = np.empty(array.shape + data[0].shape[array.ndim:], data[0].dtype)
    where = array.sharding.devices_indices_map(array.shape)
    placed = list(zip(array.sharding.mesh.devices.flat, data, strict=True))
    for device, block in reversed(placed):  # the first replica written last: it is the one kept
        out[where[device]] = block
    return out


_announced = itertools.count()  # this process's collective calls so far (every process counts the same)


def in_step(call: str) -> None:
    """On several processes, check that every process makes ``call`` as its next call that runs collectives: each
    announces its n-th such call in JAX's coordination service and waits for the others' n-th. Raises
    ``shardprop.OutOfStepError`` when another process announced another call, or none within
    ``SHARDPROP_CALL_TIMEOUT`` seconds (default 300), instead of waiting for it in a collective forever. A single
    process (or a cluster not joined through ``jax.distributed``) checks nothing.

    Examples:
        >>> sp.distributed.in_step("check()")   # a single process: nothing to check, returns None
    """
    import time

    import jax


    client = jx.coordination_client() if jax.process_count() > 1 else None
    if client is None:
        return
    n, me = next(_announced), jax.process_index()
    client.key_value_set(f"shardprop/calls/{n}/{me}", call)
    timeout = float(os.environ.get(CALL_TIMEOUT) or DEFAULT_CALL_TIMEOUT)
    deadline = time.monotonic() + timeout
    advice = ("every process must make the same debugger calls, in the same order (one that runs collectives waits "
              "for the others: call it on every process, and print on one if you like)")
    for p in range(jax.process_count()):
        if p == me:
            continue
        try:
            theirs = client.blocking_key_value_get(f"shardprop/calls/{n}/{p}",
                                                   max(1, int(1000 * (deadline - time.monotonic()))))
        except Exception as err:  # the coordination service's DEADLINE_EXCEEDED (a JaxRuntimeError)
            if "DEADLINE_EXCEEDED" not in str(err) and "deadline" not in str(err).lower():
                raise
            raise OutOfStepError(f"process {me} made the call `{call}`, but process {p} has not made it within "
                                 f"{timeout:g} s ({CALL_TIMEOUT}): {advice}", process=p) from None
        if theirs != call:
            raise OutOfStepError(f"process {me} made the call `{call}` where process {p} made `{theirs}`: {advice}",
                                 process=p)


def any_process(flags) -> list[bool]:
    """Each of ``flags`` (the same count on every process) true where it is true on any process; on a single
    process, ``flags`` as they are. Every process must call it: a decision that leads to collectives (a search
    that gathers more values) is then taken by all processes or by none, even where their own evidence differs.

    Examples:
        >>> sp.distributed.any_process([False, True])   # a single process: the flags as they are
        [False, True]
    """
    import jax
    from jax.experimental import multihost_utils

    flags = [bool(f) for f in flags]
    if jax.process_count() == 1 or not flags:
        return flags
    table = np.asarray(multihost_utils.process_allgather(np.asarray(flags, np.int32)))
    return [bool(f) for f in table.reshape(-1, len(flags)).any(axis=0)]


def process_local(rows: Any, mesh, spec) -> Any:
    """A global array from the rows this process holds: ``rows`` (each array of a pytree) is this process's part
    along the axes ``spec`` lays out over processes, in process order (``jax.make_array_from_process_local_data``).
    Each process loads only its own rows of a batch. A mesh that holds no device of this process is a
    ``shardprop.MeshError`` naming the process and the mesh's devices (``devices_of_process``).

    Examples:
        >>> mesh = sp.make_mesh((8,), ("i",))
        >>> my_rows = np.arange(16.0).reshape(8, 2)          # on a single process: every row
        >>> x = sp.distributed.process_local(my_rows, mesh, P("i"))
        >>> x.shape, x.sharding.spec == P("i")
        ((8, 2), True)
    """
    import jax
    from jax.sharding import NamedSharding

    check_device_count()
    devices_of_process(mesh.devices.flat, jax.process_index())  # a typed error, not JAX's StopIteration
    sharding = NamedSharding(mesh, spec)
    return jax.tree_util.tree_map(lambda r: jax.make_array_from_process_local_data(sharding, np.asarray(r)), rows)


def stage_fingerprints(plan) -> list[int]:
    """One number per stage of ``plan`` that two processes agree on exactly when they made the same stage: its
    sharded IR — every op and its params, every move and collective with its mesh axes and the types it takes and
    gives (partial sums included), its loops' bodies' IR — its inputs and outputs; nothing that depends on where
    the process runs (no source paths, object ids or hash seeds)."""
    import hashlib

    prints = []
    for stage in plan.stages:
        lines = [f"stage {stage.outside_shard_map}"] + [f"in {i.value} {i.layout} {i.source}" for i in stage.inputs]
        lines += _ir_text(plan.graph, stage.instructions)
        lines += [f"out {v} {layout}" for v, layout in zip(stage.outputs, stage.out_layouts, strict=True)]
        digest = hashlib.sha256("\n".join(lines).encode()).digest()
        prints.append(int.from_bytes(digest[:8], "little", signed=True))
    return prints


def _ir_text(graph, instructions) -> list[str]:
    """The instructions as text, bodies included (see ``stage_fingerprints``)."""
    def ref(r) -> str:
        return f"{r.value}:{r.type.layout}+{r.type.partial}{r.type.reduction if r.type.partial else ''}" \
            f"{'' if r.type.placement is None else repr(r.type.placement)}"

    out = []
    for instruction in instructions:
        if isinstance(instruction, Compute):
            node = graph.nodes[instruction.node]
            out.append(f"{node.op}{format_params(node)} {[ref(r) for r in instruction.inputs]} -> "
                       f"{[ref(r) for r in instruction.outputs]}")
            for body in instruction.bodies or ():
                b = body.plan.body
                out.append(f"body {b.name} {b.repeats} {b.carries} {b.operands} {sorted(b.sliced)} "
                           f"{[ref(r) for r in body.inputs]} -> {[ref(r) for r in body.outputs]}")
                out += _ir_text(b.sharded.graph, body.instructions)
        elif isinstance(instruction, Move):
            step = instruction.step
            out.append(f"move {step.kind} {step.mesh_axes} {step.axis} {step.to_axis} {ref(instruction.source)} -> "
                       f"{ref(instruction.result)}")
        else:
            out.append(f"finish {instruction.kind} {instruction.mesh_axes} {ref(instruction.source)} -> "
                       f"{ref(instruction.result)}")
    return out


def check_same_plan(plan) -> None:
    """On a multi-process run, raise ``shardprop.PlanMismatchError`` on every process unless all made the
    same plan (the stages' collectives would otherwise not match: a deadlock). Every process must call it."""
    import jax
    from jax.experimental import multihost_utils

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
            # the first process whose stage differs from this one's (there is one: the column holds two values);
            # the default only keeps next() from ever raising StopIteration
            other = next((p for p, c in enumerate(column) if c != column[me]), (me + 1) % len(counts))
            sizes = ", ".join(f"process {p}: {int(c)}" for p, c in enumerate(counts))
            raise PlanMismatchError(
                f"the processes made different plans, so their collectives would not match (a deadlock): stage {k} "
                f"of process {me} differs from process {other}'s (stages per process — {sizes}). Every process "
                "must trace the same function on the same argument shapes with the same in_specs, mesh, strategy "
                "and options", stage=k)
