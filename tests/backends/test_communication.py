"""Collectives read from compiled HLO, our estimate before compiling, and the comparison with jax.jit."""

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

import shardprop as sp
from shardprop.examples import attention, layernorm, mlp
from shardprop.backends.hlo import _groups, parse_hlo
from shardprop.core.transfers import total_moved
from tests.functions import nx_example

S = jax.ShapeDtypeStruct


@pytest.mark.parametrize("text,axes,size", [
    ("replica_groups={{0,1},{2,3},{4,5},{6,7}}, use_global_device_ids=true", ("j",), 2),
    ("replica_groups={{0,2,4,6},{1,3,5,7}}, use_global_device_ids=true", ("i",), 4),
    ("replica_groups=[4,2]<=[8], use_global_device_ids=true", ("j",), 2),
    ("replica_groups=[2,4]<=[4,2]T(1,0), use_global_device_ids=true", ("i",), 4),
    ("replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_1'}, use_global_device_ids=true", ("j",), 2),
    ("replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_0', 'axis_1'}, use_global_device_ids=true", ("i", "j"), 8),
    ("replica_groups=mesh['axis_0'=2,'axis_1'=1,'axis_2'=4], device_ids=([4,2]T(1,0)) {'axis_0'}, dims", ("j",), 2),
    ("replica_groups=mesh['axis_0'=2,'axis_1'=1,'axis_2'=4], device_ids=([4,2]T(1,0)) {'axis_2'}, dims", ("i",), 4),
    # a sub-axis (Shardy's 'name':(pre-size)size): XLA exchanging data over part of a mesh axis
    ("replica_groups=mesh['axis_0'=2,'axis_1'=4], device_ids=([2,2,2]T(0,2,1)) {'axis_1':(2)2}, ch", ("i",), 2),
    ("replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_0':(1)2}, ch", ("i",), 2),
])
def test_replica_groups_in_every_spelling_name_our_mesh_axes(text, axes, size):
    assert _groups(text, ("i", "j"), (4, 2)) == (axes, size)


def test_parse_hlo_reads_kind_shape_bytes_and_async_collectives_once(mesh):
    hlo = "\n".join([
        "  %ar = f32[256]{0} all-reduce(%x), channel_id=1, replica_groups={{0,1},{2,3},{4,5},{6,7}}, to_apply=%add",
        "  %ags = (f32[4,8]{1,0}, f32[16,8]{1,0}) all-gather-start(%y), replica_groups=[2,4]<=[4,2]T(1,0), dims={0}",
        "  %agd = f32[16,8]{1,0} all-gather-done(%ags)",
        "  %add = f32[256]{0} add(%ar, %ar)",
    ])
    (ar, ag) = parse_hlo(hlo, mesh)
    assert (ar.kind, ar.mesh_axes, ar.shape, ar.bytes, ar.moved_bytes) == ("all-reduce", ("j",), (256,), 1024, 1024)
    assert (ag.kind, ag.mesh_axes, ag.shape, ag.bytes) == ("all-gather", ("i",), (16, 8), 512)
    assert ag.moved_bytes == 512 * 3 / 4


def test_parse_hlo_counts_every_array_of_a_combined_collective(mesh):
    """XLA combines all-reduces into one over a tuple; from the sixth element on, the tuple's type carries
    ``/*index=5*/`` comments (those collectives were once dropped from the count, on both sides)."""
    arrays = ", ".join(("/*index=5*/" if k == 5 else "") + "f32[16,16]{1,0}" for k in range(7))
    hlo = f"  %all-reduce.6 = ({arrays}) all-reduce(%a, %b, %c, %d, %e, %f, %g), channel_id=1, " \
          "replica_groups=[2,4]<=[4,2]T(1,0), use_global_device_ids=true, to_apply=%add"
    (ar,) = parse_hlo(hlo, mesh)
    assert (ar.kind, ar.mesh_axes, ar.arrays, ar.bytes) == ("all-reduce", ("i",), 7, 7 * 16 * 16 * 4)
    assert "7 arrays (f32[16, 16], ...)" in str(ar)
    # a combined async start, ((operands), (results)): the results; a permute's context scalars are not data
    started = "\n".join([
        "  %ags = ((f32[4,8]{1,0}, f32[4,8]{1,0}), (f32[16,8]{1,0}, f32[16,8]{1,0})) all-gather-start(%x, %y), "
        "replica_groups=[2,4]<=[4,2]T(1,0), dims={0}",
        "  %cps = (f32[16,8]{1,0}, f32[16,8]{1,0}, u32[], u32[]) collective-permute-start(%x), "
        "source_target_pairs={{0,1},{1,0}}",
    ])
    ag, cp = parse_hlo(started, mesh)
    assert (ag.kind, ag.arrays, ag.shape, ag.bytes) == ("all-gather", 2, (16, 8), 2 * 16 * 8 * 4)
    assert (cp.kind, cp.arrays, cp.bytes) == ("collective-permute", 1, 16 * 8 * 4)


