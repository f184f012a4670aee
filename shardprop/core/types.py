"""A value's type after splitting: how each device holds its block (:class:`ValueType`).

``layout`` says which block of the value each device holds (per tensor axis, the mesh axes it is laid out over,
major first). ``partial`` names the mesh axes over which the devices of a group each hold one *summand* of that
block: the value is their sum, not yet reduced (Shardy's unreduced axes, JAX's ``P(unreduced=...)``, DTensor's
``Partial``). A mesh axis shards a value or sums it, never both. Every move between two types — a gather, an
all-to-all, a psum, taking a whole value as a partial one — is planned by :mod:`shardprop.core.moves`.

    >>> format_type((16, 8), ValueType((("i",), ()), partial=("j",)))
    '16@i,8{+j}'
"""

from __future__ import annotations

from dataclasses import dataclass

from .layouts import Layout, format_layout


@dataclass(frozen=True, slots=True)
class ValueType:
    """How each device holds a value: its ``layout``, and the mesh axes over which it is an unreduced sum."""

    layout: Layout
    partial: tuple[str, ...] = ()

    def __post_init__(self):
        used = {name for m in self.layout for name in m}
        if used & set(self.partial):
            raise ValueError(f"a mesh axis cannot both shard and sum a value: layout {self.layout}, partial "
                             f"{self.partial}")

    @property
    def is_partial(self) -> bool:
        return bool(self.partial)

    def whole(self) -> ValueType:
        """The same layout, summed: what a ``psum`` over ``partial`` gives."""
        return ValueType(self.layout)


def format_type(shape: tuple[int, ...], vtype: ValueType) -> str:
    """``16@i,8`` and, for a partial sum over ``j``, ``16@i,8{+j}`` (the dims of a printed type)."""
    dims = format_layout(shape, vtype.layout)
    return dims if not vtype.partial else f"{dims}{{+{'*'.join(vtype.partial)}}}"
