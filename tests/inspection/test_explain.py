"""sp.explain: the chain of rules, ops and source lines behind every axis's sharding."""

import pathlib
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
import pytest
from jax.sharding import PartitionSpec as P

import shardprop as sp
from tests.ir import finishes

from .nx_example import f as nx_example


def program(f, args, in_specs, mesh, strategy="auto"):
    return sp.autoshard(f, mesh=mesh, in_specs=in_specs, strategy=strategy).trace(*args)


def test_sharded_axis_is_traced_back_to_the_input_spec(mesh):
    a = jnp.ones((16, 8))
    why = sp.explain(program(nx_example, (a, a), (P("i", "j"), None), mesh, "gather"), "e")
    (axis,) = why.axes
    assert axis.mesh_axes == ("i",)
    assert axis.origin == "argument a has spec P('i', 'j'); this is its axis 0"
    assert [(s.op, s.source.rsplit("/", 1)[-1]) for s in axis.steps] == [("add", "nx_example.py:7"),
                                                                       ("reduce_sum", "nx_example.py:9")]
    # the reduced axis: its sharding is dropped, and the gather that pays for it is named with its bytes
    (consumed,) = why.consumes
    assert consumed.startswith("c: takes axis 1 (sharded over j) whole") and "Reductions drop sharding" in consumed
    assert "64 B per device" in consumed
    text = str(why)
    assert "sharded over i, 4 blocks of 4" in text and "[stage 1]" in text


def test_unannotated_input_says_it_adopted_its_sharding(mesh):
    a = jnp.ones((16, 8))
    why = sp.explain(program(nx_example, (a, a), (P("i", "j"), None), mesh), "b")
    assert all("unannotated" in axis.origin and "adopted" in axis.origin for axis in why.axes)


def test_replicated_axis_names_the_op_that_dropped_it(mesh):
    def f(x, w):
        return jnp.sort(jnp.tanh(x @ w), axis=0)

    # (w is 8x4: the result, shaped unlike x, is not returned in x's layout)
    prog = program(f, (jnp.ones((16, 8)), jnp.ones((8, 4))), (P("i", "j"), P("j")), mesh)
    why = sp.explain(prog, prog.sharded.graph.outputs[0])
    scanned, other = why.axes
    assert scanned.mesh_axes == () and "`sort`" in scanned.origin and "sharded over i" in scanned.origin
    assert "sorts need the scanned axis whole" in scanned.reason
    # axis 1 was never sharded: the weight's spec leaves its columns whole, through the matmul and tanh
    assert other.origin == "argument w (b) has spec P('j',)" and [s.op for s in other.steps] == [
        "dot_general", "tanh", "sort"]
    matmul = sp.explain(prog, "c")
    assert any("psum[j] c finishes the result" in c for c in matmul.consumes)


def test_a_contraction_names_the_axes_it_sums_and_keeps_where_it_drops_a_kept_axis(mesh):
    """Tokens over i meet a weight whose output features are over i: the product keeps both and cannot shard both,
    so its feature axis is replicated — said as such, not as "contracting axes are a reduction"."""
    def f(x, w):
        return x @ w

    prog = program(f, (jnp.ones((16, 8)), jnp.ones((8, 32))), (P("i"), P(None, "i")), mesh)
    (batch, features) = sp.explain(prog, prog.sharded.graph.outputs[0]).axes
    assert batch.mesh_axes == ("i",) and features.mesh_axes == ()
    assert features.reason == ("`dot_general` sums over a axis 1 and b axis 0 and keeps the others; c axis 1 is b "
                               "axis 1, a kept axis, sharded over i there, but i shards c axis 0 (a mesh axis shards "
                               "at most one axis of a tensor): b is taken whole there")


def test_fallback_is_named_as_the_reason(mesh):
    def f(x):
        # a host callback inside the body: no rule, so the loop falls back, naming it
        def on_host(v):
            return jax.pure_callback(lambda u: u * 2.0, jax.ShapeDtypeStruct(v.shape, v.dtype), v)

        return lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, on_host(c[1])), (0, x))[1] * 2.0

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sp.FallbackWarning)
        prog = program(f, (jnp.ones((16, 8)),), (P("i", "j"),), mesh)
    loop_value = next(n.outputs[1] for n in prog.sharded.graph.nodes if n.op == "while")
    why = sp.explain(prog, loop_value)
    assert why.rule == "conservative fallback"
    assert all("`while`" in a.origin and "`pure_callback` at test_explain.py:" in a.reason and "inside its body"
               in a.reason for a in why.axes)


def test_created_axis_that_met_no_sharding(mesh):
    def f(x):
        return jnp.broadcast_to(x[None], (4, 16)) * 3.0

    prog = program(f, (jnp.ones((16,)),), (P("i"),), mesh)
    why = sp.explain(prog, prog.sharded.graph.outputs[0])
    assert why.axes[1].mesh_axes == ("i",)
    assert "`broadcast_in_dim`" in why.axes[0].origin and "new axis" in why.axes[0].reason


