"""Random ``PartitionSpec``\\ s for the fuzzers (``tests/fuzzing.py``, ``tests/fuzzing_users.py``): as users write
them — replicated, one mesh axis, or several on one tensor axis in either order (``P(('k', 'i'))`` as often as
``P(('i', 'k'))``), usually dividing the axis and sometimes not (an argument then runs on uneven blocks) — and specs
made from another input's: the same layouts refined, coarsened, reordered or moved to other axes, as two arguments of
one model are (``x: P('i', 'j')`` meeting ``y: P(('k', 'i'), 'j')``).
"""

from __future__ import annotations

import itertools
import math

from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P


def _names(entry) -> tuple[str, ...]:
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def _entry(names: tuple[str, ...]):
    return None if not names else names[0] if len(names) == 1 else names


def _count(mesh_shape: dict[str, int], names) -> int:
    return math.prod(mesh_shape[x] for x in names)


@st.composite
def specs_for(draw, shape: tuple[int, ...], mesh_shape: dict[str, int], *, sharded: int = 3):
    """None (unannotated), P() (replicated), or — ``sharded`` times as often as each of those — a random per-axis
    assignment of unused mesh axes: one of them, or several in a random order (compound entries as often as single
    ones); usually dividing the axis, sometimes deliberately not."""
    # (Hypothesis draws a list's first entry most often, and shrinks towards it)
    kind = draw(st.sampled_from(["sharded"] * sharded + ["none", "replicated"]))
    if kind == "none":
        return None
    if kind == "replicated" or not shape:
        return P()
    free = list(mesh_shape)
    entries = []
    allow_indivisible = draw(st.integers(0, 5)) == 0
    first = draw(st.integers(0, len(shape) - 1))  # (an axis drawn first: not always the leading one sharded)
    for k in [first, *(k for k in range(len(shape)) if k != first)]:
        how_many = draw(st.sampled_from([2, 1, 1, 2, 3] if k == first else [1, 0, 0, 1, 2, 2, 3]))
        options = []
        for r in range(min(how_many, len(free)), 0, -1):  # as many mesh axes as drawn, or fewer where they divide
            options = [names for names in itertools.permutations(free, r)
                       if allow_indivisible or shape[k] % _count(mesh_shape, names) == 0]
            if options:
                break
        names = draw(st.sampled_from(options)) if options else ()
        free = [x for x in free if x not in names]
        entries.append((k, _entry(names)))
    return P(*(entry for _, entry in sorted(entries)))


@st.composite
def related_spec(draw, spec, shape: tuple[int, ...], mesh_shape: dict[str, int]):
    """A spec for an input of ``shape`` made from another input's ``spec``: per axis its mesh axes kept, cut to a
    prefix, or extended by an unused mesh axis after them or *before* them (``'i'`` becoming ``('k', 'i')``: no
    refinement of it, a move), or reordered — where the result divides the axis."""
    entries = list(spec) + [None] * (len(shape) - len(spec))
    names = [_names(e) for e in entries[: len(shape)]]
    used = {x for n in names for x in n}
    out = []
    for n, axes in zip(shape, names, strict=True):
        choice = draw(st.sampled_from(["extend before", "keep", "prefix", "extend", "reorder"]))
        if choice == "prefix" and axes:
            axes = axes[: draw(st.integers(0, len(axes) - 1))]
        elif choice in ("extend", "extend before"):
            extra = [x for x in mesh_shape if x not in used and n % _count(mesh_shape, (*axes, x)) == 0]
            if extra:
                x = draw(st.sampled_from(extra))
                axes = (*axes, x) if choice == "extend" else (x, *axes)
                used.add(x)
        elif choice == "reorder" and len(axes) > 1:
            axes = tuple(draw(st.permutations(axes)))
        out.append(_entry(axes))
    return P(*out)


@st.composite
def permuted_spec(draw, spec, shape: tuple[int, ...], mesh_shape: dict[str, int]):
    """Another input's ``spec`` with its entries moved to other axes (where they divide): the layouts of ``x``
    and ``x.T`` — a sharding conflict wherever the two meet elementwise."""
    entries = list(spec) + [None] * (len(shape) - len(spec))
    order = draw(st.permutations(range(len(shape))))
    out = []
    for n, k in zip(shape, order, strict=True):
        entry = entries[k]
        out.append(entry if n % _count(mesh_shape, _names(entry)) == 0 else None)
    return P(*out)


def divides(spec, shape: tuple[int, ...], mesh_shape: dict[str, int]) -> bool:
    """True when every entry of ``spec`` divides its axis of ``shape`` (a JAX array can be laid out so)."""
    return spec is None or all(n % _count(mesh_shape, _names(e)) == 0 for n, e in zip(shape, spec, strict=False))
