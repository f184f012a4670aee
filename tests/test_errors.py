"""Bad inputs raise typed shardprop errors naming the op, the source line and the shardings."""

import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import shardprop as sp

A = jax.ShapeDtypeStruct((16, 8), jnp.float32)


def compile(f, specs, mesh, *args):
    return sp.autoshard(f, mesh=mesh, in_specs=specs, conflicts="error").trace(*(args or (A, A)))


def add(a, b):
    return a + b  # CONFLICT_LINE


def test_conflict_names_op_source_line_and_both_shardings(mesh):
    with pytest.raises(sp.ShardingConflictError) as info:
        compile(add, (P("i", None), P("j", None)), mesh)
    message = str(info.value)
    line = add.__code__.co_firstlineno + 1
    assert f"sharding conflict in `add` at {os.path.basename(__file__)}:{line}" in message
    assert "operand 0 (a): f32[16@i,8]" in message
    assert "operand 1 (b): f32[16@j,8]" in message
    assert "axis 0 @i: argument a has spec P('i',)" in message
    assert "axis 0 @j: argument b has spec P('j',)" in message
    assert "output axis 0: one operand is sharded over i, another over j" in message
    assert "fix:" in message


def deep(a, b, c):
    x = jnp.tanh(a) * 2
    y = (b + c).T
    return x + y


def test_conflict_traces_each_operand_back_to_its_input_spec_through_the_ops(mesh):
    with pytest.raises(sp.ShardingConflictError) as info:
        square = jax.ShapeDtypeStruct((8, 8), jnp.float32)
        compile(deep, (P("i"), P(None, "j"), None), mesh, square, square, square)
    line = deep.__code__.co_firstlineno
    here = __file__.rsplit("/", 1)[-1]
    message = str(info.value)
    assert (f"axis 0 @i: argument a has spec P('i',), via `tanh` at {here}:{line + 1} -> `mul` at "
            f"{here}:{line + 1}") in message
    assert (f"axis 0 @j: argument b has spec P(None, 'j'), via `add` at {here}:{line + 2} -> `transpose` at "
            f"{here}:{line + 2}") in message


def test_one_mesh_axis_may_not_shard_two_axes_of_a_result(mesh):
    with pytest.raises(sp.ShardingConflictError, match="mesh axis 'i' would shard both output axes 0 and 1"):
        compile(add, (P("i", None), P(None, "i")), mesh)


@pytest.mark.parametrize("specs,error,pattern", [
    ((P("x"), None), sp.UnknownMeshAxisError,
     "argument a: spec P('x',) names mesh axis 'x', but the mesh has axes ('i', 'j')"),
    ((P("i", "j", None), None), sp.SpecRankError,
     "argument a: spec P('i', 'j', None) has 3 entries but the argument has rank 2"),
    ((P("i", "i"), None), sp.DuplicateMeshAxisError, "argument a: spec P('i', 'i') uses mesh axis 'i' for two"),
    ((None, P(None, ("i", "j")) ), None, None),
    ((P("i"), P(None), P()), sp.SpecTreeError, "is not a pytree prefix of the arguments"),
    (("i", None), sp.SpecTreeError, "neither a PartitionSpec nor None"),
])
def test_bad_specs(specs, error, pattern, mesh):
    if error is None:  # (None, P(None, ("i", "j"))) is fine: 8 columns over 8 devices
        compile(add, specs, mesh)
        return
    with pytest.raises(error, match=re.escape(pattern)):
        compile(add, specs, mesh)


def test_out_specs_whose_axis_their_mesh_axes_do_not_divide(mesh):
    # (an argument or a constraint whose axis does not divide is laid out in ranges, as jax.jit pads it:
    # tests/ops/test_constraints.py; a returned array's blocks must divide it, as jax.jit's out_shardings)
    with pytest.raises(sp.IndivisibleAxisError, match=re.escape("axis 0 has size 6, not divisible by 4 (mesh axes i")):
        sp.autoshard(lambda a: a[:6], mesh=mesh, in_specs=(None,), out_specs=P("i")).trace(A)


