"""Elementwise ops: unary, n-ary with numpy broadcasting (size-1 axes and scalars), comparisons, select.

Sharding: each output axis merges the operand axes aligned with it. Lineage: an output element reads the same
element of every operand (a size-1 or missing axis reads its one element). On blocks: the op itself.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from ..core.blocks import bind_as_is
from ..expr.graph import Graph, Node
from ..core.boxes import Box, LineageContext
from ..core.rules import RuleContext, RuleOutput
from ..core.layouts import Layout, TensorSharding
from .ranges import keep_ranges
from .windows import within_the_ends
from .opdef import Family, Linearity, OpDef, Trait, defs

UNARY = (
    "neg", "sign", "floor", "ceil", "round", "is_finite", "exp", "exp2", "log", "log1p", "expm1", "tanh",
    "logistic", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh",
    "sqrt", "rsqrt", "cbrt", "abs", "not", "erf", "erfc", "erf_inv", "lgamma", "digamma", "real", "imag",
    "conj", "integer_pow", "convert_element_type", "reduce_precision", "copy", "square",
    "population_count", "clz", "bessel_i0e", "bessel_i1e", "stop_gradient",
    "log2", "one_minus_square",  # jax >= 0.11 (jnp.log2; tanh's, asin's, atanh's derivatives)
    "acospi", "asinpi", "atanpi", "cospi", "sinpi", "tanpi", "exp2m1", "log2p1",  # jax >= 0.12.1
)
NARY = (
    "add", "add_any", "sub", "mul", "div", "rem", "pow", "max", "min", "atan2", "nextafter", "and", "or",
    "xor", "shift_left", "shift_right_logical", "shift_right_arithmetic", "complex", "igamma", "igammac",
    "igamma_grad_a", "polygamma", "zeta", "regularized_incomplete_beta",
    "eq", "ne", "lt", "le", "gt", "ge", "eq_to", "le_to", "lt_to",
    "select_n", "clamp",
    "threefry2x32",
    "polynomial",  # jax >= 0.12: Horner's rule on x and its coefficients (lax.erf, jnp.polyval), all broadcast
    "atan2pi", "fma", "fmuladd",  # jax >= 0.12.1 (a fused or an unfused multiply-add: a * b + c)
)
# How a partial sum passes through them (the rest: not at all): see opdef.Linearity.
# Not a conversion or reduce_precision: they round or overflow each share apart (int8 shares of 100 and 100 wrap
# apart, not together; float16 shares of 40000 are finite, their sum is not).
LINEAR = {
    **dict.fromkeys(("neg", "copy", "real", "imag", "conj"), Linearity.FIRST),
    **dict.fromkeys(("add", "add_any", "sub"), Linearity.JOINT),
    "mul": Linearity.EITHER,
    "div": Linearity.FIRST_IF_FLOAT,  # x / y with y fixed; integer division rounds
}


def operand_needs(out_shape: tuple[int, ...], out_layout: Layout, operand_shapes) -> tuple[Layout, ...]:
    """The layout each operand is consumed in for an output laid out as ``out_layout``: aligned axes (numpy
    broadcasting, right-aligned) take the output axis's layout; an axis of size 1 broadcast to a larger size
    is taken whole."""
    rank = len(out_shape)
    needs = []
    for shape in operand_shapes:
        offset = rank - len(shape)
        needs.append(tuple(out_layout[j + offset] if shape[j] == out_shape[j + offset] else ()
                           for j in range(len(shape))))
    return tuple(needs)


def elementwise(ctx: RuleContext, *operands: TensorSharding, **params) -> RuleOutput:
    """Each output axis merges the operand axes aligned with it (numpy rules, right-aligned); an operand
    axis of size 1 broadcast to a larger size, or missing (a scalar), takes no part and is never sharded. A ranged
    axis stays ranged (``shardprop.ops.ranges.keep_ranges``): the op reads it row by row."""
    out_shape = ctx.out_avals[0].shape
    rank = len(out_shape)
    if any(operand.spans for operand in operands):  # ranged rows are read row by row: they stay ranged
        plain = elementwise(ctx, *(operand.without_ranges() for operand in operands), **params)
        rows = [(i, j, j + rank - len(op.shape)) for i, op in enumerate(operands) for j, n in enumerate(op.shape)
                if n == out_shape[j + rank - len(op.shape)]]
        return keep_ranges(ctx, plain, operands, rows)
    same_shapes = all(operand.shape == out_shape for operand in operands)
    if same_shapes and len(ctx.out_avals) == 1:  # the common case, kept lean: 10^5-node graphs are the norm
        out = TensorSharding(out_shape, tuple(
            ctx.merge(k, size, [operand.axes[k] for operand in operands]) for k, size in enumerate(out_shape)))
        return RuleOutput((out,), (out.layout,) * len(operands))
    candidates = []
    for k, size in enumerate(out_shape):
        aligned = [(operand, k - (rank - len(operand.shape))) for operand in operands]
        candidates.append([op.axes[j] for op, j in aligned if j >= 0 and op.shape[j] == size])
    # each output its own shards (an op with several outputs, such as threefry2x32, computes each from all)
    outputs = tuple(TensorSharding(out_shape, tuple(ctx.merge(k, size, candidates[k])
                                                    for k, size in enumerate(out_shape)))
                    for _ in ctx.out_avals)
    return RuleOutput(outputs, operand_needs(out_shape, outputs[0].layout, [op.shape for op in operands]))


def pull_elementwise(graph: Graph, node: Node, target: Layout) -> tuple[Layout, ...]:
    """The operand layouts that give the output in ``target``."""
    avals = graph.avals
    return operand_needs(avals[node.outputs[0]].shape, target, [avals[u].shape for u in node.operands])


def _aligned(box: Box, out_shape, shape) -> Box:
    offset = len(out_shape) - len(shape)
    return tuple((0, 1) if n == 1 and out_shape[k + offset] != 1 else box[k + offset] for k, n in enumerate(shape))


def elementwise_lineage(ctx: LineageContext, box: Box, output: int, **params):
    out_shape = ctx.out_shapes[output]
    return [[_aligned(box, out_shape, shape)] for shape in ctx.in_shapes]


def elementwise_block(node: Node, invals: list, blocks) -> list:
    """The op on the blocks. An operand broadcast along a ranged axis of the output (a size-1 axis, or a missing one,
    meeting ranged rows) reaches the block's padding rows too — within the block, and on a device whose whole block
    is padding (4 rows over 8 devices: one row each, the last four past the end) — and JAX's derivative of that
    broadcast sums the cotangent over every row of the block, then over the devices that hold the operand whole: a
    padding row's NaN (``0 * inf``: the padding holds anything) would reach the operand's real value. Such an
    operand is broadcast along the ranged axes with a derivative that skips the padding rows; its value is
    unchanged."""
    spans = blocks.out_spans[0] if blocks.out_spans else ()
    ranged = [k for k, span in enumerate(spans) if span is not None and blocks.out_global[0][k] > 1]
    if not ranged:
        return bind_as_is(node, invals, blocks)
    return bind_as_is(node, [_padding_without_derivative(x, shape, ranged, blocks)
                             for x, shape in zip(invals, blocks.in_global, strict=True)], blocks)


def _padding_without_derivative(x, global_shape, ranged: list[int], blocks):
    """``x`` (of ``global_shape``) broadcast along each of the ``ranged`` output axes it is broadcast along, its
    rows past the ends of the array held out of its derivative (``lax.stop_gradient``)."""
    shape, rank = blocks.out_blocks[0], len(blocks.out_blocks[0])
    offset = rank - len(global_shape)
    spread = [k for k in ranged if k < offset or global_shape[k - offset] == 1]
    if not spread or not jnp.issubdtype(jnp.result_type(x), jnp.inexact):
        return x
    target = tuple(shape[k] if k in spread else 1 if k < offset else jnp.shape(x)[k - offset] for k in range(rank))
    x = jnp.broadcast_to(x, target)
    inside = True
    for k in spread:
        inside = inside & within_the_ends(target, k, blocks.out_global[0][k], blocks.out_layouts[0][k],
                                          blocks.mesh_shape, blocks.out_spans[0][k])
    return jnp.where(inside, x, lax.stop_gradient(x))


def mulhi_on_blocks(node: Node, invals: list, blocks) -> list:
    """``lax.mulhi`` (the high half of the product) from half-width products: JAX 0.10.2 cannot lower the
    primitive itself inside ``shard_map``. Unsigned: schoolbook on halves; signed: the unsigned result of the
    same bits, corrected by the operands' signs."""
    a, b = invals
    dtype = a.dtype
    unsigned = jnp.dtype(f"uint{dtype.itemsize * 8}")
    ua, ub = lax.bitcast_convert_type(a, unsigned), lax.bitcast_convert_type(b, unsigned)
    half = dtype.itemsize * 4
    mask = unsigned.type((1 << half) - 1)
    a0, a1, b0, b1 = ua & mask, ua >> half, ub & mask, ub >> half
    p00, p01, p10, p11 = a0 * b0, a0 * b1, a1 * b0, a1 * b1
    mid = (p00 >> half) + (p01 & mask) + (p10 & mask)
    high = p11 + (p01 >> half) + (p10 >> half) + (mid >> half)
    if jnp.issubdtype(dtype, jnp.signedinteger):  # two's complement: subtract the other operand per negative sign
        zero = unsigned.type(0)
        high = high - jnp.where(a < 0, ub, zero) - jnp.where(b < 0, ua, zero)
    return [lax.bitcast_convert_type(high, dtype)]


