"""Per-block evaluation for the shard_map body.

Inside ``shard_map`` every value is a per-device block, but equation params that carry shapes are global:
``BLOCK_PARAMS[primitive]`` rewrites them for the block (``broadcast_in_dim.shape`` becomes the output's
block shape). Ops whose block is not just the op applied to the operand blocks (``iota``, whose values on a
sharded axis start at the block's offset) have an evaluator in ``BLOCK_EVAL``. Operands that a node
consumes more finely sharded than they are held (a replicated operand meeting a sharded one) are cut
locally with :func:`local_slice` — no communication.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from jax import lax

from ..expr import jax_adapter as jx
from ..expr.graph import Node
from ..propagation.sharding import Layout

Shape = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Blocks:
    """Global and per-device shapes of a node's operands and outputs, and the outputs' layouts."""

    in_global: tuple[Shape, ...]
    in_blocks: tuple[Shape, ...]
    out_global: tuple[Shape, ...]
    out_blocks: tuple[Shape, ...]
    out_layouts: tuple[Layout, ...]
    mesh_shape: Mapping[str, int]
    body: Any = None  # the sharded body of a scan, when its rule proved one


BLOCK_PARAMS: dict[str, Callable[[Mapping[str, Any], Blocks], dict]] = {}
BLOCK_EVAL: dict[str, Callable[[Node, list, Blocks], list]] = {}


def _broadcast_in_dim(params, blocks: Blocks) -> dict:
    return {**params, "shape": blocks.out_blocks[0], "sharding": None}


def _reshape(params, blocks: Blocks) -> dict:
    return {**params, "new_sizes": blocks.out_blocks[0], "sharding": None}


def _slice(params, blocks: Blocks) -> dict:
    # Only whole axes (start 0, full limit, stride 1) keep their sharding: their limit is the block size.
    limits = tuple(b if b != g else lim for lim, b, g in
                   zip(params["limit_indices"], blocks.out_blocks[0], blocks.out_global[0], strict=True))
    return {**params, "limit_indices": limits}


def _dynamic_slice(params, blocks: Blocks) -> dict:
    return {**params, "slice_sizes": tuple(
        b if b != g else s for s, b, g in
        zip(params["slice_sizes"], blocks.out_blocks[0], blocks.out_global[0], strict=True))}


def _gather(params, blocks: Blocks) -> dict:
    # A pass-through operand axis (sliced whole) that is sharded is sliced whole *within the block*.
    return {**params, "slice_sizes": tuple(
        b if s == g else s for s, b, g in
        zip(params["slice_sizes"], blocks.in_blocks[0], blocks.in_global[0], strict=True))}


BLOCK_PARAMS.update({
    "broadcast_in_dim": _broadcast_in_dim,
    "reshape": _reshape,
    "slice": _slice,
    "dynamic_slice": _dynamic_slice,
    "gather": _gather,
})


def _iota(node: Node, invals: list, blocks: Blocks) -> list:
    params = node.params
    dimension = params["dimension"]
    block = blocks.out_blocks[0]
    (out,) = jx.bind(node.primitive, [], {**params, "shape": block, "sharding": None})
    mesh_axes = blocks.out_layouts[0][dimension]
    if mesh_axes:  # values along a sharded axis start at this block's offset
        index = block_index(mesh_axes, blocks.mesh_shape)
        out = out + (index * block[dimension]).astype(out.dtype)
    return [out]


BLOCK_EVAL["iota"] = _iota


def evaluate(node: Node, invals: list, blocks: Blocks) -> list:
    """The node's output blocks from its operand blocks."""
    custom = BLOCK_EVAL.get(node.op)
    if custom is not None:
        return custom(node, invals, blocks)
    return bind_on_blocks(node, invals, blocks)


def bind_on_blocks(node: Node, invals: list, blocks: Blocks) -> list:
    """The primitive itself, with shape-carrying params rewritten for the blocks."""
    rewrite = BLOCK_PARAMS.get(node.op)
    params = dict(node.params) if rewrite is None else rewrite(node.params, blocks)
    return jx.bind(node.primitive, invals, params)


def block_index(mesh_axes: tuple[str, ...], mesh_shape: Mapping[str, int]):
    """This device's block number along an axis laid out over ``mesh_axes`` (major first)."""
    index = 0
    for name in mesh_axes:
        index = index * mesh_shape[name] + lax.axis_index(name)
    return index


def local_slice(x, have: Layout, want: Layout, mesh_shape: Mapping[str, int]):
    """Cut this device's ``want`` block out of a block laid out as ``have`` (``have`` must be a prefix of
    ``want`` on every axis: the extra mesh axes select the sub-block, major first)."""
    for axis, (h, w) in enumerate(zip(have, want, strict=True)):
        extra = w[len(h):]
        if not extra:
            continue
        count = 1
        for name in extra:
            count *= mesh_shape[name]
        size = x.shape[axis] // count
        x = lax.dynamic_slice_in_dim(x, block_index(extra, mesh_shape) * size, size, axis)
    return x
