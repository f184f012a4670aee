"""How a call reaches its compiled program (shardprop/dispatch.py, issue #26): every signature finds its own program
as jax.jit's cache finds it — also alternating between two, as train and eval batches do — and goes straight into
that program's jax.jit; Python runs first only where a cheap predicate says so (tracers, keyword and static
arguments, arrays committed elsewhere, donated copies); a failure is reported once and never run again. Every
result against the unsharded function."""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardprop as sp
from shardprop.program import Program
from shardprop.signature import Signature

X = np.linspace(-1, 2, 128, dtype=np.float32).reshape(16, 8)
W0 = np.linspace(0, 1, 64, dtype=np.float32).reshape(8, 8)
SPECS = (P(None, "j"), P("i"))


def sgd_step(w, x, lr=0.1):
    return w - lr * (x.T @ jnp.tanh(x @ w)), jnp.sum(x)


def placed(mesh, value, spec):
    return jax.device_put(jnp.asarray(value), NamedSharding(mesh, spec))


def close(got, want):
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6)


@pytest.fixture
def python_first(monkeypatch):
    """The calls that went through Python before the jit (``Program._call_checked``)."""
    calls = []
    real = Program._call_checked
    monkeypatch.setattr(Program, "_call_checked", lambda self, leaves: calls.append(1) or real(self, leaves))
    return calls


def test_alternating_signatures_each_hit_their_own_compiled_program(mesh, python_first):
    """Train and eval batches (16 and 8 rows) in turn: each signature traced by shardprop once and compiled by
    jax.jit once, every call straight into its program's jit (before: each call first tried the other's)."""
    traced = []

    def step(w, x):
        traced.append(x.shape)
        return sgd_step(w, x)

    fs = sp.autoshard(step, mesh=mesh, in_specs=SPECS)
    train, short = (W0, X), (W0, X[8:])
    for k in range(6):
        args = train if k % 2 == 0 else short
        close(fs(*args), sgd_step(*args))
        close(fs(*(placed(mesh, a, s) for a, s in zip(args, SPECS, strict=True))), sgd_step(*args))
    assert traced == [(16, 8), (8, 8)]
    programs = [fs.trace(*args) for args in (train, short)]
    # one executable each: NumPy arguments are put where the program reads them first, as placed ones arrive
    assert [p._jit._cache_size() for p in programs] == [1, 1]
    for k in range(4):  # the Programs themselves, in turn
        args = train if k % 2 == 0 else short
        close(programs[k % 2](*args), sgd_step(*args))
    assert python_first == []


def test_one_program_per_signature_whatever_the_arguments_are(mesh, python_first):
    fs = sp.autoshard(sgd_step, mesh=mesh, in_specs=SPECS)
    w, x = placed(mesh, W0, SPECS[0]), placed(mesh, X, SPECS[1])
    transposed = placed(mesh, X, P("j", "i"))  # laid out otherwise: moved inside the program, by XLA
    for args in ((W0, X), (w, x), (jnp.asarray(W0), X), (w, transposed), (W0, X.astype(np.float64))):
        close(fs(*args), sgd_step(W0, X))
    assert len({id(p) for p in fs._programs.values()}) == 1 and python_first == []
    assert fs(W0, X)[0].sharding.spec == P(None, "j")


def test_the_checks_raise_once_with_the_messages_they_always_had(monkeypatch, mesh, python_first):
    prog = sp.autoshard(sgd_step, mesh=mesh, in_specs=SPECS).trace(W0, X)
    checks = []
    real = Signature.check
    monkeypatch.setattr(Signature, "check", lambda self, got: checks.append(1) or real(self, got))
    with pytest.raises(sp.InputMismatchError) as info:
        prog(W0, X[:8])
    assert str(info.value) == ("arguments differ from the traced ones (trace again, or call the autoshard function, "
                               "which retraces per shape):\n  argument leaf 1 (x): got f32[8,8], traced with f32[16,8]")
    assert checks == [1] and python_first == []  # raised by the jit's trace, the call not tried another way
    with pytest.raises(sp.InputMismatchError, match=r"got i32\[16,8\], traced with f32\[16,8\]"):
        prog(W0, X.astype(np.int32))
    with pytest.raises(sp.InputMismatchError, match="arguments have structure"):
        prog((W0, X))
    with pytest.raises(sp.InputMismatchError, match="argument\\[1\\] is a str, not an array"):
        prog(W0, "x")
    with pytest.raises(sp.InputMismatchError, match="use program.lower"):
        prog(W0, jax.ShapeDtypeStruct((16, 8), jnp.float32))
    with pytest.raises(sp.TraceError, match="argument\\[1\\] is a str, not an array"):
        sp.autoshard(sgd_step, mesh=mesh, in_specs=SPECS)(W0, "x")


def test_a_failure_inside_a_run_is_reported_once_and_not_run_again(monkeypatch, mesh, python_first):
    """Before, a failed fast call was tried again on the checked path (running the program twice) unless it had
    consumed donated buffers; now a call runs once, and its failure is shardprop's LoweringError."""
    fs = sp.autoshard(sgd_step, mesh=mesh, in_specs=SPECS, donate_argnums=0)
    runs = []

    def planted(self, leaves):
        runs.append(1)
        raise RuntimeError("planted failure")

    monkeypatch.setattr(Program, "_run_in_trace", planted)
    x = placed(mesh, X, SPECS[1])
    with pytest.raises(sp.LoweringError, match="RuntimeError: planted failure"):
        fs(placed(mesh, W0, SPECS[0]), x)
    assert runs == [1] and python_first == []
    with pytest.raises(sp.LoweringError, match="RuntimeError: planted failure"):
        fs.trace(W0, X)(placed(mesh, W0, SPECS[0]), x)  # a Program: the same
    assert runs == [1, 1] and python_first == []


