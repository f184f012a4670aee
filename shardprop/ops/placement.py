"""Placement: ``device_put`` and sharding constraints inside the traced function.

A ``jax.device_put(x)`` that names no devices is a copy: it passes its operand through. One that names
devices or shardings, and ``with_sharding_constraint``, say where a value should live — shardprop
does not yet follow them (they are annotations to propagate, as in Nx), so they take the conservative rule,
with a warning, and run on the gathered blocks as the identity (the placement is the plan's business, not the
block's).
"""

from __future__ import annotations

from ..backends.blocks import Blocks, bind_with
from ..expr.graph import Node
from ..propagation.context import RuleContext, RuleOutput
from ..propagation.sharding import TensorSharding
from .elementwise import identity, identity_lineage
from .fallback import conservative
from .opdef import Family, OpDef


def device_put(ctx: RuleContext, *operands: TensorSharding, devices, **params) -> RuleOutput:
    """A copy to no particular device passes through; a placement falls back (see the module docstring)."""
    if all(d is None for d in devices):
        return identity(ctx, *operands)
    return conservative(ctx, *operands)._replace(fallback=True)


def _no_placement(params, blocks: Blocks) -> dict:
    """Inside ``shard_map`` a block stays on its device: drop the placement."""
    count = len(params["devices"])
    return {**params, "devices": (None,) * count, "srcs": (None,) * count}


def constraint(ctx: RuleContext, *operands: TensorSharding, **params) -> RuleOutput:
    """Not yet followed: the conservative rule, with a warning (see the module docstring)."""
    return conservative(ctx, *operands)._replace(fallback=True)


def pass_through(node: Node, invals: list, blocks: Blocks) -> list:
    """The operand blocks themselves."""
    return list(invals)


OPS = [
    OpDef("device_put", Family.PLACEMENT, propagate=device_put, lineage=identity_lineage, lineage_exact=True,
          per_block=bind_with(_no_placement), finish=None, pull=None),
    OpDef("sharding_constraint", Family.PLACEMENT, propagate=constraint, lineage=identity_lineage,
          lineage_exact=True, per_block=pass_through, finish=None, pull=None),
]
