"""Eight virtual CPU devices, set once before JAX initialises its backend; shared meshes and helpers."""

import inspect
import itertools
import math
import os
import pathlib

import jax


def _compile_fast():
    """The default run compiles thousands of small programs, and XLA:CPU's optimisation of their machine code is most of
    the time each takes (not what the tests check: shardprop's programs, their collectives and their results): the
    tests ask XLA to optimise less — LLVM at -O0 without its expensive passes (``jax_disable_most_optimizations``), no
    verification of the emitted kernels and, at jaxlib 0.10, the older loop emitters (a third faster to compile; the
    flag is gone by 0.12). The HLO passes, the partitioner and every collective are XLA's usual ones.
    ``SHARDPROP_TEST_FAST_COMPILE=0`` compiles as a user's programs do (CI runs the slow set so)."""
    if os.environ.get("SHARDPROP_TEST_FAST_COMPILE", "1") == "0":
        return
    jax.config.update("jax_disable_most_optimizations", True)
    os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "1"  # and in the processes the tests start
    import jaxlib

    flags = ["--xla_cpu_emitter_verification_level=0"]
    if jaxlib.__version__.startswith("0.10."):  # XLA refuses an unknown flag by ending the process
        flags.append("--xla_cpu_use_fusion_emitters=false")
    os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), *flags]).strip()


_compile_fast()  # before JAX starts its backend: XLA reads XLA_FLAGS once
jax.config.update("jax_num_cpu_devices", 8)
os.environ["SHARDPROP_CHECKS"] = "1"  # every pass checks the invariants of its product (shardprop/checks.py)

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import seed as with_seed  # noqa: E402

import shardprop as sp  # noqa: E402
from jax.sharding import PartitionSpec  # noqa: E402
from shardprop import checks  # noqa: E402
from shardprop.ops import has_record  # noqa: E402
from shardprop.core.layouts import layout_refines  # noqa: E402

checks.enable()  # in case shardprop was imported before the variable was set

# The long fuzz runs' seed (tests/test_fuzz_users.py): one per session, random unless given, set before the xdist
# workers start so that they share it, and printed in the session header so that a failure can be replayed.
os.environ.setdefault("SHARDPROP_FUZZ_SEED", str(int.from_bytes(os.urandom(3), "big")))


def pytest_report_header(config):
    return f"fuzz seed: SHARDPROP_FUZZ_SEED={os.environ['SHARDPROP_FUZZ_SEED']}"


