"""Random well-typed jax.numpy programs for differential fuzzing (see tests/test_fuzz.py).

A program is plain source code (so a failure prints as a reproducer): ``def f(x0, x1): ...`` built from
elementwise ops with broadcasting, reductions (``any``/``all`` of comparisons too), ``dot_general`` with
random dimension numbers, reshape, transpose, slice, pad (negative widths, interior padding and values too), roll,
concatenate,
cumulative ops, windowed reductions, 1-D convolutions, reads and writes at an offset, flips, select, iota, gather
and scatter, over float32 values whose shapes are tracked as the program grows — and, given a mesh, sharding constraints
(``constrain(v, P(...))``: ``jax.lax.with_sharding_constraint`` on the program's mesh; the unsharded reference
runs without them, as JAX refuses a constraint that does not divide even unsharded).
Shapes mix sizes that the meshes divide and sizes they do not.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from tests.fuzz_specs import specs_for

SIZES = (1, 2, 3, 4, 6, 8, 12, 16)
MAX_ELEMENTS = 4096


@dataclass(frozen=True)
class Value:
    name: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Program:
    inputs: tuple[Value, ...]
    lines: tuple[str, ...]
    outputs: tuple[str, ...]
    ops: tuple[str, ...]  # the op kinds used, for statistics

    values: tuple[Value, ...] = ()  # every value: the inputs and each one computed

    @property
    def source(self) -> str:
        args = ", ".join(v.name for v in self.inputs)
        body = "\n".join(f"    {line}" for line in self.lines)
        return f"def f({args}):\n{body}\n    return ({', '.join(self.outputs)},)\n"


def _broadcast(a, b):
    if len(a) < len(b):
        a, b = b, a
    b = (1,) * (len(a) - len(b)) + b
    out = []
    for x, y in zip(a, b, strict=True):
        if x != y and 1 not in (x, y):
            return None
        out.append(max(x, y))
    return tuple(out)


# Each op takes (draw, pool) and returns (kind, expression, shape), or None when it does not apply.
def unary(draw, pool):
    v = draw(st.sampled_from(pool))
    fn = draw(st.sampled_from(["jnp.tanh({})", "jnp.sin({})", "jnp.abs({})", "-{}", "({} * 0.5)", "jnp.cos({})"]))
    return "elementwise", fn.format(v.name), v.shape


def binary(draw, pool):
    a, b = draw(st.sampled_from(pool)), draw(st.sampled_from(pool))
    shape = _broadcast(a.shape, b.shape)
    if shape is None:
        return None
    fn = draw(st.sampled_from(["({} + {})", "({} - {})", "({} * {})", "jnp.maximum({}, {})", "jnp.minimum({}, {})"]))
    return "broadcasting", fn.format(a.name, b.name), shape


def meet(draw, pool):
    """Two arguments of one shape combined elementwise: where their layouts differ, a sharding conflict."""
    inputs = [v for v in pool if v.name.startswith("x")]
    pairs = [(a, b) for a in inputs for b in inputs if a.name < b.name and a.shape == b.shape]
    if not pairs:
        return None
    a, b = draw(st.sampled_from(pairs))
    return "meet", f"({a.name} * {b.name})", a.shape


def select(draw, pool):
    a, b = draw(st.sampled_from(pool)), draw(st.sampled_from(pool))
    shape = _broadcast(a.shape, b.shape)
    if shape is None:
        return None
    return "select", f"jnp.where({a.name} > 0.1, {a.name}, {b.name})", shape


def reduce(draw, pool):
    v = draw(st.sampled_from([v for v in pool if v.shape] or pool))
    if not v.shape:
        return None
    axis = draw(st.integers(0, len(v.shape) - 1))
    kind = draw(st.sampled_from(["sum", "max", "min", "mean", "argmax", "any", "all", "prod"]))
    keep = draw(st.booleans())
    if kind in ("any", "all"):  # over bools: reduce_or / reduce_and
        shape = v.shape[:axis] + ((1,) if keep else ()) + v.shape[axis + 1:]
        return ("reduction", f"jnp.{kind}({v.name} > 0.25, axis={axis}, keepdims={keep}).astype(jnp.float32)",
                shape)
    if kind == "argmax":
        shape = v.shape[:axis] + v.shape[axis + 1:]
        return "argmax", f"jnp.argmax({v.name}, axis={axis}).astype(jnp.float32)", shape
    shape = v.shape[:axis] + ((1,) if keep else ()) + v.shape[axis + 1:]
    operand = f"1.0 + 0.05 * jnp.tanh({v.name})" if kind == "prod" else v.name  # bounded: a product stays finite
    return "reduction", f"jnp.{kind}({operand}, axis={axis}, keepdims={keep})", shape


def dot(draw, pool):
    a, b = draw(st.sampled_from(pool)), draw(st.sampled_from(pool))
    pairs = [(i, j) for i in range(len(a.shape)) for j in range(len(b.shape)) if a.shape[i] == b.shape[j]]
    if not pairs:
        return None
    contract = draw(st.sampled_from(pairs))
    rest = [(i, j) for i, j in pairs if i != contract[0] and j != contract[1]]
    batch = [draw(st.sampled_from(rest))] if rest and draw(st.booleans()) else []
    free_a = [i for i in range(len(a.shape)) if i != contract[0] and all(i != p for p, _ in batch)]
    free_b = [j for j in range(len(b.shape)) if j != contract[1] and all(j != q for _, q in batch)]
    shape = tuple(a.shape[i] for i, _ in batch) + tuple(a.shape[i] for i in free_a) + tuple(b.shape[j] for j in free_b)
    dims = f"((({contract[0]},), ({contract[1]},)), ({tuple(i for i, _ in batch)}, {tuple(j for _, j in batch)}))"
    return "dot_general", f"lax.dot_general({a.name}, {b.name}, {dims})", shape


def reshaped(draw, shape, max_rank: int = 99) -> tuple | None:
    """``shape`` with two neighbouring axes merged, or one axis split in two (None when none splits into at most
    ``max_rank`` axes)."""
    shape = list(shape)
    if len(shape) >= 2 and draw(st.booleans()):
        k = draw(st.integers(0, len(shape) - 2))
        shape[k:k + 2] = [shape[k] * shape[k + 1]]
    else:
        splittable = [k for k, n in enumerate(shape) if any(n % p == 0 and n > p for p in (2, 3, 4))]
        if not splittable or len(shape) >= max_rank:
            return None
        k = draw(st.sampled_from(splittable))
        p = draw(st.sampled_from([p for p in (2, 3, 4) if shape[k] % p == 0 and shape[k] > p]))
        shape[k:k + 1] = [p, shape[k] // p]
    return tuple(shape)


def reshape(draw, pool):
    v = draw(st.sampled_from(pool))
    shape = reshaped(draw, v.shape)
    return None if shape is None else ("reshape", f"{v.name}.reshape({shape})", shape)


def transpose(draw, pool):
    v = draw(st.sampled_from(pool))
    if len(v.shape) < 2:
        return None
    perm = tuple(draw(st.permutations(range(len(v.shape)))))
    return "transpose", f"jnp.transpose({v.name}, {perm})", tuple(v.shape[k] for k in perm)


def slice_(draw, pool):
    v = draw(st.sampled_from(pool))
    axes = [k for k, n in enumerate(v.shape) if n >= 2]
    if not axes:
        return None
    k = draw(st.sampled_from(axes))
    lo = draw(st.integers(0, v.shape[k] - 1))
    hi = draw(st.integers(lo + 1, v.shape[k]))
    stride = draw(st.sampled_from([1, 1, 2, 3, 4, 5, 7, 9, 16]))  # (those across blocks: picked and routed)
    if stride > 1 and draw(st.booleans()):  # every s-th element of the whole axis, from one of the first s
        lo, hi = draw(st.integers(0, stride - 1)), v.shape[k]
        if lo >= hi:
            return None
    shape = v.shape[:k] + (-(-(hi - lo) // stride),) + v.shape[k + 1:]
    return "slice", f"lax.slice_in_dim({v.name}, {lo}, {hi}, {stride}, axis={k})", shape


def flip(draw, pool):
    v = draw(st.sampled_from(pool))
    if not v.shape:
        return None
    axes = tuple(sorted(set(draw(st.lists(st.integers(0, len(v.shape) - 1), min_size=1, max_size=2)))))
    return "rev", f"jnp.flip({v.name}, {axes})", v.shape


def pad(draw, pool):
    v = draw(st.sampled_from(pool))
    if not v.shape:
        return None
    k = draw(st.integers(0, len(v.shape) - 1))
    lo, hi = draw(st.integers(-1, 5)), draw(st.integers(-1, 5))
    interior = draw(st.sampled_from([0, 0, 0, 1, 2]))  # a strided window's or slice's gradient spreads its operand
    size = v.shape[k] + lo + hi + max(v.shape[k] - 1, 0) * interior
    if size < 1:
        return None
    value = draw(st.sampled_from([0.0, 0.0, 1.5, -2.0]))
    config = tuple((lo, hi, interior) if d == k else (0, 0, 0) for d in range(len(v.shape)))  # negative: cut
    shape = v.shape[:k] + (size,) + v.shape[k + 1:]
    return "pad", f"lax.pad({v.name}, jnp.asarray({value}, {v.name}.dtype), {config})", shape


def roll(draw, pool):
    """``jnp.roll`` along a random axis (two slices joined), by any shift."""
    v = draw(st.sampled_from(pool))
    if not v.shape:
        return None
    k = draw(st.integers(0, len(v.shape) - 1))
    shift = draw(st.integers(-2 * v.shape[k], 2 * v.shape[k]))
    return "roll", f"jnp.roll({v.name}, {shift}, axis={k})", v.shape


def concatenate(draw, pool):
    a, b = draw(st.sampled_from(pool)), draw(st.sampled_from(pool))
    if not a.shape or len(a.shape) != len(b.shape):
        return None
    axes = [k for k in range(len(a.shape)) if a.shape[:k] + a.shape[k + 1:] == b.shape[:k] + b.shape[k + 1:]]
    if not axes:
        return None
    k = draw(st.sampled_from(axes))
    shape = a.shape[:k] + (a.shape[k] + b.shape[k],) + a.shape[k + 1:]
    empty = f"lax.slice_in_dim({a.name}, 0, 0, axis={k}), " if draw(st.integers(0, 4)) == 0 else ""  # (jnp.pad's
    # edge mode joins such)
    return "concatenate", f"jnp.concatenate([{empty}{a.name}, {b.name}], axis={k})", shape


def cumsum(draw, pool):
    """A cumulative op (reversed too) along a random axis: scanned block by block where the axis is sharded."""
    v = draw(st.sampled_from(pool))
    if not v.shape:
        return None
    k = draw(st.integers(0, len(v.shape) - 1))
    op = draw(st.sampled_from(["cumsum", "cummax", "cummin", "cumlogsumexp", "cumprod"]))
    reverse = draw(st.booleans())
    operand = f"jnp.tanh({v.name})" if op == "cumprod" else v.name  # bounded: a product of 16 stays finite
    return op, f"lax.{op}({operand}, axis={k}, reverse={reverse})", v.shape


def window(draw, pool):
    """A windowed sum, maximum or minimum along one random axis (any window, stride and padding)."""
    v = draw(st.sampled_from(pool))
    if not v.shape:
        return None
    k = draw(st.integers(0, len(v.shape) - 1))
    n = v.shape[k]
    w, stride = draw(st.integers(1, 5)), draw(st.integers(1, 3))
    padding = draw(st.sampled_from(["SAME", "VALID", (0, 1), (1, 1), (2, 0)]))
    if padding == "SAME":
        out = -(-n // stride)
    else:
        lo, hi = (0, 0) if padding == "VALID" else padding
        if n + lo + hi < w:
            return None
        out = (n + lo + hi - w) // stride + 1
    op, init = draw(st.sampled_from([("lax.add", "0.0"), ("lax.max", "-jnp.inf"), ("lax.min", "jnp.inf")]))
    dims = tuple(w if d == k else 1 for d in range(len(v.shape)))
    strides = tuple(stride if d == k else 1 for d in range(len(v.shape)))
    pads = repr(padding) if padding in ("SAME", "VALID") else repr(tuple(padding if d == k else (0, 0)
                                                                         for d in range(len(v.shape))))
    shape = v.shape[:k] + (out,) + v.shape[k + 1:]
    return "reduce_window", f"lax.reduce_window({v.name}, {init}, {op}, {dims}, {strides}, {pads})", shape


def conv(draw, pool):
    """A 1-D convolution (NHC, a constant kernel) of a rank-3 value along its axis 1: SAME or VALID, strided or
    dilated."""
    v = draw(st.sampled_from(pool))
    if len(v.shape) != 3:
        return None
    n, c = v.shape[1], v.shape[2]
    w, stride, dilation = draw(st.integers(1, 4)), draw(st.integers(1, 2)), draw(st.integers(1, 2))
    padding = draw(st.sampled_from(["SAME", "VALID"]))
    extent = (w - 1) * dilation + 1
    if padding == "VALID" and n < extent:
        return None
    out = -(-n // stride) if padding == "SAME" else (n - extent) // stride + 1
    kernel = f"(np.arange({w * c * c}, dtype=np.float32).reshape({w}, {c}, {c}) % 5 - 2) * 0.25"
    expr = (f"lax.conv_general_dilated({v.name}, {kernel}, ({stride},), {padding!r}, rhs_dilation=({dilation},), "
            f"dimension_numbers=('NHC', 'HIO', 'NHC'))")
    return "conv", expr, (v.shape[0], out, c)


def at_offset(draw, pool):
    """A read (``dynamic_slice``) or a write (``dynamic_update_slice``) at an offset along a random axis, the offset
    out of range too (clamped)."""
    v = draw(st.sampled_from(pool))
    if not v.shape:
        return None
    k = draw(st.integers(0, len(v.shape) - 1))
    n = v.shape[k]
    size = draw(st.integers(1, n))
    start = draw(st.integers(-2, n + 1))
    if draw(st.booleans()):
        shape = v.shape[:k] + (size,) + v.shape[k + 1:]
        return "dynamic_slice", f"lax.dynamic_slice_in_dim({v.name}, {start}, {size}, axis={k})", shape
    update = v.shape[:k] + (size,) + v.shape[k + 1:]
    return ("dynamic_update_slice",
            f"lax.dynamic_update_slice_in_dim({v.name}, jnp.full({update}, 1.5, jnp.float32), {start}, axis={k})",
            v.shape)


def iota(draw, pool):
    v = draw(st.sampled_from(pool))
    if not v.shape:
        return None
    k = draw(st.integers(0, len(v.shape) - 1))
    return "iota", f"({v.name} + lax.broadcasted_iota(jnp.float32, {v.shape}, {k}))", v.shape


def gather(draw, pool):
    v = draw(st.sampled_from(pool))
    if not v.shape:
        return None
    k = draw(st.integers(0, len(v.shape) - 1))
    # Out-of-bounds indices too: "fill" gives NaN there, "clip" the nearest element (a sharded axis is looked up
    # per block and summed, where each must come out exactly as the unsharded gather gives it).
    mode = draw(st.sampled_from(["fill", "clip"]))
    idx = draw(st.lists(st.integers(-v.shape[k] - 2, v.shape[k] + 1), min_size=1, max_size=6))
    shape = v.shape[:k] + (len(idx),) + v.shape[k + 1:]
    return "gather", f"jnp.take({v.name}, np.array({idx}), axis={k}, mode={mode!r})", shape


def scatter(draw, pool):
    """``x.at[..., idx, ...].op(c)`` along a random axis (sharded or not), out-of-bounds indices included."""
    v = draw(st.sampled_from(pool))
    if not v.shape:
        return None
    k = draw(st.integers(0, len(v.shape) - 1))
    idx = draw(st.lists(st.integers(-v.shape[k] - 2, v.shape[k] + 1), min_size=1, max_size=5))
    method = draw(st.sampled_from(["add", "set", "max", "mul"]))
    mode = draw(st.sampled_from(["clip", "drop"]))
    where = ":, " * k + f"np.array({idx})"
    return "scatter", f"{v.name}.at[{where}].{method}(1.5, mode={mode!r})", v.shape


OPS = [unary, binary, meet, select, reduce, dot, reshape, transpose, slice_, pad, roll, concatenate, cumsum, iota,
       gather, scatter, window, conv, at_offset, flip]


BODY_OPS = tuple(op for op in OPS if op is not meet)


def loop(draw, pool, body_ops=BODY_OPS):
    """A ``fori_loop`` (a scan), a ``while_loop`` (a counter, or a condition on the data) or a ``cond`` whose body is
    drawn from ``body_ops`` (the same ops; sharding constraints too when the program has a mesh), over a carry ``c``
    and closing over the values computed so far. Returns a fourth item: the lines defining the body, placed before
    the line that uses it."""
    v = draw(st.sampled_from(pool))
    tag = len(pool)
    body_pool = [Value("c", v.shape)] + [p for p in pool if p is not v]
    body = [f"def body{tag}(c):"]
    made_here = []
    for k in range(draw(st.integers(1, 3))):
        made = draw(st.sampled_from(body_ops))(draw, body_pool)
        if made is None or math.prod(made[2]) > MAX_ELEMENTS or len(made[2]) > 4:
            continue
        name = f"w{tag}_{k}"
        body.append(f"    {name} = {made[1]}")
        made_here.append(Value(name, tuple(made[2])))
        body_pool.append(made_here[-1])
    # a result the carry's shape, or one that broadcasts to it (added to the carry)
    # or one summed over its last axis into the carry's shape (a reduction finished inside the body: of a value
    # closed over, possibly ranged; the carry then takes its layout)
    results = [w for w in made_here if _broadcast(w.shape, v.shape) == v.shape or w.shape[:-1] == v.shape]
    if not results:
        return None
    w = draw(st.sampled_from(results))
    # tanh keeps repeated bodies bounded (an unbounded carry would overflow where the reference does too)
    if w.shape == v.shape:
        body.append(f"    return jnp.tanh({w.name})")
    elif w.shape[:-1] == v.shape:
        body.append(f"    return jnp.tanh(jnp.sum({w.name}, axis=-1) * 0.25)")
    else:
        body.append(f"    return jnp.tanh(c + {w.name})")
    kind = draw(st.sampled_from(["fori", "while", "while on data", "cond"]))
    expr = {
        "fori": f"lax.fori_loop(0, 3, lambda i, c: body{tag}(c), {v.name})",
        "while": f"lax.while_loop(lambda t: t[0] < 2, lambda t: (t[0] + 1, body{tag}(t[1])), (0, {v.name}))[1]",
        # max is exact, so the sharded program takes the reference's number of iterations
        "while on data": f"lax.while_loop(lambda t: (t[0] < 3) & (jnp.max(t[1]) > -0.5), "
                         f"lambda t: (t[0] + 1, body{tag}(t[1])), (0, {v.name}))[1]",
        "cond": f"lax.cond(jnp.max({v.name}) > 0.1, body{tag}, lambda c: c * 0.5, {v.name})",
    }[kind]
    constrained = any(line.lstrip().split(" = ", 1)[-1].startswith("constrain(") for line in body)
    return kind + (" with a constraint inside" if constrained else ""), expr, v.shape, body


def constraint(mesh_shape: dict[str, int]):
    """A sharding constraint on a value of the pool, with a random spec over ``mesh_shape``'s axes."""
    def op(draw, pool):
        v = draw(st.sampled_from(pool))
        spec = draw(specs_for(v.shape, mesh_shape))
        if spec is None:
            return None
        return "constraint", f"constrain({v.name}, {spec!r})", v.shape
    return op


