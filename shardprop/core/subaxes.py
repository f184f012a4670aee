"""Sub-axes: a mesh axis cut into factors, which a move (``shardprop.core.moves``) may use between its ends.

Mesh axis ``i`` of size 4 is two factors of size 2: device ``i = 2a + b`` is at ``a`` on ``i[major 2]`` and at
``b`` on ``i[minor 2]`` (Shardy's ``i:(1)2`` and ``i:(2)2``). An axis laid out over ``(i,)`` is laid out over
``(i[major 2], i[minor 2])``, so a move may cut a mesh axis in two for free and move the factors apart, as XLA
does: on the (4, 2) mesh ``("i", "j")``, ``P('i', 'j') -> P('j', 'i')`` is a permute and an all-to-all over
``i[minor 2]`` (groups of two devices within ``i``), fewer bytes than any plan over whole mesh axes.

A sub-axis is a *name*, a ``str`` as a mesh axis is, so that layouts, types, steps and listings hold and print it
as they do a mesh axis: ``i[major 2]``, ``i[minor 2]``, and ``i[2 after 4]`` for a factor of size 2 after a major
one of size 4 (of an axis of 16 or more). ``sub_axis`` reads a name back, given the mesh. Nothing outside the
move planner and its executor sees one: every plan starts and ends on whole mesh axes.

    >>> cuts("i", {"i": 8})
    (('i[major 2]', 'i[minor 4]'), ('i[major 4]', 'i[minor 2]'))
    >>> merged(("i[2 after 2]", "i[minor 2]", "j"), {"i": 8, "j": 2})
    ('i[minor 4]', 'j')
    >>> groups(("i[minor 2]",), {"i": 4, "j": 2})
    (('i',), ((0, 1), (2, 3)))
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from .layouts import Layout
from .types import ValueType

Groups = tuple[tuple[int, ...], ...]


class SubAxis(NamedTuple):
    """Factor ``size`` of mesh axis ``parent``, after major factors of ``pre`` devices."""

    parent: str
    pre: int
    size: int


def name(parent: str, pre: int, size: int, total: int) -> str:
    """The name of factor ``size`` after ``pre`` of mesh axis ``parent`` of ``total`` devices: ``parent`` itself
    when the factor is the whole axis."""
    if pre == 1 and size == total:
        return parent
    if pre == 1:
        return f"{parent}[major {size}]"
    if pre * size == total:
        return f"{parent}[minor {size}]"
    return f"{parent}[{size} after {pre}]"


_NAME = re.compile(r"(.+)\[(?:(major|minor) (\d+)|(\d+) after (\d+))\]")


@functools.lru_cache(maxsize=4096)
def _parsed(text: str) -> tuple[str, str, int, int] | None:
    m = _NAME.fullmatch(text)
    if m is None:
        return None
    return (m[1], m[2], int(m[3]), 0) if m[2] else (m[1], "after", int(m[4]), int(m[5]))


def sub_axis(text: str, mesh_shape: Mapping[str, int]) -> SubAxis | None:
    """The factor ``text`` names, or None for a mesh axis of ``mesh_shape`` (or a name that is neither)."""
    if text in mesh_shape:
        return None
    parsed = _parsed(text)
    if parsed is None or parsed[0] not in mesh_shape:
        return None
    parent, where, size, pre = parsed
    total = mesh_shape[parent]
    return SubAxis(parent, 1 if where == "major" else total // size if where == "minor" else pre, size)


def span(text: str, mesh_shape: Mapping[str, int]) -> tuple[str, int, int]:
    """``(mesh axis, minor, size)`` of a mesh axis or sub-axis: the device at ``d`` on the mesh axis is at
    ``d // minor % size`` on it."""
    s = sub_axis(text, mesh_shape)
    if s is None:
        return text, 1, mesh_shape[text]
    return s.parent, mesh_shape[s.parent] // (s.pre * s.size), s.size


def coordinate(text: str, at: Mapping[str, int], mesh_shape: Mapping[str, int]) -> int:
    """The coordinate on mesh axis or sub-axis ``text`` of the device at ``at[axis]`` on each mesh axis."""
    parent, minor, size = span(text, mesh_shape)
    return at[parent] // minor % size


def is_whole(names: Iterable[str], mesh_shape: Mapping[str, int]) -> bool:
    """True when every name is a mesh axis of ``mesh_shape`` (the common case, and the fast paths' test)."""
    return all(n in mesh_shape for n in names)


