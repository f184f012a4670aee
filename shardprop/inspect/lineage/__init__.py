"""Lineage — the Nx idea of tracing a section of an output back to the input elements it was computed from.

``lineage(prog, output=0, block=(0, 1))`` takes one block of an output as laid out on the mesh and walks the
graph backwards once: every node maps the boxes asked of its outputs to boxes of its operands with the
lineage rule of its primitive's record (``shardprop.ops``). The answer is sound (no dependency is
missed); it is exact when every rule on the way is exact (see ``Lineage.exact``).
"""

from __future__ import annotations

from typing import Any

from ...errors import OptionError
from ...expr.graph import value_name
from ...gc_pause import gc_paused
from ...core.layouts import shard_count
from ..products import as_plan, resolve_value
from ...core.boxes import Box, full_box, mask
from .walk import dependencies, seeded_dependencies

__all__ = ["Lineage", "block_box", "dependencies", "lineage", "mask", "seeded_dependencies"]


class Lineage(dict):
    """``{flat input index: [box, ...]}`` — the input elements a block depends on, as boxes (one
    ``(start, stop)`` per axis) whose union is the set. ``value`` and ``box`` say which block was asked
    about; ``exact`` is False when some rule on the way over-approximated (then the boxes are a superset)."""

    value: int
    box: Box
    exact: bool

    def __repr__(self) -> str:
        flag = "" if self.exact else ", exact=False"
        return f"Lineage({dict.__repr__(self)}{flag})"


def block_box(prog: Any, value: int, block: Any) -> Box:
    """The box of ``block`` (one block index per axis, as laid out on the mesh) of ``value``."""
    plan = as_plan(prog)
    shape = plan.graph.avals[value].shape
    if block is None:
        return full_box(shape)
    block = (block,) if isinstance(block, int) else tuple(block)
    layout = plan.layout(value)
    if len(block) != len(shape):
        raise OptionError(f"block {block} has {len(block)} entries but {value_name(value)} has rank {len(shape)}")
    box = []
    for axis, (index, size, mesh_axes) in enumerate(zip(block, shape, layout, strict=True)):
        count = shard_count(plan.mesh_shape, mesh_axes)
        if not isinstance(index, int) or not 0 <= index < count:
            laid = f"sharded over {'*'.join(mesh_axes)} into {count} blocks" if mesh_axes else "replicated (1 block)"
            raise OptionError(f"block index {index!r} out of range on axis {axis} of {value_name(value)}: the "
                              f"axis is {laid}")
        length = size // count
        box.append((index * length, (index + 1) * length))
    return tuple(box)


@gc_paused
def lineage(prog: Any, output: int = 0, block: Any = None, *, value: Any = None) -> Lineage:
    """For every input (by flat index), the boxes of input elements that one block of an output depends on.

    ``block`` indexes the output's blocks along each axis as laid out on the mesh (None: the whole output);
    ``value`` (a printed name such as ``"e"`` or a value id) asks about an intermediate value instead of
    output ``output``.

    Examples:
        For the Nx example on a (4, 2) mesh:

        >>> mesh = sp.make_mesh((4, 2), ("i", "j"))
        >>> def f(a, b):                                   # the Nx design note's example
        ...     x, y = a + b, a - b
        ...     return jnp.sum(x, axis=1)[:, None] + jnp.sum(y, axis=0)[None, :]
        >>> a, b = jnp.arange(128.0).reshape(16, 8), jnp.ones((16, 8))
        >>> prog = sp.autoshard(f, mesh=mesh, in_specs=(P("i", "j"), None), strategy="gather").trace(a, b)
        >>> sp.lineage(prog, output=0, block=(0, 1))
        Lineage({0: [((0, 4), (0, 8)), ((0, 16), (4, 8))], 1: [((0, 4), (0, 8)), ((0, 16), (4, 8))]})

        i.e. the output block needs ``a[0:4, :]`` and ``a[:, 4:8]`` (and the same of ``b``).
    """
    plan = as_plan(prog)
    graph = plan.graph
    if value is None:
        if not isinstance(output, int) or not 0 <= output < len(graph.outputs):
            raise OptionError(f"output {output!r} out of range: the function has {len(graph.outputs)} flat outputs")
        value = graph.outputs[output]
    else:
        value = resolve_value(plan, value)
    box = block_box(prog, value, block)
    found, exact = dependencies(graph, value, [box])
    result = Lineage(found)
    result.value, result.box, result.exact = value, box, exact
    return result