def test_a_donated_array_is_donated_by_the_jit_or_copied_and_invalidated(mesh, python_first):
    fs = sp.autoshard(sgd_step, mesh=mesh, in_specs=SPECS, donate_argnums=0)
    w, x = placed(mesh, W0, SPECS[0]), placed(mesh, X, SPECS[1])
    want = W0
    for _ in range(3):  # the training loop: the output takes the donated input's place
        previous, (w, _) = w, fs(w, x)
        want = sgd_step(want, X)[0]
        assert previous.is_deleted() and not x.is_deleted()
    close(w, want)
    assert python_first == []
    uncommitted = jnp.asarray(W0)  # copied onto the mesh first: the copy donated, the original invalidated
    close(fs(uncommitted, x)[0], sgd_step(W0, X)[0])
    assert uncommitted.is_deleted() and len(python_first) == 1
    with pytest.raises(sp.InputMismatchError, match="argument leaf 0 is an array that was deleted"):
        fs(previous, x)  # donated again (XLA would crash the process): refused in Python
    with pytest.raises(sp.InputMismatchError, match="donated, and the same array is also passed"):
        sp.autoshard(lambda a, b: a * 2 + b, mesh=mesh, in_specs=(P("i"), P("i")), donate_argnums=0)(x, x)
    assert not x.is_deleted()


def test_explicit_meshes_type_the_outputs_on_them_alternating_or_not(python_first):
    """jax.make_mesh's default (Explicit axes): the program runs on the axes made Auto and gives its outputs back
    typed on the user's mesh, with or without jax.set_mesh, NumPy or placed arguments, donating or not."""
    explicit = jax.make_mesh((4, 2), ("i", "j"))
    fs = sp.autoshard(sgd_step, mesh=explicit, in_specs=SPECS)
    donating = sp.autoshard(sgd_step, mesh=explicit, in_specs=SPECS, donate_argnums=0)
    for context in (contextlib.nullcontext(), jax.set_mesh(explicit)):
        with context:
            for rows in (16, 8, 16):
                want = sgd_step(W0, X[:rows])
                x = placed(explicit, X[:rows], SPECS[1])
                for f, args in ((fs, (W0, X[:rows])), (fs, (placed(explicit, W0, SPECS[0]), x)),
                                (donating, (placed(explicit, W0, SPECS[0]), x))):
                    new_w, total = f(*args)
                    close((new_w, total), want)
                    assert new_w.sharding == NamedSharding(explicit, P(None, "j"))
                    assert f is fs or args[0].is_deleted()
    assert python_first == []


def test_an_array_committed_to_other_devices_is_moved_onto_the_mesh_first(mesh, python_first):
    fs = sp.autoshard(sgd_step, mesh=mesh, in_specs=SPECS)
    elsewhere = jax.device_put(X, jax.devices()[1])  # jax.jit of a computation on the mesh refuses it
    close(fs(W0, elsewhere), sgd_step(W0, X))
    assert len(python_first) == 1


def test_transformations_go_through_python_and_apply_the_rules(mesh, python_first):
    def loss(x, w):
        return jnp.sum(jax.nn.relu(x @ w) ** 2)  # relu: a custom_jvp, differentiated by its rule

    fs = sp.autoshard(loss, mesh=mesh, in_specs=(P("i"), P(None, "j")))
    for rows in (16, 8, 16):
        x = X[:rows]
        close(jax.grad(fs, argnums=1)(x, W0), jax.grad(loss, argnums=1)(x, W0))
        close(jax.jit(fs)(x, W0), loss(x, W0))
        close(jax.vmap(fs, in_axes=(0, None))(np.stack([x, -x]), W0), jax.vmap(loss, in_axes=(0, None))(
            np.stack([x, -x]), W0))
    assert python_first and len(fs._programs) == 2


def test_keyword_and_static_arguments_find_their_program_as_positional_ones_do(mesh, python_first):
    traced = []

    def pooled(x, n, scale=1.0):
        return x.reshape(n, -1).sum(1) * scale

    def counted(x, n, scale=1.0):
        traced.append(n)
        return pooled(x, n, scale)

    fs = sp.autoshard(counted, mesh=mesh, in_specs=(P("i"),), static_argnums=1)
    for k in range(6):
        n = (4, 8)[k % 2]
        close(fs(X, n, scale=2.0), pooled(X, n, 2.0))
        close(fs(X, n), pooled(X, n))
    assert sorted(traced) == [4, 4, 8, 8] and python_first == []  # n x (with or without scale): one trace each


def test_a_program_compiles_once_for_its_call_its_hlo_its_memory_and_its_communication(mesh):
    """One executable per signature (issue #49): reading a called program's HLO, memory and collectives compiles
    nothing more, nor does calling it after reading them."""
    from tests.test_spellings import compiles_of

    fs = sp.autoshard(sgd_step, mesh=mesh, in_specs=SPECS)
    first = compiles_of(lambda: close(fs(W0, X), sgd_step(W0, X)))
    prog = fs.trace(W0, X)
    readings = compiles_of(lambda: (prog.hlo(), prog.memory(), prog.communication()))
    again = compiles_of(lambda: close(prog(W0, X), sgd_step(W0, X)))
    assert (first >= 1, readings, again) == (True, 0, 0)
