"""What a primitive's ``per_block`` piece sees: ``Blocks``, and the helpers to evaluate on blocks.

Inside ``shard_map`` every value is a per-device block, but equation params that carry shapes are global.
A primitive whose params carry no global shape is evaluated with ``bind_as_is``; one whose params do
rewrites them for the block (``bind_with``: ``broadcast_in_dim.shape`` becomes the output's block
shape); one whose block is not the op applied to the operand blocks (``iota``, whose values on a sharded
axis start at the block's offset) has its own evaluator. Each operand block arrives in the layout the node
consumes it in (``in_layouts``): the IR's moves brought it there, a local slice where it was held coarser.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from jax import lax

from ..expr import jax_adapter as jx
from ..expr.graph import Node
from .layouts import Layout

Shape = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Blocks:
    """Global and per-device shapes of a node's operands and outputs, and the outputs' layouts."""

    in_global: tuple[Shape, ...]
    in_blocks: tuple[Shape, ...]
    in_layouts: tuple[Layout, ...]  # how each operand block is laid out (which block of the operand it is)
    out_global: tuple[Shape, ...]
    out_blocks: tuple[Shape, ...]
    out_layouts: tuple[Layout, ...]
    mesh_shape: Mapping[str, int]
    # A loop's or a cond's bodies, when its rule sharded them: each a function from its input blocks to its output
    # blocks (the backend evaluates the body's own plan); None otherwise.
    bodies: tuple[Callable[[list], list], ...] | None = None
    # Per operand and per output, the rows each ranged axis holds (``ValueType.span``: a Span or None per axis;
    # () when none is ranged): ``shardprop.ops.ranges`` reads them.
    in_spans: tuple = ()
    out_spans: tuple = ()


def bind_as_is(node: Node, invals: list, blocks: Blocks) -> list:
    """The primitive itself on the operand blocks: its params carry no global shape."""
    return jx.bind(node.primitive, invals, dict(node.params))


def bind_globally(node: Node, invals: list, blocks: Blocks) -> list:
    """The ``per_block`` piece of a primitive that must not run inside ``shard_map`` (one shardprop has no
    record for: a ``shard_map`` of the user's, a host callback, an op JAX cannot lower under manual sharding).
    Its stage runs outside ``shard_map``, on whole arrays, under the program's ``jax.jit``; its operands are
    gathered (the conservative record), so its blocks are the whole arrays and binding is the same call —
    without the sharding constraints inside its sub-computations (a ``cond``'s branches): its result is
    replicated whatever they say, and XLA refuses branches constrained differently ("inconsistent conditional
    sharding", as under ``jax.jit``)."""
    return jx.bind(node.primitive, invals, jx.without_placements(node.params))


def bind_with(rewrite: Callable[[Mapping[str, Any], Blocks], dict]) -> Callable[[Node, list, Blocks], list]:
    """A ``per_block`` piece that binds the primitive with its shape-carrying params rewritten for the blocks
    (``rewrite(params, blocks) -> params``)."""

    def per_block(node: Node, invals: list, blocks: Blocks) -> list:
        return jx.bind(node.primitive, invals, rewrite(node.params, blocks))

    per_block.__name__ = f"bind_with_{rewrite.__name__.lstrip('_')}"
    per_block.__doc__ = rewrite.__doc__
    return per_block


def cut_to_blocks(node: Node, invals: list, blocks: Blocks) -> list:
    """The primitive on the operand blocks, then each output cut to this device's block along the axes it
    computed whole but holds sharded (axes it *created*, such as a split piece's split axis)."""
    return cut_outputs(jx.bind(node.primitive, invals, dict(node.params)), blocks)


def cut_outputs(outs: list, blocks: Blocks) -> list:
    """Each output cut to this device's block along the axes it came out whole but is held in blocks."""
    cut = []
    for x, block, layout in zip(outs, blocks.out_blocks, blocks.out_layouts, strict=True):
        for axis, (have, want) in enumerate(zip(x.shape, block, strict=True)):
            if have != want:
                x = lax.dynamic_slice_in_dim(x, block_index(layout[axis], blocks.mesh_shape) * want, want, axis)
        cut.append(x)
    return cut


def block_index(mesh_axes: tuple[str, ...], mesh_shape: Mapping[str, int]):
    """This device's block number along an axis laid out over ``mesh_axes`` (major first)."""
    index = 0
    for name in mesh_axes:
        index = index * mesh_shape[name] + lax.axis_index(name)
    return index


def block_rows(shape: tuple[int, ...], axis: int, mesh_axes: tuple[str, ...], mesh_shape: Mapping[str, int],
               block: int, first: int = 0):
    """The array row each position of this device's block stands for along ``axis``, as int32 of ``shape`` (the
    block's, or one broadcastable to it): ``block`` rows per device, device 0's first position at row ``first``
    (``-span.offset`` for a ranged axis; less a halo's rows before it). The one row index of the pieces on blocks."""
    return lax.broadcasted_iota(np.int32, shape, axis) + (block_index(mesh_axes, mesh_shape) * block + first)


def first_device_only(x, mesh_axes: tuple[str, ...], mesh_shape: Mapping[str, int]):
    """``x`` on the first device of each group over ``mesh_axes``, zero on the others: a partial sum over those
    axes whose total is ``x``."""
    return lax.select(block_index(mesh_axes, mesh_shape) == 0, x, lax.full_like(x, 0))


def one_unseen(mesh_shape: Mapping[str, int], dtype):
    """1 of ``dtype``, computed on the device from its mesh position (``min(index + 1, 1)``): a value XLA cannot
    fold, so that ops around it are not simplified across it (the guards of ``backends/evaluate.computed_once`` and
    ``ops/pooling.summed_windows`` rest on it)."""
    index = lax.axis_index(next(iter(mesh_shape)))
    return lax.min(index + 1, lax.full_like(index, 1)).astype(dtype)
