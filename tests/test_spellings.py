"""jax.jit's spellings and habits (shardprop/spellings.py, issue #31): NamedSharding leaves, in_shardings= /
out_shardings=, the mesh of jax.set_mesh, the decorator form, an unannotated argument keeping its array's own layout
(jax.jit's rule, checked against jax.jit itself), and a training step compiling once when fed its own outputs
(compiles counted, not timed, against jax.jit's count). Every value against the unsharded function."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardprop as sp
from shardprop.bench import models

X = np.linspace(-1, 2, 128, dtype=np.float32).reshape(16, 8)


def close(got, want):
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6)


def layer(x):
    return jnp.tanh(x) * 2


class Compiles:
    """Counts XLA backend compiles, as JAX's monitoring reports them: an executable compiled, or read from the
    persistent compilation cache the suite keeps (tests/conftest.py) in its place."""

    def __init__(self):
        self.count = 0
        jax.monitoring.register_event_duration_secs_listener(self._heard)
        jax.monitoring.register_event_listener(self._read)

    def _heard(self, event, duration, **_):
        if event == "/jax/core/compile/backend_compile_duration":
            self.count += 1

    def _read(self, event, **_):
        if event == "/jax/compilation_cache/cache_hits":
            self.count += 1


COMPILES = Compiles()


def compiles_of(run) -> int:
    before = COMPILES.count
    run()
    return COMPILES.count - before


@pytest.mark.parametrize("spelling", ["in_shardings", "named_in_specs"])
def test_named_shardings_read_as_their_specs(mesh, spelling):
    sharding = NamedSharding(mesh, P("i", "j"))
    options = {"in_shardings": sharding} if spelling == "in_shardings" else {"in_specs": (sharding,)}
    fs = sp.autoshard(layer, mesh=mesh, out_shardings=NamedSharding(mesh, P("i")), **options)
    out = fs(X)
    close(out, layer(X))
    assert fs.trace(X).in_specs == (P("i", "j"),)
    assert out.sharding.spec == P("i")


def test_a_named_sharding_on_another_mesh_is_refused_naming_both(mesh, meshes):
    fs = sp.autoshard(layer, mesh=mesh, in_specs=NamedSharding(meshes["8"], P("i")))
    with pytest.raises(sp.MeshError) as info:
        fs(X)
    message = str(info.value)
    assert "{'i': 8}" in message and "{'i': 4, 'j': 2}" in message and "test_spellings.py" in message


def test_one_option_spelled_two_ways_is_refused(mesh):
    with pytest.raises(sp.OptionError, match="in_specs= and in_shardings= are one option"):
        sp.autoshard(layer, mesh=mesh, in_specs=P("i"), in_shardings=P("i"))


def test_the_mesh_comes_from_jax_set_mesh_or_the_named_shardings(mesh):
    fs = sp.autoshard(layer, in_specs=P("j"))
    with jax.set_mesh(mesh):
        out = fs(X)
    close(out, layer(X))
    assert out.sharding.spec == P("j") and dict(out.sharding.mesh.shape) == {"i": 4, "j": 2}
    from_sharding = sp.autoshard(layer, in_shardings=NamedSharding(mesh, P("i")))
    assert from_sharding(X).sharding.spec == P("i")


def test_no_mesh_anywhere_says_the_three_ways_to_give_one():
    with pytest.raises(sp.OptionError) as info:
        sp.autoshard(layer, in_specs=P("i"))(X)
    message = str(info.value)
    assert "mesh=" in message and "jax.set_mesh" in message and "NamedSharding" in message
    assert message.endswith(")") and "test_spellings.py" in message  # the call's line


def test_the_decorator_form(mesh):
    @sp.autoshard(mesh=mesh, in_specs=P("i"))
    def scaled(x, y):
        return x * y

    close(scaled(X, X), X * X)
    assert isinstance(scaled, sp.AutoSharded) and scaled.__name__ == "scaled"


@pytest.mark.parametrize("spec", [P("i", "j"), P("j"), P(None, "i"), P()])
def test_an_unannotated_array_keeps_its_layout_as_under_jax_jit(mesh, spec):
    x = jax.device_put(X, NamedSharding(mesh, spec))
    fs = sp.autoshard(layer, mesh=mesh, in_specs=None)
    out = fs(x)
    close(out, layer(X))
    assert out.sharding.spec == jax.jit(layer)(x).sharding.spec == spec  # jax.jit's rule is the oracle
    prog = fs.trace(x)
    assert prog.in_specs == (spec,) and prog.kept == frozenset({0})
    assert "<- x (its array's own layout)" in str(prog.stages)


def test_a_written_spec_wins_over_the_arrays_layout_and_moves_it(mesh):
    x = jax.device_put(X, NamedSharding(mesh, P("i", "j")))
    fs = sp.autoshard(layer, mesh=mesh, in_specs=P("j"))
    out = fs(x)
    close(out, layer(X))
    assert out.sharding.spec == P("j") and fs.trace(x).kept == frozenset()


def test_host_values_and_placed_arrays_of_one_layout_share_one_program(mesh):
    fs = sp.autoshard(layer, mesh=mesh, in_specs=None)
    close(fs(X), layer(X))  # a host value: adopts (nothing to meet: replicated)
    replicated = jax.device_put(X, NamedSharding(mesh, P()))
    assert compiles_of(lambda: close(fs(replicated), layer(X))) == 0
    sharded = jax.device_put(X, NamedSharding(mesh, P("i")))
    close(fs(sharded), layer(X))  # another layout: its own program
    assert len({id(p) for p in fs._programs.values()}) == 2


def test_a_training_step_fed_its_own_outputs_compiles_once_as_jax_jit_does(mesh):
    """Called on host parameters, then on its own outputs: calls 2 and 3 compile nothing, and the three no more
    than jax.jit with the same in_shardings compiles (it compiles call 2 again in jax 0.10.2)."""
    params = models.init_mlp((64, 64, 64))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 64)).astype(np.float32)
    labels = rng.integers(0, 64, size=32).astype(np.int32)
    layouts = ([{"w": P(None, "j"), "b": P("j")}, {"w": P("j", None), "b": P()}], P("i"), P("i"))
    step = sp.autoshard(models.mlp_train_step, mesh=mesh, in_specs=layouts)
    shardings = jax.tree_util.tree_map(lambda s: NamedSharding(mesh, s), layouts)
    jitted = jax.jit(models.mlp_train_step, in_shardings=shardings, out_shardings=(shardings[0], None))
    ours, theirs, want = params, params, params
    counts = {"shardprop": [], "jax.jit": []}
    for _ in range(3):
        counts["shardprop"].append(compiles_of(lambda p=ours: jax.block_until_ready(step(p, x, labels))))
        counts["jax.jit"].append(compiles_of(lambda p=theirs: jax.block_until_ready(jitted(p, x, labels))))
        ours, loss = step(ours, x, labels)
        theirs, _ = jitted(theirs, x, labels)
        want, want_loss = models.mlp_train_step(want, x, labels)
        close((ours, loss), (want, want_loss))
    assert counts["shardprop"][1:] == [0, 0] and counts["jax.jit"][2] == 0
    assert 1 <= sum(counts["shardprop"]) <= sum(counts["jax.jit"])
