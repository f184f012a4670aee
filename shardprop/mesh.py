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

    >>> mesh = make_mesh((4, 2), ("i", "j"))    # needs 8 devices
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
    available = list(devices) if devices is not None else jax.devices()
    if math.prod(shape) != len(available) and devices is not None:
        raise MeshError(f"a {shape} mesh needs {math.prod(shape)} devices, {len(available)} were given")
    if math.prod(shape) > len(available):
        raise MeshError(
            f"a {shape} mesh needs {math.prod(shape)} devices but only {len(available)} exist; on CPU set "
            "jax.config.update('jax_num_cpu_devices', N) right after importing jax"
        )
    return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape),
                         devices=available[: math.prod(shape)])


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