def test_parse_hlo_reads_long_tuples_in_linear_time(mesh):
    """A 40-array tuple feeding an op that is not a collective: no match, found at once (a pattern with a nested
    quantifier once backtracked exponentially here and hung compare_with_jit)."""
    arrays = ", ".join(f"{'/*index=5*/' if k == 5 else ''}f32[8,8]{{1,0}}" for k in range(40))
    assert parse_hlo(f"  %t = ({arrays}) tuple(%a), metadata={{op_name=\"x\"}}", mesh) == []


def test_combined_weight_gradients_are_counted_against_jit(mesh):
    """Six weight gradients summed over the sharded batch: jax.jit combines them into one all-reduce of a
    6-tuple; its bytes count (they were reported as 0)."""
    def f(x, *ws):
        return jax.grad(lambda ws: sum(jnp.sum(jnp.tanh(x @ w)) for w in ws))(ws)

    ws = tuple(jnp.full((16, 16), 0.01 * k) for k in range(6))
    comparison = sp.compare_with_jit(f, mesh, (P("i"),) + (None,) * 6, jnp.ones((8, 16)), *ws)
    assert comparison.jit_bytes >= 6 * 16 * 16 * 4 * 2 * 3 / 4 * 0.99  # an all-reduce over 4 of 6 [16, 16]
    assert 0 < comparison.shardprop_bytes <= comparison.jit_bytes, str(comparison)


@pytest.mark.parametrize("strategy", ["gather", "collective", "auto"])
def test_estimate_matches_the_compiled_program_for_the_nx_example(strategy, mesh):
    a = S((1024, 1024), jnp.float32)
    prog = sp.autoshard(nx_example, mesh=mesh, in_specs=(P("i", "j"), P("i", "j")), strategy=strategy).trace(a, a)
    key = lambda t: (t.kind, t.mesh_axes, t.shape, t.bytes)  # noqa: E731
    assert sorted(map(key, prog.communication())) == sorted(map(key, prog.estimated_communication()))


MLP = mlp.init_params((256, 512, 128))
MLP_SPECS = ([{"w": P(None, "j"), "b": P("j")}, {"w": P("j", None), "b": P()}], P("i"), P("i"))
MLP_ARGS = (MLP, S((256, 256), jnp.float32), S((256,), jnp.int32))
BLOCK = attention.init_block(d_model=128, n_heads=4, d_ff=256)
COL, ROW = P(None, "j"), P("j", None)
BLOCK_SPECS = ({"wq": COL, "wk": COL, "wv": COL, "wo": ROW, "w1": COL, "b1": P("j"), "w2": ROW, "b2": None,
                "ln1_g": None, "ln1_b": None, "ln2_g": None, "ln2_b": None}, P("i"))
LN_ARGS = (S((256, 512), jnp.float32), S((512,), jnp.float32), S((512,), jnp.float32))