def test_explain_rejects_unknown_values(mesh):
    a = jnp.ones((16, 8))
    with pytest.raises(sp.OptionError, match="no value 'zz'"):
        sp.explain(program(nx_example, (a, a), (P("i", "j"), None), mesh), "zz")


def test_explanation_is_json_ready(mesh):
    import json

    a = jnp.ones((16, 8))
    data = sp.explain(program(nx_example, (a, a), (P("i", "j"), None), mesh, "gather"), "i").to_dict()
    step = json.loads(json.dumps(data))["axes"][1]["steps"][0]
    assert (step["value"], step["axis"], step["op"], step["rule"]) == ("d", 1, "sub", "elementwise.elementwise")
    assert step["source"].endswith("nx_example.py:8")


def test_a_value_held_finer_by_a_reduce_scatter_is_explained_as_the_plan_holds_it(mesh):
    """``x @ w`` summed over j and then sliced by the next contraction: the plan keeps only each device's
    block of the sum (psum_scatter), so explain, the listing and the block picture all say axis 1 is over j."""
    args = (jnp.ones((16, 8)), jnp.ones((8, 8)), jnp.ones((8, 4)))  # (a result shaped unlike x: it mirrors no argument)
    prog = program(lambda x, w, v: (x @ w) @ v, args, (P("i", "j"), P("j", None), P("j")), mesh, "collective")
    assert [f.step.kind for f in finishes(prog, prog.sharded.graph.producer[3])] == ["psum-scatter"]
    why = sp.explain(prog, "d")
    assert why.equation.startswith("d:f32[16@i,8@j] = dot_general")
    listing = str(prog.graph)  # computed partial, then held as each device's block of the sum
    assert "d:f32[16@i,8]{+j} = dot_general" in listing and "d:f32[16@i,8@j] = psum_scatter[j axis=1] d" in listing
    assert [a.mesh_axes for a in why.axes] == [("i",), ("j",)] == [tuple(m) for m in prog.plan.layout(3)]
    assert "finished by a reduce-scatter (psum_scatter[j axis=1] d)" in why.axes[1].origin


def test_splitting_a_program_again_starts_from_its_propagated_graph(mesh):
    a = jnp.ones((16, 8))
    prog = program(nx_example, (a, a), (P("i", "j"), None), mesh, "collective")
    assert len(prog.stages) == 1
    with pytest.raises(sp.OptionError, match=r"prog.sharded"):
        sp.split(prog.sharded.graph, strategy="gather")  # a traced Graph is not propagated yet
    with pytest.raises(sp.OptionError, match=r"prog.sharded"):
        sp.split(prog.graph, strategy="gather")  # the printed view is not a product
    again = sp.split(prog.sharded, strategy="gather")
    assert len(again.stages) == 2 and type(again.sharded) is sp.ShardedGraph
    assert sp.to_json(again)["strategy"] == "gather" and len(sp.to_json(again)["stages"]) == 2
    assert sp.to_json(again.sharded)["strategy"] is None  # a bare ShardedGraph has no plan to report


def recurrent_source() -> str:
    from shardprop.examples import recurrent

    return pathlib.Path(recurrent.__file__).read_text()


def _line_of(source: str, text: str, after: str = "") -> int:
    """The line number of the first line holding ``text`` (after the first holding ``after``)."""
    start = source.index(after) if after else 0
    return source[:source.index(text, start)].count("\n") + 1


def _rnn_grad_program(mesh):
    from shardprop.examples import recurrent

    xs, h0 = jnp.ones((6, 8, 16)), jnp.ones((8, 16))
    return program(jax.grad(recurrent.rnn_loss), (recurrent.init_rnn(), xs, h0), (None, P(None, "i"), P("i")), mesh)


def test_explain_descends_into_a_loop_body_by_the_path_the_listing_prints(mesh):
    """``"ba/body/o"``: a value of the backward scan's body. Its sum over the batch is left partial (one psum after
    the loop, not one per step), its sharded axis is traced to the body input and from there to the loop's operand,
    and the loop's own explanation points inside. (The names are read from the listing: jax 0.12 writes tanh's
    derivative as one primitive, so its values are named otherwise than 0.10.2's.)"""
    prog = _rnn_grad_program(mesh)
    listing = str(prog.graph)
    loop = re.findall(r"^ *(\w+)/body: the body of `scan`", listing, re.M)[-1]  # the backward scan: the second
    body = listing[listing.index(f"{loop}/body: the body of `scan`"):]
    total, summed = re.search(r"^ *(\w+):f32\[16\]\{\+i\} = reduce_sum\[axes=\(0,\)\] (\w+)", body, re.M).groups()
    why = sp.explain(prog, f"{loop}/body/{total}")
    at = _line_of(recurrent_source(), "_, hs = lax.scan(step, h0, xs)")
    assert f"[in {loop}/body: the body of `scan` at recurrent.py:{at}, run 6 times]" in why.equation
    assert why.equation.startswith(f"{total}:f32[16]{{+i}} = reduce_sum")  # its type says it is a partial sum
    assert "kept partial: one psum after the loop sums it, not one per iteration" in why.partial
    sharded = sp.explain(prog, f"{loop}/body/{summed}")  # the batch-sharded cotangent inside the body
    assert sharded.axes[0].mesh_axes == ("i",)
    assert re.fullmatch(r"body input \d+ \(\w+\) is carry \d+ of `scan` \(it starts as \w+, then is the previous "
                        r"iteration's\), held as P\('i',\); this is its axis 0", sharded.axes[0].origin)
    # (by its id: under jax 0.12.1 the listing calls the loop `w`, which names the user's params['w'])
    scan = [node for node in prog.sharded.graph.nodes if node.op == "scan"][-1]
    explained = sp.explain(prog, scan.outputs[0])
    assert explained.equation.startswith(f"{loop}:")
    assert any("carry 0 kept a partial sum over i" in c for c in explained.consumes)
    assert any(f"sp.explain(prog, '{loop}/body/<value>')" in c for c in explained.consumes)


