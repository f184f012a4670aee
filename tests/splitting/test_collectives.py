"""The "collective" strategy: reductions and contractions over sharded axes finished inside the stage with
psum/pmax/pmin — same results as the unsharded function, fewer stages, all-reduces instead of all-gathers."""

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

import shardprop as sp
from tests.functions import nx_example
from shardprop.splitting.ir import Move
from tests.ir import finishes, steps
from tests.conftest import MESH_SHAPES, assert_same_as_unsharded, covering, on_more_examples, random_args
from tests.test_workloads import WORKLOADS


def test_nx_example_is_one_stage_with_two_all_reduces(mesh):
    a, b = random_args([((16, 8), np.float32)] * 2)
    fs = sp.autoshard(nx_example, mesh=mesh, in_specs=(P("i", "j"), P("i", "j")), strategy="collective")
    np.testing.assert_allclose(fs(a, b), nx_example(a, b), rtol=1e-5, atol=1e-5)
    prog = fs.trace(a, b)
    assert len(prog.stages) == 1 and prog.out_specs == (P("i", "j"),)
    assert sorted((c.kind, c.mesh_axes) for c in prog.plan.collectives.values()) == [("psum", ("i",)),
                                                                                     ("psum", ("j",))]
    assert sorted(steps(prog)) == [("psum", ("i",)), ("psum", ("j",))]  # the IR's only collectives
    hlo = prog.lower(a, b).compile().as_text()
    assert "all-reduce" in hlo and "all-gather" not in hlo
    assert "psum[j] e -> e:f32[16@i], 16 B (finishes `reduce_sum`" in str(prog.stages)


def test_matmul_basic_from_the_shard_map_doc(mesh):
    a, b = random_args([((8, 16), np.float32), ((16, 32), np.float32)])
    fs = sp.autoshard(lambda a, b: a @ b, mesh=mesh, in_specs=(P("i", "j"), P("j", None)), strategy="collective")
    np.testing.assert_allclose(fs(a, b), a @ b, rtol=1e-5, atol=1e-5)
    prog = fs.trace(a, b)
    assert len(prog.stages) == 1 and prog.out_specs == (P("i"),)
    assert [(c.kind, c.mesh_axes) for c in prog.plan.collectives.values()] == [("psum", ("j",))]


@pytest.mark.parametrize("f,expected_kind", [
    (lambda a: jnp.max(a, axis=1), "pmax"),
    (lambda a: jnp.min(a, axis=0), "pmin"),
    (lambda a: jnp.sum(a * 2.0), "psum"),
    (lambda a: jnp.mean(a, axis=1), "psum"),
])
def test_reductions_finish_with_the_matching_collective(f, expected_kind, mesh):
    prog = assert_same_as_unsharded(f, random_args([((16, 8), np.float32)]), mesh=mesh, in_specs=P("i", "j"),
                                    strategy="collective")
    assert len(prog.stages) == 1
    assert {c.kind for c in prog.plan.collectives.values()} == {expected_kind}


@pytest.mark.parametrize("f,expected_kind", [
    (lambda a: jnp.any(a > 1.0, axis=1), "pmax"),
    (lambda a: jnp.all(a > -1.0, axis=0), "pmin"),
    (lambda a: jnp.max(a > 0.0, axis=1), "pmax"),
    (lambda a: jnp.min(a > 0.0), "pmin"),
])
def test_any_and_all_over_bools_finish_with_pmax_and_pmin(f, expected_kind, mesh):
    x = random_args([((16, 8), np.float32)], seed=3)[0]
    x[3, :] = 2.0  # one row all above 1, so any/all are neither all-True nor all-False
    prog = assert_same_as_unsharded(f, (x,), mesh=mesh, in_specs=P("i", "j"), strategy="collective")
    assert len(prog.stages) == 1
    assert {c.kind for c in prog.plan.collectives.values()} == {expected_kind}
    assert {t.kind for t in prog.communication()} == {"all-reduce"}  # in the compiled HLO too


