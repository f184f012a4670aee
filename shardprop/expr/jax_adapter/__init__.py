"""The one package that knows JAX internals.

Everything JAX-version-specific lives here: turning a function into a jaxpr, walking its equations, recognising
calls to inline (nested ``jit``, ``custom_jvp_call``, ``custom_vjp_call``, ``closed_call``, ``remat``), binding a
primitive from its equation params (``jaxprs.py``); abstract types, dtypes, tracers, placement and mesh contexts
(``values.py``); the user's source lines (``sources.py``); an all-reduce JAX has no public collective for
(``collectives.py``); the supported releases (jax 0.10.2 through 0.12.x), checked at import, and what differs
between them — a ``scan``'s params, a call's body param, the primitive names only some release defines — read into
one vocabulary, 0.10.2's (``versions.py``). Private imports (``jax._src``) are confined to these five modules. The
rest of shardprop sees only ``shardprop.expr.graph`` and the names below; when a JAX release changes these
internals, this package is the one to touch.
"""

# first: a JAX outside the supported releases is refused before any module reads its internals
from .versions import JAX_VERSION, PRIMITIVES_OF_SOME_RELEASES  # noqa: F401  (the adapter's names, re-exported)
from .jaxprs import (  # noqa: F401  (the adapter's names, re-exported)
    Primitive, CALL_JAXPR_PARAM, LINEAR_SOLVE, INLINED_CALLS, CUSTOM_JVP_CALLS, CUSTOM_VJP_CALLS,
    PLATFORM_INDEX, FOLDED_AT_TRACE, FOLDABLE_INDEX_ARITHMETIC, Equation, Body, make_jaxpr, closed_body,
    constraint_equation,
    call_body, static_platform_index, cond_branch, STATIC_WHEN_CONSTANT, as_static_slice, as_constant, is_literal,
    is_drop_var, literal_value,
    PLACEMENTS, without_placements, bind, defined_primitives, public_primitives,
)
from .values import (  # noqa: F401  (the adapter's names, re-exported)
    aval_of, is_weakly_typed, with_weak_type, is_traced, is_differentiated, typed_on_explicit_axes,
    abstract_type, committed_array_devices, device_list, refuses_transformation, place, put_all, coordination_client,
    DiffersAcrossProcesses,
    canonical_dtype, as_dtype, is_extended_dtype, dtype_kind, partitionable_random_bits, threefry_bits_at,
    itemsize, python_scalar_aval, is_array_dtype, program_mesh_context, on_auto_axes, explicit_mesh_of,
    no_mesh_context,
)
from .collectives import pprod  # noqa: F401  (the adapter's names, re-exported)
from .sources import (  # noqa: F401  (the adapter's names, re-exported)
    exclude_from_sources, sources_of_traceback, user_call_site, argument_names,
)
