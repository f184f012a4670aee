"""Table-driven rule tests: each row checks the propagated output sharding of one op family AND that the
sharded execution equals the unsharded function."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import shardprop as sp
from tests.conftest import assert_same_as_unsharded, check_rule_case, random_args

F32, I32, BOOL = np.float32, np.int32, np.bool_
M = (16, 8)

# (id, function, [(shape, dtype)], mesh, in_specs, expected output spec(s), primitive that must have a rule)
CASES = [
    ("neg", lambda a: -a, [(M, F32)], "4x2", (P("i", "j"),), P("i", "j"), "neg"),
    ("exp_sharded_rows", jnp.exp, [(M, F32)], "4x2", (P("i"),), P("i"), "exp"),
    ("tanh_compound", jnp.tanh, [(M, F32)], "4x2", (P(("i", "j")),), P(("i", "j")), "tanh"),
    ("logistic", jax.nn.sigmoid, [(M, F32)], "8", (P(None, "i"),), P(None, "i"), "logistic"),
    ("add_same", lambda a, b: a + b, [(M, F32), (M, F32)], "4x2", (P("i", "j"), P("i", "j")), P("i", "j"), "add"),
    ("add_sharded_plus_unannotated", lambda a, b: a + b, [(M, F32), (M, F32)], "4x2", (P("i", "j"), None),
     P("i", "j"), "add"),
    ("add_sharded_plus_replicated", lambda a, b: a + b, [(M, F32), (M, F32)], "4x2", (P("i", None), P()),
     P("i"), "add"),
    ("add_complementary_axes", lambda a, b: a + b, [(M, F32), (M, F32)], "4x2", (P("i", None), P(None, "j")),
     P("i", "j"), "add"),
    # one layout refines the other: the coarser operand is cut locally, no conflict (and no communication)
    ("add_refined_compound", lambda a, b: a + b, [(M, F32), (M, F32)], "4x2", (P(("i", "j")), P("i")),
     P(("i", "j")), "add"),
    ("add_refined_both_axes", lambda a, b: a + b, [(M, F32), (M, F32)], "2x2x2", (P("i", ("j", "k")), P(None, "j")),
     P("i", ("j", "k")), "add"),
    ("mul_scalar_broadcast", lambda a: a * 3.0, [(M, F32)], "4x2", (P("i", "j"),), P("i", "j"), "mul"),
    ("sub_row_vector_broadcast", lambda a, r: a - r, [(M, F32), ((8,), F32)], "4x2", (P("i", "j"), None),
     P("i", "j"), "sub"),
    ("div_size1_broadcast", lambda a, c: a / c, [(M, F32), ((16, 1), F32)], "4x2", (P("i", "j"), P("i")),
     P("i", "j"), "div"),
    ("max_min_pow", lambda a, b: jnp.maximum(a, b) ** 2 + jnp.minimum(a, b), [(M, F32), (M, F32)], "2x2x2",
     (P("i", ("j", "k")), None), P("i", ("j", "k")), "max"),
    ("comparison", lambda a, b: a < b, [(M, F32), (M, F32)], "4x2", (P("i", "j"), None), P("i", "j"), "lt"),
    ("select_n", lambda p, a, b: lax.select_n(p, a, b), [(M, BOOL), (M, F32), (M, F32)], "4x2",
     (P("i"), None, P("i")), P("i"), "select_n"),
    ("where_scalar", lambda a: jnp.where(a > 0, a, 0.5), [(M, F32)], "8", (P("i"),), P("i"), "select_n"),
    ("convert_element_type", lambda a: a.astype(jnp.int32), [(M, F32)], "4x2", (P("j", "i"),), P("j", "i"),
     "convert_element_type"),
    ("integer_ops", lambda a, b: (a * b) % 3 + (a & b), [(M, I32), (M, I32)], "4x2", (P("i", "j"), P("i", "j")),
     P("i", "j"), "rem"),
    ("broadcast_in_dim_new_axis", lambda v: jnp.broadcast_to(v, M), [((8,), F32)], "4x2", (P("j"),),
     P(None, "j"), "broadcast_in_dim"),
    ("broadcast_new_axis_adopts", lambda v, a: jnp.broadcast_to(v, M) + a, [((8,), F32), (M, F32)], "4x2",
     (P(), P("i", "j")), P("i", "j"), "broadcast_in_dim"),
    ("expand_dims", lambda a: a[:, None, :], [(M, F32)], "4x2", (P("i", "j"),), P("i", None, "j"),
     "broadcast_in_dim"),
    ("squeeze", lambda a: jnp.squeeze(a, 1), [((16, 1, 8), F32)], "4x2", (P("i", None, "j"),), P("i", "j"),
     "squeeze"),
    ("transpose", lambda a: a.T, [(M, F32)], "4x2", (P("i", "j"),), P("j", "i"), "transpose"),
    ("transpose_3d", lambda a: jnp.transpose(a, (2, 0, 1)), [((8, 4, 16), F32)], "2x2x2",
     (P("i", "j", "k"),), P("k", "i", "j"), "transpose"),
    ("reduce_sum_drops_axis", lambda a: jnp.sum(a, axis=1), [(M, F32)], "4x2", (P("i", "j"),), P("i"),
     "reduce_sum"),
    ("reduce_sum_all", jnp.sum, [(M, F32)], "4x2", (P("i", "j"),), P(), "reduce_sum"),
    ("reduce_max", lambda a: jnp.max(a, axis=0), [(M, F32)], "4x2", (P("i", "j"),), P("j"), "reduce_max"),
    ("reduce_min", lambda a: jnp.min(a, axis=0), [(M, F32)], "8", (P(None, "i"),), P("i"), "reduce_min"),
    ("reduce_prod", lambda a: jnp.prod(a, axis=1), [(M, F32)], "4x2", (P("i", "j"),), P("i"), "reduce_prod"),
    ("reduce_and", lambda a: jnp.all(a, axis=0), [(M, BOOL)], "4x2", (P("i", "j"),), P("j"), "reduce_and"),
    ("reduce_or", lambda a: jnp.any(a, axis=1), [(M, BOOL)], "4x2", (P("i", "j"),), P("i"), "reduce_or"),
    ("argmax", lambda a: jnp.argmax(a, axis=1), [(M, F32)], "4x2", (P("i", "j"),), P("i"), "argmax"),
    ("argmin", lambda a: jnp.argmin(a, axis=0), [(M, F32)], "4x2", (P("i", "j"),), P("j"), "argmin"),
    ("dot_general_free_axes", lambda a, b: a @ b, [(M, F32), ((8, 4), F32)], "4x2", (P("i"), P(None, "j")),
     P("i", "j"), "dot_general"),
    ("dot_general_contracting_dropped", lambda a, b: a @ b, [(M, F32), ((8, 4), F32)], "4x2",
     (P("i", "j"), P("j", None)), P("i"), "dot_general"),
    ("dot_general_free_axes_share_a_mesh_axis", lambda a, b: a @ b.T, [(M, F32), (M, F32)], "4x2",
     (P("i"), P("i")), P("i"), "dot_general"),
    ("dot_general_batch", lambda a, b: jnp.einsum("bij,bjk->bik", a, b), [((8, 4, 6), F32), ((8, 6, 2), F32)],
     "4x2", (P("i", "j"), P("i")), P("i", "j"), "dot_general"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_rule(case, meshes):
    _, f, arg_types, mesh_name, in_specs, expected, primitive = case
    check_rule_case(f, random_args(arg_types), mesh=meshes[mesh_name], in_specs=in_specs, expected=expected,
                    primitive=primitive)


@pytest.mark.parametrize("mesh_name,specs", [("4x2", (P(("i", "j")), P("i"))),
                                             ("2x2x2", (P("i", ("j", "k")), P(None, "j")))])
def test_a_refining_layout_is_a_local_slice_with_no_communication(mesh_name, specs, meshes):
    a = jax.ShapeDtypeStruct(M, F32)
    prog = sp.autoshard(lambda x, y: x * y + x, mesh=meshes[mesh_name], in_specs=specs).trace(a, a)
    assert len(prog.stages) == 1 and prog.out_specs == (specs[0],)
    assert prog.communication() == []  # measured in the compiled HLO


def test_reduction_needs_the_reduced_axis_whole(mesh):
    g = sp.propagate(sp.trace(lambda a: jnp.sum(a, axis=1), jax.ShapeDtypeStruct(M, F32)), P("i", "j"), mesh=mesh)
    (node,) = [n for n in g.graph.nodes if n.op == "reduce_sum"]
    assert g.needs[node.id] == ((("i",), ()),)


def test_replicated_operand_is_consumed_as_a_local_slice(mesh):
    g = sp.propagate(sp.trace(lambda a, b: a + b, *[jax.ShapeDtypeStruct(M, F32)] * 2), (P("i", "j"), P()),
                     mesh=mesh)
    (node,) = [n for n in g.graph.nodes if n.op == "add"]
    assert g.needs[node.id] == ((("i",), ("j",)), (("i",), ("j",)))
    assert g.layout(g.graph.inputs[1]) == ((), ())


def _doubled(a):
    return jax.pure_callback(lambda x: x * 2.0, jax.ShapeDtypeStruct(a.shape, a.dtype), a)


def test_primitive_without_rule_falls_back_with_one_warning_at_the_users_line(mesh):
    import inspect
    import warnings

    line = inspect.getsourcelines(_doubled)[1] + 1
    with pytest.warns(sp.FallbackWarning, match="no sharding rule for primitive `pure_callback`") as caught:
        prog = assert_same_as_unsharded(_doubled, random_args([(M, F32)]), mesh=mesh, in_specs=P("i", "j"))
    (warning,) = [w for w in caught if issubclass(w.category, sp.FallbackWarning)]
    assert warning.filename.endswith("test_rules.py") and warning.lineno == line  # the user's line
    (node,) = [n for n in prog.sharded.graph.nodes if n.op == "pure_callback"]
    assert node.id in prog.sharded.fallbacks
    assert all(m == () for need in prog.sharded.needs[node.id] for m in need)  # every operand gathered
    assert all(m == () for v in node.outputs for m in prog.sharded.layout(v))  # every output replicated
    # once per traced program and primitive: two loops, one warning; another program, warned again
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default", sp.FallbackWarning)
        sp.propagate(sp.trace(lambda a: _doubled(_doubled(a)), jax.ShapeDtypeStruct(M, F32)), P("i"), mesh=mesh)
        sp.propagate(sp.trace(_doubled, jax.ShapeDtypeStruct(M, F32)), P("i"), mesh=mesh)
    messages = [str(w.message) for w in caught if issubclass(w.category, sp.FallbackWarning)]
    assert len(messages) == 2 and "(and 1 more use(s))" in messages[0]


UNARY_FUNCTIONS = [lax.neg, lax.sign, lax.floor, lax.ceil, lax.round, lax.is_finite, lax.exp, lax.exp2, lax.tanh,
                   lax.logistic, lax.sin, lax.cos, lax.atan, lax.sinh, lax.cosh, lax.asinh, lax.abs, lax.erf,
                   lax.erfc, lax.square, lax.cbrt, lambda x: lax.log(lax.abs(x) + 1), lambda x: lax.log1p(lax.abs(x)),
                   lambda x: lax.sqrt(lax.abs(x)), lambda x: lax.rsqrt(lax.abs(x) + 1), lax.expm1,
                   lambda x: lax.integer_pow(x, 3), lambda x: lax.reduce_precision(x, 5, 10),
                   lambda x: lax.stop_gradient(x), lambda x: lax.clamp(-0.5, x, 0.5),
                   lambda x: lax.pow(lax.abs(x) + 1, x), lambda x: lax.atan2(x, x + 2),
                   lambda x: lax.nextafter(x, x + 1), lambda x: lax.rem(x, 0.3)]


@pytest.mark.parametrize("spec", [P("i", "j"), P(("i", "j")), P(None, "j"), None])
def test_every_unary_and_binary_float_rule_in_one_program(spec, mesh):
    def f(a):
        return tuple(fn(a) for fn in UNARY_FUNCTIONS)

    args = random_args([(M, F32)])
    prog = assert_same_as_unsharded(f, args, mesh=mesh, in_specs=(spec,), rtol=1e-5, atol=1e-5)
    assert not prog.sharded.fallbacks
    expected = P() if spec is None else spec
    assert set(prog.out_specs) == {expected}
