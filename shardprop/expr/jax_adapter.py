"""The one module that knows JAX internals.

Everything JAX-version-specific lives here: turning a function into a jaxpr, walking its equations,
recognising calls to inline (nested ``jit``, ``custom_jvp_call``, ``custom_vjp_call``, ``closed_call``,
``remat``), reading ``source_info``, and binding a primitive from its equation params. The rest of shardprop
sees only :mod:`shardprop.expr.graph`. When a JAX release changes these internals, this file is the one to
touch.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex_core

# Private imports are confined to this block; they are the adapter's reason to exist.
from jax._src import core as _core_internal  # trace_state_clean: are we inside a jax.jit trace
from jax._src import source_info_util as _source_info_util
from jax._src.lax import lax as _lax_internal  # _convert_element_type: the only way to set a weak type

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
}
# ``custom_linear_solve`` (``jnp.linalg.solve``) computes ``solve(*solve_consts, *b)``: its forward is the
# ``solve`` jaxpr applied to its own constants and the right-hand side.
LINEAR_SOLVE = "custom_linear_solve"
INLINED_CALLS = frozenset(CALL_JAXPR_PARAM) | {LINEAR_SOLVE}
# Calls whose derivative is not that of their body (relu's is 0 at 0, a user's clipped or numerically safe
# gradients, solve's transpose): a program that inlined one must be differentiated as the user's function is.
CUSTOM_JVP_CALLS = frozenset({"custom_jvp_call", "custom_jvp_call_jaxpr", LINEAR_SOLVE})
CUSTOM_VJP_CALLS = frozenset({"custom_vjp_call"})
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
    :func:`is_literal`, :func:`literal_value`, :func:`aval_of`, :func:`is_drop_var`."""

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
    else:
        param = CALL_JAXPR_PARAM.get(name)
        if param is None or param not in equation.params:
            return None
        feeding = tuple(range(len(equation.invars)))
        body = _as_body(equation.params[param])
    if body is None or len(body.invars) != len(feeding) or len(body.outvars) != len(equation.outvars):
        return None  # not the shape of call we know how to inline: leave it a primitive
    return body, feeding


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


def _as_body(sub) -> Body | None:
    if isinstance(sub, jex_core.ClosedJaxpr):
        return _body(sub.jaxpr, list(sub.consts))
    if isinstance(sub, jex_core.Jaxpr):
        return _body(sub, [])
    return None


def _body(jaxpr, consts) -> Body:
    equations = (
        Equation(e.primitive, tuple(e.invars), tuple(e.outvars), e.params, *_sources(e.source_info.traceback))
        for e in jaxpr.eqns
    )
    return Body(list(jaxpr.invars), list(zip(jaxpr.constvars, consts, strict=True)), list(jaxpr.outvars), equations)


def aval_of(var) -> tuple[tuple[int, ...], Any]:
    """Shape and dtype; the dtype is a numpy dtype, or JAX's own for extended types (PRNG keys)."""
    aval = var.aval
    return tuple(int(d) for d in aval.shape), as_dtype(aval.dtype)


def is_weakly_typed(var) -> bool:
    """True when a jaxpr variable or literal is weakly typed (its dtype yields to the other operand's)."""
    return bool(getattr(var.aval, "weak_type", False))


def with_weak_type(x, weak: bool):
    """``x`` with its weak type set to ``weak`` (same dtype and values); ``x`` itself if it already is."""
    if bool(jax.typeof(x).weak_type) == weak:
        return x
    return _lax_internal._convert_element_type(x, weak_type=weak)


def is_traced(x) -> bool:
    """``x`` is an abstract value of a JAX transformation (``jit``, ``vmap``, ``grad``), not a concrete array."""
    return isinstance(x, jax.core.Tracer)


def is_differentiated(x) -> bool:
    """``x`` carries a tangent: a transformation that differentiates (``jax.grad``, ``jax.jvp``) is tracing it."""
    from jax._src.interpreters import ad

    while is_traced(x):
        if isinstance(x, ad.JVPTracer | ad.LinearizeTracer):
            return True
        x = getattr(x, "primal", None) if hasattr(x, "primal") else getattr(x, "val", None)
    return False


def typed_on_explicit_axes(x) -> bool:
    """``x`` is traced with a type on a mesh's Explicit axes (see :func:`explicit_mesh_of`): sharding is part of
    the types there, and a sharding constraint is an assert."""
    return explicit_mesh_of([x]) is not None


def abstract_type(x) -> Any:
    """``jax.typeof(x)`` of a JAX array or tracer (shape, dtype, weak type and, on Explicit axes, sharding), read
    without ``typeof``'s dispatch: a hashable key for a call's signature."""
    return x.aval


def device_list(mesh_or_sharding) -> Any:
    """The devices of a mesh or a sharding, in order, as ``jax.jit`` compares them when it checks that the
    arguments of a computation and its shardings agree on their devices (cheap to compare)."""
    return mesh_or_sharding._internal_device_list


