"""Elementwise ops: unary, n-ary with numpy broadcasting (size-1 axes and scalars), comparisons, select."""

from __future__ import annotations

from ..sharding import TensorSharding
from .fallback import conservative
from .registry import RuleContext, RuleOutput, register

UNARY = (
    "neg", "sign", "floor", "ceil", "round", "is_finite", "exp", "exp2", "log", "log1p", "expm1", "tanh",
    "logistic", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh",
    "sqrt", "rsqrt", "cbrt", "abs", "not", "erf", "erfc", "erf_inv", "lgamma", "digamma", "real", "imag",
    "conj", "integer_pow", "convert_element_type", "reduce_precision", "copy", "copy_p", "square",
    "population_count", "clz", "bessel_i0e", "bessel_i1e", "stop_gradient",
)
NARY = (
    "add", "add_any", "sub", "mul", "div", "rem", "pow", "max", "min", "atan2", "nextafter", "and", "or",
    "xor", "shift_left", "shift_right_logical", "shift_right_arithmetic", "complex", "igamma", "igammac",
    "polygamma", "zeta", "random_gamma_grad", "regularized_incomplete_beta",
    "eq", "ne", "lt", "le", "gt", "ge", "eq_to", "le_to", "lt_to",
    "select_n", "clamp", "threefry2x32",
)


@register(*UNARY, *NARY)
def elementwise(ctx: RuleContext, *operands: TensorSharding, **params) -> RuleOutput:
    """Each output axis merges the operand axes aligned with it (numpy rules, right-aligned); an operand
    axis of size 1 broadcast to a larger size, or missing (a scalar), takes no part and is never sharded."""
    out_shape = ctx.out_avals[0].shape
    rank = len(out_shape)
    if all(operand.shape == out_shape for operand in operands):  # the common case: no broadcasting
        out = TensorSharding(out_shape, tuple(
            ctx.merge(k, size, [operand.axes[k] for operand in operands]) for k, size in enumerate(out_shape)))
        return RuleOutput((out,) * len(ctx.out_avals), (out.layout,) * len(operands))
    axes = []
    for k, size in enumerate(out_shape):
        candidates = []
        for operand in operands:
            j = k - (rank - len(operand.shape))
            if j >= 0 and operand.shape[j] == size:
                candidates.append(operand.axes[j])
        axes.append(ctx.merge(k, size, candidates))
    out = TensorSharding(out_shape, tuple(axes))
    out_layout = out.layout
    needs = []
    for operand in operands:
        offset = rank - len(operand.shape)
        needs.append(tuple(
            out_layout[j + offset] if operand.shape[j] == out_shape[j + offset] else ()
            for j in range(len(operand.shape))
        ))
    return RuleOutput((out,) * len(ctx.out_avals), tuple(needs))




@register("bitcast_convert_type")
def bitcast_convert_type(ctx: RuleContext, operand: TensorSharding, **params) -> RuleOutput:
    """Elementwise between types of one width; a width change adds or drops a minor axis: conservative."""
    if ctx.out_avals[0].shape == operand.shape:
        return elementwise(ctx, operand)
    return conservative(ctx, operand)


@register("optimization_barrier")
def identity(ctx: RuleContext, *operands: TensorSharding, **params) -> RuleOutput:
    """Each output is its operand, unchanged."""
    outputs = tuple(
        TensorSharding(op.shape, tuple(ctx.carry(k, n, op.axes[k]) for k, n in enumerate(op.shape)))
        for op in operands)
    return RuleOutput(outputs, tuple(op.layout for op in operands))
