"""Models written with real libraries — flax (linen), equinox, haiku, optax — sharded data-parallel: each training
step equals the unsharded one, and its compiled collectives move no more bytes per device than jax.jit's with the
same input shardings. The builders are the benchmark's (``shardprop.bench.libraries``), at small sizes."""

import pytest

import shardprop as sp
from shardprop.bench import libraries
from shardprop.bench.workloads import MESHES
from tests.conftest import assert_same_as_unsharded

# (id, builder, the libraries it imports)
CASES = [
    ("flax_cnn_batchnorm_sgd", libraries.flax_cnn("data", "sgd", small=True), ("flax", "optax")),
    ("flax_embedding_classifier_adam", libraries.flax_embedding("data", small=True), ("flax", "optax")),
    ("equinox_mlp_adam", libraries.equinox_mlp("data", small=True), ("equinox", "optax")),
    ("haiku_convnet_sgd", libraries.haiku_convnet("data", small=True), ("haiku", "optax")),
]


@pytest.fixture(scope="module")
def data_mesh():
    return sp.make_mesh(*MESHES["data"])


@pytest.mark.parametrize("name,build,modules", CASES, ids=[c[0] for c in CASES])
def test_library_train_step_equals_unsharded_and_moves_no_more_than_jit(name, build, modules, data_mesh):
    for module in modules:
        pytest.importorskip(module)
    f, args, specs = build()
    prog = assert_same_as_unsharded(f, args, mesh=data_mesh, in_specs=specs, rtol=2e-4, atol=2e-5)
    assert not prog.sharded.fallbacks
    comparison = sp.compare_with_jit(f, data_mesh, specs, *args, program=prog)
    assert comparison.jit_bytes > 0  # the gradients are summed over the batch: something moves
    assert comparison.shardprop_bytes <= comparison.jit_bytes, str(comparison)
