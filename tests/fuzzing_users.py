"""Random programs shaped as users write them, for differential fuzzing (``tests/test_fuzz_users.py``).

``tests/fuzzing.py`` draws every primitive shardprop has a record for; this generator draws what models are made of,
in the combinations where layouts meet: reductions (sum, mean, max, min, argmax) over one and two axes, with
``keepdims`` broadcast back against their operand (``x - x.mean(0, keepdims=True)``, a softmax's max) and sliced
afterwards (``jnp.sum(x, axis=1)[2:6]``); a value compared with its own extreme, written out twice; pooling windows
over slices; elementwise ops and broadcasts between values of related shapes; extremes and
selects (the gradients of ``max``, ``min`` and ``jnp.maximum`` average over ties); reshapes that split and merge
sharded axes; slices, pads (constant and edge) and concatenations along sharded axes; transposes and contractions;
sharding constraints, whose specs (``tests/fuzz_specs.py``) put several mesh axes on one tensor axis in either order.
Sizes mix those the meshes divide and those they do not. Programs are plain source (``tests/fuzzing.Program``), so a
failure prints as a script.
"""

from __future__ import annotations

import math

from hypothesis import strategies as st

from tests.fuzz_specs import specs_for
from tests.fuzzing import Program, Value, _broadcast, reshaped

SIZES = (8, 16, 4, 12, 8, 16, 4, 6, 3, 10, 2)  # the meshes' 2, 4 and 8 blocks divide most, not all (the first is
# drawn most often)
MAX_ELEMENTS = 2048
EXTREMES = ("max", "min")
REDUCTIONS = ("sum", "mean", "max", "min", "argmax")


def _pick(draw, pool, rank_at_least: int = 1) -> Value | None:
    """A value of the pool, the newest as often as any other (ops chain, as a model's do)."""
    fitting = [v for v in pool if len(v.shape) >= rank_at_least]
    if not fitting:
        return None
    return fitting[-1] if draw(st.booleans()) else draw(st.sampled_from(fitting))


def _axes(draw, v: Value) -> tuple[int, ...]:
    """One axis of ``v``, or two (sorted)."""
    count = draw(st.integers(1, min(2, len(v.shape))))
    return tuple(sorted(draw(st.lists(st.integers(0, len(v.shape) - 1), min_size=count, max_size=count,
                                      unique=True))))


def _axis_text(axes: tuple[int, ...]) -> str:
    return str(axes[0]) if len(axes) == 1 else str(axes)


def _reduced(v: Value, axes: tuple[int, ...], keep: bool) -> tuple[int, ...]:
    return tuple(1 if k in axes else n for k, n in enumerate(v.shape) if keep or k not in axes)


def _reduction_of(draw, v: Value, *, keep: bool, kinds=REDUCTIONS) -> tuple[str, str, tuple[int, ...]]:
    """``(kind, expression, shape)`` of a reduction of ``v``."""
    kind = draw(st.sampled_from(kinds))
    if kind == "argmax":
        axis = draw(st.integers(0, len(v.shape) - 1))
        return kind, f"jnp.argmax({v.name}, axis={axis}, keepdims={keep}).astype(jnp.float32)", _reduced(
            v, (axis,), keep)
    axes = _axes(draw, v)
    return kind, f"jnp.{kind}({v.name}, axis={_axis_text(axes)}, keepdims={keep})", _reduced(v, axes, keep)


def reduction(draw, pool):
    v = _pick(draw, pool)
    if v is None:
        return None
    kind, expr, shape = _reduction_of(draw, v, keep=draw(st.booleans()))
    return f"reduction ({kind})", expr, shape