@st.composite
def programs(draw, max_ops: int = 6, mesh_shape: dict[str, int] | None = None) -> Program:
    """A random program; with ``mesh_shape``, sharding constraints on that mesh among its ops."""
    if mesh_shape is None:
        ops = [*OPS, loop, loop]
    else:
        constrain = constraint(mesh_shape)
        looping = functools.partial(loop, body_ops=(*BODY_OPS, constrain))  # constraints inside bodies too
        ops = [*OPS, looping, looping, constrain, constrain]
    n_inputs = draw(st.integers(1, 3))
    rank = draw(st.integers(1, 3))
    base = tuple(draw(st.sampled_from(SIZES)) for _ in range(rank))
    inputs = []
    for i in range(n_inputs):
        # Mostly the same shape (so ops combine), sometimes a broadcastable or different one.
        choice = draw(st.sampled_from(["same", "same", "other", "reduced"]))
        if choice == "same" or i == 0:
            shape = base
        elif choice == "reduced":
            shape = tuple(1 if draw(st.booleans()) else n for n in base)
        else:
            shape = tuple(draw(st.sampled_from(SIZES)) for _ in range(draw(st.integers(1, 3))))
        inputs.append(Value(f"x{i}", shape))
    pool = list(inputs)
    lines, kinds = [], []
    for step in range(draw(st.integers(1, max_ops))):
        op = draw(st.sampled_from(ops))
        made = op(draw, pool)
        if made is None:
            continue
        kind, expr, shape, *prelude = made
        if math.prod(shape) > MAX_ELEMENTS or len(shape) > 4:
            continue
        name = f"v{step}"
        lines.extend(prelude[0] if prelude else [])
        lines.append(f"{name} = {expr}")
        kinds.append(kind)
        pool.append(Value(name, tuple(shape)))
    computed = [v.name for v in pool[n_inputs:]] or [inputs[0].name]
    outputs = tuple(draw(st.lists(st.sampled_from(computed), min_size=1, max_size=2, unique=True)))
    return Program(tuple(inputs), tuple(lines), outputs, tuple(kinds), tuple(pool))


def random_inputs(program: Program, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(size=v.shape).astype(np.float32) for v in program.inputs]
