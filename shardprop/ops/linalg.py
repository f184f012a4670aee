"""Batched linear algebra and FFTs: leading batch axes keep their sharding, the core axes are needed whole.

Every operand of these ops is a batch of matrices (or vectors): its trailing *core* axes are what the op works
on, its leading axes a batch all operands and outputs share. The batch axes merge like elementwise axes (each
device factorises, solves or transforms its own matrices); the core axes are needed whole and come out
replicated. An FFT's core axes are its last ``len(fft_lengths)`` axes.

Lineage: an output block reads the same batch block of every operand, whole along the core axes (exact for
FFTs, a superset for factorisations whose outputs are triangular or banded). On blocks: as they are — their
params describe the core axes, which each device holds whole.
"""

from __future__ import annotations

from ..core.blocks import bind_as_is
from ..core.boxes import Box, LineageContext, full_box
from ..core.rules import RuleContext, RuleOutput
from ..core.layouts import TensorSharding
from .fallback import conservative
from .opdef import Family, Linearity, OpDef

# The number of trailing core axes of each operand, in operand order.
CORE_RANKS: dict[str, tuple[int, ...]] = {
    "cholesky": (2,), "cholesky_update": (2, 1), "eig": (2,), "eigh": (2,), "hessenberg": (2,),
    "householder_product": (2, 1), "lu": (2,), "lu_pivots_to_permutation": (1,), "ormqr": (2, 1, 2), "qr": (2,),
    "schur": (2,), "svd": (2,), "symmetric_product": (2, 2), "triangular_solve": (2, 2), "tridiagonal": (2,),
    "tridiagonal_solve": (1, 1, 1, 2),
}


def _batch_rank(op: str, in_shapes, out_shapes, params) -> int | None:
    """The number of leading batch axes every operand and output shares, or None when they disagree."""
    cores = (len(params["fft_lengths"]),) if op == "fft" else CORE_RANKS[op]
    batch = {len(shape) - core for shape, core in zip(in_shapes, cores, strict=True)}
    if len(batch) != 1:
        return None
    (b,) = batch
    return b if b >= 0 and all(len(shape) >= b for shape in out_shapes) else None


def batched_core(op: str):
    """The sharding rule of batched op ``op`` (see the module docstring)."""

    def rule(ctx: RuleContext, *operands: TensorSharding, **params) -> RuleOutput:
        b = _batch_rank(op, [o.shape for o in operands], [a.shape for a in ctx.out_avals], params)
        if b is None:
            return conservative(ctx, *operands)
        outputs = tuple(TensorSharding(a.shape, tuple(
            ctx.merge(k, n, [o.axes[k] for o in operands]) if k < b else None for k, n in enumerate(a.shape)))
            for a in ctx.out_avals)
        batch = tuple(ctx.merge(k, operands[0].shape[k], [o.axes[k] for o in operands]) for k in range(b))
        layout = TensorSharding(operands[0].shape[:b], batch).layout
        return RuleOutput(outputs, tuple(layout + ((),) * (len(o.shape) - b) for o in operands))

    rule.__name__ = rule.__qualname__ = "batched_core"
    return rule


def batched_core_lineage(op: str):
    """The lineage rule of batched op ``op``: the output's batch box in every operand, core axes whole."""

    def lineage(ctx: LineageContext, box: Box, output: int, **params):
        b = _batch_rank(op, ctx.in_shapes, ctx.out_shapes, params)
        if b is None:
            ctx.exact = False
            return [[full_box(shape)] for shape in ctx.in_shapes]
        return [[box[:b] + full_box(shape)[b:]] for shape in ctx.in_shapes]

    lineage.__name__ = lineage.__qualname__ = "batched_core_lineage"
    return lineage


def _batched(name: str, *, exact: bool) -> OpDef:
    return OpDef(name, Family.LINALG, propagate=batched_core(name), lineage=batched_core_lineage(name),
                 lineage_exact=exact, per_block=bind_as_is, finish=None, pull=None, linear=Linearity.NONE)


OPS = [
    *(_batched(name, exact=False) for name in sorted(CORE_RANKS)),
    _batched("fft", exact=True),  # every output element of a transform reads every core element
]
