"""JAX values as shardprop handles them: abstract types and weak types, tracers, dtypes (extended ones: PRNG
keys), placing arrays on a mesh, random bits, and the mesh contexts a program runs in."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jax._src import core as _core_internal  # trace_state_clean: are we inside a jax.jit trace
from jax._src.array import ArrayImpl as _ArrayImpl  # JAX's concrete array type (committed_array_devices)
from jax._src.lax import lax as _lax_internal  # _convert_element_type: the only way to set a weak type


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
    """``x`` is traced with a type on a mesh's Explicit axes (see ``explicit_mesh_of``): sharding is part of
    the types there, and a sharding constraint is an assert."""
    return explicit_mesh_of([x]) is not None


def abstract_type(x) -> Any:
    """``jax.typeof(x)`` of a JAX array or tracer (shape, dtype, weak type and, on Explicit axes, sharding), read
    without ``typeof``'s dispatch: a hashable key for a call's signature."""
    return x.aval


def committed_array_devices(x) -> Any:
    """For a concrete ``jax.Array`` of JAX's own array type: the device list of its sharding (``device_list``) when
    it is committed, ``False`` when it is not (``jax.jit`` would place it); ``None`` for anything else (another
    array type, a tracer, a host value), which the caller checks the slow way. Read without the public
    properties' dispatch: a call checks every argument leaf this way, a few hundred nanoseconds each."""
    if type(x) is not _ArrayImpl:
        return None
    return device_list(x.sharding) if x._committed else False


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


def put_all(values: Sequence, shardings: Sequence) -> list:
    r"""Host values (NumPy arrays, uncommitted ``jax.Array``\ s) put on the devices, committed, laid out as
    ``shardings`` say — in one batched call into JAX's C++ sharding of arguments, the one ``jax.jit`` uses for its
    own (about half of what ``jax.device_put`` of a list costs)."""
    from jax._src.interpreters import pxla
    from jax._src.lib import xla_client as xc

    if any(is_extended_dtype(getattr(v, "dtype", None)) for v in values):  # PRNG keys: shard_args takes their bits
        return list(jax.device_put(list(values), list(shardings)))
    return list(pxla.shard_args(list(shardings), [None] * len(values),
                                [xc.ArrayCopySemantics.REUSE_INPUT] * len(values), list(values)))


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


