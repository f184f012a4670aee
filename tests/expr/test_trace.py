"""Tracing into our graph: inlining, constants, pytrees, source lines, the listing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import shardprop as sp
from shardprop.expr import CONSTANT, PARAMETER

X = jax.ShapeDtypeStruct((8, 4), jnp.float32)


def ops(graph):
    return [n.op for n in graph.nodes if n.op not in (PARAMETER, CONSTANT)]


def test_nested_jit_custom_jvp_and_custom_vjp_are_inlined():
    @jax.custom_vjp
    def h(x):
        return jnp.sin(x)

    h.defvjp(lambda x: (jnp.sin(x), x), lambda r, g: (g * jnp.cos(r),))

    def f(x):
        return jax.jit(lambda y: y * 2.0)(jax.nn.relu(h(x)))

    g = sp.trace(f, X)
    assert ops(g) == ["sin", "max", "mul"]


def test_literals_and_closed_over_constants_become_constant_nodes():
    table = np.arange(4.0, dtype=np.float32)
    g = sp.trace(lambda x: x + table + 1.0, X)
    constants = [n for n in g.nodes if n.op == CONSTANT]
    values = sorted(float(np.sum(n.params["value"])) for n in constants)
    assert values == [1.0, 6.0]


def test_nodes_record_op_operands_shape_dtype_and_user_source_line():
    def f(a, b):
        return a * b  # the line recorded below

    g = sp.trace(f, X, X)
    (mul,) = [n for n in g.nodes if n.op == "mul"]
    assert mul.operands == g.inputs
    assert g.avals[mul.output].shape == (8, 4) and g.avals[mul.output].dtype == np.float32
    line = f.__code__.co_firstlineno + 1
    assert mul.source == f"{__file__}:{line}"


def test_pytree_arguments_and_outputs_round_trip():
    def f(params, x):
        return {"y": x @ params["w"], "n": (jnp.sum(x),)}

    g = sp.trace(f, {"w": jax.ShapeDtypeStruct((4, 3), jnp.float32)}, X)
    assert len(g.inputs) == 2 and len(g.outputs) == 2
    assert jax.tree_util.tree_unflatten(g.out_tree, [0, 1]) == {"n": (0,), "y": 1}


def test_listing_is_jaxpr_like_with_source_lines():
    g = sp.trace(lambda a, b: jnp.sum(a + b, axis=1), X, X)
    text = str(g)
    assert text.splitlines()[:4] == ["{ lambda ;", "    a:f32[8,4]   # a", "    b:f32[8,4]   # b", "  let"]
    assert "c:f32[8,4] = add a b" in text
    assert "d:f32[8] = reduce_sum[axes=(1,)] c" in text
    assert "# test_trace.py:" in text
    assert text.splitlines()[-1] == "  in (d,) }"


def test_networkx_graph_gives_topological_order_and_ancestors():
    g = sp.trace(lambda a, b: (a + b) * a, X, X)
    order = g.topological_order()
    assert order.index(2) < order.index(3)
    assert g.ancestors(3) == {0, 1, 2}


def test_non_array_argument_is_a_trace_error():
    with pytest.raises(sp.TraceError, match=r"argument\[1\] is a str, not an array"):
        sp.trace(lambda a, s: a, X, "hello")


def test_jax_errors_while_tracing_become_trace_errors():
    with pytest.raises(sp.TraceError, match="tracing 'bad' failed"):
        def bad(a, b):
            return a @ b

        sp.trace(bad, X, X)


def test_static_branches_are_inlined_while_tracing():
    """``platform_index`` (``jnp.linalg.det``) is folded to the branch for this platform, and a ``cond`` whose
    index is a constant — including ``lax.switch``'s clamped index — is inlined as that branch."""
    from jax import lax

    x = jax.ShapeDtypeStruct((4, 5, 5), jnp.float32)  # (3x3 and smaller have a closed form)
    ops = {n.op for n in sp.trace(jnp.linalg.det, x).nodes}
    assert "platform_index" not in ops and "cond" not in ops and "lu" in ops
    for index, branch in ((0, "sin"), (1, "cos"), (7, "tanh"), (-2, "sin")):
        graph = sp.trace(lambda a, i=index: lax.switch(i, [jnp.sin, jnp.cos, jnp.tanh], a), x)
        assert [n.op for n in graph.nodes if n.op not in (PARAMETER, CONSTANT)] == [branch]
    # a predicate computed from data stays a cond
    data_dependent = sp.trace(lambda a: lax.cond(a.sum() > 0, jnp.sin, jnp.cos, a), x)
    assert "cond" in {n.op for n in data_dependent.nodes}


def test_an_expression_written_twice_is_one_node_as_jax_jit_computes_it_once():
    """Issue #48 (review): ``jnp.where(m + x <= jnp.min(m + x, 0), ...)`` written out twice was two nodes, held in
    different kernels with different roundings, and the comparison missed the minimum (wrong counts and
    gradients). XLA merges common subexpressions; so does the trace — the same op on the same values with the same
    params, and small constants of the same bits."""
    def f(x):
        return jnp.where(jnp.mean(x, 0, keepdims=True) + x <= jnp.min(jnp.mean(x, 0, keepdims=True) + x, axis=0), x,
                         0.0)

    written = ops(sp.trace(f, X))
    assert [written.count(op) for op in ("reduce_sum", "div", "add", "reduce_min", "le")] == [1, 1, 1, 1, 1]


@pytest.mark.parametrize("name,f,count", [
    ("other params", lambda x: (jnp.sum(x, 0), jnp.sum(x, 1)), 2),
    ("other operands", lambda x: (x * 2.0, (x + 1.0) * 2.0), 3),
    ("constants of other signs", lambda x: (x * 0.0, x * -0.0), 2),
    ("constants of other dtypes", lambda x: (x.astype(jnp.int32) + 1, x + 1.0), 2),
    ("draws from one key", lambda x: (jax.random.normal(jax.random.key(0), (8, 4)) * x,
                                      jax.random.normal(jax.random.key(0), (8, 4)) * x), None),
])
def test_expressions_that_differ_stay_apart(name, f, count):
    graph = sp.trace(f, X)
    if count is None:  # random bits are drawn once per call as written (an effect-like op is never merged)
        assert sum(n.op == "random_bits" for n in graph.nodes) == 2
    else:
        assert len([n for n in graph.nodes if n.op in ("reduce_sum", "mul", "add")]) == count
