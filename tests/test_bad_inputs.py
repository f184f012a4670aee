"""The catalogue of bad inputs: each raises the exact shardprop error type with a message naming the
problem — never a raw JAX/XLA traceback."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import shardprop as sp

A = np.ones((16, 8), np.float32)
S = jax.ShapeDtypeStruct((16, 8), jnp.float32)


def mesh():
    return sp.make_mesh((4, 2), ("i", "j"))


def run(f, in_specs, *args, strict=False, conflicts="error"):
    return sp.autoshard(f, mesh=mesh(), in_specs=in_specs, strict=strict, conflicts=conflicts)(*args)


def add(a, b):
    return a + b


def call_with_other_shapes():
    prog = sp.autoshard(add, mesh=mesh(), in_specs=P("i")).trace(A, A)
    prog(A, np.ones((8, 8), np.float32))


def _on_host(x):
    return jax.pure_callback(lambda v: v * 2.0, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


def no_rule_strict():
    run(lambda a: lax.while_loop(lambda c: c[0] < 2, lambda c: (c[0] + 1, _on_host(c[1])), (0, a))[1], P("i"), A,
        strict=True)


CATALOGUE = [
    ("spec longer than the rank", lambda: run(add, (P("i", "j", None), None), A, A), sp.SpecRankError,
     "argument a: spec P('i', 'j', None) has 3 entries but the argument has rank 2"),
    ("unknown mesh axis", lambda: run(add, (P("x"), None), A, A), sp.UnknownMeshAxisError,
     "argument a: spec P('x',) names mesh axis 'x', but the mesh has axes ('i', 'j')"),
    ("mesh axis used twice in one spec", lambda: run(add, (P("i", "i"), None), A, A), sp.DuplicateMeshAxisError,
     "argument a: spec P('i', 'i') uses mesh axis 'i' for two tensor axes"),
    ("mesh axis used twice in a compound entry", lambda: run(add, (P(("i", "i")), None), A, A),
     sp.DuplicateMeshAxisError, "uses mesh axis 'i' for two tensor axes"),
    # (an argument or a constraint whose axis does not divide is laid out in ranges, as jax.jit pads it:
    # tests/ops/test_ranges.py, tests/ops/test_constraints.py; a returned array cannot be, under jax.jit either)
    ("out_specs whose axis size does not divide",
     lambda: sp.autoshard(lambda a: a[:, :6], mesh=mesh(), in_specs=None, out_specs=P(None, ("i", "j")))(A),
     sp.IndivisibleAxisError, "axis 1 has size 6, not divisible by 8"),
    ("in_specs tree does not match the arguments", lambda: run(add, (P("i"), None, None), A, A),
     sp.SpecTreeError, "is not a pytree prefix of the arguments"),
    ("in_specs leaf that is not a spec", lambda: run(add, ("i", None), A, A), sp.SpecTreeError,
     "in_specs leaf 'i' is neither a PartitionSpec nor None"),
    ("non-array argument", lambda: run(add, None, A, "hello"), sp.TraceError,
     "argument[1] is a str, not an array"),
    ("python int too large for int32", lambda: run(add, None, A, 2**40), sp.TraceError,
     "argument[1]: Python int 1099511627776 too large to convert to int32"),
    ("dtype the backend cannot shard", lambda: run(lambda a: a, P("i"), np.array(["a", "b"])),
     sp.UnsupportedDtypeError, "argument[0] has dtype <U1, which a JAX array cannot hold"),
    ("sharding conflict", lambda: run(add, (P("i"), P("j")), A, A), sp.ShardingConflictError,
     "sharding conflict in `add`"),
    ("primitive with no rule under strict=True", no_rule_strict, sp.NoRuleError,
     "no sharding rule applies to `while` at test_bad_inputs.py:41 (`pure_callback` at test_bad_inputs.py:37 inside "
     "its body has no rule)"),
    ("mesh with more devices than exist", lambda: sp.make_mesh((4, 4), ("i", "j")), sp.MeshError,
     "a (4, 4) mesh needs 16 devices but only 8 exist"),
    ("mesh with the wrong number of given devices", lambda: sp.make_mesh((2, 2), ("i", "j"), devices=jax.devices()),
     sp.MeshError, "a (2, 2) mesh needs 4 devices, 8 were given"),
    ("something that is not a mesh", lambda: sp.autoshard(add, mesh="4x2", in_specs=None)(A, A), sp.MeshError,
     "expected a jax.sharding.Mesh"),
    ("calling a program with other shapes", call_with_other_shapes, sp.InputMismatchError,
     "argument leaf 1 (b): got f32[8,8], traced with f32[16,8]"),
    ("a function JAX cannot trace", lambda: run(lambda a, b: a @ b, None, A, A), sp.TraceError,
     "tracing '<lambda>' failed: TypeError: dot_general requires contracting dimensions to have the same shape"),
    ("sp.AUTO with strict=True and nothing fixed", lambda: run(add, sp.AUTO, A, A, strict=True), sp.SearchError,
     "sp.AUTO with strict=True: every argument is sp.AUTO or unannotated"),
    ("a memory limit that is not a number of bytes",
     lambda: sp.autoshard(add, mesh=mesh(), in_specs=sp.AUTO, memory_limit="8GB"), sp.OptionError,
     "memory_limit='8GB': expected a positive number of bytes per device"),
    ("a memory limit nothing fits",
     lambda: sp.autoshard(add, mesh=mesh(), in_specs=(sp.AUTO, P("i")), memory_limit=64)(A, A), sp.MemoryLimitError,
     "the search found no layout of argument a that fits memory_limit=64 B per device: "),
    ("a fixed layout over the memory limit",
     lambda: sp.autoshard(add, mesh=mesh(), in_specs=P(), memory_limit=64)(A, A), sp.MemoryLimitError,
     "over memory_limit=64; shard more of the arguments, or pass sp.AUTO"),
    ("sp.AUTO inside a PartitionSpec", lambda: run(add, (P(sp.AUTO), None), A, A), sp.SpecError,
     "has entry sp.AUTO for axis 0: expected a mesh axis name, a tuple of names, or None (sp.AUTO stands for a "
     "whole spec"),
]


@pytest.mark.parametrize("name,make_error,error,message", CATALOGUE, ids=[c[0] for c in CATALOGUE])
def test_bad_input(name, make_error, error, message):
    with pytest.raises(error, match=re.escape(message)) as info:
        make_error()
    assert isinstance(info.value, sp.ShardingError)
    assert type(info.value) is error  # the exact type, not just a base class
