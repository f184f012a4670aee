"""Placement: ``device_put`` and sharding constraints inside the traced function.

A ``jax.device_put(x)`` that names no devices is a copy: it passes its operand through. One that names
devices or shardings says where a value should live; shardprop does not follow it yet (the conservative rule,
with a warning). ``with_sharding_constraint`` is an annotation, as an input spec is: it pins its value's layout;
open axes upstream adopt it (an unannotated argument that reaches a constraint is laid out as the constraint
says) and so do the ops downstream; an operand that arrives laid out otherwise is moved there by the plan (a
local slice when the pin is finer, a gather and a slice otherwise).
"""

from __future__ import annotations

from jax.sharding import AxisType, PartitionSpec

from ..core.blocks import Blocks, bind_with
from ..expr.graph import Node
from ..core.rules import RuleContext, RuleOutput
from ..core.layouts import Open, Sharded, TensorSharding, layout_from_spec, shard_count, uneven_span
from .elementwise import identity, identity_lineage
from .fallback import conservative
from .opdef import Family, Linearity, OpDef, Trait


def device_put(ctx: RuleContext, *operands: TensorSharding, devices, **params) -> RuleOutput:
    """A copy to no particular device passes through; a placement falls back (see the module docstring)."""
    if all(d is None for d in devices):
        return identity(ctx, *operands)
    return conservative(ctx, *operands)._replace(fallback=True)


def _no_placement(params, blocks: Blocks) -> dict:
    """Inside ``shard_map`` a block stays on its device: drop the placement."""
    count = len(params["devices"])
    return {**params, "devices": (None,) * count, "srcs": (None,) * count}


def constraint(ctx: RuleContext, operand: TensorSharding, *, sharding, unconstrained_dims=frozenset(),
               **params) -> RuleOutput:
    """A sharding constraint pins its value's layout: open axes adopt it, the operand is consumed in it (moved
    there when it arrives otherwise), and the result is laid out as it says. An unconstrained axis carries the
    operand's sharding. An axis its mesh axes do not divide is laid out in blocks of ``ceil(n / count)`` rows, the
    last ones short — ranged, as an argument laid out so is (``jax.jit`` pads it so)."""
    spec = getattr(sharding, "spec", sharding)
    shape = operand.shape
    entries = _entries(spec, len(shape))
    # (jax >= 0.12.1's vmap of a constraint writes the mapped axis as P.UNCONSTRAINED, not in unconstrained_dims)
    unconstrained_dims = set(unconstrained_dims) | {k for k, e in enumerate(entries)
                                                    if e is PartitionSpec.UNCONSTRAINED}
    pinned = layout_from_spec(PartitionSpec(*(None if k in unconstrained_dims else e for k, e in enumerate(entries))),
                              shape, ctx.mesh_shape, "the sharding constraint", uneven=True)
    axes, needs, reads = [], [], []
    for k, (size, source, mesh_axes) in enumerate(zip(shape, operand.axes, pinned, strict=True)):
        if k in unconstrained_dims:
            ranged = isinstance(source, Sharded) and source.span is not None
            axes.append(ctx.ranged(k, size, source.mesh_axes, source.span, [(source, 0)]) if ranged else
                        ctx.carry(k, size, source))
            needs.append(() if ranged else source.mesh_axes if isinstance(source, Sharded) else ())
            reads.append((source.mesh_axes, source.span) if ranged else None)
            continue
        if isinstance(source, Open):
            ctx.request(source, mesh_axes)
        span = uneven_span(size, shard_count(ctx.mesh_shape, mesh_axes)) if mesh_axes else None
        if span is not None:  # blocks of ceil(n / count) rows: read so, the operand's rows realigned or taken there
            sources = [(source, 0)] if isinstance(source, Sharded) and source.mesh_axes == mesh_axes else []
            axes.append(ctx.ranged(k, size, mesh_axes, span, sources))
            needs.append(())
            reads.append((mesh_axes, span))
            continue
        if isinstance(source, Sharded) and source.mesh_axes == mesh_axes and source.span is None:
            axes.append(ctx.carry(k, size, source))
        else:
            axes.append(ctx.root(k, size, mesh_axes) if mesh_axes else None)
        needs.append(mesh_axes)
        reads.append(None)
    spans = (tuple(reads),) if any(r is not None for r in reads) else None
    return RuleOutput((TensorSharding(shape, tuple(axes)),), (tuple(needs),), need_spans=spans)


def _entries(spec, rank: int) -> tuple:
    """The spec's entries for every axis (a spec may be shorter than the rank; the rest are replicated)."""
    entries = tuple(spec)
    return entries + (None,) * (rank - len(entries))


def reshard(ctx: RuleContext, operand: TensorSharding, *, dst_sharding, **params) -> RuleOutput:
    """``jax.sharding.reshard``: under a mesh with Explicit axes a placement, which pins the layout as a
    sharding constraint does; on Auto axes (``jax.grad`` binds it on cotangents) it asks for nothing: identity."""
    mesh = getattr(dst_sharding, "mesh", None)
    if all(t == AxisType.Auto for t in getattr(mesh, "axis_types", ())):
        return identity(ctx, operand)
    return constraint(ctx, operand, sharding=dst_sharding)


def pass_through(node: Node, invals: list, blocks: Blocks) -> list:
    """The operand blocks themselves."""
    return list(invals)


OPS = [
    OpDef("device_put", Family.PLACEMENT, propagate=device_put, lineage=identity_lineage, lineage_exact=True,
          per_block=bind_with(_no_placement), finish=None, pull=None, linear=Linearity.NONE),
    OpDef("sharding_constraint", Family.PLACEMENT, propagate=constraint, lineage=identity_lineage,
          lineage_exact=True, per_block=pass_through, finish=None, pull=None, linear=Linearity.NONE,
          reads_ranges=True, traits=frozenset({Trait.ANNOTATION})),
    OpDef("reshard", Family.PLACEMENT, propagate=reshard, lineage=identity_lineage, lineage_exact=True,
          per_block=pass_through, finish=None, pull=None, linear=Linearity.NONE),
]
