"""``trace(f, *args) -> Graph``: run ``jax.make_jaxpr`` and flatten the jaxpr into our graph.

Calls (nested ``jit``, ``custom_jvp_call``, ``custom_vjp_call``, ...) are inlined, so the graph holds only
primitives that sharding rules understand; literals and closed-over constants become ``constant`` nodes.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from types import MappingProxyType
from typing import Any

import jax
import numpy as np

from ..errors import ShardingError, TraceError, UnsupportedDtypeError
from ..gc_pause import gc_paused
from . import jax_adapter as jx
from .graph import CONSTANT, PARAMETER, Aval, Graph, Node


def abstractify(args: tuple) -> tuple[list[jax.ShapeDtypeStruct], Any]:
    """Flatten ``args`` to ShapeDtypeStructs; arrays, ShapeDtypeStructs and Python scalars are accepted as
    leaves. A Python scalar is a weakly typed rank-0 array, as under ``jax.jit`` (``x * 2.0`` keeps the dtype
    of an ``f16`` ``x``); weak types of arrays are kept too."""
    leaves, tree = jax.tree_util.tree_flatten(args)
    avals = []

    def where(i):
        return "argument" + jax.tree_util.keystr(jax.tree_util.tree_flatten_with_path(args)[0][i][0])

    for i, leaf in enumerate(leaves):
        if isinstance(leaf, (bool, int, float, complex)):
            try:
                leaf = jx.python_scalar_aval(leaf)
            except OverflowError as err:
                raise TraceError(f"{where(i)}: {err} (pass an array with an explicit dtype)") from None
        if not (isinstance(leaf, jax.ShapeDtypeStruct) or (hasattr(leaf, "shape") and hasattr(leaf, "dtype"))):
            raise TraceError(
                f"{where(i)} is a {type(leaf).__name__}, not an array: shardprop shards array arguments "
                "only (pass jax/numpy arrays, Python scalars or jax.ShapeDtypeStruct; close over other static "
                "values instead)"
            )
        if not jx.is_array_dtype(leaf.dtype):
            raise UnsupportedDtypeError(
                f"{where(i)} has dtype {leaf.dtype}, which a JAX array cannot hold, so it cannot be sharded "
                "(use numeric, bool or PRNG key arrays)")
        # Canonical dtype: a numpy int64 argument is an int32 under jax.jit unless x64 is enabled.
        avals.append(jax.ShapeDtypeStruct(tuple(leaf.shape), jx.canonical_dtype(leaf.dtype),
                                          weak_type=bool(getattr(leaf, "weak_type", False))))
    return avals, tree


def trace(f: Callable, *args, names: Sequence[str] | None = None) -> Graph:
    """Trace ``f`` on ``args`` (arrays, ShapeDtypeStructs, or pytrees of them) into a ``Graph``.

    Examples:
        >>> g = sp.trace(lambda a, b: a + b, jnp.ones((4, 2)), jnp.ones((4, 2)))
        >>> print(g)
        { lambda ;
            a:f32[4,2]   # a
            b:f32[4,2]   # b
          let
            c:f32[4,2] = add a b   # <doctest ...>:1
          in (c,) }
    """
    avals, in_tree = abstractify(args)
    out_tree_box = []

    def leaves_of_f(*structured):
        out = f(*structured)
        out_leaves, out_tree = jax.tree_util.tree_flatten(out)
        out_tree_box.append(out_tree)
        return out_leaves

    # Traced on the arguments' pytrees, seen as ``f`` (its name, line and signature): JAX's own errors while tracing
    # (a Python ``if`` on a traced value) then name the user's function and ``params['w']``, as under ``jax.jit``
    functools.update_wrapper(leaves_of_f, f, updated=())
    try:
        closed = jx.make_jaxpr(leaves_of_f, jax.tree_util.tree_unflatten(in_tree, avals))
    except ShardingError:
        raise  # shardprop's own checks while tracing (out_specs) say what is wrong themselves
    except Exception as err:  # any JAX error while tracing the user's code
        raise TraceError(f"tracing {getattr(f, '__name__', f)!r} failed: {type(err).__name__}: {err}") from err
    graph = _GraphBuilder().build(closed, in_tree, out_tree_box[-1])
    names = jx.argument_names(f, args, {}) if names is None else tuple(names)
    if names is None or len(names) != len(graph.inputs):
        return graph
    return dataclasses.replace(graph, names=names)


def with_pinned_outputs(graph: Graph, shardings: dict[int, Any]) -> Graph:
    """``graph`` with each flat output ``k`` of ``shardings`` passed through a sharding constraint to
    ``shardings[k]`` (a ``NamedSharding`` on the program's mesh, under whose context this runs): the graph a trace
    of the function with those outputs under ``jax.lax.with_sharding_constraint`` gives, without tracing it again
    (how a program returns an updated state in its argument's layout). The constraints are at the lines that
    computed the outputs."""
    nodes, avals, outputs = list(graph.nodes), list(graph.avals), list(graph.outputs)
    made: dict[tuple, int] = {}  # (value, sharding) -> the constrained value: one constraint for both
    equations: dict[tuple, tuple] = {}  # (shape, dtype, sharding) -> the equation: a stack's layers pin alike
    for k, sharding in sorted(shardings.items()):
        value = graph.outputs[k]
        if (value, sharding) not in made:
            aval, producer = graph.avals[value], graph.nodes[graph.producer[value]]
            kind = (aval.shape, aval.dtype, sharding)
            if kind not in equations:
                equations[kind] = jx.constraint_equation(aval.shape, aval.dtype, sharding)
            primitive, params = equations[kind]
            avals.append(aval)
            nodes.append(Node(len(nodes), primitive.name, (value,), (len(avals) - 1,), MappingProxyType(params),
                              producer.source, primitive, producer.caller))
            made[value, sharding] = len(avals) - 1
        outputs[k] = made[value, sharding]
    return dataclasses.replace(graph, nodes=tuple(nodes), avals=tuple(avals), outputs=tuple(outputs))


def trace_jaxpr(closed_jaxpr) -> Graph:
    """The graph of a closed jaxpr held in an equation's params (a ``scan`` body), inputs and outputs flat."""
    return _GraphBuilder().build(closed_jaxpr, None, None)


class _GraphBuilder:
    def __init__(self):
        self.nodes: list[Node] = []
        self.avals: list[Aval] = []
        self.scalar_constants: dict[int, int] = {}  # value -> its integer, for constant cond indices
        self.custom_derivatives: set[str] = set()  # inlined calls with custom derivative rules
        self.merged: dict[tuple, tuple[int, ...]] = {}  # an expression's key -> its outputs (CSE)
        self.constants: set[int] = set()  # the values of constant nodes

    def _new_value(self, shape, dtype) -> int:
        self.avals.append(Aval(tuple(shape), jx.as_dtype(dtype)))
        return len(self.avals) - 1

    def _add_node(self, op, operands, out_avals, params, source, primitive=None, caller=None) -> Node:
        outputs = tuple(self._new_value(s, d) for s, d in out_avals)
        node = Node(len(self.nodes), op, tuple(operands), outputs, MappingProxyType(dict(params)), source, primitive,
                    caller)
        self.nodes.append(node)
        return node

    def _constant(self, value) -> int:
        value = jx.as_constant(value)
        key = _constant_key(value)
        if key is not None and key in self.merged:  # one node per small constant, as XLA folds them
            return self.merged[key][0]
        out = self._add_node(CONSTANT, (), [(value.shape, value.dtype)], {"value": value}, None).output
        if key is not None:
            self.merged[key] = (out,)
        self.constants.add(out)
        if isinstance(value, np.ndarray) and value.shape == () and value.dtype.kind in "iu":
            self.scalar_constants[out] = int(value)
        return out

    # GC is paused while our graph is built, not while the user's function runs under make_jaxpr: their
    # cyclic garbage must still be collected.
    @gc_paused
    def build(self, closed, in_tree, out_tree) -> Graph:
        body = jx.closed_body(closed)
        env: dict = {}
        inputs = []
        for index, var in enumerate(body.invars):
            node = self._add_node(PARAMETER, (), [jx.aval_of(var)], {"index": index}, None)
            env[var] = node.output
            inputs.append(node.output)
        for var, value in body.consts:
            env[var] = self._constant(value)
        self._inline(body.equations, env, None)
        outputs = tuple(self._read(env, var) for var in body.outvars)
        return Graph(tuple(self.nodes), tuple(self.avals), tuple(inputs), outputs, in_tree, out_tree,
                     weak_inputs=tuple(map(jx.is_weakly_typed, body.invars)),
                     weak_outputs=tuple(map(jx.is_weakly_typed, body.outvars)),
                     custom_derivatives=frozenset(self.custom_derivatives))

    def _folds(self, eqn, operands) -> bool:
        if eqn.primitive.name not in jx.FOLDABLE_INDEX_ARITHMETIC or len(eqn.outvars) != 1:
            return False
        shape, dtype = jx.aval_of(eqn.outvars[0])
        return shape == () and getattr(dtype, "kind", "") in "iu" and all(o in self.scalar_constants for o in operands)

    def _read(self, env, var) -> int:
        if jx.is_literal(var):
            return self._constant(jx.literal_value(var))
        return env[var]

    def _inline(self, equations, env, outer_source: str | None, outer_caller: str | None = None) -> None:
        for eqn in equations:
            # Ops inside library calls (relu, where) often have no user frame: report the call's line.
            source, caller = (eqn.source, eqn.caller) if eqn.source else (outer_source, outer_caller)
            operands = [self._read(env, var) for var in eqn.invars]
            if eqn.primitive.name == jx.PLATFORM_INDEX:  # folded: the platform is known now
                env[eqn.outvars[0]] = self._constant(np.int32(jx.static_platform_index(eqn)))
                continue
            if self._folds(eqn, operands):  # index arithmetic on constants (lax.switch clamps its index)
                # each operand in its own dtype (an int16 index stays int16: the folded value must match its type)
                (value,) = jx.bind(eqn.primitive, [np.asarray(self.scalar_constants[o], self.avals[o].dtype)
                                                   for o in operands], eqn.params)
                env[eqn.outvars[0]] = self._constant(np.asarray(value, jx.aval_of(eqn.outvars[0])[1]))
                continue
            call = jx.call_body(eqn)
            if call is None and eqn.primitive.name == "cond" and operands[0] in self.scalar_constants:
                call = jx.cond_branch(eqn, self.scalar_constants[operands[0]])
            if call is not None:
                if eqn.primitive.name in jx.CUSTOM_JVP_CALLS | jx.CUSTOM_VJP_CALLS:
                    self.custom_derivatives.add(eqn.primitive.name)
                body, feeding = call
                sub_env = {var: self._constant(c) for var, c in body.consts}
                sub_env.update(zip(body.invars, [operands[k] for k in feeding], strict=True))
                self._inline(body.equations, sub_env, source, caller)
                for outer, inner in zip(eqn.outvars, body.outvars, strict=True):
                    if not jx.is_drop_var(outer):
                        env[outer] = self._read(sub_env, inner)
                continue
            primitive, params = eqn.primitive, eqn.params
            if primitive.name == jx.STATIC_WHEN_CONSTANT and all(o in self.scalar_constants for o in operands[1:]):
                primitive, params = jx.as_static_slice(eqn, [self.scalar_constants[o] for o in operands[1:]])
                operands = operands[:1]
            # (an expression of constants alone is not merged: each reader makes its own copy in its layout, free)
            key = None if all(o in self.constants for o in operands) else _expression_key(primitive.name, operands,
                                                                                         params)
            outputs = self.merged.get(key) if key is not None else None
            if outputs is None:
                outputs = self._add_node(primitive.name, operands, [jx.aval_of(v) for v in eqn.outvars], params,
                                         source, primitive, caller).outputs
                if key is not None:
                    self.merged[key] = outputs
            for var, value in zip(eqn.outvars, outputs, strict=True):
                if not jx.is_drop_var(var):
                    env[var] = value


# Not merged however alike: ops with effects or whose results differ call to call.
_UNMERGED_WORDS = ("callback", "print", "debug", "rng", "random_bits", "infeed", "outfeed", "send", "recv", "barrier",
                   "token", "io_")


def _expression_key(op: str, operands, params) -> tuple | None:
    """A key equal for two applications of ``op`` to the same values with the same params — one expression written
    twice, which ``jax.jit`` (XLA's common subexpressions) computes once; None where they must stay apart (effects,
    randomness, params holding functions or bodies)."""
    if not _mergeable(op):
        return None
    frozen = _frozen(tuple(sorted(params.items())))
    return None if frozen is None else (op, tuple(operands), frozen)


@functools.cache
def _mergeable(op: str) -> bool:
    return not any(word in op for word in _UNMERGED_WORDS)


def _frozen(value):
    """``value`` as a hashable key of plain data, or None where it holds anything else."""
    kind = type(value)
    if kind is int or kind is bool or kind is str:  # (typed: True == 1)
        return (kind, value)
    if value is None or isinstance(value, np.dtype):
        return value
    if isinstance(value, (float, np.generic)):  # (by repr: -0.0 == 0.0, nan != nan)
        return (kind, repr(value))
    if isinstance(value, tuple):  # (NamedTuples too: dimension numbers)
        items = [_frozen(v) for v in value]
        return None if any(i is None and v is not None for i, v in zip(items, value, strict=True)) else (
            kind, tuple(items))
    if isinstance(value, (frozenset, set)):
        items = [_frozen(v) for v in sorted(value, key=repr)]
        return None if any(i is None for i in items) else (kind, tuple(items))
    if kind.__hash__ is not None and dataclasses.is_dataclass(value) or hasattr(value, "_value_"):
        return (kind, repr(value))  # frozen dataclasses (gather dimension numbers), enums
    return None


def _constant_key(value) -> tuple | None:
    """A key for a small constant (a scalar, a short vector): one node per value, dtype and shape."""
    if not isinstance(value, (np.ndarray, np.generic)) or value.size > 16 or value.dtype.kind not in "biufc":
        return None  # (a PRNG key, a large array: kept as they are)
    return ("constant", value.dtype.str, value.shape, value.tobytes())
