"""Every primitive the installed JAX defines is accounted for, and every record is complete and works.

* the records, the calls the tracer inlines and the list of primitives without a record cover what JAX
  defines, without overlap, and name nothing it does not define;
* every record has every piece (or says it has none), and the public primitives of ``jax.lax`` that have no
  record are the kinds that cannot have one yet;
* every record has an example program (``examples.py``) that runs on sharded inputs without a fallback, meets
  a sharded value at the primitive, and equals the unsharded function.
"""


import numpy as np
import pytest

from shardprop.expr import jax_adapter as jx
from shardprop.ops import Family, lookup, table
from shardprop.ops.without_record import (AD, COLLECTIVE, MEMORY, NO_FUNCTION, NOT_IN_TRACES, STATE,
                                          TOKEN, WITHOUT_RECORD)
from tests.conftest import assert_same_as_unsharded, random_args
from tests.ops.examples import EXAMPLES, MESH_EXAMPLES


def test_every_primitive_jax_defines_is_accounted_for_once():
    defined = jx.defined_primitives()
    recorded, inlined, without = set(table()), set(jx.INLINED_CALLS | jx.FOLDED_AT_TRACE), set(WITHOUT_RECORD)
    assert not (recorded & inlined) and not (recorded & without) and not (inlined & without)
    assert sorted(defined - recorded - inlined - without) == [], "primitives nobody has decided about"
    # a name only another supported JAX release defines (jax_adapter/versions.py) is allowed
    assert sorted((recorded | inlined | without) - defined - jx.PRIMITIVES_OF_SOME_RELEASES) == [], \
        "names no supported JAX release defines"


def test_every_record_has_every_piece():
    for name, op in table().items():
        assert op.name == name and isinstance(op.family, Family) and not op.is_fallback
        assert callable(op.propagate) and callable(op.lineage) and callable(op.per_block), name
        assert op.finish is None or callable(op.finish), name
        assert op.pull is None or callable(op.pull), name
        assert isinstance(op.lineage_exact, bool), name
        assert op.why and op.rule_name.count(".") == 1, name
    reductions_with_a_finish = {n for n, op in table().items() if op.family is Family.REDUCTION and op.finish}
    assert reductions_with_a_finish == {"reduce_sum", "reduce_max", "reduce_min", "reduce_and", "reduce_or",
                                        "reduce_prod", "argmax", "argmin"}


def test_public_primitives_without_a_record_are_those_that_cannot_have_one_yet():
    public = jx.public_primitives() - set(table()) - jx.INLINED_CALLS - jx.FOLDED_AT_TRACE
    reasons = {WITHOUT_RECORD[name] for name in public}
    assert reasons <= {COLLECTIVE, MEMORY, STATE, TOKEN, AD, NOT_IN_TRACES, NO_FUNCTION}, sorted(public)
    assert not {"while", "scan", "cond"} & public  # loops and branches have records (issue #15)


def test_an_unknown_primitive_gets_the_conservative_record():
    op = lookup("no_such_primitive")
    assert op.is_fallback and op.finish is None and not op.lineage_exact


def test_every_record_has_an_example():
    covered = set().union(*(e.primitives for e in EXAMPLES + MESH_EXAMPLES))
    assert sorted((set(table()) & jx.defined_primitives()) - covered) == []
    assert sorted(covered - set(table())) == []


def _args(example):
    args = random_args(example.args, seed=3)
    if example.positive:
        args = [np.abs(a) + np.asarray(0.5, a.dtype) if a.dtype.kind == "f" else a for a in args]
    return args


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.name for e in EXAMPLES])
def test_record_runs_on_sharded_inputs(example, meshes):
    prog = assert_same_as_unsharded(example.fn, _args(example), mesh=meshes[example.mesh], in_specs=example.specs,
                                    rtol=2e-5, atol=2e-5)
    plan = prog.plan
    nodes = [(view, n) for view, n in _nodes_and_bodies(plan) if n.op in example.primitives]
    assert example.primitives == {n.op for _, n in nodes}, "the example must emit every primitive it names"
    assert not plan.sharded.fallbacks, [plan.graph.nodes[n].op for n in plan.sharded.fallbacks]
    for view, node in nodes:
        if lookup(node.op).family is Family.RANDOM:
            continue  # keys are replicated on purpose
        if not node.operands and all(view.graph.avals[v].shape == () for v in node.outputs):
            continue  # a scalar made from nothing (empty2): nothing to shard
        touched = [view.layout(v) for v in (*node.operands, *node.outputs)]
        assert any(any(m) for m in touched), f"`{node.op}` met no sharded value"


def _nodes_and_bodies(view):
    """``(view, node)`` for every node of a plan and of its loops' and conds' bodies, recursively."""
    for node in view.graph.nodes:
        yield view, node
        for body_plan in view.body_plans(node.id) or ():
            yield from _nodes_and_bodies(body_plan.decisions)


@pytest.mark.parametrize("example", MESH_EXAMPLES, ids=[e.name for e in MESH_EXAMPLES])
def test_record_with_a_mesh_runs_on_sharded_inputs(example, meshes):
    mesh = meshes[example.mesh]
    prog = assert_same_as_unsharded(example.fn(mesh), _args(example), mesh=mesh, in_specs=example.specs)
    assert not prog.sharded.fallbacks
    assert {n.op for n in prog.plan.graph.nodes} >= set(example.primitives)
