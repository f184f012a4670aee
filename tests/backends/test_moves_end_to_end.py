"""Every kind of move, end to end: at a sharding constraint, at a conflict, between stages, inside loop bodies and out
of them. For each program the values equal the unsharded function's, the estimate (the IR's priced moves) equals
what the compiled HLO moves — kind by kind, byte for byte — and no layout change is left to XLA between stages.
"""

import collections
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardprop as sp
from tests.conftest import assert_same_as_unsharded
from tests.ir import held_partial, steps

RNG = np.random.default_rng(7)
X = RNG.normal(size=(16, 8)).astype(np.float32)
SQ = RNG.normal(size=(16, 16)).astype(np.float32)
CUBE = RNG.normal(size=(16, 32, 24)).astype(np.float32)
SEQ = RNG.normal(size=(64,)).astype(np.float32)
WIDE = RNG.normal(size=(4, 64)).astype(np.float32)


def constrained(mesh, spec):
    return lambda v: jax.lax.with_sharding_constraint(v, NamedSharding(mesh, spec))


def kinds_and_bytes(transfers):
    """What a list of transfers moves, kind by kind: ``{kind: total bytes moved per device}`` (a collective XLA
    combines with another of its kind counts the same)."""
    out: dict[str, float] = collections.defaultdict(float)
    for t in transfers:
        out[str(t.kind)] += t.total_moved_bytes
    return dict(out)


# (id, function of (mesh), args, in_specs, mesh, the step kinds the IR must use)
CASES = [
    ("transposed 2-D at a constraint", lambda m: lambda x: constrained(m, P("j", "i"))(x * 2), (X,),
     (P("i", "j"),), "4x2", {"all-to-all", "permute"}),
    ("a sub-axis move at a constraint", lambda m: lambda x: constrained(m, P("i", "j"))(x + 1), (X,),
     (P(("i", "j")),), "4x2", {"all-to-all"}),
    ("compound axes to another tensor axis", lambda m: lambda x: constrained(m, P(None, ("i", "j")))(x - 1),
     (SQ,), (P(("i", "j")),), "4x2", {"all-to-all"}),
    ("two mesh axes to one tensor axis (the issue's case)",
     lambda m: lambda x: constrained(m, P(None, ("i", "j"), None))(x * 3), (CUBE,), (P("j", None, "i"),), "4x2",
     {"all-to-all"}),
    ("a gather of only what is needed", lambda m: lambda x: constrained(m, P("i"))(jnp.exp(x)), (X,),
     (P("i", "j"),), "4x2", {"all-gather"}),
    ("a conflict resolved by an all-to-all", lambda m: lambda a: a + a.T, (SQ,), (P("i"),), "4x2",
     {"all-to-all"}),
    ("two operands transposed against each other", lambda m: lambda a, b: a + b.T, (SQ, SQ),
     (P("i", "j"), P("i", "j")), "4x2", None),
    ("a conflict inside a loop body", lambda m: lambda c: jax.lax.fori_loop(0, 3, lambda k, h: jnp.tanh(h + h.T), c),
     (SQ,), (P("i"),), "4x2", {"all-to-all"}),
    ("a constraint inside a loop body", lambda m: lambda x: jax.lax.scan(
        lambda c, _: (constrained(m, P(None, "j"))(c * 0.5 + jnp.mean(c, axis=0)), None), x, None, length=3)[0],
     (X,), (P("i"),), "4x2", None),
    ("a reduce-scatter where the consumer slices", lambda m: lambda a, b, c: (a @ b) * c,
     (RNG.normal(size=(16, 32)).astype(np.float32), RNG.normal(size=(32, 16)).astype(np.float32), SQ),
     (P("i", "j"), P("j", None), P("i", "j")), "4x2", {"psum-scatter"}),
    ("a sum left partial, then one psum", lambda m: lambda x, w: jnp.sum(x @ w) * 0.5,
     (X, RNG.normal(size=(8, 4)).astype(np.float32)), (P(None, "j"), P("j", None)), "4x2", {"psum"}),
    ("a psum over two mesh axes on a 3-axis mesh", lambda m: lambda x: jnp.sum(x, axis=1), (SQ,),
     (P("x", ("y", "z")),), "2x2x2", {"psum"}),
    ("a scatter-add counting its operand once", lambda m: lambda base, ids, u: base.at[ids].add(u),
     (SQ, (np.arange(32) * 5 % 16).astype(np.int32), RNG.normal(size=(32, 16)).astype(np.float32)),
     (P(), P("i"), P("i")), "8", {"take-once", "psum"}),
    ("an embedding gradient summed once after a scan", lambda m: jax.grad(lambda t, ids: jnp.mean(jax.lax.scan(
        lambda h, i: (jnp.tanh(h + t[i]), jnp.sum(h ** 2)), jnp.zeros((8, 16)), ids)[1])),
     (RNG.normal(size=(12, 16)).astype(np.float32), (np.arange(40).reshape(5, 8) * 7 % 12).astype(np.int32)),
     (P(), P(None, "i")), "8", {"take-once", "psum"}),
    # the row movements: each is a step of a move (or, a prefix, a finish), planned and priced as the others
    ("a halo: a window reads its neighbours' rows", lambda m: lambda x: jax.lax.reduce_window(
        x, -jnp.inf, jax.lax.max, (3,), (1,), "SAME"), (SEQ,), (P("i"),), "8", {"halo"}),
    ("a rotation: a roll's blocks joined in place", lambda m: lambda x: jnp.roll(x, 3) * 2, (SEQ,), (P("i"),), "8",
     {"rotate"}),
    ("a route: two sequences joined in place", lambda m: lambda x: jnp.concatenate([x, x * 2]) * 3, (SEQ,),
     (P("i"),), "8", {"route"}),
    ("a mirror: a reversal done block by block", lambda m: lambda x: x[::-1] + 1, (SEQ,), (P("i"),), "8",
     {"mirror"}),
    ("a route of a strided slice's picks", lambda m: lambda x: x[:, ::16] * 2, (WIDE,), (P(None, "i"),), "8",
     {"route"}),
    ("a prefix: a cumulative sum's block totals", lambda m: lambda x: jnp.cumsum(x) * 2, (SEQ,), (P("i"),), "8",
     {"prefix"}),
    ("a realignment of ranged rows", lambda m: lambda x: x[1:] - x[:-1], (SEQ,), (P("i"),), "8", {"realign"}),
]
MESHES = {"4x2": ((4, 2), ("i", "j")), "2x2x2": ((2, 2, 2), ("x", "y", "z")), "8": ((8,), ("i",))}


