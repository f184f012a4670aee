"""Lowering to shard_map: the program, each stage on its own, lower(), argument checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardprop as sp
from tests.functions import nx_example
from tests.conftest import random_args


@pytest.fixture
def nx(mesh):
    a, b = random_args([((16, 8), np.float32)] * 2)
    fs = sp.autoshard(nx_example, mesh=mesh, in_specs=(P("i", "j"), P("i", "j")), strategy="gather")
    return fs, a, b


def test_output_is_a_jax_array_sharded_on_the_mesh(nx, mesh):
    fs, a, b = nx
    out = fs(a, b)
    assert isinstance(out, jax.Array)
    assert out.sharding.is_equivalent_to(NamedSharding(mesh, P("i", "j")), 2)
    np.testing.assert_allclose(out, nx_example(a, b), rtol=1e-5, atol=1e-5)


def test_each_stage_runs_on_its_own(nx):
    fs, a, b = nx
    prog = fs.trace(a, b)
    x, y = prog.stage(0)(a, b)
    np.testing.assert_allclose(x, a + b, rtol=1e-6)
    np.testing.assert_allclose(y, a - b, rtol=1e-6)
    (out,) = prog.stage(1)(x, y)
    np.testing.assert_allclose(out, nx_example(a, b), rtol=1e-5, atol=1e-5)
    with pytest.raises(sp.InputMismatchError, match=r"stage 1 takes \(c:f32\[16@i,8@j\], d:f32\[16@i,8@j\]\)"):
        prog.stage(1)(x)
    with pytest.raises(sp.InputMismatchError, match="stage 0 takes"):
        prog.stage(0)(a, b[:8])


def test_lower_returns_jax_lowered_with_readable_hlo(nx):
    fs, a, b = nx
    lowered = fs.trace(a, b).lower(a, b)
    assert isinstance(lowered, jax.stages.Lowered)
    hlo = lowered.compile().as_text()
    assert "all-gather" in hlo  # the gathers between the two stages
    spec_args = [jax.ShapeDtypeStruct(a.shape, a.dtype)] * 2
    assert isinstance(fs.lower(*spec_args), jax.stages.Lowered)


def test_trace_accepts_shape_dtype_structs(nx):
    fs, a, b = nx
    prog = fs.trace(jax.ShapeDtypeStruct((16, 8), jnp.float32), jax.ShapeDtypeStruct((16, 8), jnp.float32))
    np.testing.assert_allclose(prog(a, b), nx_example(a, b), rtol=1e-5, atol=1e-5)
    assert fs.trace(a, b) is prog  # one program per argument shapes


def test_calling_a_program_with_other_shapes_or_dtypes_is_a_clear_error(nx):
    fs, a, b = nx
    prog = fs.trace(a, b)
    with pytest.raises(sp.InputMismatchError, match=r"argument leaf 1 \(b\): got f32\[8,8\], traced with f32\[16,8\]"):
        prog(a, b[:8])
    with pytest.raises(sp.InputMismatchError, match=r"got i32\[16,8\], traced with f32\[16,8\]"):
        prog(a, b.astype(np.int32))
    with pytest.raises(sp.InputMismatchError, match="structure"):
        prog((a, b))
    with pytest.raises(sp.InputMismatchError, match=r"use program.lower"):
        prog(a, jax.ShapeDtypeStruct((16, 8), jnp.float32))


def test_autoshard_retraces_for_new_shapes(nx):
    fs, a, b = nx
    out = fs(a[:8], b[:8])
    np.testing.assert_allclose(out, nx_example(a[:8], b[:8]), rtol=1e-5, atol=1e-5)


def test_step_by_step_api_equals_autoshard(nx, mesh):
    _, a, b = nx
    graph = sp.trace(nx_example, a, b)
    sharded = sp.propagate(graph, (P("i", "j"), None), mesh=mesh)
    plan = sp.split(sharded, strategy="gather")
    prog = sp.lower(plan, mesh)
    np.testing.assert_allclose(prog(a, b), nx_example(a, b), rtol=1e-5, atol=1e-5)


def test_identity_and_constant_outputs(mesh):
    def f(a):
        return a, jnp.array([1.0, 2.0, 3.0]), a * 2

    (a,) = random_args([((8, 8), np.float32)])
    fs = sp.autoshard(f, mesh=mesh, in_specs=P("i"))
    for got, want in zip(fs(a), f(a), strict=True):
        np.testing.assert_allclose(got, want)


def test_a_mesh_with_explicit_axes_works_too():
    explicit = jax.make_mesh((4, 2), ("i", "j"))  # jax's default: AxisType.Explicit
    a, b = random_args([((16, 8), np.float32)] * 2)
    fs = sp.autoshard(nx_example, mesh=explicit, in_specs=(P("i", "j"), None))
    np.testing.assert_allclose(fs(a, b), nx_example(a, b), rtol=1e-5, atol=1e-5)


def test_something_other_than_a_mesh_is_a_mesh_error():
    with pytest.raises(sp.MeshError, match="expected a jax.sharding.Mesh"):
        sp.autoshard(nx_example, mesh=(4, 2), in_specs=None).trace(*random_args([((16, 8), np.float32)] * 2))


def test_what_has_no_record_runs_as_under_jit(mesh, capsys):
    """A shard_map of the user's, a host callback, jax.debug.print: run outside shard_map, on whole arrays,
    they behave as under jax.jit (before, they were bound on every device's block, or failed to lower)."""
    import warnings

    from jax import lax

    a = np.arange(128, dtype=np.float32).reshape(16, 8)

    def kernel(x):
        return jax.shard_map(lambda u: lax.psum(u, "i"), mesh=mesh, in_specs=P("i"), out_specs=P())(x) * 3

    def callback(x):
        return jax.pure_callback(lambda y: np.asarray(y) * 2, jax.ShapeDtypeStruct(x.shape, x.dtype), x) + x

    def printing(x):
        jax.debug.print("total {}", x.sum())
        return x * 2

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sp.FallbackWarning)
        for f in (kernel, callback, printing):
            prog = sp.autoshard(f, mesh=mesh, in_specs=(P("i"),)).trace(a)
            np.testing.assert_allclose(prog(a), f(jnp.asarray(a)), rtol=1e-6)
            assert any(s.outside_shard_map for s in prog.stages)
    jax.effects_barrier()
    assert capsys.readouterr().out.count("total 8128.0") == 2  # once for shardprop's run, once for jnp's