def test_every_error_is_a_sharding_error_and_exported():
    import inspect

    import shardprop.errors as errors

    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass) if c.__module__ == errors.__name__]
    exceptions = [c for c in classes if issubclass(c, BaseException)]
    warnings_ = {c for c in exceptions if issubclass(c, Warning)}
    assert sp.ConflictKind.REUSE == "reuse"  # an enum of strings, not an exception
    assert {c.__name__ for c in warnings_} == {"FallbackWarning", "ReshardWarning", "StrategyWarning"}
    assert len(exceptions) >= 18
    for error in set(exceptions) - warnings_:
        assert issubclass(error, sp.ShardingError), error
        assert getattr(sp, error.__name__) is error, f"{error.__name__} is not exported as sp.{error.__name__}"


def test_a_conflict_error_carries_the_op_the_line_and_the_layouts(mesh):
    a = jax.ShapeDtypeStruct((16, 8), jnp.float32)
    with pytest.raises(sp.ShardingConflictError) as caught:
        sp.propagate(sp.trace(lambda x, y: x + y, a, a), (P("i", "j"), P("j", "i")), mesh=mesh, conflicts="error")
    err = caught.value
    assert err.op == "add" and err.source.rsplit("/", 1)[-1].startswith("test_errors.py:")
    assert err.kind is sp.ConflictKind.MISMATCH and sorted(err.layouts) == [("i",), ("j",)]


def test_mesh_errors():
    with pytest.raises(sp.MeshError, match="needs 16 devices but only 8 exist"):
        sp.make_mesh((4, 4), ("i", "j"))
    with pytest.raises(sp.MeshError, match="distinct"):
        sp.make_mesh((2, 2), ("i", "i"))


def test_autoshard_and_program_say_what_they_are(mesh):
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    def scaled(a, b):
        return a * b

    fs = sp.autoshard(scaled, mesh=mesh, in_specs=(P("i", "j"), None))
    assert repr(fs).startswith("<autoshard ") and "scaled" in repr(fs) and "0 programs traced" in repr(fs)
    prog = fs.trace(jnp.ones((16, 8)), jnp.ones((16, 8)))
    assert "1 program traced" in repr(fs) and "{'i': 4, 'j': 2}" in repr(fs)
    assert repr(prog) == ("<Program 1 stage, 3 nodes, strategy auto, on mesh {'i': 4, 'j': 2}; inputs "
                          "a: f32[16,8]@P('i', 'j'), b: f32[16,8]@P('i', 'j')>")


def test_a_conflict_inside_a_library_is_reported_at_the_users_line_that_called_it(mesh):
    """optax's `p + u` is where the conflict is, but the user wrote the call: the warning names both and is
    attributed to the user's line (so a warnings filter on the user's module sees it); the error says so too."""
    import warnings

    optax = pytest.importorskip("optax")
    w = np.ones((16, 16), np.float32)

    def step(w, u):
        return optax.apply_updates(w, u.T)

    line = step.__code__.co_firstlineno + 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = sp.autoshard(step, mesh=mesh, in_specs=(P(None, "j"), P(None, "j")))(w, w * 2)
    np.testing.assert_array_equal(np.asarray(out), w + (w * 2).T)
    (warning,) = [c for c in caught if c.category is sp.ReshardWarning]
    assert warning.filename.endswith("test_errors.py") and warning.lineno == line
    assert f"at update.py:42 (called from test_errors.py:{line})" in str(warning.message)
    with pytest.raises(sp.ShardingConflictError, match=rf"update.py:42 \(called from .*test_errors.py:{line}\)"):
        sp.autoshard(step, mesh=mesh, in_specs=(P(None, "j"), P(None, "j")), conflicts="error")(w, w)