def test_bitwise_and_or_over_integers_keep_their_gather(mesh):
    """``reduce_and``/``reduce_or`` over integers are bitwise: a min/max would be wrong, so they gather."""
    from jax import lax

    x = np.arange(16 * 8, dtype=np.int32).reshape(16, 8) * 37 % 101
    f = lambda a: (lax.reduce_and(a, (1,)), lax.reduce_or(a, (0,)))  # noqa: E731
    prog = assert_same_as_unsharded(f, (x,), mesh=mesh, in_specs=P("i", "j"), strategy="collective")
    assert not prog.plan.collectives


def test_ops_without_a_combine_form_keep_their_gather(mesh):
    f = lambda a: jnp.sort(a, axis=1)[:, 0] + jnp.argsort(a, axis=1)[:, -1]  # noqa: E731
    prog = assert_same_as_unsharded(f, random_args([((16, 8), np.float32)]), mesh=mesh, in_specs=P("i", "j"),
                                    strategy="collective")
    assert not prog.plan.collectives  # sorts gather their axis (a top_k has a combine form: tests/ops/test_top_k.py)
    assert steps(prog) == [("all-gather", ("j",))]  # one gather of the argument, shared by both


def test_unknown_strategy_is_an_option_error(mesh):
    with pytest.raises(sp.OptionError, match="unknown strategy 'fastest'"):
        sp.autoshard(nx_example, mesh=mesh, in_specs=None, strategy="fastest").trace(
            *random_args([((16, 8), np.float32)] * 2))


@pytest.mark.parametrize("name,f,args,mesh_name,specs,run", covering(WORKLOADS, ["gather", "collective"]))
def test_workloads_under_the_gather_and_collective_strategies(name, f, args, mesh_name, specs, run, meshes, traced):
    """Each workload runs under one strategy by default (covering: every workload and both strategies; each under
    both with -m slow), and under the other is planned, not run: collective finishes never take more stages."""
    mesh = meshes[mesh_name]
    plans = {strategy: traced(f, args, mesh=mesh, in_specs=specs, strategy=strategy)
             for strategy in ("gather", "collective")}
    assert_same_as_unsharded(f, args, mesh=mesh, in_specs=specs, rtol=2e-4, atol=2e-5, program=plans[run])
    assert len(plans["collective"].stages) <= len(plans["gather"].stages)


@pytest.mark.parametrize("mesh_name,specs", [
    ("4x2", (P("i", "j"), P("j", None), P("i", "j"))),
    ("2x2x2", (P("i", ("j", "k")), P(("j", "k")), P("i", ("j", "k")))),
])
def test_matmul_reduce_scatter_when_the_consumer_wants_the_result_sharded(mesh_name, specs, meshes):
    """The shard_map doc's matmul_reduce_scatter: the product's consumer slices it over the contracted mesh
    axes anyway, so the partial sums are reduce-scattered rather than all-reduced (half the bytes)."""
    f = lambda a, b, c: (a @ b) * c  # noqa: E731
    args = random_args([((16, 32), np.float32), ((32, 16), np.float32), ((16, 16), np.float32)])
    prog = assert_same_as_unsharded(f, args, mesh=meshes[mesh_name], in_specs=specs, strategy="collective")
    ((node_id, collective),) = prog.plan.collectives.items()
    (scatter,) = finishes(prog, node_id)
    assert collective.kind == "psum" and scatter.step.kind == "psum-scatter" and scatter.step.axis == 1
    assert "reduce-scatter" in prog.hlo() and "all-reduce" not in prog.hlo()
    assert [t.kind for t in prog.communication()] == [t.kind for t in prog.estimated_communication()]


def _with_nans_and_ties(seed):
    x = np.round(np.random.default_rng(seed).normal(size=(16, 8)) * 2).astype(np.float32) / 2  # many ties
    x[3, 5] = x[7, 1] = x[7, 6] = np.nan
    return x


@pytest.mark.covering
@pytest.mark.parametrize("f", [lambda a: jnp.argmax(a, axis=1), lambda a: jnp.argmin(a, axis=0)],
                         ids=["argmax", "argmin"])
@pytest.mark.parametrize("x", [random_args([((16, 8), np.float32)])[0], _with_nans_and_ties(1),
                               np.random.default_rng(2).integers(-3, 4, size=(16, 8)).astype(np.int32)],
                         ids=["floats", "nans_and_ties", "ints"])
