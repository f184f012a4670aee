"""The Nx data model: shard ids, ranges and parents; unannotated inputs; stable printed ids."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import shardprop as sp
from tests.functions import nx_example
from tests.conftest import assert_same_as_unsharded, random_args

A = jax.ShapeDtypeStruct((16, 8), jnp.float32)


def nx_sharded(mesh, specs=None):
    specs = (P("i", "j"), P("i", "j")) if specs is None else specs
    return sp.propagate(sp.trace(nx_example, A, A), specs, mesh=mesh)


def test_input_spec_splits_axes_into_equal_root_shards(mesh):
    g = nx_sharded(mesh)
    a = g.graph.inputs[0]
    rows, cols = g.shards(a, 0), g.shards(a, 1)
    assert [(s.start, s.stop) for s in rows] == [(0, 4), (4, 8), (8, 12), (12, 16)]
    assert [(s.start, s.stop) for s in cols] == [(0, 4), (4, 8)]
    assert all(s.parents == () for s in rows + cols)
    assert [s.axis for s in rows] == [0] * 4 and [s.axis for s in cols] == [1] * 2


def test_elementwise_child_shards_have_both_operands_as_parents(mesh):
    g = nx_sharded(mesh)
    a, b = g.graph.inputs
    x = next(n for n in g.graph.nodes if n.op == "add").output
    for axis in (0, 1):
        for child, pa, pb in zip(g.shards(x, axis), g.shards(a, axis), g.shards(b, axis), strict=True):
            assert child.parents == (pa, pb)
            assert (child.start, child.length) == (pa.start, pa.length)


def test_sharded_plus_unannotated_takes_the_sharded_ranges(mesh):
    g = nx_sharded(mesh, (P("i", "j"), None))
    a, b = g.graph.inputs
    assert g.in_specs == (P("i", "j"), P("i", "j"))
    x = next(n for n in g.graph.nodes if n.op == "add").output
    assert [(s.start, s.stop) for s in g.shards(x, 0)] == [(s.start, s.stop) for s in g.shards(a, 0)]


def test_reductions_drop_sharding_on_reduced_axes(mesh):
    g = nx_sharded(mesh)
    z, w = [n.output for n in g.graph.nodes if n.op == "reduce_sum"]
    assert g.layout(z) == (("i",),) and g.layout(w) == (("j",),)
    x = next(n for n in g.graph.nodes if n.op == "add").output
    assert [s.parents for s in g.shards(z, 0)] == [(p,) for p in g.shards(x, 0)]


def test_output_traces_back_to_both_inputs(mesh):
    g = nx_sharded(mesh)
    a, b = g.graph.inputs
    out = g.graph.outputs[0]
    roots = set()
    stack = list(g.shards(out, 0) + g.shards(out, 1))
    while stack:
        s = stack.pop()
        if not s.parents:
            roots.add(s.id)
        stack.extend(s.parents)
    # row blocks of the output come from a's/b's row shards (via z), column blocks from their column shards.
    expected = {s.id for v in (a, b) for axis in (0, 1) for s in g.shards(v, axis)}
    assert roots == expected


def test_compound_spec_splits_over_the_product_of_mesh_axes(meshes):
    g = sp.propagate(sp.trace(jnp.tanh, A), P(("i", "j", "k")), mesh=meshes["2x2x2"])
    shards = g.shards(g.graph.inputs[0], 0)
    assert len(shards) == 8 and shards[3].start == 6 and shards[3].length == 2
    assert g.out_specs == (P(("i", "j", "k")),)


def test_printed_ids_are_stable_across_runs(mesh):
    first = nx_sharded(mesh)
    second = nx_sharded(mesh)
    out = first.graph.outputs[0]
    assert first.describe(out) == second.describe(out)
    assert first.describe(first.graph.inputs[0]).splitlines()[1].startswith("  axis 0 @i: #0[0:4]<-()")


def test_unannotated_meeting_two_shardings_is_replicated(mesh):
    def f(a, c, b):
        return a + b, c + b

    args = random_args([((16, 8), np.float32)] * 3)
    prog = assert_same_as_unsharded(f, args, mesh=mesh, in_specs=(P("i"), P("j"), None))
    assert prog.in_specs[2] == P()


def test_two_unannotated_inputs_adopt_together(mesh):
    def f(a, b, c):
        return (b * c) + a

    args = random_args([((16, 8), np.float32)] * 3)
    prog = assert_same_as_unsharded(f, args, mesh=mesh, in_specs=(P("i", "j"), None, None))
    assert prog.in_specs == (P("i", "j"),) * 3


def test_unannotated_never_uses_a_mesh_axis_twice(mesh):
    def f(a, b):
        return a + b, a + b.T

    args = random_args([((8, 8), np.float32)] * 2)
    prog = assert_same_as_unsharded(f, args, mesh=mesh, in_specs=(P("i"), None))
    layout = prog.sharded.layout(prog.sharded.graph.inputs[1])
    names = [n for m in layout for n in m]
    assert len(names) == len(set(names))


def test_everything_unannotated_is_replicated(mesh):
    args = random_args([((16, 8), np.float32)] * 2)
    prog = assert_same_as_unsharded(nx_example, args, mesh=mesh, in_specs=None)
    assert prog.in_specs == (P(), P()) and len(prog.stages) == 1