def refuses_transformation(err: Exception) -> bool:
    """``err`` is JAX refusing a transformation the user applied, as it would to the unsharded function
    (``jax.jvp`` of a function holding a ``custom_vjp``): the user's to see, not a shardprop bug."""
    return isinstance(err, TypeError) and "can't apply forward-mode autodiff (jvp) to a custom_vjp" in str(err)


def place(x, sharding, *, donate: bool = False):
    """``x`` laid out as ``sharding``. A concrete array is put there (``donate``: its buffer may be reused, and
    the array is invalid afterwards, as a donated ``jax.jit`` argument). A traced one (``jax.jit``, ``jax.vmap``,
    ``jax.grad`` of an autoshard function) gets a sharding constraint instead: ``device_put``'s batching rule
    would lay the *batched* array out by the per-example sharding, a constraint's puts the batch axis aside."""
    if is_traced(x):
        return jax.lax.with_sharding_constraint(x, sharding)
    if donate and isinstance(x, jax.Array):
        return jax.device_put(x, sharding, donate=True)
    try:
        return jax.device_put(x, sharding)
    except AssertionError as err:  # JAX's own check, on a mesh spanning processes, that a host value is global
        if "not the same on each process" in str(err):
            raise DiffersAcrossProcesses from None
        raise


def coordination_client():
    """JAX's distributed runtime client (the coordination service's key-value store: ``key_value_set``,
    ``blocking_key_value_get``), or None when ``jax.distributed`` is not initialized."""
    from jax._src import distributed

    return distributed.global_state.client


class DiffersAcrossProcesses(Exception):
    """A host value placed on a mesh spanning processes is not the same on every process."""


def canonical_dtype(dtype) -> Any:
    """The dtype JAX stores ``dtype`` as: ``int64`` becomes ``int32`` unless ``jax_enable_x64`` is set, as
    ``jax.jit`` does with a numpy argument. Extended dtypes (PRNG keys) are kept."""
    if jax.dtypes.issubdtype(dtype, jax.dtypes.extended):
        return dtype
    return np.dtype(jax.dtypes.canonicalize_dtype(dtype))


def as_dtype(dtype) -> Any:
    try:
        return np.dtype(dtype)
    except TypeError:  # an extended dtype such as key<fry>: keep JAX's object
        return dtype


def is_extended_dtype(dtype) -> bool:
    """True for JAX's extended dtypes (PRNG keys), which numpy cannot hold."""
    return not isinstance(dtype, np.dtype) and jax.dtypes.issubdtype(dtype, jax.dtypes.extended)


def dtype_kind(dtype) -> str:
    """numpy's one-letter kind ("f", "i", "u", "c", "b"), also for the ml_dtypes floats numpy calls "V"
    (bfloat16, float8s); "" for extended dtypes.

    >>> dtype_kind(jnp.bfloat16), dtype_kind(np.int8)
    ('f', 'i')
    """
    if is_extended_dtype(dtype):
        return ""
    for kind, family in (("b", jnp.bool_), ("c", jnp.complexfloating), ("f", jnp.floating),
                         ("u", jnp.unsignedinteger), ("i", jnp.signedinteger)):
        if jnp.issubdtype(dtype, family):
            return kind
    return np.dtype(dtype).kind


def partitionable_random_bits(key_dtype) -> bool:
    """True when the bits ``random_bits`` draws with a key of ``key_dtype`` depend only on the key and each
    element's position in the whole array (threefry keys under ``jax_threefry_partitionable``, JAX's default):
    a device can then draw its own block, and get the unsharded program's numbers."""
    impl = getattr(key_dtype, "_impl", None)
    return getattr(impl, "name", None) == "threefry2x32" and bool(jax.config.jax_threefry_partitionable)


def threefry_bits_at(key, bit_width: int, positions):
    """The bits ``random_bits(key, bit_width, shape)`` gives the elements at flat ``positions`` (uint32, below
    2**32) of the whole ``shape``: JAX's partitionable threefry hashes each element's 64-bit position."""
    from jax.extend.random import threefry2x32_p

    k1, k2 = jax.random.key_data(key)
    bits1, bits2 = threefry2x32_p.bind(k1, k2, jnp.zeros_like(positions), positions)
    dtype = jnp.dtype(f"uint{bit_width}")
    if bit_width == 64:
        return (bits1.astype(dtype) << dtype.type(32)) | bits2.astype(dtype)
    return (bits1 ^ bits2).astype(dtype)


def itemsize(dtype) -> int:
    """Bytes per element, extended dtypes included (a threefry key is two uint32 words: 8 bytes)."""
    return int(dtype.itemsize)


def python_scalar_aval(value: bool | int | float | complex) -> jax.ShapeDtypeStruct:
    """The abstract value ``jax.jit`` gives a Python scalar argument: rank 0, weakly typed (except bool).
    Raises OverflowError for an int that does not fit the default integer dtype."""
    aval = jax.typeof(value)
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type)