def sizes_with(names: Iterable[str], mesh_shape: Mapping[str, int]) -> Mapping[str, int]:
    """``mesh_shape`` and the size of every sub-axis among ``names`` (``mesh_shape`` itself when there is none)."""
    extra = {n: s.size for n in names if (s := sub_axis(n, mesh_shape)) is not None}
    return {**mesh_shape, **extra} if extra else mesh_shape


def parents(names: Iterable[str], mesh_shape: Mapping[str, int]) -> tuple[str, ...]:
    """The mesh axes ``names`` (mesh axes and sub-axes) are part of, in mesh order."""
    found = {n if (s := sub_axis(n, mesh_shape)) is None else s.parent for n in names}
    return tuple(n for n in mesh_shape if n in found)


def merged(names: tuple[str, ...], mesh_shape: Mapping[str, int]) -> tuple[str, ...]:
    """``names`` with each run of adjacent factors of one mesh axis, major before minor, as one name: how a layout
    or a step is spelled (``(i[major 2], i[minor 2])`` is ``(i,)``)."""
    if is_whole(names, mesh_shape):
        return names
    out: list[str] = []
    last: SubAxis | None = None
    for n in names:
        s = sub_axis(n, mesh_shape)
        if s is not None and last is not None and last.parent == s.parent and last.pre * last.size == s.pre:
            last = SubAxis(s.parent, last.pre, last.size * s.size)
            out[-1] = name(*last, mesh_shape[s.parent])
        else:
            last = s
            out.append(n)
    return tuple(out)


def spelled(state: tuple[Layout, tuple[str, ...]], mesh_shape: Mapping[str, int]) -> tuple[Layout, tuple[str, ...]]:
    """A ``(layout, partial)`` over factors, spelled on the mesh: every axis of the layout, and the sums,
    ``merged``."""
    layout, partial = state
    return tuple(merged(m, mesh_shape) for m in layout), merged(partial, mesh_shape)


def cuts(parent: str, mesh_shape: Mapping[str, int]) -> tuple[tuple[str, str], ...]:
    """Every way to cut mesh axis ``parent`` in two, ``(major, minor)``, the smaller major first: a size-6 axis is
    ``2 x 3`` or ``3 x 2``; a prime one cannot be cut."""
    total = mesh_shape[parent]
    return tuple((name(parent, 1, d, total), name(parent, d, total // d, total))
                 for d in range(2, total) if total % d == 0)


def cut_mesh(mesh_shape: Mapping[str, int], parent: str, factors: tuple[str, ...]) -> dict[str, int]:
    """``mesh_shape`` with mesh axis ``parent`` replaced by ``factors`` (its sub-axes, major first)."""
    out: dict[str, int] = {}
    for n, size in mesh_shape.items():
        out.update({f: span(f, mesh_shape)[2] for f in factors} if n == parent else {n: size})
    return out


def cut_type(vtype: ValueType, parent: str, factors: tuple[str, ...]) -> ValueType:
    """``vtype`` with mesh axis ``parent`` spelled as ``factors`` wherever it lays the value out or sums it."""
    def cut(names: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(f for n in names for f in (factors if n == parent else (n,)))

    return ValueType(tuple(cut(m) for m in vtype.layout), cut(vtype.partial))


def groups(names: tuple[str, ...], mesh_shape: Mapping[str, int]) -> tuple[tuple[str, ...], Groups]:
    """A collective over ``names`` as ``lax`` runs one: over the mesh axes ``parents(names)``, in groups
    (``axis_index_groups``: linear indices over those axes, major first) of the devices that differ only on
    ``names``, each group in the order of its devices' linear index over ``names``."""
    return _groups(tuple(names), tuple(mesh_shape.items()))


@functools.lru_cache(maxsize=4096)
def _groups(names: tuple[str, ...], mesh: tuple[tuple[str, int], ...]) -> tuple[tuple[str, ...], Groups]:
    sizes = dict(mesh)
    over = parents(names, sizes)
    spans = [span(n, sizes) for n in names]
    members: dict[tuple[int, ...], list[tuple[int, int]]] = {}
    for index, coords in enumerate(itertools.product(*(range(sizes[p]) for p in over))):
        at = dict(zip(over, coords, strict=True))
        position, rest = 0, dict(at)  # rest: the coordinates with the digits of the named factors zeroed
        for parent, minor, size in spans:
            digit = at[parent] // minor % size
            position = position * size + digit
            rest[parent] -= digit * minor
        members.setdefault(tuple(rest.values()), []).append((position, index))
    return over, tuple(tuple(index for _, index in sorted(group)) for _, group in sorted(members.items()))
