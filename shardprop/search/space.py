"""What the search chooses from: ``sp.AUTO``, each argument's candidate layouts, and which arguments are decided
together.

``sp.AUTO`` is an ``in_specs`` leaf (or pytree prefix) that asks for a searched layout. The candidates of an argument
are every way to lay its axes out over the mesh that the axes divide evenly: each mesh axis on one tensor axis, or on
none; several mesh axes on one tensor axis in the mesh's order. Arguments shaped like a parameter further down the same
path (an optimizer's moments, ``opt_state[0].mu['w']`` beside ``params['w']``) are decided with it: one group, one
layout. """

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
from jax.sharding import PartitionSpec

from ..ops import has_record, lookup
from ..ops.opdef import Family


class _Auto:
    """The ``in_specs`` leaf asking the search for a layout (``sp.AUTO``): one instance, printed as its name."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "sp.AUTO"

    def __reduce__(self):
        return (_Auto, ())


AUTO = _Auto()


def is_spec_leaf(x: Any) -> bool:
    """An ``in_specs`` leaf: a PartitionSpec, None (unannotated) or ``sp.AUTO``."""
    return x is None or x is AUTO or isinstance(x, PartitionSpec)


def candidate_specs(shape: tuple[int, ...], mesh_shape: dict[str, int]) -> tuple[PartitionSpec, ...]:
    """Every layout of an array of ``shape`` whose axes the mesh axes divide evenly, replicated first, then by how
    many mesh axes shard it, in a fixed order (the search's order, so its choice is the same on every run).

    >>> candidate_specs((8, 6), {"i": 4, "j": 2})
    (P(), P('i',), P('j',), P(None, 'j'), P('i', 'j'), P(('i', 'j'),))
    """
    names = list(mesh_shape)
    found: dict[PartitionSpec, int] = {}
    # each mesh axis goes on one tensor axis or on none (len(shape)): (rank + 1) ** mesh-axes choices
    for placement in itertools.product(range(len(shape) + 1), repeat=len(names)):
        axes: list[list[str]] = [[] for _ in shape]
        for name, where in zip(names, placement, strict=True):
            if where < len(shape):
                axes[where].append(name)
        if any(n % _count(mesh_shape, a) for n, a in zip(shape, axes, strict=True)):
            continue
        spec = _spec(axes)
        found.setdefault(spec, sum(map(len, axes)))
    return tuple(sorted(found, key=lambda s: (found[s], _order_key(s))))


def _count(mesh_shape, axes) -> int:
    out = 1
    for a in axes:
        out *= mesh_shape[a]
    return out


def _spec(axes: list[list[str]]) -> PartitionSpec:
    entries = [None if not a else a[0] if len(a) == 1 else tuple(a) for a in axes]
    while entries and entries[-1] is None:
        entries.pop()
    return PartitionSpec(*entries)


def _order_key(spec: PartitionSpec) -> str:
    return repr(tuple(spec))


@dataclass(frozen=True)
class Leaf:
    """One flat argument of the traced function: its position, its name (``path``: as ``jax.jit`` names it,
    ``params[0]['w']``), shape, dtype;
    ``argument`` is the part of the path naming the function's argument (``[1]``; ``[0][1]`` or ``[1]['lr']`` for a
    program traced on ``(args, kwargs)``), ``within`` the rest (``[0].mu['w']``)."""

    index: int
    path: str
    shape: tuple[int, ...]
    dtype: Any
    argument: str = ""
    within: str = ""

    @property
    def nbytes(self) -> int:
        size = self.dtype.itemsize
        for n in self.shape:
            size *= n
        return size


def leaves_of(graph, keyword_form: bool = False) -> list[Leaf]:
    """The flat arguments of ``graph`` with their key paths (``[0]['w']``: argument 0's key ``'w'``);
    ``keyword_form``: the program was traced on ``(args, kwargs)`` (keyword or static arguments), so an argument is
    named by two keys."""
    depth = 2 if keyword_form else 1
    keystr = jax.tree_util.keystr
    return [Leaf(k, name, graph.avals[v].shape, graph.avals[v].dtype, keystr(keys[:depth]), keystr(keys[depth:]))
            for k, (keys, v, name) in enumerate(zip(graph.argument_keys, graph.inputs, graph.argument_names,
                                                     strict=True))]


def decision_groups(leaves: list[Leaf], searched: list[int], followers=frozenset()) -> list[tuple[int, ...]]:
    """The searched leaves in groups decided together, each group led by its first leaf: a leaf joins an earlier
    argument's leaf of its shape whose path within its argument its own path ends with, key by key (the longest
    such: ``[1][0].mu[0]['w']`` joins ``[0][0]['w']``; an NNX moment ``.opt_state[0].mu['l1']['kernel'].value``
    joins ``.l1.kernel.value``) — and a leaf of ``followers`` (one the user left unannotated) also an earlier
    argument's leaf at its very path (a hand-written optimizer's ``m['w']`` and ``v['w']`` follow ``params['w']``;
    two arguments alike that the search lays out, two models, are not tied)."""
    leader: dict[int, int] = {}
    for k in searched:
        mine = _keys(leaves[k].within)
        best = None
        for j in searched:
            if j >= k or leader.get(j, j) != j or leaves[j].shape != leaves[k].shape:
                continue
            other = _keys(leaves[j].within)
            # strictly deeper: the parameter's tree nested inside another argument's (not two arguments alike)
            deeper = len(mine) > len(other) or (k in followers and len(mine) == len(other))
            if other and deeper and mine[-len(other):] == other \
                    and leaves[j].argument != leaves[k].argument \
                    and (best is None or len(other) > len(_keys(leaves[best].within))):
                best = j
        leader[k] = k if best is None else best
    groups: dict[int, list[int]] = {}
    for k in searched:
        groups.setdefault(leader[k], []).append(k)
    return [tuple(members) for _, members in sorted(groups.items())]


# one key of a key path as jax.tree_util.keystr writes it: an attribute, a dict key or a sequence index
_KEY = re.compile(r"\.(\w+)|\['([^']*)'\]|\[(\d+)\]")


def _keys(within: str) -> tuple[str, ...]:
    """The keys of a path, whatever their kind: an NNX parameter ``.l1.kernel.value`` and its optimizer moment
    ``.opt_state[0].mu['l1']['kernel'].value`` end alike."""
    return tuple(next(g for g in m.groups() if g is not None) for m in _KEY.finditer(within))


def state_pairs(graph, returns_inputs: Sequence[int] = (), *, mirrors: bool = True) -> list[tuple[int, int]]:
    """``(output, argument)`` for each output that is an argument's state for the next call, to come back in the
    argument's layout: the last outputs when ``returns_inputs`` names their arguments (an NNX module's state), and an
    output of an argument's shape and dtype where those outputs and arguments are as many — the k-th output the
    k-th argument's (a training step returning its parameters, optimizer state or KV cache updated, in order) unless
    ``mirrors`` is False. Not an argument returned as it is, nor an output the user's own constraint lays out.

    >>> state_pairs(trace(lambda w, x: (w - x.sum() * w, x.sum()), w, x))  # doctest: +SKIP
    [(0, 0)]
    """
    base = len(graph.outputs) - len(returns_inputs)
    pairs = [(base + i, j) for i, j in enumerate(returns_inputs)]
    if not mirrors:
        return pairs
    inputs = set(graph.inputs)

    def kind(value):
        return graph.avals[value].shape, str(graph.avals[value].dtype)

    arguments: dict[tuple, list[int]] = {}
    for index, value in enumerate(graph.inputs):
        if graph.avals[value].shape and index not in returns_inputs:
            arguments.setdefault(kind(value), []).append(index)
    outputs: dict[tuple, list[int]] = {}
    for index, value in enumerate(graph.outputs[:base]):
        op = graph.nodes[graph.producer[value]].op
        pinned = has_record(op) and lookup(op).family is Family.PLACEMENT
        if graph.avals[value].shape and value not in inputs and not pinned:
            outputs.setdefault(kind(value), []).append(index)
    for key, returned in outputs.items():
        alike = arguments.get(key, [])
        if len(alike) == len(returned):
            pairs += list(zip(returned, alike, strict=True))
    return sorted(pairs)