def is_array_dtype(dtype) -> bool:
    """True for the dtypes a JAX array can hold (numeric, bool, and extended dtypes such as PRNG keys)."""
    try:
        if jax.dtypes.issubdtype(dtype, jax.dtypes.extended):
            return True
        dtype = np.dtype(dtype)
        return dtype.kind in "biufc" or dtype.type.__module__.startswith("ml_dtypes")  # bfloat16, float8_*
    except TypeError:
        return False


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


def program_mesh_context(mesh):
    """A context in which ``mesh`` (a program's, Auto axes) is JAX's context mesh — needed only when the user
    has set another one (``jax.set_mesh`` of an Explicit-axes mesh, which ``shard_map`` would refuse ours
    under, and under which our sharding constraints would be asserts); with none set, nothing. Inside a
    ``jax.jit`` trace, where ``set_mesh`` is refused, the abstract mesh is set instead."""
    current = jax.sharding.get_abstract_mesh()
    if current.empty or current == mesh.abstract_mesh:
        return contextlib.nullcontext()
    if not _core_internal.trace_state_clean():  # inside a jax.jit trace, where set_mesh is refused
        return jax.sharding.use_abstract_mesh(mesh.abstract_mesh)
    return jax.set_mesh(mesh)


def on_auto_axes(fn, mesh, out_shardings):
    """``fn`` (a program built for ``mesh``'s axes made Auto), callable inside a ``jax.jit`` whose arguments are typed
    on ``mesh``'s Explicit axes: its arguments are seen untyped (Auto), its outputs come back typed as
    ``out_shardings`` say (``jax.sharding.auto_axes``)."""
    abstract = getattr(mesh, "abstract_mesh", mesh)

    def call(*args):
        with jax.sharding.use_abstract_mesh(abstract):
            return jax.sharding.auto_axes(fn, out_sharding=out_shardings)(*args)

    return call


def explicit_mesh_of(leaves) -> Any:
    """The (abstract) mesh whose Explicit axes type some traced leaf (``jax.jit`` of arguments placed on a
    ``jax.make_mesh`` mesh, or traced under ``jax.set_mesh`` of one), or None."""
    context = jax.sharding.get_abstract_mesh()
    for x in leaves:
        if is_traced(x):
            for mesh in (getattr(getattr(jax.typeof(x), "sharding", None), "mesh", None), context):
                if any(t == jax.sharding.AxisType.Explicit for t in getattr(mesh, "axis_types", ())):
                    return mesh
    return None


def no_mesh_context():
    """A context in which JAX has no context mesh (``jax.set_mesh`` of an empty mesh): unsharded single-device
    computations (the debugger's reference) run there whatever mesh the user has set."""
    return jax.set_mesh(jax.sharding.Mesh(np.empty((), dtype=object), ()))


def exclude_from_sources(path: str) -> None:
    """Frames in ``path`` (a file or folder of shardprop's that calls the user's function, or adds ops to it)
    are not the user's line: an op they add is attributed to the user's frame that called in."""
    _source_info_util.register_exclusion(path)


# shardprop's own frames are never the user's line: an op a wrapper of ours adds (out_specs' constraints) is
# attributed to the user's call.
exclude_from_sources(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _is_library(path: str) -> bool:
    return f"{os.sep}site-packages{os.sep}" in path or f"{os.sep}dist-packages{os.sep}" in path


@functools.lru_cache(maxsize=1024)
def _sources(traceback) -> tuple[str | None, str | None]:
    """The ``file:line`` JAX names as the user's for an equation (None when it recorded none) and, when that line is
    inside an installed library (flax, optax, equinox: code the user did not write), the user's own line that
    called into it — what a warning should point at."""
    return _user_lines(traceback)


def user_call_site() -> str | None:
    """``file:line`` of the user's frame calling in now (past an installed library, to the user's own line), found
    as every equation's line is: JAX's user frames, shardprop's own excluded. None when there is none."""
    source, caller = _user_lines(_source_info_util.current().traceback)
    return caller or source


def _user_lines(traceback) -> tuple[str | None, str | None]:
    frames = _source_info_util.user_frames(traceback)
    first = next(frames, None)
    if first is None:
        return None, None
    source = f"{first.file_name}:{first.start_line}"
    if _is_library(first.file_name):
        for frame in frames:
            if not _is_library(frame.file_name):
                return source, f"{frame.file_name}:{frame.start_line}"
    return source, None


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
    out = primitive.bind(*invals, **primitive.get_bind_params(params))
    return list(out) if primitive.multiple_results else [out]


# Modules of kernel languages and accelerator back ends: their primitives never appear in a traced jax.numpy
# program, and importing them can need an accelerator's libraries.
_NOT_SCANNED = ("test_util", "internal_test", "test_loader", "test_multiprocess", "mosaic", "pallas", "triton",
                "tpu_custom", "mlir.dialects", "lib.", "export.serialization")


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