def pytest_configure(config):
    """JAX's persistent compilation cache, under the pytest cache (never the user's home): a rerun reads the
    executables of the last one instead of compiling them (the five-minute budget is measured cold, without it).
    ``SHARDPROP_TEST_COMPILE_CACHE=0`` turns it off."""
    if os.environ.get("SHARDPROP_TEST_COMPILE_CACHE", "1") == "0":
        return
    jax.config.update("jax_compilation_cache_dir", str(config.rootpath / ".pytest_cache" / "jax-compiles"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by mark
def pytest_collection_modifyitems(config, items):
    """``@pytest.mark.covering`` on a test with stacked ``parametrize`` decorators: the default run keeps a covering
    sample of their cross product (``in_covering_sample``: every value of every decorator at least once) and marks the
    rest ``slow``, where the whole product runs (CI runs it)."""
    kept: dict = {}  # a covering test -> (its tables' sizes, the rows of each table its default-run items take)
    for item in items:
        if item.get_closest_marker("covering") is None or not hasattr(item, "callspec"):
            continue
        tables = [_table_of(mark) for mark in item.iter_markers("parametrize")]
        chosen = [_row_of(item, names, rows) for names, rows in tables]
        sizes = [len(rows) for _, rows in tables]
        entry = kept.setdefault(item.function, [sizes, [set() for _ in tables], 0])
        entry[2] += 1
        rows_kept = entry[1]
        if in_covering_sample(chosen, sizes):
            for seen, k in zip(rows_kept, chosen, strict=True):
                seen.add(k)
        else:
            item.add_marker(pytest.mark.slow)
    # the rule's own check, where the whole table was collected: every row of every table is kept
    for function, (sizes, rows_kept, collected) in kept.items():
        if collected == math.prod(sizes) and any(len(seen) != size for seen, size in zip(rows_kept, sizes,
                                                                                             strict=True)):
            raise pytest.UsageError(f"@pytest.mark.covering left rows of {function.__name__} out of the default run")
    _end_to_end_first(items)


def _end_to_end_first(items) -> None:
    """The files at the top of ``tests/`` (end to end: the multi-process programs, the README, the recipes, the
    libraries' models — the longest tests) run first, the packages' many short tests after them: the two workers then
    end together instead of one waiting on a long test at the end (the longest first, as a scheduler packs jobs)."""
    top = pathlib.Path(__file__).parent
    items.sort(key=lambda item: item.path.parent != top)  # stable: each part keeps its order


def _table_of(mark) -> tuple[list[str], list[tuple]]:
    """A ``parametrize`` mark's argument names and its rows, each row the tuple of its values."""
    from _pytest.mark.structures import ParameterSet

    names, rows = mark.args if len(mark.args) == 2 else (mark.kwargs["argnames"], mark.kwargs["argvalues"])
    names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
    return names, [ParameterSet.extract_from(row, force_tuple=len(names) == 1).values for row in rows]


def _row_of(item, names: list[str], rows: list[tuple]) -> int:
    """Which row of its table an item runs: found by identity (pytest's ``callspec.indices`` number the items of the
    whole cross product, not the rows of each decorator)."""
    got = [item.callspec.params[n] for n in names]
    return next(k for k, row in enumerate(rows) if all(a is b for a, b in zip(row, got, strict=True)))


def in_covering_sample(chosen, sizes):
    """Whether the combination taking value ``chosen[j]`` of table ``j`` (of ``sizes[j]`` values) is in the covering
    sample of their cross product: the ``t``-th sampled combination takes value ``t + j`` of table ``j``, modulo its
    size, for ``t`` up to the largest size — so every value of every table is sampled at least once."""
    return any(all(k == (t + j) % size for j, (k, size) in enumerate(zip(chosen, sizes, strict=True)))
               for t in range(max(sizes)))


MESH_SHAPES = {
    "8": ((8,), ("i",)),
    "4x2": ((4, 2), ("i", "j")),
    "2x4": ((2, 4), ("i", "j")),
    "2x2x2": ((2, 2, 2), ("i", "j", "k")),
}


@pytest.fixture(scope="session")
def meshes():
    return {name: sp.make_mesh(shape, names) for name, (shape, names) in MESH_SHAPES.items()}


@pytest.fixture(scope="session")
def mesh(meshes):
    return meshes["4x2"]


@pytest.fixture(scope="session")
def traced():
    """Programs that several tests only read, traced (and compiled) once per worker process:
    ``traced(f, args, mesh=mesh, in_specs=specs, strategy="gather")`` — keyed by the function, the arguments, the mesh
    and the options (a table's rows are the same objects in every test reading them)."""
    programs = {}

    def trace(f, args, *, mesh, in_specs, **options):
        key = (f, tuple(map(id, args)), id(mesh), repr(in_specs), tuple(sorted(options.items())))
        if key not in programs:  # (the arguments kept alive with the program: their ids stay theirs)
            programs[key] = (sp.autoshard(f, mesh=mesh, in_specs=in_specs, **options).trace(*args), args)
        return programs[key][0]

    return trace


def random_args(shapes_dtypes, seed=0):
    """Random arrays for ``[(shape, dtype), ...]`` (bools and ints too)."""
    rng = np.random.default_rng(seed)
    out = []
    for shape, dtype in shapes_dtypes:
        dtype = np.dtype(dtype)
        if dtype == np.bool_:
            out.append(rng.random(shape) > 0.5)
        elif dtype.kind in "iu":
            out.append(rng.integers(-5, 6, size=shape).astype(dtype))
        else:
            out.append(rng.normal(size=shape).astype(dtype))
    return out


def check_rule_case(f, args, *, mesh, in_specs, expected, primitive):
    """One row of a rule table: the sharded result equals the unsharded one, propagation lays the outputs out as
    ``expected`` (a spec or a tuple of specs; the program may return one sliced further, where it mirrors an
    argument: propagation/uses.py), and ``primitive`` was sharded by its own rule."""
    prog = assert_same_as_unsharded(f, args, mesh=mesh, in_specs=in_specs)
    expected = (expected,) if isinstance(expected, PartitionSpec) else tuple(expected)
    sharded = prog.sharded
    propagated = tuple(sharded.spec(v) if k in sharded.returned_sliced else prog.out_specs[k]
                       for k, v in enumerate(sharded.graph.outputs))
    assert propagated == expected
    assert all(layout_refines(sharded.layout(sharded.graph.outputs[k]), sharded.output_layout(k))
               for k in sharded.returned_sliced)
    assert has_record(primitive)
    assert primitive in {n.op for n in prog.sharded.graph.nodes}
    assert not prog.sharded.fallbacks
    return prog


def assert_same_as_unsharded(f, args, *, mesh, in_specs, strategy="auto", rtol=1e-5, atol=1e-5, program=None):
    """The oracle: ``autoshard(f)`` on the mesh (or ``program``, a trace of it: the ``traced`` fixture's) equals plain
    ``f`` on the same inputs on one device (``assert_like_unsharded``), leaf by leaf.

    Tolerance: float32 reassociation of sums across blocks (rtol=atol=1e-5 by default). Returns the program.
    """
    fs = sp.autoshard(f, mesh=mesh, in_specs=in_specs, strategy=strategy) if program is None else program
    got = fs(*args)
    assert all(isinstance(g, jax.Array) for g in jax.tree_util.tree_leaves(got))
    assert_like_unsharded(got, f, args, rtol=rtol, atol=atol)
    return fs.trace(*args) if program is None else program


def assert_differentiates_as_unsharded(f, args, *, mesh, in_specs, strategy="auto", out_specs=None, rtol=1e-5,
                                       atol=1e-5):
    """The oracle for derivatives: the gradient of the weighted sum of ``f``'s outputs (``tests.fuzz_oracle.weighted``)
    with respect to every argument, both ways — ``jax.grad`` of ``autoshard(f)``, and ``autoshard`` of ``jax.grad`` —
    equals the unsharded gradient (``assert_like_unsharded``; a NaN or an infinity only where it has one). Returns the
    sharded gradient's program."""
    from tests.fuzz_oracle import loss_weights, weighted  # the fuzzers' loss: every element's gradient differs

    argnums = tuple(range(len(args)))
    fs = sp.autoshard(f, mesh=mesh, in_specs=in_specs, strategy=strategy, out_specs=out_specs)
    grad = sp.autoshard(jax.grad(weighted(f), argnums=argnums), mesh=mesh, in_specs=in_specs, strategy=strategy)
    reference = jax.grad(weighted(f), argnums=argnums)  # one function: its jit compiles once for both checks
    # jax.grad of the weighted loss of autoshard(f), as its vjp with the loss's weights for cotangents: the same
    # derivative, without running the loss op by op (every op of it compiled alone: most of a small test's compiles)
    outputs, pullback = jax.vjp(fs, *args)
    for got in (pullback(jax.tree_util.tree_map(loss_weights, outputs)), grad(*args)):
        assert_like_unsharded(got, reference, args, rtol=rtol, atol=atol)
    return grad.trace(*args)


def assert_like_unsharded(got, f, args, *, rtol=1e-5, atol=1e-5, atol_per_magnitude=False):
    """``got`` equals ``f(*args)`` computed by plain JAX on one device, leaf by leaf (same tree, shapes and dtypes;
    a NaN or an infinity only where it has one; with ``atol_per_magnitude``, ``atol`` is per unit of the leaf's
    largest magnitude, at least 1: a sum's rounding scales with its terms). ``f`` runs under one ``jax.jit`` (one
    compile, where op by op JAX compiles every op alone) and, only where that differs, op by op: the two can differ
    in a last bit (XLA computes a cheap value again in each kernel reading it, and a maximum's derivative
    ``x == max(x)`` can then miss the maximum: ``tests/fuzz_oracle.py``). Both are JAX without shardprop."""
    args = jax.tree_util.tree_map(jax.numpy.asarray, args)
    if not _leaves_close(got, jax.jit(f)(*args), rtol, atol, atol_per_magnitude):
        want = f(*args)
        got_leaves, got_tree = jax.tree_util.tree_flatten(got)
        want_leaves, want_tree = jax.tree_util.tree_flatten(want)
        assert got_tree == want_tree
        for g, w in zip(got_leaves, want_leaves, strict=True):
            assert g.shape == w.shape and g.dtype == w.dtype
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=rtol,
                                       atol=atol * _magnitude(w) if atol_per_magnitude else atol)


def _leaves_close(got, want, rtol, atol, atol_per_magnitude=False) -> bool:
    got_leaves, got_tree = jax.tree_util.tree_flatten(got)
    want_leaves, want_tree = jax.tree_util.tree_flatten(want)
    return got_tree == want_tree and all(
        g.shape == w.shape and g.dtype == w.dtype and np.allclose(
            np.asarray(g), np.asarray(w), rtol=rtol, atol=atol * _magnitude(w) if atol_per_magnitude else atol,
            equal_nan=True)
        for g, w in zip(got_leaves, want_leaves, strict=True))


def _magnitude(w) -> float:
    return float(np.max(np.abs(np.asarray(w)), initial=1.0))


def on_more_examples(test, examples, seed, **strategies):
    """The Hypothesis property ``test`` again in the slow set: ``examples`` examples drawn from ``strategies`` (its
    ``@given`` arguments, by name) from ``seed``, a seed of its own, while the default run keeps the property on a
    small budget. Bind the result to a ``test_`` name in the property's module::

        test_slices_on_more_examples = on_more_examples(test_slices, 60, 49_101, first=st.integers(0, 30))
    """
    inner = test.hypothesis.inner_test
    fixtures = [name for name in inspect.signature(inner).parameters if name not in strategies]

    @pytest.mark.slow
    def more(request):
        values = {name: request.getfixturevalue(name) for name in fixtures}

        @with_seed(seed)
        @settings(max_examples=examples, deadline=None, derandomize=False, database=None, print_blob=True,
                  suppress_health_check=list(HealthCheck))
        @given(**strategies)
        def run(**drawn):
            inner(**drawn, **values)

        run()

    more.__doc__ = f"``{test.__name__}`` on {examples} examples from seed {seed} (the slow set's budget)."
    return more


def covering(rows, *columns, ids=None):
    """The cross product of ``rows`` (tuples of parameters) with each of ``columns`` (lists of values) as pytest
    params: a covering sample in the default run — every row once and every column value at least once
    (``in_covering_sample``) — and the rest marked ``slow``: the full cross product runs there (CI runs it). A param's
    id is its row's first entry (or ``ids(row)``) and its column values. (``@pytest.mark.covering`` does the same for
    stacked ``parametrize`` decorators.)"""
    sizes = [len(rows), *(len(c) for c in columns)]
    params = []
    for k, row in enumerate(rows):
        for combo in itertools.product(*(range(len(c)) for c in columns)):
            values = tuple(c[i] for c, i in zip(columns, combo, strict=True))
            label = "-".join(str(v) for v in (row[0] if ids is None else ids(row), *values))
            params.append(pytest.param(*row, *values, id=label,
                                       marks=() if in_covering_sample((k, *combo), sizes) else pytest.mark.slow))
    return params
