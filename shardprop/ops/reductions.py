"""Reductions drop sharding on the reduced axes: the op needs those axes whole (the split pass cuts there)
and the other axes keep their sharding.

Lineage: an output element reads the whole reduced axes. Finish: a sum, maximum or minimum over sharded
axes can instead be computed per block and finished by ``psum``/``pmax``/``pmin`` over their mesh axes
(``any``/``all`` over bools are a max/min; ``argmax``/``argmin`` combine offset indices), for the dtypes the
collective is exact for; a product or an ``xor`` has no collective, so it is given its axes whole.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.blocks import bind_as_is
from ..expr import jax_adapter as jx
from ..expr.graph import Node
from ..core.boxes import Box, LineageContext
from ..core.rules import RuleContext, RuleOutput
from ..core.layouts import TensorSharding
from ..core.types import whole
from ..core.collectives import Collective, CollectiveKind
from .opdef import Family, Linearity, OpDef


def reduction(ctx: RuleContext, operand: TensorSharding, *, axes, **params) -> RuleOutput:
    reduced = set(axes)
    kept = [k for k in range(len(operand.shape)) if k not in reduced]
    out_shape = ctx.out_avals[0].shape
    out = TensorSharding(out_shape, tuple(
        ctx.carry(i, out_shape[i], operand.axes[k]) for i, k in enumerate(kept)
    ))
    need = tuple(() if k in reduced else m for k, m in enumerate(operand.layout))
    return RuleOutput((out,), (need,))


def reduction_lineage(ctx: LineageContext, box: Box, output: int, *, axes, **params):
    (shape,) = ctx.in_shapes
    kept = iter(box)
    return [[tuple((0, n) if k in axes else next(kept) for k, n in enumerate(shape))]]


def reduce(ctx: RuleContext, *operands: TensorSharding, dimensions, **params) -> RuleOutput:
    """``lax.reduce`` with a computation of its own, over several operands at once: their kept axes merge like
    elementwise axes, the reduced ones are needed whole; the init values are scalars."""
    n_arrays = len(ctx.out_avals)  # operands, then as many init values
    arrays = operands[:n_arrays]
    reduced = set(dimensions)
    kept = [k for k in range(len(arrays[0].shape)) if k not in reduced]
    out_shape = ctx.out_avals[0].shape
    outputs = tuple(TensorSharding(aval.shape, tuple(ctx.merge(i, out_shape[i], [a.axes[k] for a in arrays])
                                                     for i, k in enumerate(kept))) for aval in ctx.out_avals)
    need = [()] * len(arrays[0].shape)
    for i, k in enumerate(kept):
        need[k] = outputs[0].layout[i]
    return RuleOutput(outputs, (tuple(need),) * n_arrays + tuple(() for _ in operands[n_arrays:]))


def reduce_lineage(ctx: LineageContext, box: Box, output: int, *, dimensions, **params):
    """Every operand, whole along the reduced axes (the computation may combine them any way: not exact
    with more than one)."""
    n_arrays = len(ctx.out_shapes)
    if n_arrays > 1:
        ctx.exact = False
    kept = list(box)
    operand_box = []
    for k, n in enumerate(ctx.in_shapes[0]):
        operand_box.append((0, n) if k in dimensions else kept.pop(0))
    return [[tuple(operand_box)] for _ in range(n_arrays)] + [[()] for _ in ctx.in_shapes[n_arrays:]]


@dataclass(frozen=True)
class FinishReduction:
    """Finish a reduction over sharded axes with ``kind`` over their mesh axes, for operand dtypes of the
    numpy kinds in ``exact_for`` (no max over complex numbers; ``and``/``or`` are a min/max only over bools)."""

    kind: CollectiveKind
    exact_for: str

    def __call__(self, decisions, node: Node):
        (v,) = node.operands
        dtype = decisions.graph.avals[v].dtype
        kind = jx.dtype_kind(dtype)  # bfloat16 is a float too; "" (a PRNG key) is in every string
        if not kind or kind not in self.exact_for:
            return None
        produced = decisions.layout(v)
        mesh_axes = tuple(name for k in sorted(node.params["axes"]) for name in produced[k])
        if not mesh_axes:
            return None
        return whole((produced,)), Collective(self.kind, mesh_axes)


def _reduction(name: str, finish: FinishReduction | None, linear: Linearity = Linearity.NONE) -> OpDef:
    return OpDef(name, Family.REDUCTION, propagate=reduction, lineage=reduction_lineage,
                 lineage_exact=True, per_block=bind_as_is, finish=finish, pull=None, linear=linear)


OPS = [
    _reduction("reduce_sum", FinishReduction(CollectiveKind.PSUM, "fiuc"), Linearity.FIRST),
    _reduction("reduce_max", FinishReduction(CollectiveKind.PMAX, "fiub")),
    _reduction("reduce_min", FinishReduction(CollectiveKind.PMIN, "fiub")),
    _reduction("reduce_or", FinishReduction(CollectiveKind.PMAX, "b")),
    _reduction("reduce_and", FinishReduction(CollectiveKind.PMIN, "b")),
    _reduction("argmax", FinishReduction(CollectiveKind.ARGMAX, "fiu")),
    _reduction("argmin", FinishReduction(CollectiveKind.ARGMIN, "fiu")),
    # No collective multiplies or xors partial results: these are given their reduced axes whole.
    _reduction("reduce_prod", None),
    _reduction("reduce_xor", None),
    # not exact with several operands: the computation may combine them any way
    OpDef("reduce", Family.REDUCTION, propagate=reduce, lineage=reduce_lineage, lineage_exact=False,
          per_block=bind_as_is, finish=None, pull=None, linear=Linearity.NONE),
]
