"""Reading JAX's programs: a function as a jaxpr, its equations, the calls to inline, literals, sub-computations
without their sharding constraints, binding a primitive, and the primitives the installed JAX defines."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.extend import core as jex_core



from .sources import sources_of_traceback
from .values import aval_of
from .versions import EVAL_JAXPR_BODY, bind_params, read_params

Primitive = jex_core.Primitive

# Primitives that are calls of a sub-jaxpr: their body is inlined into our graph, so sharding rules see the
# ops inside (a `jnp.where` is a `jit` around `select_n`, `relu` is a `custom_jvp_call`, `jax.checkpoint` is a
# `remat2`). Only the forward computation matters here: custom derivatives were applied before we trace.
CALL_JAXPR_PARAM = {
    "jit": "jaxpr",
    "call": "call_jaxpr",
    "closed_call": "call_jaxpr",
    "custom_jvp_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
    "custom_jvp_call_jaxpr": "fun_jaxpr",
    "custom_vmap_call": "call",
    "linear_call": "callee",
    "remat2": "jaxpr",
    "composite": "jaxpr",
    # jax 0.12: calls that only order their body's equations (jax.experimental.overlap) or attach XLA metadata
    "program_order": "call_jaxpr",
    "xla_metadata_call": "jaxpr",
    # jax 0.12 folds ``call`` and ``closed_call`` into ``eval_jaxpr`` (``core.closed_call_p is eval_jaxpr_p``)
    "eval_jaxpr": EVAL_JAXPR_BODY,
}
# ``custom_linear_solve`` (``jnp.linalg.solve``) computes ``solve(*solve_consts, *b)``: its forward is the
# ``solve`` jaxpr applied to its own constants and the right-hand side.
LINEAR_SOLVE = "custom_linear_solve"
# jax >= 0.12.1 binds some jax.numpy functions as one "high-level" primitive (``jnp.searchsorted``'s SearchSorted):
# its body is its expansion into ordinary primitives (``to_lojax``), which may differ in derivative (its own rules)
HI_PRIMITIVE = "call_hi_primitive"
INLINED_CALLS = frozenset(CALL_JAXPR_PARAM) | {LINEAR_SOLVE, HI_PRIMITIVE}
# Calls whose derivative is not that of their body (relu's is 0 at 0, a user's clipped or numerically safe
# gradients, solve's transpose): a program that inlined one must be differentiated as the user's function is.
CUSTOM_JVP_CALLS = frozenset({"custom_jvp_call", "custom_jvp_call_jaxpr", LINEAR_SOLVE})
CUSTOM_VJP_CALLS = frozenset({"custom_vjp_call", HI_PRIMITIVE})
# ``platform_index`` picks a branch of the ``cond`` that follows it by the platform the program is lowered for
# (``jnp.linalg.det``, ``jnp.diag``, ``jax.nn.initializers.orthogonal``): the tracer folds it to a constant,
# and a ``cond`` whose index is a constant is inlined as that branch.
PLATFORM_INDEX = "platform_index"
FOLDED_AT_TRACE = frozenset({PLATFORM_INDEX})
# Integer scalar arithmetic on constants is folded too, so that ``lax.switch(1, ...)``'s clamped index is known.
FOLDABLE_INDEX_ARITHMETIC = frozenset({"clamp", "convert_element_type", "add", "sub", "mul", "max", "min", "rem",
                                       "div", "neg"})


@dataclass(frozen=True, slots=True)
class Equation:
    """One primitive application. ``invars``/``outvars`` are opaque variable handles: read them with
    ``is_literal``, ``literal_value``, ``aval_of``, ``is_drop_var``."""

    primitive: Primitive
    invars: tuple[Any, ...]
    outvars: tuple[Any, ...]
    params: Any
    source: str | None
    caller: str | None = None  # the user's own line that called into the library ``source`` is in, if it is


@dataclass(frozen=True, slots=True)
class Body:
    """A jaxpr's interface and equations: ``consts`` pairs each constvar with its value."""

    invars: list
    consts: list
    outvars: list
    equations: Iterator[Equation]


def make_jaxpr(flat_fun: Callable, avals: Sequence[jax.ShapeDtypeStruct]):
    """Trace ``flat_fun`` (flat positional arrays in, flat list out) into a closed jaxpr, without the equations
    whose results nothing uses (``jax.grad`` leaves the forward loss in; ``jax.jit`` drops such code, so the cost
    model must not count it). Effectful equations (callbacks, prints) stay."""
    from jax._src.interpreters import partial_eval as pe

    closed = jax.make_jaxpr(flat_fun)(*avals)
    jaxpr, _ = pe.dce_jaxpr(closed.jaxpr, [True] * len(closed.jaxpr.outvars), instantiate=True)
    return closed.replace(jaxpr=jaxpr)