def _slice_text(draw, shape: tuple[int, ...]) -> tuple[str, tuple[int, ...]] | None:
    """A basic slice of a value of ``shape`` along one axis: ``(index text, result shape)``."""
    axes = [k for k, n in enumerate(shape) if n >= 2]
    if not axes:
        return None
    k = draw(st.sampled_from(axes))
    n = shape[k]
    lo = draw(st.integers(0, n - 1))
    hi = draw(st.integers(lo + 1, n))
    step = draw(st.sampled_from([1, 1, 1, 2, 3]))
    size = -(-(hi - lo) // step)
    index = ", ".join([":"] * k + [f"{lo}:{hi}" + (f":{step}" if step > 1 else "")])
    return index, shape[:k] + (size,) + shape[k + 1:]


def sliced_reduction(draw, pool):
    """A slice of a reduction's result (``jnp.sum(x, axis=1)[2:6]``): of a value each device may hold a partial sum of,
    or ranged rows of."""
    v = _pick(draw, pool, 2)
    if v is None:
        return None
    kind, expr, shape = _reduction_of(draw, v, keep=draw(st.booleans()))
    cut = _slice_text(draw, shape)
    if cut is None:
        return None
    index, shape = cut
    return f"slice of a reduction ({kind})", f"{expr}[{index}]", shape


def normalized(draw, pool):
    """A value combined with a reduction of itself (or of a value of its shape) kept as size-1 axes and broadcast back:
    centring, scaling, a softmax's shift."""
    v = _pick(draw, pool)
    if v is None:
        return None
    same = [w for w in pool if w.shape == v.shape]
    w = draw(st.sampled_from(same))
    kind, expr, _ = _reduction_of(draw, v, keep=True, kinds=("sum", "mean", "max", "min"))
    how = draw(st.sampled_from(["({} - {})", "({} * {})", "({} / (1.0 + jnp.abs({})))", "jnp.exp({} - {})"]))
    if how.startswith("jnp.exp"):  # a softmax's numerator: bounded where the reduction is the maximum
        expr = how.format(w.name, f"jnp.max({v.name}, axis={_axis_text(_axes(draw, v))}, keepdims=True)")
        kind = "max"
    else:
        expr = how.format(w.name, expr)
    return f"keepdims broadcast ({kind})", expr, v.shape


def meeting_reduction(draw, pool):
    """Two values of one shape (two arguments, where their layouts differ: ``x: P('i', 'j')``, ``y: P(('k', 'i'))``)
    meeting through a reduction of one kept as size-1 axes: ``y - jnp.sum(x, axis=1, keepdims=True)``."""
    pairs = [(a, b) for a in pool for b in pool if a is not b and a.shape == b.shape and a.shape]
    if not pairs:
        return None
    v, w = draw(st.sampled_from(pairs))
    kind, expr, _ = _reduction_of(draw, v, keep=True, kinds=("sum", "mean", "max", "min"))
    how = draw(st.sampled_from(["({} + {})", "({} - {})", "({} * {})"]))
    return f"meeting through a keepdims reduction ({kind})", how.format(w.name, expr), v.shape


def extreme_of_combination(draw, pool):
    """The maximum or minimum of values each computed from several others — their gradient averages over the
    elements attaining it, which must be found as the reduction found them: ``jnp.min(x + x.mean(0, keepdims=True),
    axis=0)``, the maximum over a pad's rows (the pad's value may win, and tie)."""
    v = _pick(draw, pool)
    if v is None:
        return None
    k = draw(st.integers(0, len(v.shape) - 1))
    how = draw(st.sampled_from(["mean", "pad", "affine"]))
    if how == "mean":
        inner, shape = f"({v.name} + jnp.mean({v.name}, axis={draw(st.integers(0, len(v.shape) - 1))}, " \
                       f"keepdims=True))", v.shape
    elif how == "pad":
        lo, hi = draw(st.integers(0, 3)), draw(st.integers(1, 4))
        widths = tuple((lo, hi) if d == k else (0, 0) for d in range(len(v.shape)))
        inner = f"jnp.pad({v.name}, {widths}, constant_values={draw(st.sampled_from([0.0, 1.0, 5.0]))})"
        shape = v.shape[:k] + (v.shape[k] + lo + hi,) + v.shape[k + 1:]
    else:
        inner, shape = f"({v.name} * 0.75 + jnp.sin({v.name}))", v.shape
    kind = draw(st.sampled_from(EXTREMES))
    keep = draw(st.booleans())
    return f"extreme of a combination ({how})", f"jnp.{kind}({inner}, axis={k}, keepdims={keep})", _reduced(
        Value("", shape), (k,), keep)


def compared_with_itself(draw, pool):
    """A combined value compared with its own extreme, the expression written out twice as users write it:
    ``jnp.where(m + x <= jnp.min(m + x, axis=0, keepdims=True), x, 0.0)`` (one node, as ``jax.jit`` computes it once:
    two would be held in two kernels with two roundings)."""
    v = _pick(draw, pool)
    if v is None:
        return None
    k = draw(st.integers(0, len(v.shape) - 1))
    inner = draw(st.sampled_from([f"({v.name} + jnp.mean({v.name}, axis={k}, keepdims=True))",
                                  f"({v.name} * 0.75 + jnp.sin({v.name}))"]))
    kind = draw(st.sampled_from(EXTREMES))
    test = "<=" if kind == "min" else ">="
    return (f"compared with its own extreme ({kind})",
            f"jnp.where({inner} {test} jnp.{kind}({inner}, axis={k}, keepdims=True), {v.name}, 0.0)", v.shape)


def window_over_slice(draw, pool):
    """A pooling window (a sum or a maximum, SAME padding, stride 1 or 2) along one axis of a slice: a block reads its
    neighbours' rows (a halo) of rows laid out in ranges."""
    v = _pick(draw, pool)
    cut = None if v is None else _slice_text(draw, v.shape)
    if cut is None:
        return None
    index, shape = cut
    k = draw(st.integers(0, len(shape) - 1))
    width, stride = draw(st.sampled_from([2, 3])), draw(st.sampled_from([1, 1, 2]))
    dims = tuple(width if d == k else 1 for d in range(len(shape)))
    strides = tuple(stride if d == k else 1 for d in range(len(shape)))
    kind, init = draw(st.sampled_from([("add", "0.0"), ("max", "-jnp.inf")]))
    out = shape[:k] + (-(-shape[k] // stride),) + shape[k + 1:]
    return (f"window over a slice ({kind})",
            f"lax.reduce_window({v.name}[{index}], {init}, lax.{kind}, {dims}, {strides}, 'SAME')", out)


def over_its_norm(draw, pool):
    """A value over the sum of its squares along an axis, as a user normalizes rows: where the axis is laid out in
    ranges or uneven blocks, the padding rows are ``0 / 0`` (NaN), which nothing downstream — a broadcast's
    derivative, a window, a product — may let into a real row."""
    v = _pick(draw, pool)
    if v is None:
        return None
    k = draw(st.integers(0, len(v.shape) - 1))
    return "over its norm", f"({v.name} / jnp.sum({v.name} * {v.name}, axis={k}, keepdims=True))", v.shape


def elementwise(draw, pool):
    a, b = _pick(draw, pool, 0), draw(st.sampled_from(pool))
    shape = _broadcast(a.shape, b.shape)
    if shape is None:
        return None
    how = draw(st.sampled_from(["({} + {})", "({} - {})", "({} * {})", "jnp.maximum({}, {})", "jnp.minimum({}, {})",
                                "jnp.where({0} > {1}, {0}, {1})"]))
    return "elementwise", how.format(a.name, b.name), shape


def unary(draw, pool):
    v = _pick(draw, pool, 0)
    how = draw(st.sampled_from(["jnp.tanh({})", "jnp.sin({})", "jnp.abs({})", "({} * 0.5)", "jnp.square({})"]))
    return "unary", how.format(v.name), v.shape


def reshape(draw, pool):
    """Two adjacent axes merged into one, or one split into two: sharded axes regrouped."""
    v = _pick(draw, pool)
    if v is None:
        return None
    shape = reshaped(draw, v.shape, max_rank=4)
    return None if shape is None else ("reshape", f"{v.name}.reshape({shape})", shape)


def slice_(draw, pool):
    v = _pick(draw, pool)
    if v is None:
        return None
    cut = _slice_text(draw, v.shape)
    if cut is None:
        return None
    index, shape = cut
    return "slice", f"{v.name}[{index}]", shape


def pad(draw, pool):
    v = _pick(draw, pool)
    if v is None:
        return None
    k = draw(st.integers(0, len(v.shape) - 1))
    lo, hi = draw(st.integers(0, 4)), draw(st.integers(0, 4))
    widths = tuple((lo, hi) if d == k else (0, 0) for d in range(len(v.shape)))
    mode = draw(st.sampled_from(["constant", "constant", "edge"]))
    value = draw(st.sampled_from([0.0, 1.0, -2.0]))
    extra = f", constant_values={value}" if mode == "constant" else ", mode='edge'"
    return f"pad ({mode})", f"jnp.pad({v.name}, {widths}{extra})", v.shape[:k] + (v.shape[k] + lo + hi,) + v.shape[
        k + 1:]


def empty_piece(draw, pool):
    """A value through an empty one along an axis (a slice of nothing joined to it, a sum over one added, a split's
    empty pieces): the value is whole, its gradient passes the empty pieces (an edge pad's does too)."""
    v = _pick(draw, pool)
    if v is None:
        return None
    k = draw(st.integers(0, len(v.shape) - 1))
    at = draw(st.integers(0, v.shape[k]))
    nothing = ", ".join([":"] * k + [f"{at}:{at}"])
    how = draw(st.sampled_from([f"jnp.concatenate([{v.name}[{nothing}], {v.name}], axis={k})",
                                f"({v.name} + jnp.sum({v.name}[{nothing}], axis={k}, keepdims=True))",
                                f"jnp.split({v.name}, [0, {v.shape[k]}], axis={k})[1]"]))
    return "through an empty piece", how, v.shape


def concatenate(draw, pool):
    a = _pick(draw, pool)
    if a is None:
        return None
    k = draw(st.integers(0, len(a.shape) - 1))
    partners = [b for b in pool if len(b.shape) == len(a.shape) and all(
        x == y for d, (x, y) in enumerate(zip(a.shape, b.shape, strict=True)) if d != k)]
    b = draw(st.sampled_from(partners))
    return "concatenate", f"jnp.concatenate([{a.name}, {b.name}], axis={k})", a.shape[:k] + (
        a.shape[k] + b.shape[k],) + a.shape[k + 1:]


def transpose(draw, pool):
    v = _pick(draw, pool, 2)
    if v is None:
        return None
    perm = tuple(draw(st.permutations(range(len(v.shape)))))
    return "transpose", f"jnp.transpose({v.name}, {perm})", tuple(v.shape[k] for k in perm)


def matmul(draw, pool):
    """``a @ b`` where ``a``'s last axis meets ``b``'s second-to-last (a matrix) or only axis."""
    a = _pick(draw, pool)
    if a is None:
        return None
    partners = [b for b in pool if b.shape and (len(b.shape) == 1 or len(b.shape) == 2) and
                b.shape[0] == a.shape[-1]]
    if not partners:
        return None
    b = draw(st.sampled_from(partners))
    shape = a.shape[:-1] + b.shape[1:]
    return "matmul", f"({a.name} @ {b.name})", shape


def constraint(mesh_shape: dict[str, int]):
    """A sharding constraint on a value of the pool (compound specs in either order, dividing or not)."""
    def op(draw, pool):
        v = _pick(draw, pool, 0)
        spec = draw(specs_for(v.shape, mesh_shape))
        if spec is None:
            return None
        return "constraint", f"constrain({v.name}, {spec!r})", v.shape
    return op


MOTIFS = (sliced_reduction, meeting_reduction, extreme_of_combination, normalized, compared_with_itself,
          window_over_slice, over_its_norm)
OPS = (*MOTIFS, reduction, reduction, elementwise, unary, reshape, slice_, pad, concatenate, transpose, matmul,
       empty_piece)


@st.composite
def user_programs(draw, mesh_shape: dict[str, int], max_ops: int = 5) -> Program:
    """A random program of ``OPS`` and sharding constraints on ``mesh_shape``'s axes, over 1 to 3 float32 inputs of
    one shape, of that shape with some axes 1 (as ``keepdims`` leaves them), or of another."""
    ops = (*OPS, constraint(mesh_shape))
    rank = draw(st.sampled_from([2, 3, 1]))
    base = tuple(draw(st.sampled_from(SIZES)) for _ in range(rank))
    inputs = []
    for i in range(draw(st.sampled_from([2, 1, 2, 3]))):
        choice = draw(st.sampled_from(["same", "same", "kept", "other"])) if i else "same"
        if choice == "same":
            shape = base
        elif choice == "kept":
            shape = tuple(1 if draw(st.booleans()) else n for n in base)
        else:
            shape = tuple(draw(st.sampled_from(SIZES)) for _ in range(draw(st.integers(1, 3))))
        inputs.append(Value(f"x{i}", shape))
    pool, lines, kinds = list(inputs), [], []
    for step in range(draw(st.integers(1, max_ops))):
        made = draw(st.sampled_from(MOTIFS if step == 0 and draw(st.booleans()) else ops))(draw, pool)
        if made is None or math.prod(made[2]) > MAX_ELEMENTS or len(made[2]) > 4 or 0 in made[2]:
            continue
        kind, expr, shape = made
        lines.append(f"v{step} = {expr}")
        kinds.append(kind)
        pool.append(Value(f"v{step}", tuple(shape)))
    computed = [v.name for v in pool[len(inputs):]] or [inputs[0].name]
    # the newest value (the whole chain feeds it), and perhaps another
    outputs = tuple(dict.fromkeys([computed[-1], *draw(st.lists(st.sampled_from(computed), max_size=1))]))
    return Program(tuple(inputs), tuple(lines), outputs, tuple(kinds), tuple(pool))