@pytest.mark.parametrize("name,make,args,specs,mesh_name,kinds", CASES, ids=[c[0] for c in CASES])
def test_estimate_equals_the_compiled_moves_and_values_equal_unsharded(name, make, args, specs, mesh_name, kinds):
    mesh = sp.make_mesh(*MESHES[mesh_name])
    f = make(mesh)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sp.ReshardWarning)
        prog = assert_same_as_unsharded(f, args, mesh=mesh, in_specs=specs, rtol=1e-4, atol=1e-4)
    measured, estimated = prog.communication(), prog.estimated_communication()
    assert kinds_and_bytes(measured) == pytest.approx(kinds_and_bytes(estimated)), (measured, estimated)
    if kinds is not None:
        assert {kind for kind, _ in steps(prog, sending=False)} >= kinds, steps(prog, sending=False)
    # every stage boundary passes values as made: each stage's in_specs are its sources' out_specs
    for stage in prog.plan.stages:
        for i in stage.inputs:
            if not i.source.is_argument:
                source = prog.plan.stages[i.source.stage]
                assert source.out_layouts[i.source.index] == i.layout


def test_a_layout_change_over_two_mesh_axes_moves_fewer_bytes_than_jax_jit():
    """``P('j', None, 'i')`` to ``P(None, ('i', 'j'), None)``: two all-to-alls, where jax.jit rematerializes the
    value (openxla/xla#15207) — a fraction of its bytes."""
    mesh = sp.make_mesh((4, 2), ("i", "j"))
    f = constrained(mesh, P(None, ("i", "j"), None))
    comparison = sp.compare_with_jit(f, mesh, (P("j", None, "i"),), CUBE)
    assert [str(t.kind) for t in comparison.shardprop] == ["all-to-all", "all-to-all"]
    assert comparison.shardprop_bytes * 4 < comparison.jit_bytes, str(comparison)
    np.testing.assert_array_equal(np.asarray(comparison.program(CUBE)), CUBE)