def constraint_equation(shape: tuple[int, ...], dtype, sharding) -> tuple[Primitive, dict]:
    """The primitive and params of ``jax.lax.with_sharding_constraint(x, sharding)`` for an ``x`` of ``shape`` and
    ``dtype``, as a trace of it records them (run under the program's mesh context)."""
    closed = jax.make_jaxpr(lambda x: jax.lax.with_sharding_constraint(x, sharding))(
        jax.ShapeDtypeStruct(tuple(shape), dtype))
    (equation,) = closed.jaxpr.eqns
    return equation.primitive, dict(equation.params)


def closed_body(closed_jaxpr) -> Body:
    """The top level of a closed jaxpr."""
    jaxpr = closed_jaxpr.jaxpr
    return _body(jaxpr, list(closed_jaxpr.consts))


def call_body(equation: Equation) -> tuple[Body, tuple[int, ...]] | None:
    """If ``equation`` is a call to inline (nested jit, custom_jvp/vjp, checkpoint, ...): its body and which of
    the equation's operands feed the body's inputs, in order; else None."""
    name = equation.primitive.name
    if name == LINEAR_SOLVE:
        lengths = equation.params["const_lengths"]
        start = lengths.matvec + lengths.vecmat
        feeding = (*range(start, start + lengths.solve), *range(sum(lengths), len(equation.invars)))
        body = _as_body(equation.params["jaxprs"].solve)
    elif name == HI_PRIMITIVE:
        feeding = tuple(range(len(equation.invars)))
        body = _as_body(_expanded(equation))
    else:
        param = CALL_JAXPR_PARAM.get(name)
        if param is None or param not in equation.params:
            return None
        feeding = tuple(range(len(equation.invars)))
        body = _as_body(equation.params[param])
    if body is None or len(body.invars) != len(feeding) or len(body.outvars) != len(equation.outvars):
        return None  # not the shape of call we know how to inline: leave it a primitive
    return body, feeding


def _expanded(equation: Equation):
    """A high-level primitive's expansion into ordinary ones, traced on its operands' types."""
    avals = [jax.ShapeDtypeStruct(*aval_of(v)) for v in equation.invars]
    to_lojax, params = equation.primitive.to_lojax, dict(equation.params)
    return jax.make_jaxpr(lambda *args: to_lojax(*args, **params))(*avals)


def static_platform_index(equation: Equation) -> int:
    """The branch ``platform_index`` selects on this process's default backend (``cpu``; ``gpu`` matches
    ``cuda`` and ``rocm``): the first branch naming the platform, else the default (None) branch."""
    backend = jax.default_backend()
    names = {backend} | ({"cuda", "rocm"} if backend == "gpu" else set())
    default = None
    for index, platforms in enumerate(equation.params["platforms"]):
        if platforms is None:
            default = index
        elif names.intersection(platforms):
            return index
    if default is None:
        raise ValueError(f"platform_index has no branch for platform {backend!r}")
    return default


def cond_branch(equation: Equation, index: int) -> tuple[Body, tuple[int, ...]]:
    """The body of branch ``index`` (clamped, as ``lax.switch`` does) of a ``cond`` and the operands that
    feed it (all but the index)."""
    branches = equation.params["branches"]
    body = _as_body(branches[min(max(index, 0), len(branches) - 1)])
    return body, tuple(range(1, len(equation.invars)))


# A ``dynamic_slice`` whose starts are all constants (``lax.dynamic_slice_in_dim(x, 3, 16)``) is the static slice it
# names: traced as one, so that it keeps a sharded axis as ranges as ``x[3:19]`` does.
STATIC_WHEN_CONSTANT = "dynamic_slice"


def as_static_slice(equation: Equation, starts: Sequence[int]) -> tuple[Primitive, dict]:
    """``(primitive, params)`` of the static ``slice`` a ``dynamic_slice`` with constant ``starts`` is, each start
    clamped into its axis as ``lax.dynamic_slice`` clamps it."""
    shape, _ = aval_of(equation.invars[0])
    sizes = equation.params["slice_sizes"]
    begin = tuple(min(max(int(s), 0), n - size) for s, n, size in zip(starts, shape, sizes, strict=True))
    limit = tuple(b + size for b, size in zip(begin, sizes, strict=True))
    return jax.lax.slice_p, {"start_indices": begin, "limit_indices": limit, "strides": None}


def _as_body(sub) -> Body | None:
    if isinstance(sub, jex_core.ClosedJaxpr):
        return _body(sub.jaxpr, list(sub.consts))
    if isinstance(sub, jex_core.Jaxpr):
        return _body(sub, [])
    return None


def _body(jaxpr, consts) -> Body:
    equations = (
        Equation(e.primitive, tuple(e.invars), tuple(e.outvars), read_params(e.primitive.name, e.params),
                 *sources_of_traceback(e.source_info.traceback))
        for e in jaxpr.eqns
    )
    return Body(list(jaxpr.invars), list(zip(jaxpr.constvars, consts, strict=True)), list(jaxpr.outvars), equations)