def bitcast_convert_type(ctx: RuleContext, operand: TensorSharding, **params) -> RuleOutput:
    """Elementwise between types of one width. A narrower type adds a minor axis (an element's bytes), held whole; a
    wider one consumes the operand's minor axis (an element's bytes), needed whole; the leading axes keep their
    sharding either way (each device converts its block)."""
    shape = ctx.out_avals[0].shape
    if shape == operand.shape:
        return elementwise(ctx, operand)
    common = min(len(shape), len(operand.shape))
    axes = tuple(ctx.carry(k, shape[k], operand.axes[k]) for k in range(common)) + (None,) * (len(shape) - common)
    need = operand.layout[:common] + ((),) * (len(operand.shape) - common)
    return RuleOutput((TensorSharding(shape, axes),), (need,))


def bitcast_lineage(ctx: LineageContext, box: Box, output: int, **params):
    if ctx.in_shapes[0] == ctx.out_shapes[0]:
        return [[box]]
    # a width change adds or drops a minor axis: the leading axes map one to one
    (shape,) = ctx.in_shapes
    common = min(len(shape), len(box))
    return [[box[:common] + tuple((0, n) for n in shape[common:])]]


def identity(ctx: RuleContext, *operands: TensorSharding, **params) -> RuleOutput:
    """Each output is its operand, unchanged."""
    outputs = tuple(
        TensorSharding(op.shape, tuple(ctx.carry(k, n, op.axes[k]) for k, n in enumerate(op.shape)))
        for op in operands)
    return RuleOutput(outputs, tuple(op.layout for op in operands))