# (id, function, in_specs, args): the shard_map doc's matmuls, the Nx example and the shardprop/examples/ workloads.
VERSUS_JIT = [
    ("nx_example", nx_example, (P("i", "j"), P("i", "j")), (S((1024, 1024), jnp.float32),) * 2),
    ("matmul_basic", lambda a, b: a @ b, (P("i", "j"), P("j", None)), (S((256, 512), jnp.float32),
                                                                        S((512, 256), jnp.float32))),
    ("matmul_reduce_scatter", lambda a, b, c: (a @ b) * c, (P("i", "j"), P("j", None), P("i", "j")),
     (S((256, 512), jnp.float32), S((512, 256), jnp.float32), S((256, 256), jnp.float32))),
    ("mlp_loss", mlp.loss, MLP_SPECS, MLP_ARGS),
    ("mlp_grad", jax.grad(mlp.loss), MLP_SPECS, MLP_ARGS),
    ("layer_norm_dp", layernorm.layer_norm, (P("i"), None, None), LN_ARGS),
    ("layer_norm_2d", layernorm.layer_norm, (P("i", "j"), None, None), LN_ARGS),
    ("transformer_block_tp", attention.transformer_block, BLOCK_SPECS, (BLOCK, S((16, 64, 128), jnp.float32))),
    # a tensor-parallel layer's weight gradient over a sharded batch: both free axes over j, the batch summed
    ("weight_grad_2d", lambda h, c: h.T @ c, (P("i", "j"), P("i", "j")), (S((64, 32), jnp.float32),) * 2),
]


@pytest.mark.parametrize("name,f,specs,args", VERSUS_JIT, ids=[c[0] for c in VERSUS_JIT])
def test_auto_moves_no_more_bytes_than_jax_jit(name, f, specs, args, mesh):
    comparison = sp.compare_with_jit(f, mesh, specs, *args)
    assert comparison.shardprop_bytes <= comparison.jit_bytes, str(comparison)
    # and our cost model, before compiling, saw the traffic XLA compiled (within 1%: XLA drops collectives
    # whose results are dead, such as the loss's all-reduce in a gradient-only program)
    estimate = total_moved(comparison.program.estimated_communication())
    assert estimate == pytest.approx(comparison.shardprop_bytes, rel=0.01)


def test_comparison_prints_both_programs_side_by_side(mesh):
    text = str(sp.compare_with_jit(nx_example, mesh, (P("i", "j"), P("i", "j")), *(S((64, 64), jnp.float32),) * 2))
    assert "shardprop" in text and "jax.jit" in text
    assert text.count("all-reduce over") == 4


def test_a_comparison_reads_a_traced_program_as_it_is_and_refuses_one_on_another_mesh(mesh, meshes):
    args = (S((64, 64), jnp.float32),) * 2
    program = sp.autoshard(nx_example, mesh=mesh, in_specs=(P("i", "j"), P("i", "j"))).trace(*args)
    comparison = sp.compare_with_jit(nx_example, mesh, (P("i", "j"), P("i", "j")), *args, program=program)
    assert comparison.program is program
    assert str(comparison) == str(sp.compare_with_jit(nx_example, mesh, (P("i", "j"), P("i", "j")), *args))
    with pytest.raises(sp.OptionError, match=r"the program runs on mesh \{'i': 4, 'j': 2\}.*comparison is on mesh "
                                              r"\{'i': 2, 'j': 4\}"):
        sp.compare_with_jit(nx_example, meshes["2x4"], (P("i", "j"), P("i", "j")), *args, program=program)


@pytest.mark.parametrize("strategy", ["gather", "collective", "auto"])
def test_a_value_whose_mesh_axes_change_tensor_axes_moves_by_all_to_all(strategy, mesh):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sp.ReshardWarning)
        prog = sp.autoshard(lambda x: x + x.T, mesh=mesh, in_specs=(P("i"),), strategy=strategy).trace(
            S((256, 256), jnp.float32))
    key = lambda t: (t.kind, t.mesh_axes, t.bytes, t.moved_bytes)  # noqa: E731
    measured = list(map(key, prog.communication()))
    assert measured == list(map(key, prog.estimated_communication()))
    assert measured == [("all-to-all", ("i",), 256 * 64 * 4, 256 * 64 * 4 * 3 / 4)]  # a quarter of a gather
    assert "b:f32[256@i,256] = all_to_all[i axis=1->0] b" in str(prog.graph)  # the move, in the listing
