"""Per-block evaluation helpers for the shard_map body.

Inside ``shard_map`` every value is a per-device block, but equation params that carry shapes are global:
``BLOCK_PARAMS[primitive]`` rewrites them for the block (``broadcast_in_dim.shape`` becomes the output's
block shape). Operands that a node consumes more finely sharded than they are held (a replicated operand
meeting a sharded one) are cut locally with :func:`local_slice` — no communication.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from jax import lax

from ..propagation.sharding import Layout

BlockParams = Callable[[Mapping[str, Any], tuple[tuple[int, ...], ...]], dict]
BLOCK_PARAMS: dict[str, BlockParams] = {}


def _broadcast_in_dim(params, out_blocks):
    return {**params, "shape": out_blocks[0], "sharding": None}


BLOCK_PARAMS["broadcast_in_dim"] = _broadcast_in_dim


def block_params(op: str, params: Mapping[str, Any], out_blocks: tuple[tuple[int, ...], ...]) -> dict:
    rewrite = BLOCK_PARAMS.get(op)
    return dict(params) if rewrite is None else rewrite(params, out_blocks)


def local_slice(x, have: Layout, want: Layout, mesh_shape: Mapping[str, int]):
    """Cut this device's ``want`` block out of a block laid out as ``have`` (``have`` must be a prefix of
    ``want`` on every axis: the extra mesh axes select the sub-block, major first)."""
    for axis, (h, w) in enumerate(zip(have, want, strict=True)):
        extra = w[len(h):]
        if not extra:
            continue
        count, index = 1, 0
        for name in extra:
            index = index * mesh_shape[name] + lax.axis_index(name)
            count *= mesh_shape[name]
        size = x.shape[axis] // count
        x = lax.dynamic_slice_in_dim(x, index * size, size, axis)
    return x
