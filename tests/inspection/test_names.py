"""Values named as the user knows them (issue #31): every argument leaf by its parameter and key path as jax.jit's
messages name it (``params['w']``) — in the listing's head, the stage table, explain, errors, JSON, the debugger and
the search's table; keyword and static arguments too; a model's many inputs print as a table; ``prog.stages[k]``
prints as its block; a library's line in a listing says the user's line that called it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import shardprop as sp

PARAMS = {"w": np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8), "b": np.ones(8, np.float32)}
X = np.linspace(-1, 2, 128, dtype=np.float32).reshape(16, 8)
SPECS = ({"w": P(None, "j"), "b": P("j")}, P("i"))


def layer(params, x):
    return jnp.tanh(x @ params["w"]) + params["b"]


@pytest.fixture
def prog(mesh):
    return sp.autoshard(layer, mesh=mesh, in_specs=SPECS).trace(PARAMS, X)


def test_the_listing_heads_each_argument_with_its_name(prog):
    head = str(prog.graph).splitlines()[:5]
    assert head == ["{ lambda ;",
                    "    a:f32[8@j]      # params['b']",
                    "    b:f32[8,8@j]    # params['w']",
                    "    c:f32[16@i,8]   # x",
                    "  let"]


def test_the_stage_table_and_one_stage_say_where_inputs_come_from_by_name(prog):
    table = str(prog.stages)
    assert "<- params['w']" in table and "<- x" in table and "<- argument" not in table
    assert str(prog.stages[0]) == repr(prog.stages[0]) == table.rsplit("\nprogram outputs:", 1)[0]
    assert isinstance(prog.stages[0], sp.Stage) and prog.stages[0].nodes == prog.plan.stages[0].nodes


@pytest.mark.parametrize("name", ["params['w']", "[0]['w']", "w"])
def test_explain_and_the_debugger_take_an_arguments_name(prog, mesh, name):
    why = sp.explain(prog, name)
    assert why.value == prog.graph.plan.graph.inputs[1]
    assert why.equation.endswith("= argument params['w']")
    assert "origin: argument params['w'] (b) has spec P(None, 'j')" in str(why)
    dbg = sp.Debugger(prog, PARAMS, X)
    np.testing.assert_array_equal(np.asarray(dbg.value(name)), PARAMS["w"])


def test_json_names_every_input_and_where_its_spec_came_from(mesh):
    x = jax.device_put(X, jax.sharding.NamedSharding(mesh, P("i")))
    prog = sp.autoshard(layer, mesh=mesh, in_specs=(sp.AUTO, None)).trace(PARAMS, x)
    inputs = sp.to_json(prog)["inputs"]
    assert [(i["name"], i["spec_source"]) for i in inputs] == [
        ("params['b']", "sp.AUTO"), ("params['w']", "sp.AUTO"), ("x", "array")]


def test_a_bad_spec_names_the_argument_and_the_call(mesh):
    fs = sp.autoshard(layer, mesh=mesh, in_specs=({"w": P("i", "i"), "b": P()}, P("i")))
    with pytest.raises(sp.DuplicateMeshAxisError) as info:
        fs(PARAMS, X)
    message = str(info.value)
    assert message.startswith("argument params['w']: spec P('i', 'i')")
    assert message.endswith(")") and "(call at test_names.py:" in message
    frames = [tb.tb_frame.f_code.co_filename for tb in _walk(info.value.__traceback__)]
    assert all(f.endswith("api.py") for f in frames[1:]) and len(frames) <= 3  # the call's own two frames, no more


def _walk(tb):
    while tb is not None:
        yield tb
        tb = tb.tb_next


def test_keyword_and_static_arguments_are_named_as_jax_jit_names_them(mesh):
    def scaled(params, x, n, *, scale):
        return layer(params, x) * scale * n

    fs = sp.autoshard(scaled, mesh=mesh, in_specs=SPECS, static_argnums=2)
    prog = fs.trace(PARAMS, X, 3, scale=np.float32(2.0))
    assert prog.graph.plan.graph.argument_names == ("params['b']", "params['w']", "x", "scale")
    np.testing.assert_allclose(np.asarray(fs(PARAMS, X, 3, scale=np.float32(2.0))),
                               np.asarray(layer(PARAMS, X)) * 6, rtol=1e-5, atol=1e-6)


def test_a_python_if_on_a_traced_value_names_the_users_function_and_argument(mesh):
    def branchy(params, x):
        if x.sum() > 0:
            return x
        return params["w"]

    with pytest.raises(sp.TraceError) as info:
        sp.autoshard(branchy, mesh=mesh, in_specs=None)(PARAMS, X)
    message = str(info.value)
    assert "tracing the function branchy at" in message and "the argument x" in message
    assert "flat_fun" not in message and "trace.py" not in message


def test_many_inputs_print_as_a_table_with_names_and_sources(mesh):
    params = [dict(PARAMS) for _ in range(3)]
    prog = sp.autoshard(lambda ps, x: sum(layer(p, x) for p in ps), mesh=mesh,
                        in_specs=(sp.AUTO, P("i"))).trace(params, X)
    lines = repr(prog).splitlines()
    assert lines[0].endswith("; 7 inputs:") and len(lines) == 8
    assert lines[1].split()[:3] == ["ps[0]['b']", "f32[8]", str(prog.in_specs[0][0]["b"])]
    assert lines[1].endswith("(chosen by sp.AUTO)") and lines[-1].split()[0] == "x"


def test_a_library_line_in_the_listing_names_the_users_line_that_called_it(mesh):
    import flax.linen as nn

    model = nn.Dense(8)
    variables = model.init(jax.random.PRNGKey(0), X)
    prog = sp.autoshard(lambda v, x: model.apply(v, x), mesh=mesh, in_specs=(None, P("i"))).trace(variables, X)
    listing = str(prog.graph)
    assert "(called from test_names.py:" in listing
    assert "# x" in listing and "v['params']['kernel']" in listing


def test_a_users_key_is_never_shadowed_by_a_generated_name(prog, mesh):
    """The listing calls params['w'] "b"; the user's "b" is params['b'] (#52: "wq" explained a constant the
    listing happened to call wq)."""
    assert sp.explain(prog, "b").equation.endswith("= argument params['b']")
    np.testing.assert_array_equal(np.asarray(sp.Debugger(prog, PARAMS, X).value("b")), PARAMS["b"])
    assert sp.explain(prog, prog.graph.plan.graph.inputs[1]).equation.endswith("= argument params['w']")  # by id


def test_a_key_several_arguments_share_is_refused_naming_them(mesh):
    def step(params, m, x):
        return jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, m), jnp.sum(x @ params["w"])

    prog = sp.autoshard(step, mesh=mesh, in_specs=(SPECS[0], SPECS[0], P("i"))).trace(PARAMS, PARAMS, X)
    with pytest.raises(sp.errors.UnknownValueError, match=r"'w' names 2 arguments: params\['w'\], m\['w'\]"):
        sp.explain(prog, "w")
    assert sp.explain(prog, "m['w']").equation.endswith("= argument m['w']")


def test_outputs_are_named_by_their_path(mesh):
    def step(params, x):
        return {"w": params["w"] * 2.0}, jnp.sum(layer(params, x))

    prog = sp.autoshard(step, mesh=mesh, in_specs=SPECS).trace(PARAMS, X)
    graph = prog.graph.plan.graph
    assert graph.output_paths == ("out[0]['w']", "out[1]")
    assert sp.explain(prog, "out[1]").value == graph.outputs[1]
    assert " = reduce_sum" in sp.explain(prog, "out[1]").equation
    assert sp.explain(prog, "out[0]['w']").value == graph.outputs[0]


def test_explain_a_source_line_explains_every_value_made_there(prog):
    line = next(node for node in prog.graph.plan.graph.nodes if node.op == "tanh").source.rsplit("/", 1)[-1]
    graph = prog.graph.plan.graph
    made = [v for node in graph.nodes if node.source and node.source.endswith("/" + line) for v in node.outputs]
    why = sp.explain(prog, line)
    assert [e.value for e in why] == made and {graph.nodes[graph.producer[v]].op for v in made} >= {
        "dot_general", "tanh", "add"}
    assert str(why).startswith(f"{len(made)} values made at {line}:")
    assert why.to_dict()["line"] == line and len(why.to_dict()["values"]) == len(made)
    with pytest.raises(sp.errors.UnknownValueError, match="no value of this program is made at test_names.py:1 "):
        sp.explain(prog, "test_names.py:1")
