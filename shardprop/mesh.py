"""Mesh construction with the axis types shard_map needs.

``jax.make_mesh`` defaults to ``AxisType.Explicit`` in recent JAX, which makes ``shard_map`` reject inputs
whose sharding differs from ``in_specs``. shardprop reshards between stages freely, so it builds meshes with
``AxisType.Auto`` on every axis.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
from jax.sharding import AxisType, Mesh

from .errors import MeshError


def make_mesh(shape: Sequence[int], names: Sequence[str], *, devices=None) -> Mesh:
    """Build a ``jax.sharding.Mesh`` of the given shape with ``Auto`` axis types.

    On one process it takes the first devices; on several (after ``sp.distributed.initialize()``) it spans every
    process's devices, so its size must be the global device count (see ``check_spans_every_process``).

    Examples:
        >>> mesh = sp.make_mesh((4, 2), ("i", "j"))    # needs 8 devices
        >>> dict(mesh.shape)
        {'i': 4, 'j': 2}
    """
    shape, names = tuple(int(s) for s in shape), tuple(names)
    if len(shape) != len(names):
        raise MeshError(f"mesh shape {shape} and axis names {names} differ in length")
    if len(set(names)) != len(names):
        raise MeshError(f"mesh axis names must be distinct, got {names}")
    if any(s < 1 for s in shape):
        raise MeshError(f"mesh axis sizes must be positive, got {shape}")
    check_device_count()  # before jax.devices() starts the backend with a count the launcher did not set
    available = list(devices) if devices is not None else jax.devices()
    if math.prod(shape) != len(available) and devices is not None:
        raise MeshError(f"a {shape} mesh needs {math.prod(shape)} devices, {len(available)} were given")
    if devices is None and jax.process_count() > 1:
        check_spans_every_process(shape, available)
    elif math.prod(shape) > len(available):
        raise MeshError(
            f"a {shape} mesh needs {math.prod(shape)} devices but only {len(available)} exist; on CPU set "
            "jax.config.update('jax_num_cpu_devices', N) right after importing jax"
        )
    return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape),
                         devices=available[: math.prod(shape)])


# The CPU device count sp.distributed.initialize() set and who asked for it, e.g. (4, "shardprop launch
# --devices-per-process 4"), so that a later change of jax_num_cpu_devices can be refused against it.
_started_with: tuple[int, str] | None = None


def started_with(devices_per_process: int, asked_by: str) -> None:
    """Record the CPU device count a cluster was started with (``sp.distributed.initialize``) and who asked."""
    global _started_with
    _started_with = (devices_per_process, asked_by)


def check_device_count() -> None:
    """Raise ``shardprop.MeshError`` when ``jax_num_cpu_devices`` was changed after
    ``sp.distributed.initialize`` set it to the devices per process the launcher asked for (``started_with``): a
    module written for one process that sets 8, say.

    Refused rather than honoured: honoured, the cluster silently takes another shape than ``--devices-per-process``
    says (2 x 8 devices where 2 x 4 were asked), and the error surfaces later and elsewhere (a mesh that does not
    fit). The comparison is with a count every process was given alike, so every process that made the change
    refuses, without a collective. ``sp.make_mesh`` checks before it starts JAX's backend: a script that catches
    the error may still set the count back."""
    if _started_with is None:
        return
    asked, asked_by = _started_with
    now = jax.config.jax_num_cpu_devices
    if now != asked:
        ask_for = (f"launch with --devices-per-process {now}" if asked_by.startswith("shardprop launch")
                   else f"pass devices_per_process={now}")
        raise MeshError(
            f"jax_num_cpu_devices was set to {now} after sp.distributed.initialize() set it to {asked} for "
            f"`{asked_by}`: each process would have {now} devices, not the {asked} the cluster was started with. "
            f"Set the count in one place: {ask_for} to have {now} each, or set jax_num_cpu_devices before "
            "sp.distributed.initialize() (a single-process default, which initialize's count then replaces)")


def check_spans_every_process(shape: tuple[int, ...], devices: list) -> None:
    """On several processes, a mesh must hold every process's devices: raise ``MeshError`` (each process's
    device count, the mesh's size) unless ``shape`` holds exactly ``devices``, the global ones. Taking the first
    devices, as on one process, would give a mesh of process 0's devices alone: the others would hold none of it."""
    size, processes = math.prod(shape), sorted({d.process_index for d in devices})
    if size == len(devices):
        return
    counts = [sum(d.process_index == p for d in devices) for p in processes]
    fits = ""
    if size % len(processes) == 0:
        fits = (f", or give each process {size // len(processes)} devices (shardprop launch --devices-per-process "
                f"{size // len(processes)})")
    raise MeshError(
        f"a {shape} mesh holds {size} devices, but the {len(processes)} processes have {len(devices)} ("
        + ", ".join(f"process {p}: {n}" for p, n in zip(processes, counts, strict=True))
        + f"): on several processes a mesh spans every process's devices. Make the mesh hold {len(devices)}{fits}")


def as_auto_mesh(mesh) -> Mesh:
    """``mesh`` with every axis ``AxisType.Auto`` (the same devices and names).

    A mesh from a plain ``jax.make_mesh`` has ``Explicit`` axes, under which ``shard_map`` rejects the
    resharding between stages that the gathers are made of.
    """
    if not isinstance(mesh, Mesh):
        raise MeshError(f"expected a jax.sharding.Mesh (see shardprop.make_mesh), got {type(mesh).__name__}")
    if all(t == AxisType.Auto for t in mesh.axis_types):
        return mesh
    return Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * len(mesh.axis_names))