def as_constant(value) -> Any:
    """A constant's value as a numpy array, or as it is when numpy cannot hold it (typed PRNG keys)."""
    try:
        return np.asarray(value)
    except TypeError:
        return value


def is_literal(var) -> bool:
    return isinstance(var, jex_core.Literal)


def is_drop_var(var) -> bool:
    return isinstance(var, jex_core.DropVar)


def literal_value(var) -> Any:
    shape, dtype = aval_of(var)
    if not isinstance(dtype, np.dtype):
        return var.val
    return np.asarray(var.val, dtype=dtype).reshape(shape)


PLACEMENTS = ("sharding_constraint",)


def without_placements(params: dict) -> dict:
    """``params`` with every sub-computation (a scan's body, a cond's branches) rid of sharding constraints:
    bound as it is inside ``shard_map`` (a scan that runs on gathered blocks), a constraint would name mesh axes
    that are manual there, which JAX refuses. Unchanged when there is none."""
    out = dict(params)
    for name, value in params.items():
        if isinstance(value, jex_core.ClosedJaxpr) and _has_placement(value.jaxpr):
            out[name] = _stripped(value)
        elif isinstance(value, tuple) and any(isinstance(v, jex_core.ClosedJaxpr) and _has_placement(v.jaxpr)
                                              for v in value):
            out[name] = tuple(_stripped(v) if isinstance(v, jex_core.ClosedJaxpr) else v for v in value)
    return out


def _has_placement(jaxpr) -> bool:
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in PLACEMENTS:
            return True
        for value in eqn.params.values():
            subs = value if isinstance(value, tuple) else (value,)
            if any(isinstance(v, jex_core.ClosedJaxpr) and _has_placement(v.jaxpr) for v in subs):
                return True
    return False


def _stripped(closed):
    """``closed`` re-traced with its sharding constraints (at any depth) as the identity."""
    jaxpr = closed.jaxpr

    def run(*args):
        env = dict(zip(jaxpr.constvars, closed.consts, strict=True))
        env.update(zip(jaxpr.invars, args, strict=True))
        read = lambda v: v.val if is_literal(v) else env[v]  # noqa: E731
        for eqn in jaxpr.eqns:
            invals = [read(v) for v in eqn.invars]
            outs = invals if eqn.primitive.name in PLACEMENTS else bind(eqn.primitive, invals,
                                                                         without_placements(eqn.params))
            env.update((v, o) for v, o in zip(eqn.outvars, outs, strict=True) if not is_drop_var(v))
        return [read(v) for v in jaxpr.outvars]

    avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype, weak_type=v.aval.weak_type) for v in jaxpr.invars]
    return jax.make_jaxpr(run)(*avals)


def bind(primitive: Primitive, invals: Sequence[Any], params: dict) -> list:
    """Apply ``primitive`` to ``invals`` with an equation's params; always returns a list of outputs."""
    # As jax 0.10.2's own eval_jaxpr does: a call-like primitive (shard_map) keeps its body in the params
    # ("subfuns"), which its bind pops itself.
    out = primitive.bind(*invals, **primitive.get_bind_params(bind_params(primitive.name, params)))
    return list(out) if primitive.multiple_results else [out]


# Modules of kernel languages and accelerator back ends: their primitives never appear in a traced jax.numpy
# program, and importing them can need an accelerator's libraries.
_NOT_SCANNED = ("test_util", "internal_test", "test_loader", "test_multiprocess", "mosaic", "pallas", "triton",
                "tpu_custom", "mlir.dialects", "lib.", "export.serialization",
                "thunky")  # jax 0.12's XLA:GPU thunk-executor language (jax.experimental.thunky)


@functools.cache
def defined_primitives() -> frozenset[str]:
    """The name of every primitive the installed JAX defines (every ``Primitive`` object found in JAX's own
    modules, kernel languages aside): the list a completeness check compares shardprop's records with."""
    import importlib
    import pkgutil
    import warnings

    import jax._src as source

    names = set()
    for info in pkgutil.walk_packages(source.__path__, "jax._src.", onerror=lambda name: None):
        if any(part in info.name for part in _NOT_SCANNED):
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                module = importlib.import_module(info.name)
        except Exception:  # an optional dependency is missing: its primitives cannot be emitted either
            continue
        names.update(v.name for v in vars(module).values() if isinstance(v, Primitive))
    return frozenset(names)


def public_primitives() -> frozenset[str]:
    """The primitives ``jax.lax``, ``jax.lax.linalg`` and ``jax.extend.core.primitives`` export."""
    import jax.extend.core.primitives as extended
    import jax.lax
    import jax.lax.linalg

    return frozenset(v.name for module in (jax.lax, jax.lax.linalg, extended) for v in vars(module).values()
                     if isinstance(v, Primitive))
