"""Random bit generation. ``random_bits`` with one threefry key (JAX's default, partitionable threefry) creates
its axes, as ``iota`` does: they adopt the sharding of what they meet (the activations a dropout mask multiplies)
and each device draws only its own block — each element's bits hash the key and the element's position in the
whole array, so the blocks are exactly the unsharded program's numbers. Other keys and generators (a batch of
keys, ``rbg``, the non-partitionable threefry) are conservative on purpose: keys and bits replicated, so every
device draws the numbers the unsharded program draws. ``threefry2x32`` itself is elementwise.

(``random_gamma`` too: each element's draw depends on its position in the whole array, which a block does not
know.)

Lineage: every element of the keys (sound; not claimed exact). On blocks: ``random_bits`` hashes the block's
global positions; the others run as they are, on the replicated keys.
"""

from __future__ import annotations

import math

import numpy as np
from jax import lax

from ..core.blocks import Blocks, bind_as_is, block_index
from ..expr import jax_adapter as jx
from ..expr.graph import Node
from ..core.rules import CREATED, RuleContext, RuleOutput
from ..core.layouts import TensorSharding
from .fallback import conservative as _conservative
from .fallback import whole_operands
from .opdef import Family, Linearity, OpDef, defs


def conservative(ctx: RuleContext, *operands: TensorSharding, **params) -> RuleOutput:
    """Keys and bits replicated, on purpose (see the module docstring)."""
    return _conservative(ctx, *operands)


def random_bits(ctx: RuleContext, key: TensorSharding, *, bit_width, shape, **params) -> RuleOutput:
    """One partitionable threefry key: every axis of the bits is created (it adopts what it meets), the key is
    read whole. Otherwise conservative."""
    if key.shape != () or not jx.partitionable_random_bits(ctx.in_avals[0].dtype) or math.prod(shape) >= 2**32:
        return conservative(ctx, key)
    return RuleOutput((TensorSharding(tuple(shape), tuple(CREATED if n > 1 else None for n in shape)),), ((),))


def random_bits_on_blocks(node: Node, invals: list, blocks: Blocks) -> list:
    """This device's block of the bits: the threefry hash of each element's flat position in the whole array
    (the block's own positions, offset by its start along each sharded axis)."""
    (block,), (whole,), (layout,) = blocks.out_blocks, blocks.out_global, blocks.out_layouts
    if block == whole:
        return bind_as_is(node, invals, blocks)
    positions = lax.full(block, 0, np.uint32)
    stride = 1
    for d in reversed(range(len(whole))):
        along = lax.broadcasted_iota(np.uint32, block, d)
        if layout[d]:
            along = along + (block_index(layout[d], blocks.mesh_shape) * block[d]).astype(np.uint32)
        positions = positions + along * np.uint32(stride)
        stride *= whole[d]
    return [jx.threefry_bits_at(invals[0], node.params["bit_width"], positions)]


OPS = [
    OpDef("random_bits", Family.RANDOM, propagate=random_bits, lineage=whole_operands, lineage_exact=False,
          per_block=random_bits_on_blocks, finish=None, pull=None, linear=Linearity.NONE),
    *defs(("random_seed", "random_wrap", "random_unwrap", "random_split", "random_fold_in", "random_clone",
           "random_gamma", "rng_bit_generator", "rng_uniform",
           "random_poisson"),  # (jax >= 0.12.1)
          Family.RANDOM, linear=Linearity.NONE,
          propagate=conservative, lineage=whole_operands, lineage_exact=False, per_block=bind_as_is, finish=None,
          pull=None),
]