@pytest.mark.parametrize("spec", [P("i", "j"), P(("i", "j")), P(None, ("j", "i"))])
def test_argmax_and_argmin_combine_with_index_offsets(f, x, spec, mesh):
    prog = sp.autoshard(f, mesh=mesh, in_specs=spec, strategy="collective").trace(x)
    np.testing.assert_array_equal(prog(x), f(jnp.asarray(x)))  # exact: first index of the extreme, or of a NaN
    assert any(c.kind in ("argmax", "argmin") for c in prog.plan.collectives.values()) or len(prog.stages) == 1
    key = lambda t: (t.kind, t.mesh_axes, t.shape, t.bytes)  # noqa: E731
    assert sorted(map(key, prog.communication())) == sorted(map(key, prog.estimated_communication()))


def test_the_gather_goes_before_the_broadcast_that_would_make_it_bigger(mesh):
    """sort needs its axis whole; gathering the 64-row column before it is broadcast to 64x64 moves 32x
    fewer bytes than gathering the matrix. The sort's need flows back through the multiply and the broadcast
    (propagation's backward pass), so the Nx placement ("gather") gathers the column too; "auto" would pull the
    gather above the broadcast itself (splitting's pull) were it placed after."""
    def f(r, m):
        return jnp.sort(jnp.broadcast_to(jnp.exp(r)[:, None], (64, 64)) * 3.0, axis=0) + m

    args = random_args([((64,), np.float32), ((64, 64), np.float32)])
    specs = (P("i"), P("i", "j"))
    nx_style = assert_same_as_unsharded(f, args, mesh=mesh, in_specs=specs, strategy="gather")
    auto = assert_same_as_unsharded(f, args, mesh=mesh, in_specs=specs, strategy="auto")
    gathered = {t.kind: t.bytes for t in auto.communication()}
    assert gathered == {"all-gather": 64 * 4}          # the column, not the matrix
    assert {t.kind: t.bytes for t in nx_style.communication()} == {"all-gather": 64 * 4}
    assert [(t.kind, t.bytes) for t in auto.communication()] == [
        (t.kind, t.bytes) for t in auto.estimated_communication()]


@pytest.mark.covering
@pytest.mark.parametrize("strategy", ["auto", "collective"])
@pytest.mark.parametrize("name,f,spec", [
    ("min_all", jnp.min, P(None, "j")),
    ("max_rows", lambda a: jnp.max(a, axis=0), P("i")),
    ("min_rows", lambda a: jnp.min(a, axis=0), P("i")),
])
def test_max_and_min_finishes_keep_nan_and_signed_zero_as_jnp_does(name, f, spec, strategy, mesh):
    # XLA's cross-device max/min drop NaN and ignore the sign of zero; the result must still be jnp's.
    with_nan = np.arange(128, dtype=np.float32).reshape(16, 8)
    with_nan[9, 1] = np.nan
    zeros = np.zeros((16, 8), np.float32)
    zeros[5] = -0.0
    for x in (with_nan, zeros, -zeros):
        fs = sp.autoshard(f, mesh=mesh, in_specs=spec, strategy=strategy)
        assert fs.trace(x).plan.collectives, "the point is the collective finish"
        got, want = np.asarray(fs(x)), np.asarray(f(jnp.asarray(x)))
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.covering
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int32"])
@pytest.mark.parametrize("f", [lambda a: jnp.max(a, axis=0), lambda a: jnp.min(a, axis=0)], ids=["max", "min"])
def test_max_and_min_finish_with_one_all_reduce_of_the_result_in_total_order(f, dtype, mesh):
    """Floats are combined as integers in IEEE total order: exactly jnp's answer for NaN, infinities and signed
    zeros, with one all-reduce the size of the result (as jax.jit's), no flags alongside."""
    specials = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.5, -1.5] if dtype != "int32" else [0, 7, -7, 2**31 - 1]
    rng = np.random.default_rng(0)
    x = rng.choice(np.array(specials, np.float64), size=(16, 8)).astype(jnp.dtype(dtype))
    fs = sp.autoshard(f, mesh=mesh, in_specs=P("i"), strategy="collective")
    got, want = np.asarray(fs(x)).astype(np.float64), np.asarray(f(jnp.asarray(x))).astype(np.float64)
    np.testing.assert_array_equal(got, want)
    number = ~np.isnan(want)  # a NaN's sign bit means nothing
    np.testing.assert_array_equal(np.signbit(got[number]), np.signbit(want[number]))
    assert [t.kind for t in fs.trace(x).communication()] == ["all-reduce"]