def test_explain_names_the_gather_inside_a_body_and_what_it_costs_each_iteration(mesh):
    from shardprop.examples import recurrent

    gates_on_j = {"wx": P(None, "j"), "wh": P(None, "j"), "b": P("j")}
    prog = program(recurrent.gru_loss, (recurrent.init_gru(), jnp.ones((6, 8, 16)), jnp.ones((8, 16))),
                   (gates_on_j, P(None, "i"), P("i")), mesh)
    listing = str(prog.graph)
    # the gates are split in place (each device keeps its rows of each gate, ranged); a gate meeting another whose
    # rows lie on other devices reads them realigned, inside the body
    assert "o:f32[8@i,16@j[24k:24k+24]] = realign[j axis=1 by=32] o" in listing
    why = sp.explain(prog, "f/body/t")  # r * n: the reset gate's rows meet the candidate's
    (line,) = [c for c in why.consumes if c.startswith("o: read as f32[8@i,16@j[24k:24k+24]]")]
    at = _line_of(recurrent_source(), "_, hs = lax.scan(step, h0, xs)", after="def gru_loss")
    assert (f"Paid for by realign[j axis=1 by=32] o (128 B per device) inside the body of `scan` at "
            f"recurrent.py:{at}, run 6 times, each time") in line
    weight = sp.explain(prog, "f/body/a")
    assert weight.axes[1].origin == "body input 0 (a) is c, operand 0 of `scan`, held as P(None, 'j'); this is its " \
        "axis 1"


def test_explain_follows_while_conditions_and_nested_bodies(mesh):
    from shardprop.examples import recurrent

    x = jnp.ones((8, 16))
    grow = program(recurrent.grow_until, (x,), (P("i", "j"),), mesh)
    why = sp.explain(grow, "b/cond/c")
    assert "the condition of `while`" in why.equation and "every iteration" in why.equation
    assert any("psum[i*j] c finishes the result" in c for c in why.consumes)
    nested = program(recurrent.nested_loops, (x,), (P("i", "j"),), mesh)
    inner = sp.explain(nested, "b/body/b/body/d")
    at = _line_of(recurrent_source(), "c = lax.fori_loop(0, 3")
    assert f"[in b/body/b/body: the body of `scan` at recurrent.py:{at}, run 3 times]" in inner.equation
    assert inner.axes[0].origin.startswith("body input 0 (a) is carry 0 of `scan` (it starts as b/body/a")


@pytest.mark.parametrize("path, message", [
    ("b/bod/c", "`scan` computing 'b' has no part 'bod'; its parts are 'body'"),
    ("b/body", "a path names a value inside a body as <op output>/<part>/<value>"),
    ("b/body/zz", "no value 'zz' in this graph"),
])
def test_a_bad_path_is_refused_saying_what_exists(mesh, path, message):
    from shardprop.examples import recurrent

    prog = program(recurrent.nested_loops, (jnp.ones((8, 16)),), (P("i", "j"),), mesh)
    with pytest.raises(sp.UnknownValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        sp.explain(prog, path)
    plain = program(nx_example, (jnp.ones((16, 8)),) * 2, (P("i", "j"), None), mesh)
    with pytest.raises(sp.UnknownValueError, match="it has no body"):
        sp.explain(plain, "e/body/a")


def test_explain_follows_a_value_moved_there_and_back(meshes):
    """A cumulative product's gradient moves a value to another layout and back (found by review: explain looped
    for ever following the chain of moves that made an operand); every value is explained."""
    def loss(x):
        o = jax.lax.cumprod(jnp.tanh(x), axis=1)
        return jnp.sum(o * jnp.cos(jnp.arange(o.size, dtype=o.dtype).reshape(o.shape)))

    x = np.random.default_rng(0).normal(size=(12, 12, 6)).astype(np.float32)
    prog = sp.autoshard(jax.grad(loss), mesh=meshes["2x2x2"], in_specs=(P("j", "i", "k"),), strategy="gather").trace(x)
    np.testing.assert_allclose(np.asarray(prog(x)), np.asarray(jax.grad(loss)(x)), rtol=1e-4, atol=1e-5)
    for v in range(len(prog.plan.graph.avals)):
        assert sp.explain(prog, v).axes is not None
