"""A call's signature: the arguments' pytree structure and each leaf's shape, canonical dtype and weak type —
what a compiled program is fixed to, as ``jax.jit`` keys its cache by it.

``Signature.of(args)`` reads it off a call's arguments (arrays, Python scalars, ShapeDtypeStructs, or the tracers
of a ``jax.jit`` trace); ``Program.signature`` is the one the program was traced with, and ``check`` raises the
``shardprop.InputMismatchError`` a call with other arguments gets — inside the program's ``jax.jit`` trace and
on the checked path alike, with one message. An autoshard function keys its programs by it, and finds the program
of a call it has seen by ``call_key``, the same facts read cheaply.

    >>> Signature.of((jnp.ones((16, 8)), 2.0))                                       # doctest: +SKIP
    Signature(f32[16,8], f32[] weak)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

from .errors import InputMismatchError, ShardingError
from .expr import jax_adapter as jx
from .expr.graph import Aval, Graph
from .expr.trace import abstractify


@dataclass(frozen=True)
class Signature:
    """The pytree structure of a call's arguments and, per leaf, its shape and dtype (``avals``; the dtype
    canonical, as ``jax.jit`` sees a NumPy ``int64``) and whether it is weakly typed (a Python scalar)."""

    tree: Any
    avals: tuple[Aval, ...]
    weak_types: tuple[bool, ...]
    # the leaves' names as jax.jit names them (params['w']), for messages; not part of what a program is fixed to
    names: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def of(cls, args: Any) -> Signature:
        """The signature of ``args`` (a pytree); a leaf that is not an array, a Python scalar or a ShapeDtypeStruct
        is a ``shardprop.TraceError`` naming it (``shardprop.UnsupportedDtypeError`` for a dtype a JAX
        array cannot hold)."""
        structs, tree = abstractify(args)
        return cls(tree, tuple(Aval(tuple(s.shape), jx.as_dtype(s.dtype)) for s in structs),
                   tuple(bool(s.weak_type) for s in structs))

    @classmethod
    def of_graph(cls, graph: Graph) -> Signature:
        """The signature a graph was traced on."""
        return cls(graph.in_tree, tuple(graph.avals[v] for v in graph.inputs), tuple(graph.weak_inputs),
                   graph.argument_names)

    def check_structure(self, tree: Any) -> None:
        """Raise ``shardprop.InputMismatchError`` unless ``tree`` is the traced arguments' structure."""
        if tree != self.tree:
            raise InputMismatchError(f"arguments have structure {tree}, but the program was traced with {self.tree}")

    def check(self, got: Signature) -> None:
        """Raise ``shardprop.InputMismatchError`` unless ``got`` has this structure and every leaf this shape
        and dtype. Weak types may differ, as for a compiled ``jax.jit`` function: the program keeps its own."""
        self.check_structure(got.tree)
        problems = [f"  argument leaf {k}{f' ({self.names[k]})' if self.names else ''}: got {a}, traced with {want}"
                    for k, (a, want) in enumerate(zip(got.avals, self.avals, strict=True)) if a != want]
        if problems:
            raise InputMismatchError(
                "arguments differ from the traced ones (trace again, or call the autoshard function, which "
                "retraces per shape):\n" + "\n".join(problems))

    def check_call(self, args: Any) -> None:
        """``check`` of a call's arguments, a leaf that is not an array reported as an
        ``shardprop.InputMismatchError`` too."""
        try:
            got = Signature.of(args)
        except ShardingError as err:
            raise InputMismatchError(str(err)) from None
        self.check(got)

    def shape_dtype_structs(self, shardings: Sequence) -> list[jax.ShapeDtypeStruct]:
        """One ShapeDtypeStruct per leaf, laid out as ``shardings`` say, with the traced weak types."""
        return [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s, weak_type=w)
                for a, s, w in zip(self.avals, shardings, self.weak_types, strict=True)]

    def __repr__(self) -> str:
        leaves = ", ".join(f"{a}{' weak' if w else ''}" for a, w in zip(self.avals, self.weak_types, strict=True))
        return f"Signature({leaves})"


def check_runnable(leaves: Sequence) -> None:
    """Raise ``shardprop.InputMismatchError`` for an argument leaf no program can run on: a ShapeDtypeStruct
    (lower it instead) or an array deleted (donated to an earlier call)."""
    for k, x in enumerate(leaves):
        if isinstance(x, jax.ShapeDtypeStruct):
            raise InputMismatchError("a Program runs on arrays; use program.lower(...) for ShapeDtypeStructs")
        if isinstance(x, jax.Array) and not jx.is_traced(x) and x.is_deleted():
            raise InputMismatchError(f"argument leaf {k} is an array that was deleted (donated to an earlier call, "
                                     "or deleted): pass the array that call returned in its place")


_PYTHON_SCALARS = (bool, int, float, complex)


def call_key(tree: Any, leaves: Sequence) -> tuple | None:
    """A cheap key of a call's signature (its arguments' ``tree`` and ``leaves``), read in about a microsecond
    per leaf, as ``jax.jit`` keys its cache: calls with equal keys have equal ``Signature``\\ s. None when a
    leaf is not an array or a Python scalar: then only ``Signature.of`` can say."""
    parts: list[Any] = [tree, jax.config.jax_enable_x64]  # NumPy's and Python's dtypes read per this flag
    for x in leaves:
        if isinstance(x, jax.Array):  # its type: shape, (canonical) dtype, weak type, and sharding where typed
            parts.append(jx.abstract_type(x))
        elif isinstance(x, np.ndarray | np.generic):
            parts.append((x.shape, x.dtype))
        elif type(x) in _PYTHON_SCALARS and (type(x) is not int or -2**31 <= x < 2**31):
            parts.append(type(x))  # a weakly typed scalar (an int past int32 may not fit: Signature.of says)
        else:
            return None
    return tuple(parts)