def _conv(x, k, groups=1):
    from jax import lax

    return lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                    feature_group_count=groups)


def _conv_loss(k, x):
    return jnp.mean(jnp.tanh(_conv(x, k)) ** 2)


@pytest.mark.parametrize("strategy", ["collective", "auto"])
def test_a_convolutions_kernel_gradient_over_a_sharded_batch_is_all_reduced_not_gathered(strategy, meshes):
    """JAX computes the kernel gradient as a convolution whose input-feature axis is the batch: with the batch
    sharded, each device convolves its rows and one all-reduce of the small kernel-shaped result finishes it (as
    jax.jit does), instead of gathering the batch-sharded activations (issue #17: 59x jit's bytes on a flax
    BatchNorm+conv train step)."""
    import jax

    k, x = random_args([((3, 3, 3, 8), np.float32), ((16, 12, 12, 3), np.float32)])
    grad = jax.grad(_conv_loss)
    prog = assert_same_as_unsharded(grad, (k, x), mesh=meshes["8"], in_specs=(P(), P("i")), strategy=strategy)
    assert [(t.kind, t.shape) for t in prog.communication()] == [("all-reduce", (3, 3, 3, 8))]
    assert "all-gather" not in prog.hlo()
    assert any(c.kind == "psum" and c.mesh_axes == ("i",) for c in prog.plan.collectives.values())
    comparison = sp.compare_with_jit(grad, meshes["8"], (P(), P("i")), k, x, strategy=strategy)
    assert comparison.shardprop_bytes <= comparison.jit_bytes


@pytest.mark.parametrize("mesh_name,x_spec,k_spec", [
    ("4x2", P("i", None, None, "j"), P(None, None, "j", None)),      # input channels over j, batch over i
    ("2x2x2", P(None, None, None, ("j", "k")), P(None, None, ("j", "k"), "i")),  # and output channels over i
])
def test_a_convolution_over_sharded_input_channels_sums_its_blocks(mesh_name, x_spec, k_spec, meshes):
    x, k = random_args([((8, 10, 10, 8), np.float32), ((3, 3, 8, 4), np.float32)])
    prog = assert_same_as_unsharded(_conv, (x, k), mesh=meshes[mesh_name], in_specs=(x_spec, k_spec),
                                    strategy="collective")
    assert [t.kind for t in prog.communication()] == ["all-reduce"]


def test_a_grouped_convolution_keeps_its_features_whole(meshes):
    """With feature groups, input features pair with kernel features group by group: no per-block sum."""
    x, k = random_args([((8, 10, 10, 8), np.float32), ((3, 3, 1, 8), np.float32)])
    prog = assert_same_as_unsharded(lambda x, k: _conv(x, k, groups=8), (x, k), mesh=meshes["4x2"],
                                    in_specs=(P("i", None, None, "j"), P()), strategy="collective")
    assert not prog.plan.collectives


@st.composite
def _sharded_convolutions(draw):
    """A convolution (or its kernel gradient) with its batch, input and output channels sharded over random
    mesh axes (each mesh axis used once), channel counts divisible by what shards them."""
    mesh_name = draw(st.sampled_from(["8", "4x2", "2x2x2"]))
    sizes, names = MESH_SHAPES[mesh_name]
    size_of = dict(zip(names, sizes, strict=True))
    free = list(names)
    groups = []
    for _ in range(3):  # batch, input channels, output channels
        take = draw(st.lists(st.sampled_from(free), unique=True, max_size=len(free))) if free else []
        free = [n for n in free if n not in take]
        groups.append(tuple(take))
    count = [int(np.prod([size_of[n] for n in g])) if g else 1 for g in groups]
    batch, cin, cout = (c * draw(st.integers(1, 2)) for c in count)
    entry = [g if len(g) > 1 else (g[0] if g else None) for g in groups]
    x_spec, k_spec = P(entry[0], None, None, entry[1]), P(None, None, entry[1], entry[2])
    return mesh_name, (batch, 6, 6, cin), (3, 3, cin, cout), x_spec, k_spec, draw(st.booleans())