def test_a_deferred_sum_is_seen_by_explain_json_and_the_plan_fingerprint(monkeypatch):
    """``jnp.sum((x @ w) * 2.0)`` with the contraction sharded: the product is held as a partial sum and one psum of
    the scalar finishes it. ``explain`` says so, ``to_json`` types the value partial, and two plans that differ only
    there have different fingerprints (a multi-process run would refuse them)."""
    from shardprop.distributed import stage_fingerprints

    mesh = sp.make_mesh((4, 2), ("i", "j"))
    w = RNG.normal(size=(8, 4)).astype(np.float32)
    f = lambda x, w: jnp.sum((x @ w) * 2.0)  # noqa: E731
    prog = assert_same_as_unsharded(f, (X, w), mesh=mesh, in_specs=(P(None, "j"), P("j", None)), rtol=1e-4)
    (c,) = [v for v in held_partial(prog) if prog.plan.graph.nodes[prog.plan.graph.producer[v]].op == "dot_general"]
    why = sp.explain(prog, c)
    assert "{+j}" in why.equation and why.partial and "a psum of its smaller result sums it" in why.partial
    assert "sum over j is not reduced yet" in str(why)
    doc = sp.to_json(prog)
    assert doc["values"][c]["partial"] == ["j"]
    psums = [i for s in doc["stages"] for i in s["instructions"] if i.get("op") == "psum"]
    assert [(p["from"]["partial"], p["to"]["partial"], p["moved_bytes"]) for p in psums] == [(["j"], [], 4.0)]
    gathered = sp.autoshard(f, mesh=mesh, in_specs=(P(None, "j"), P("j", None)), strategy="gather").trace(X, w)
    collective = sp.autoshard(f, mesh=mesh, in_specs=(P(None, "j"), P("j", None)), strategy="collective").trace(X, w)
    assert stage_fingerprints(prog.plan) == stage_fingerprints(collective.plan)
    assert stage_fingerprints(prog.plan) != stage_fingerprints(gathered.plan)
    # the same program with the psum finishing the contraction itself: one stage too, another plan
    split_module = sys.modules["shardprop.splitting.split"]  # the module: the package exports the function `split`
    monkeypatch.setattr(split_module, "defer_sums_past_linear_consumers", lambda decisions: decisions)
    undeferred = sp.split(prog.sharded, strategy="collective")
    assert len(undeferred.stages) == len(prog.plan.stages) and not any(
        undeferred.type(v).partial for v in range(len(undeferred.graph.avals)))
    assert stage_fingerprints(undeferred) != stage_fingerprints(prog.plan)


def test_every_view_says_a_value_is_a_partial_sum_and_where_it_is_summed():
    """Found by a new-user pass: the listing typed a partial value ``{+j}`` but the block picture, the debugger's
    comparison and the JSON's moves did not say it."""
    mesh = sp.make_mesh((4, 2), ("i", "j"))
    w = RNG.normal(size=(8, 4)).astype(np.float32)
    f = lambda x, w: jnp.sum((x @ w * 3.0).T, 0)  # noqa: E731
    prog = assert_same_as_unsharded(f, (X, w), mesh=mesh, in_specs=(P("i", "j"), P("j")), rtol=1e-4)
    (partial,) = [v for v in held_partial(prog) if prog.plan.graph.nodes[prog.plan.graph.producer[v]].op == "mul"]
    picture = sp.inspect.as_text(sp.blocks(prog, partial))
    assert "]{+j}" in picture and "a partial sum over j" in picture
    dbg = sp.Debugger(prog, X, w)
    dbg.run()
    assert any("{+j}" in row.where.typed for row in dbg.compare().rows)
    doc = sp.to_json(prog)
    kinds = {(i["op"], i["finishes"]) for s in doc["stages"] for i in s["instructions"] if i["kind"] != "compute"}
    assert ("psum", True) in kinds


def test_compare_with_jit_takes_python_scalars():
    """Found by a new-user pass: a Python scalar argument crashed the comparison (autoshard took it)."""
    mesh = sp.make_mesh((4, 2), ("i", "j"))
    f = lambda a, s: jax.lax.dynamic_slice_in_dim(a, s, 4, axis=0) * 2.0  # noqa: E731
    comparison = sp.compare_with_jit(f, mesh, (P("i", "j"), None), X, 3)
    np.testing.assert_allclose(np.asarray(comparison.program(X, 3)), np.asarray(f(X, 3)))
    assert sp.compare_with_jit(lambda a, s: a * s, mesh, (P("i", "j"), None), X, 2.0).shardprop_bytes == 0
