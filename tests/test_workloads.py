"""Real workloads from shardprop/examples/, sharded by autoshard under data, tensor and 2-D parallelism on three
meshes, each equal to the unsharded function; and every primitive they use has a real rule."""

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import shardprop as sp
from shardprop.examples import attention, convnet, layernorm, mlp
from shardprop.ops import Family, has_record, lookup
from tests.conftest import assert_same_as_unsharded

RNG = np.random.default_rng(7)
X = RNG.normal(size=(16, 32)).astype(np.float32)
LABELS = RNG.integers(0, 10, size=16).astype(np.int32)
MLP = mlp.init_params()
GAMMA = (1 + 0.1 * RNG.normal(size=32)).astype(np.float32)
BETA = (0.1 * RNG.normal(size=32)).astype(np.float32)
SEQ = RNG.normal(size=(8, 16, 32)).astype(np.float32)
BLOCK = attention.init_block()
IMAGES = RNG.normal(size=(8, 16, 16, 3)).astype(np.float32)
CONV = convnet.init_convnet()


def mlp_specs(batch, hidden):
    return [{"w": P(None, hidden), "b": P(hidden)}, {"w": P(hidden, None), "b": P()}], P(batch), P(batch)


def block_specs(hidden):
    col, row = P(None, hidden), P(hidden, None)
    return {"wq": col, "wk": col, "wv": col, "wo": row, "w1": col, "b1": P(hidden), "w2": row, "b2": None,
            "ln1_g": None, "ln1_b": None, "ln2_g": None, "ln2_b": None}


def conv_specs(features):
    return {"convs": [P(None, None, None, features)] * 2, "dense": None}


# (workload id, function, args, mesh, in_specs) — data parallel, tensor parallel, and 2-D for each workload.
WORKLOADS = [
    ("mlp_forward_dp", mlp.forward, (MLP, X), "8", (None, P("i"))),
    ("mlp_forward_tp", mlp.forward, (MLP, X), "4x2", (mlp_specs(None, "j")[0], None)),
    ("mlp_forward_2d", mlp.forward, (MLP, X), "2x2x2", (mlp_specs(None, "k")[0], P(("i", "j")))),
    ("mlp_loss_dp", mlp.loss, (MLP, X, LABELS), "8", (P(), P("i"), P("i"))),
    ("mlp_loss_tp", mlp.loss, (MLP, X, LABELS), "4x2", mlp_specs(None, "j")),
    ("mlp_loss_2d", mlp.loss, (MLP, X, LABELS), "4x2", mlp_specs("i", "j")),
    ("mlp_loss_2d_3axes", mlp.loss, (MLP, X, LABELS), "2x2x2", mlp_specs(("i", "j"), "k")),
    ("mlp_train_step_dp", mlp.train_step, (MLP, X, LABELS), "8", (P(), P("i"), P("i"))),
    ("mlp_train_step_tp", mlp.train_step, (MLP, X, LABELS), "4x2", mlp_specs(None, "j")),
    ("mlp_train_step_2d", mlp.train_step, (MLP, X, LABELS), "2x2x2", mlp_specs(("i", "j"), "k")),
    ("layer_norm_dp", layernorm.layer_norm, (X, GAMMA, BETA), "8", (P("i"), None, None)),
    ("layer_norm_tp", layernorm.layer_norm, (X, GAMMA, BETA), "4x2", (P(None, "j"), P("j"), None)),
    ("layer_norm_2d", layernorm.layer_norm, (X, GAMMA, BETA), "2x2x2", (P(("i", "j"), "k"), None, None)),
    ("softmax_dp", layernorm.softmax, (X,), "8", (P("i"),)),
    ("softmax_tp", layernorm.softmax, (X,), "4x2", (P(None, "j"),)),
    ("softmax_2d", layernorm.softmax, (X,), "2x2x2", (P("i", ("j", "k")),)),
    ("attention_dp", attention.multi_head_attention,
     (SEQ, BLOCK["wq"], BLOCK["wk"], BLOCK["wv"], BLOCK["wo"]), "8", (P("i"), None, None, None, None)),
    ("attention_tp", attention.multi_head_attention,
     (SEQ, BLOCK["wq"], BLOCK["wk"], BLOCK["wv"], BLOCK["wo"]), "4x2",
     (None, P(None, "j"), P(None, "j"), P(None, "j"), P("j", None))),
    ("attention_2d", attention.multi_head_attention,
     (SEQ, BLOCK["wq"], BLOCK["wk"], BLOCK["wv"], BLOCK["wo"]), "2x2x2",
     (P(("i", "j")), P(None, "k"), P(None, "k"), P(None, "k"), P("k", None))),
    ("transformer_dp", attention.transformer_block, (BLOCK, SEQ), "8", (None, P("i"))),
    ("transformer_tp", attention.transformer_block, (BLOCK, SEQ), "4x2", (block_specs("j"), None)),
    ("transformer_2d", attention.transformer_block, (BLOCK, SEQ), "4x2", (block_specs("j"), P("i"))),
    ("transformer_2d_3axes", attention.transformer_block, (BLOCK, SEQ), "2x2x2", (block_specs("k"), P(("i", "j")))),
    ("convnet_dp", convnet.convnet, (CONV, IMAGES), "8", (None, P("i"))),
    ("convnet_tp", convnet.convnet, (CONV, IMAGES), "4x2", (conv_specs("j"), None)),
    ("convnet_2d", convnet.convnet, (CONV, IMAGES), "2x2x2", (conv_specs("k"), P(("i", "j")))),
]


@pytest.mark.parametrize("name,f,args,mesh_name,specs", WORKLOADS, ids=[w[0] for w in WORKLOADS])
def test_workload_equals_unsharded(name, f, args, mesh_name, specs, meshes, traced):
    mesh = meshes[mesh_name]
    prog = assert_same_as_unsharded(f, args, mesh=mesh, in_specs=specs, rtol=2e-4, atol=2e-5,
                                    program=traced(f, args, mesh=mesh, in_specs=specs, strategy="auto"))
    assert not prog.sharded.fallbacks


def test_sharding_is_kept_where_it_should_be(meshes):
    """Data parallelism keeps the batch sharded end to end; tensor parallelism keeps the hidden units."""
    prog = sp.autoshard(mlp.forward, mesh=meshes["8"], in_specs=(None, P("i"))).trace(MLP, X)
    assert prog.out_specs == (P("i"),) and len(prog.stages) == 1
    prog = sp.autoshard(attention.transformer_block, mesh=meshes["4x2"], in_specs=(None, P("i"))).trace(BLOCK, SEQ)
    assert prog.out_specs == (P("i"),) and len(prog.stages) == 1
    prog = sp.autoshard(convnet.convnet, mesh=meshes["8"], in_specs=(None, P("i"))).trace(CONV, IMAGES)
    assert prog.out_specs == (P("i"),) and len(prog.stages) == 1


def test_every_primitive_in_the_examples_has_a_real_rule():
    used = set()
    for _, f, args, _, _ in WORKLOADS:
        used.update(n.op for n in sp.trace(f, *args).nodes)
    used -= {"parameter", "constant"}
    assert used, "no primitives collected"
    missing = sorted(p for p in used if not has_record(p))
    assert not missing, f"primitives without a rule: {missing}"
    conservative = sorted(p for p in used if lookup(p).family is Family.RANDOM)
    assert not conservative, f"primitives with only the conservative rule: {conservative}"
