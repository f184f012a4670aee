"""``jax.jit``'s spellings of shardings, read into shardprop's: ``NamedSharding`` leaves where a ``PartitionSpec`` goes,
the mesh set by ``jax.set_mesh`` where ``mesh=`` is not given, and an argument array's own layout where its spec is
not written.

A JAX user writes ``jax.jit(f, in_shardings=NamedSharding(mesh, P("data")))`` under ``jax.set_mesh(mesh)``;
``autoshard`` takes the same (``in_shardings=``/``out_shardings=`` are its ``in_specs``/``out_specs``), reads each
``NamedSharding`` as its spec on the one mesh, and — as ``jax.jit`` keeps an argument's sharding — lets an
unannotated argument that is already an array laid out on the mesh keep its layout.

    >>> program_mesh(None, (NamedSharding(mesh, P("i")),))                               # doctest: +SKIP
    Mesh('i': 8)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .errors import MeshError, OptionError
from .expr import jax_adapter as jx
from .search import AUTO


def _is_leaf(x: Any) -> bool:
    return x is AUTO or x is None or isinstance(x, PartitionSpec | NamedSharding)


def _named_shardings(*trees: Any) -> list[NamedSharding]:
    return [x for tree in trees for x in jax.tree_util.tree_leaves(tree, is_leaf=_is_leaf)
            if isinstance(x, NamedSharding)]


def context_mesh() -> Mesh | None:
    """The concrete mesh set by ``jax.set_mesh`` (as a context manager or globally), or None."""
    mesh = jax.sharding.get_mesh()
    return None if mesh.empty else mesh


def program_mesh(mesh: Mesh | None, *spec_trees: Any) -> Mesh:
    """The mesh a program runs on: ``mesh`` when given; else the context mesh (``jax.set_mesh``); else the one mesh
    of the ``NamedSharding`` leaves in ``spec_trees`` — where ``jax.jit`` would find it. None of them is an
    ``shardprop.OptionError`` saying the three ways to give one."""
    if mesh is not None:
        return mesh
    context = context_mesh()
    if context is not None:
        return context
    meshes = {_mesh_key(s.mesh): s.mesh for s in _named_shardings(*spec_trees)}
    if len(meshes) == 1:
        return next(iter(meshes.values()))
    several = f" (their NamedShardings name {len(meshes)} different meshes)" if meshes else ""
    raise OptionError(f"no mesh to shard on{several}: pass mesh=, call under `with jax.set_mesh(mesh):` (or "
                      "jax.set_mesh(mesh) once), or give NamedSharding(mesh, spec) in in_shardings")


def _mesh_key(mesh) -> tuple:
    """A mesh's identity for sharding: its axis names and sizes and its devices in order (not its axis types)."""
    return tuple(mesh.axis_names), tuple(mesh.devices.shape), tuple(d.id for d in np.ravel(mesh.devices))


def same_devices(a, b) -> bool:
    """Whether meshes ``a`` and ``b`` name the same axes over the same devices in the same order (their axis types
    may differ: an Explicit ``jax.make_mesh`` mesh and its Auto twin lay arrays out alike)."""
    return _mesh_key(a) == _mesh_key(b)


def as_specs(tree: Any, mesh: Mesh, what: str) -> Any:
    """``tree`` (``in_specs`` or ``out_specs``, or their ``*_shardings`` spelling) with each ``NamedSharding`` leaf
    read as its ``PartitionSpec``. A ``NamedSharding`` on another mesh than ``mesh`` is a
    ``shardprop.MeshError`` naming ``what`` and both meshes."""
    def spec_of(x):
        if not isinstance(x, NamedSharding):
            return x
        if not same_devices(x.mesh, mesh):
            raise MeshError(f"{what} has NamedSharding(..., {x.spec}) on mesh {_describe(x.mesh)}, but the program's "
                            f"mesh is {_describe(mesh)}: every sharding of one program is on its mesh")
        return x.spec
    if isinstance(tree, NamedSharding):
        return spec_of(tree)
    return jax.tree_util.tree_map(spec_of, tree, is_leaf=_is_leaf)


def _describe(mesh) -> str:
    ids = [d.id for d in np.ravel(mesh.devices)]
    return f"{dict(mesh.shape)} over devices {ids}"


def one_of(specs: Any, shardings: Any, spec_name: str) -> Any:
    """``specs`` or ``shardings`` (``in_specs`` or ``in_shardings``: one option spelled two ways), whichever is
    given; both is an ``shardprop.OptionError``."""
    if specs is not None and shardings is not None:
        raise OptionError(f"{spec_name}= and {spec_name.replace('specs', 'shardings')}= are one option spelled two "
                          "ways (shardprop's and jax.jit's): give one")
    return shardings if specs is None else specs


def own_specs(leaves: Sequence, mesh: Mesh) -> tuple[PartitionSpec | None, ...]:
    """Per argument leaf, the ``PartitionSpec`` it is laid out in when it is a (committed, concrete) ``jax.Array`` —
    or a ``ShapeDtypeStruct`` with a sharding — placed on ``mesh``'s devices by a ``NamedSharding`` of the same axes
    (``jax.jit`` keeps such an argument's sharding), else None (a host value, an uncommitted array, a tracer, or an
    array on other devices)."""
    return tuple(_own_spec(x, mesh) for x in leaves)


def _own_spec(x: Any, mesh: Mesh) -> PartitionSpec | None:
    if isinstance(x, jax.ShapeDtypeStruct):  # jax.jit's .lower takes a layout so too
        sharding = x.sharding
    elif isinstance(x, jax.Array) and not jx.is_traced(x) and x.committed:
        sharding = x.sharding
    else:
        return None
    if isinstance(sharding, NamedSharding) and same_devices(sharding.mesh, mesh):
        return sharding.spec
    return None


def placements(leaves: Sequence) -> tuple:
    """Each leaf's sharding when it is a committed concrete ``jax.Array``, else None: what a call's own layouts add to
    its cheap cache key (a microsecond per leaf or less)."""
    return tuple(x.sharding if isinstance(x, jax.Array) and not jx.is_traced(x) and x.committed else None
                 for x in leaves)


def leaves_some_unannotated(in_specs: Any) -> bool:
    """Whether ``in_specs`` leaves some argument unannotated (None): only then can an array's own layout count."""
    return any(x is None for x in jax.tree_util.tree_leaves(in_specs, is_leaf=_is_leaf))


def same_spec(a: PartitionSpec, b: PartitionSpec) -> bool:
    """Whether two specs lay an array out alike: ``P('i', None)`` as ``P('i')``, ``P(('i',))`` as ``P('i')``."""
    return _canonical(a) == _canonical(b)


def _canonical(spec: PartitionSpec) -> tuple:
    entries = [() if e is None else tuple(e) if isinstance(e, tuple) else (e,) for e in spec]
    while entries and not entries[-1]:
        entries.pop()
    return tuple(entries)