@settings(max_examples=8, deadline=None, derandomize=True)  # 40 more in the slow set (the end of this file)
@given(_sharded_convolutions(), st.sampled_from(["gather", "collective", "auto"]))
def test_random_sharded_convolutions_and_kernel_gradients_equal_the_unsharded_ones(case, strategy):
    import jax

    mesh_name, x_shape, k_shape, x_spec, k_spec, gradient = case
    x, k = random_args([(x_shape, np.float32), (k_shape, np.float32)])
    mesh = sp.make_mesh(*MESH_SHAPES[mesh_name])
    if gradient:
        assert_same_as_unsharded(jax.grad(_conv_loss), (k, x), mesh=mesh, in_specs=(k_spec, x_spec),
                                 strategy=strategy, rtol=1e-4, atol=1e-6)
    else:
        assert_same_as_unsharded(_conv, (x, k), mesh=mesh, in_specs=(x_spec, k_spec), strategy=strategy)


def _embedding_loss(table, ids):
    return jnp.mean(jnp.tanh(table[ids]) ** 2)


def _add_rows(base, ids, u):
    return jnp.asarray(base).at[ids].add(u)


def _sub_rows(base, ids, u):
    from jax import lax

    return lax.scatter_sub(base, ids[:, None], u, lax.ScatterDimensionNumbers((1,), (0,), (0,)))


@pytest.mark.covering
@pytest.mark.parametrize("mesh_name,spec", [("8", P("i")), ("4x2", P(("i", "j"))), ("2x2x2", P(("k", "i")))])
@pytest.mark.parametrize("f", [_add_rows, _sub_rows], ids=["scatter-add", "scatter-sub"])
def test_a_scatter_add_over_sharded_rows_is_finished_by_a_psum_counting_its_operand_once(f, mesh_name, spec, meshes):
    """Each device scatters its rows of updates into the operand and a psum adds the results; the (replicated,
    non-zero) operand is taken on one device of each group only, or the sum would count it once per device."""
    base, u = random_args([((50, 16), np.float32), ((64, 16), np.float32)])
    ids = (np.arange(64) * 7 % 50).astype(np.int32)  # repeated rows accumulate
    prog = assert_same_as_unsharded(f, (base, ids, u), mesh=meshes[mesh_name], in_specs=(P(), spec, spec),
                                    strategy="collective")
    assert [t.kind for t in prog.communication()] == ["all-reduce"]
    ((node_id, _),) = prog.plan.collectives.items()  # the operand is consumed partial: taken once, locally
    assert [need.partial != () for need in prog.plan.needs(node_id)] == [True, False, False]
    assert [kind for kind, _ in steps(prog, sending=False)] == ["take-once", "psum"]


@pytest.mark.covering
@pytest.mark.parametrize("mesh_name,spec", [("8", P("i")), ("4x2", P(("i", "j"))), ("2x2x2", P(("k", "i")))])
@pytest.mark.parametrize("how,dtype", [("max", np.int32), ("min", np.int32), ("mul", np.int32),
                                       ("mul", np.float32)])
def test_a_scatter_max_min_or_mul_over_sharded_rows_is_finished_by_one_all_reduce(how, dtype, mesh_name, spec,
                                                                                    meshes):
    """segment_max / segment_min / segment_prod of data sharded by rows: each device scatters its rows into the
    (replicated, non-identity) operand and one all-reduce combines the results, as jax.jit does — a product taking the
    operand on one device of each group only, or it would be multiplied in once per device."""
    rng = np.random.default_rng(3)
    base = rng.integers(-3, 4, size=(10, 4)).astype(dtype)
    u = (rng.integers(-3, 4, size=(64, 4)) if dtype == np.int32 else rng.uniform(0.8, 1.2, size=(64, 4))).astype(
        dtype)
    ids = (np.arange(64) * 7 % 10).astype(np.int32)  # repeated rows combine

    def f(base, ids, u):
        return getattr(jnp.asarray(base).at[ids], how)(u)

    prog = assert_same_as_unsharded(f, (base, ids, u), mesh=meshes[mesh_name], in_specs=(P(), spec, spec),
                                    rtol=1e-5)
    assert [t.kind for t in prog.communication()] == ["all-reduce"]
    comparison = sp.compare_with_jit(f, meshes[mesh_name], (P(), spec, spec), base, ids, u)
    assert comparison.shardprop_bytes <= comparison.jit_bytes, str(comparison)


