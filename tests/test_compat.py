"""Names from before the records and the plan view (0.1) still work, as the docs promise."""

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import shardprop as sp
from tests.functions import nx_example


def test_old_names_are_aliases_of_the_new_ones(mesh):
    from shardprop.inspect.lineage import LINEAGE_RULES
    from shardprop.inspect.listing import AnnotatedGraph, StageTable
    from shardprop.ops import lookup
    from shardprop.propagation.rules import RULES
    from shardprop.splitting import StagedGraph, StageList

    from shardprop.backends import Program, lower
    from shardprop.propagation.rules import RuleContext, RuleOutput

    assert StagedGraph is AnnotatedGraph and StageList is StageTable
    assert RULES["reduce_sum"] is lookup("reduce_sum").propagate
    assert LINEAGE_RULES["dot_general"] == (lookup("dot_general").lineage, True)
    assert Program is sp.Program and lower is sp.lower and RuleContext and RuleOutput


def test_plan_stage_of_without_a_node_is_the_whole_map(mesh):
    from shardprop.splitting import StagedGraph

    a = jax.ShapeDtypeStruct((16, 8), jnp.float32)
    prog = sp.autoshard(nx_example, mesh=mesh, in_specs=(P("i", "j"), None), strategy="gather").trace(a, a)
    plan = prog.plan
    whole = plan.stage_of()
    assert whole == {n: plan.stage_of(n) for n in whole} and set(whole.values()) == {0, 1}
    assert plan.format_stages() == str(plan) == str(prog.stages)
    # prog.graph prints the listing and reads like the propagated graph it shows; split takes it as before
    assert prog.graph.in_specs == prog.sharded.in_specs and prog.graph.graph is prog.sharded.graph
    assert str(StagedGraph.of(plan)) == str(prog.graph)
    assert len(sp.split(prog.graph, strategy="collective").stages) == 1