def identity_lineage(ctx: LineageContext, box: Box, output: int, **params):
    return [[box] if k == output else [] for k in range(len(ctx.in_shapes))]


def sink(ctx: RuleContext, *operands: TensorSharding, **params) -> RuleOutput:
    """No outputs: the operands are read where they are."""
    return RuleOutput((), tuple(op.layout for op in operands))


def elementwise_factors(node: Node, in_shapes) -> tuple[tuple[int | None, ...], ...] | None:
    """Axis ``k`` of every operand carries factor ``k`` — the operands laid out alike — but an axis of length 1
    another operand is longer on (broadcast along it: taken whole) and a scalar's none. None for operands of
    different ranks (the rule aligns them from the right, as numpy broadcasts; a traced program's never are): the
    layout search asks about their layouts' combinations instead.

    >>> elementwise_factors(None, [(64, 8), (1, 8)])
    ((0, 1), (None, 1))
    """
    shapes = [shape for shape in in_shapes if shape]
    if len({len(shape) for shape in shapes}) > 1:
        return None
    longest = [max(n) for n in zip(*shapes, strict=True)]
    return tuple(tuple(None if n == 1 < longest[k] else k for k, n in enumerate(shape)) for shape in in_shapes)


def nothing_read(ctx: LineageContext, box: Box, output: int, **params):
    """Never asked: the op has no outputs."""
    return [[] for _ in ctx.in_shapes]


# what the evaluator asks of their arithmetic (backends/evaluate.py: a value compared with itself, computed once)
TRAITS = {**dict.fromkeys(("eq", "ne", "lt", "le", "gt", "ge"), (Trait.COMPARISON,)),
          **dict.fromkeys(("max", "min"), (Trait.SELECTING,)),
          **dict.fromkeys(("mul", "div", "square", "integer_pow"), (Trait.PRODUCT,)),
          **dict.fromkeys(("add", "sub", "add_any"), (Trait.SUM,)),
          "copy": (Trait.VIEW,)}

OPS = [
    *defs(UNARY + NARY, Family.ELEMENTWISE, propagate=elementwise, lineage=elementwise_lineage,
          lineage_exact=True, per_block=elementwise_block, finish=None, pull=pull_elementwise, linear=LINEAR,
          reads_ranges=True, traits=TRAITS, factors=elementwise_factors),
    OpDef("mulhi", Family.ELEMENTWISE, propagate=elementwise, lineage=elementwise_lineage, lineage_exact=True,
          per_block=mulhi_on_blocks, finish=None, pull=pull_elementwise, linear=Linearity.NONE),
    OpDef("bitcast_convert_type", Family.ELEMENTWISE, propagate=bitcast_convert_type, lineage=bitcast_lineage,
          lineage_exact=True, per_block=bind_as_is, finish=None, pull=None, linear=Linearity.NONE),
    # Values that pass through unchanged: a barrier, a checkpoint name.
    *defs(("optimization_barrier", "name"), Family.ELEMENTWISE, propagate=identity, lineage=identity_lineage,
          lineage_exact=True, per_block=bind_as_is, finish=None, pull=None, linear=Linearity.NONE),
    # Keeps its operands alive against dead-code elimination; computes nothing.
    OpDef("dce_sink", Family.ELEMENTWISE, propagate=sink, lineage=nothing_read, lineage_exact=True,
          per_block=bind_as_is, finish=None, pull=None, linear=Linearity.NONE),
]
