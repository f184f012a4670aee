"""Property test: random elementwise/broadcast/reduction programs under random meshes and specs either
equal the unsharded result or raise a ShardingConflictError — never a wrong number, never another error.

A failing example prints the program as plain jax.numpy code (see the ``note`` in the report).
"""

import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

import shardprop as sp
from tests.conftest import MESH_SHAPES, assert_same_as_unsharded, random_args

UNARY = ["jnp.tanh({})", "jnp.sin({})", "-{}", "jnp.abs({})", "({} * 0.5)"]
BINARY = ["({} + {})", "({} - {})", "({} * {})", "jnp.maximum({}, {})", "jnp.where({0} > {1}, {0}, {1})"]
REDUCE = ["jnp.sum({}, axis={}, keepdims=True)", "jnp.max({}, axis={}, keepdims=True)",
          "jnp.mean({}, axis={}, keepdims=True)"]


@st.composite
def programs(draw):
    n_inputs = draw(st.integers(1, 3))
    names = [f"x{i}" for i in range(n_inputs)]
    lines = []
    for step in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["unary", "binary", "reduce", "transpose"]))
        a = draw(st.sampled_from(names))
        if kind == "unary":
            expr = draw(st.sampled_from(UNARY)).format(a)
        elif kind == "binary":
            expr = draw(st.sampled_from(BINARY)).format(a, draw(st.sampled_from(names)))
        elif kind == "reduce":
            expr = draw(st.sampled_from(REDUCE)).format(a, draw(st.integers(0, 1)))
            expr = f"({a} - {expr})"  # broadcast back to the full shape
        else:
            expr = f"{a}.T"
        name = f"v{step}"
        lines.append(f"    {name} = {expr}")
        names.append(name)
    outs = draw(st.lists(st.sampled_from(names[n_inputs:]), min_size=1, max_size=2, unique=True))
    source = f"def f({', '.join(names[:n_inputs])}):\n" + "\n".join(lines) + f"\n    return ({', '.join(outs)},)\n"
    return n_inputs, source


@st.composite
def spec_for(draw, mesh_names):
    names = list(mesh_names)
    choice = draw(st.sampled_from(["none", "replicated", "row", "col", "both", "compound"]))
    if choice == "none":
        return None
    if choice == "replicated":
        return P()
    first = draw(st.sampled_from(names))
    rest = [n for n in names if n != first]
    if choice == "row":
        return P(first)
    if choice == "col":
        return P(None, first)
    if choice == "both" and rest:
        return P(first, draw(st.sampled_from(rest)))
    if choice == "compound" and rest:
        return P((first, draw(st.sampled_from(rest))))
    return P(first)


@st.composite
def cases(draw):
    n_inputs, source = draw(programs())
    mesh_name = draw(st.sampled_from(sorted(MESH_SHAPES)))
    specs = tuple(draw(spec_for(MESH_SHAPES[mesh_name][1])) for _ in range(n_inputs))
    return source, n_inputs, mesh_name, specs


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases())
def test_random_programs_equal_unsharded_or_conflict(case, meshes):
    source, n_inputs, mesh_name, specs = case
    note(f"mesh {MESH_SHAPES[mesh_name]}, in_specs={specs}\n{source}")
    namespace = {"jnp": jnp}
    exec(source, namespace)  # noqa: S102  the generated program
    f = namespace["f"]
    args = random_args([((16, 16), np.float32)] * n_inputs)
    try:
        assert_same_as_unsharded(f, args, mesh=meshes[mesh_name], in_specs=specs, rtol=1e-4, atol=1e-4)
        event("equal to unsharded")
    except sp.ShardingConflictError:
        event("sharding conflict")  # a genuine conflict is allowed; any other error is a failure