def test_a_float_scatter_max_takes_its_rows_whole():
    """A float maximum's derivative averages the tangents of all its ties, across devices too: its rows are
    gathered (no per-device maximum to combine), and the value and the gradient equal the unsharded ones."""
    import jax

    mesh = sp.make_mesh((8,), ("i",))
    base = np.zeros((10, 4), np.float32)
    u = np.maximum(random_args([((64, 4), np.float32)])[0], 0)  # relu'd: exact ties at 0 with the operand
    ids = (np.arange(64) * 7 % 10).astype(np.int32)

    def loss(base, u):
        return jnp.sum(jnp.asarray(base).at[ids].max(u) * jnp.arange(40.0).reshape(10, 4))

    prog = assert_same_as_unsharded(jax.grad(loss, (0, 1)), (base, u), mesh=mesh, in_specs=(P(), P("i")))
    assert {str(c.kind) for c in prog.plan.collectives.values()} <= {"psum"}  # (the gradient's scatter-adds)


def test_auto_all_reduces_an_embedding_gradient_when_the_table_is_smaller_than_the_batch(meshes):
    """A small vocabulary and a large batch: all-reducing the table's gradient moves less than gathering the batch's
    rows (and indices), as jax.jit does; with a large table auto gathers the rows instead (fewer bytes than jit)."""
    import jax

    grad = jax.grad(_embedding_loss)
    small = (random_args([((12, 16), np.float32)])[0], (np.arange(512) * 5 % 12).astype(np.int32))
    large = (random_args([((400, 16), np.float32)])[0], (np.arange(64) * 5 % 400).astype(np.int32))
    for args, expected in ((small, ["all-reduce"]), (large, ["all-gather", "all-gather"])):
        prog = assert_same_as_unsharded(grad, args, mesh=meshes["8"], in_specs=(P(), P("i")))
        assert [t.kind for t in prog.communication()] == expected
        comparison = sp.compare_with_jit(grad, meshes["8"], (P(), P("i")), *args)
        assert comparison.shardprop_bytes <= comparison.jit_bytes


def test_an_embedding_gradient_inside_a_scan_is_summed_once_after_the_loop(meshes):
    """A lookup per time step: its gradient scatter-adds every step's rows into the table's gradient, a carry of
    the transposed loop. Each device adds its batch rows to its own partial copy of the carry and one all-reduce
    after the loop finishes it: 1,344 B, where jax.jit all-reduces every step (6,720 B; 19,040 B before
    scatter-add had a finish, when the batch's rows were gathered every step)."""
    import jax
    from jax import lax

    def loss(table, ids):
        def step(h, ids_t):
            h = jnp.tanh(h + table[ids_t])
            return h, jnp.sum(h ** 2)

        return jnp.mean(lax.scan(step, jnp.zeros((64, 16)), ids)[1])

    table = random_args([((12, 16), np.float32)])[0]
    ids = (np.arange(5 * 64).reshape(5, 64) * 7 % 12).astype(np.int32)
    grad = jax.grad(loss)
    assert_same_as_unsharded(grad, (table, ids), mesh=meshes["8"], in_specs=(P(), P(None, "i")), rtol=1e-4)
    comparison = sp.compare_with_jit(grad, meshes["8"], (P(), P(None, "i")), table, ids)
    assert [(t.kind, t.shape, t.repeats) for t in comparison.shardprop] == [("all-reduce", (12, 16), 1)]
    assert comparison.shardprop_bytes * 5 == comparison.jit_bytes  # one all-reduce, not one per step


