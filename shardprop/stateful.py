"""flax NNX objects as arguments, updated in place as ``nnx.jit`` updates them.

An NNX training step mutates its arguments — ``optimizer.update(model, grads)`` assigns new parameter values —
and returns only the loss. A plain ``jax.jit`` (and a plain trace) sees the modules as pytrees of arrays: the
mutation happens on copies inside the trace and is lost. Like ``nnx.jit``, an autoshard function called with NNX
objects (``nnx.Module``, ``nnx.Optimizer``, ``nnx.Rngs``: any ``nnx.Pytree``) returns their state after the call from
the program as extra outputs (``returning_state``) and writes it back into the caller's objects
(``write_back``), so the caller's model is the updated one. Only this module knows flax.

    >>> step = sp.autoshard(train_step, mesh=mesh, in_specs=(P(), P(), P("data"), P("data")))  # doctest: +SKIP
    >>> loss = step(model, optimizer, x, y)      # model and optimizer updated in place, as under nnx.jit
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

from .errors import SpecTreeError, TraceError


def _nnx():
    return sys.modules.get("flax.nnx")  # never imported here: a program of a user without flax has no NNX objects


def stateful_positions(args: Sequence) -> tuple[int, ...]:
    """The positions of ``args`` that are NNX objects (their state may change in the call)."""
    nnx = _nnx()
    if nnx is None:
        return ()
    base = getattr(nnx, "Pytree", None) or nnx.Object
    return tuple(k for k, a in enumerate(args) if isinstance(a, base))


def returning_state(f: Callable, positions: tuple[int, ...]) -> Callable:
    """``f`` returning ``(its outputs, the state of args[p] after the call for each p in positions)``: each state the
    object's array leaves, in its pytree order. An object whose structure the call changed (a Variable added or
    removed) is a ``shardprop.TraceError``: its new state could not be written back."""
    def with_state(*args, **kwargs):
        before = [jax.tree_util.tree_structure(args[p]) for p in positions]
        out = f(*args, **kwargs)
        states = []
        for p, structure in zip(positions, before, strict=True):
            leaves, after = jax.tree_util.tree_flatten(args[p])
            if after != structure:
                raise TraceError(f"{getattr(f, '__name__', 'the function')} changed the structure of its argument "
                                 f"{p} ({type(args[p]).__name__}: a Variable added or removed), so its new state "
                                 "cannot be written back as nnx.jit would; create every Variable before the call")
            states.append(leaves)
        return out, tuple(states)

    functools.update_wrapper(with_state, f, updated=())  # its name, line and signature: the user's
    return with_state


def state_leaves(args: Sequence, positions: tuple[int, ...], leaves: Sequence) -> tuple[int, ...]:
    """For each leaf of the state ``returning_state`` returns, in order, its position among ``leaves`` (the
    flat leaves of the call's arguments): the argument leaf it is the new value of."""
    where: dict[int, int] = {}
    for k, leaf in enumerate(leaves):
        where.setdefault(id(leaf), k)
    return tuple(where[id(leaf)] for p in positions for leaf in jax.tree_util.tree_leaves(args[p]))


# the Variable metadata flax's nnx.with_partitioning writes (its name changed across flax versions)
_SHARDING_METADATA = ("out_sharding", "sharding_names", "sharding")


def declared_specs(args: Any, leaves: Sequence) -> tuple:
    """For each of ``leaves`` (the flat leaves of the call's arguments) the ``PartitionSpec`` its NNX Variable's
    sharding metadata declares (``nnx.with_partitioning``; read by ``nnx.get_partition_spec``), else None.

        >>> declared_specs((model, x), leaves)      # doctest: +SKIP
        (None, PartitionSpec(None, 'model'), None)  # model.bias, model.kernel, x
    """
    nnx = _nnx()
    if nnx is None:
        return (None,) * len(leaves)
    base = getattr(nnx, "Pytree", None) or nnx.Object
    said: dict[int, Any] = {}
    for obj in jax.tree_util.tree_leaves(args, is_leaf=lambda x: isinstance(x, base)):
        if not isinstance(obj, base):
            continue
        for _, node in nnx.iter_graph(obj):
            if isinstance(node, nnx.Variable) and any(node.get_metadata().get(k) for k in _SHARDING_METADATA):
                said[id(node.get_value())] = nnx.get_partition_spec(node).get_value()
    return tuple(said.get(id(leaf)) for leaf in leaves)


def object_spec_trees(args: Sequence, in_specs: Any) -> Any:
    """``in_specs`` with each entry for an NNX object that is given by attribute path — a mapping such as
    ``nnx.get_partition_spec(nnx.state(model))`` or a nested dict of specs (``{'l1': {'kernel': P(None, 'model')}}``)
    — turned into a spec tree shaped like the object (a pytree prefix of it). A path's spec covers every Variable
    under it; a Variable no path reaches is unannotated; a path that names no Variable is a
    ``shardprop.SpecTreeError``.

        >>> object_spec_trees((model, x), (nnx.get_partition_spec(nnx.state(model)), P("data")))  # doctest: +SKIP
    """
    nnx = _nnx()
    if nnx is None or not isinstance(in_specs, tuple | list):
        return in_specs
    base = getattr(nnx, "Pytree", None) or nnx.Object
    specs = list(in_specs)
    for k, (arg, spec) in enumerate(zip(args, in_specs, strict=False)):  # (fewer specs: keyword arguments)
        if isinstance(arg, base) and isinstance(spec, Mapping):
            specs[k] = _shaped_like(nnx, arg, spec, k)
    return type(in_specs)(specs)


def _shaped_like(nnx, obj: Any, spec: Mapping, position: int) -> Any:
    """The spec tree of ``obj`` that ``spec`` (a mapping by attribute path) describes."""
    by_leaf: dict[int, Any] = {}
    reached: set[tuple] = set()
    for path, variable in nnx.to_flat_state(nnx.state(obj)):
        node, depth = spec, 0
        while isinstance(node, Mapping) and depth < len(path) and path[depth] in node:
            node, depth = node[path[depth]], depth + 1
        if isinstance(node, Mapping):
            continue  # no spec on its path: unannotated
        reached.add(tuple(path[:depth]))
        by_leaf[id(variable.get_value())] = node.get_value() if isinstance(node, nnx.Variable) else node
    named = [path for path in _leaf_paths(spec, nnx) if path not in reached]
    if named:
        raise SpecTreeError(f"in_specs for argument {position} ({type(obj).__name__}) names "
                            f"{'.'.join(map(str, named[0]))}, which is no Variable of it (its Variables: "
                            f"{', '.join('.'.join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(obj)))})")
    return jax.tree_util.tree_map(lambda leaf: by_leaf.get(id(leaf)), obj)


def _leaf_paths(spec: Mapping, nnx, prefix: tuple = ()) -> list[tuple]:
    """The paths of a nested mapping's leaves (a Variable wrapping a spec is a leaf)."""
    paths = []
    for key, value in spec.items():
        if isinstance(value, Mapping) and not isinstance(value, nnx.Variable):
            paths += _leaf_paths(value, nnx, (*prefix, key))
        else:
            paths.append((*prefix, key))
    return paths


def write_back(args: Sequence, positions: tuple[int, ...], states: Sequence[list]) -> None:
    """Each NNX object ``args[p]`` updated in place to its state after the call (``nnx.update``)."""
    nnx = _nnx()
    for p, leaves in zip(positions, states, strict=True):
        updated = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(args[p]), list(leaves))
        nnx.update(args[p], nnx.state(updated))


def returned_out_specs(out_specs: Any) -> Any:
    """``out_specs`` for a function ``returning_state`` wraps: the user's for its outputs, the states free."""
    return None if out_specs is None else (out_specs, None)