@pytest.mark.parametrize("strategy", ["gather", "collective", "auto"])
def test_a_scatter_add_into_the_carry_itself_keeps_the_carry_partial(strategy, meshes):
    """The carry is the scatter-add's operand: each device adds its rows to its own partial copy (no first-device
    masking, which would drop the other devices' partial sums), one all-reduce after the loop."""
    import jax

    idx = (np.arange(24).reshape(3, 8) * 5 % 8).astype(np.int32)
    upd = random_args([((3, 8, 4), np.float32)])[0]

    def f(idx, upd):
        return jax.lax.scan(lambda c, xs: (c.at[xs[0]].add(xs[1]) * 0.5, None), jnp.ones((8, 4)), (idx, upd))[0]

    prog = assert_same_as_unsharded(f, (idx, upd), mesh=meshes["4x2"], in_specs=(P(None, "i"), P(None, "i")),
                                    strategy=strategy)
    if strategy != "gather":
        assert [(t.kind, t.repeats) for t in prog.communication()] == [("all-reduce", 1)]


@pytest.mark.parametrize("strategy", ["gather", "collective", "auto"])
def test_a_scatter_add_into_a_non_zero_operand_inside_a_loop_counts_the_operand_once(strategy, meshes):
    """Found by review: a psum that must count an operand once, deferred past the loop, still takes that operand
    on each group's first device only (else every device would add it)."""
    import jax

    idx = (np.arange(24).reshape(3, 8) * 5 % 8).astype(np.int32)
    upd = random_args([((3, 8, 4), np.float32)])[0]

    def f(idx, upd):
        base = jnp.ones((8, 4))
        return jax.lax.scan(lambda c, xs: (c + base.at[xs[0]].add(xs[1]), None), jnp.zeros((8, 4)), (idx, upd))[0]

    prog = assert_same_as_unsharded(f, (idx, upd), mesh=meshes["4x2"], in_specs=(P(None, "i"), P(None, "i")),
                                    strategy=strategy)
    if strategy != "gather":
        assert [(t.kind, t.repeats) for t in prog.communication()] == [("all-reduce", 1)]
        (loop,) = prog.plan.bodies
        (body,) = prog.plan.body_programs(loop)  # inside: the constant operand taken once, every iteration
        assert [i.step.kind for i in body.instructions if isinstance(i, Move)].count("take-once") == 1


@pytest.mark.parametrize("strategy", ["collective", "auto"])
def test_a_scatter_add_whose_scattered_axes_share_a_mesh_axis_is_not_finished_by_a_psum(strategy, meshes):
    """Found by review: indices P('i') and updates P(None, 'i') would have summed over i twice (a LoweringError)."""
    from jax import lax

    dn = lax.ScatterDimensionNumbers(update_window_dims=(), inserted_window_dims=(0, 1),
                                     scatter_dims_to_operand_dims=(0, 1))
    base, upd = random_args([((8, 8), np.float32), ((8, 8), np.float32)])
    idx = (np.arange(8 * 8 * 2).reshape(8, 8, 2) * 3 % 8).astype(np.int32)
    assert_same_as_unsharded(lambda o, i, u: lax.scatter_add(o, i, u, dn), (base, idx, upd), mesh=meshes["4x2"],
                             in_specs=(P(), P("i"), P(None, "i")), strategy=strategy)


def test_a_scatter_mul_in_a_loop_gathers_its_invariant_rows_once_rather_than_all_reducing_every_iteration(meshes):
    """The product finish all-reduces per iteration inside a loop's body; the rows it would spare, loop invariants,
    are gathered once before the loop instead (144 B; 960 B all-reduced ten times, as jax.jit does). Found by review."""
    import jax

    x = np.ones((24,), np.float32) * 1.01
    i = (np.arange(24) * 5 % 24).astype(np.int32)
    u = random_args([((24,), np.float32)])[0] * 0.1 + 1.0

    def f(x, i, u):
        return jax.lax.fori_loop(0, 10, lambda k, c: c.at[i].mul(u), x)

    mesh = sp.make_mesh((4, 2), ("i", "j"))
    assert_same_as_unsharded(f, (x, i, u), mesh=mesh, in_specs=(P(), P("i"), P("i")), rtol=1e-4)
    comparison = sp.compare_with_jit(f, mesh, (P(), P("i"), P("i")), x, i, u)
    assert comparison.shardprop_bytes < comparison.jit_bytes, str(comparison)


test_random_sharded_convolutions_on_more_examples = on_more_examples(
    test_random_sharded_convolutions_and_kernel_gradients_equal_the_unsharded_ones, 40, 49_102,
    case=_sharded_convolutions(), strategy=st.sampled_from(["gather", "collective", "auto"]))
