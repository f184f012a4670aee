"""What propagation's walks reuse from one another (propagation/memo.py, and the backward pass's remembered trials in
producing.py) changes no layout: training steps propagated under each expert layout give exactly what propagating each
with nothing reused gives — every value's
layout, every operand's, what is returned, the conflicts resolved and the views taken, and the plan's price."""

import warnings

import pytest

import shardprop as sp
from shardprop.bench import experts as bench
from shardprop.core.layouts import Sharded
from shardprop.propagation import memo as memo_module
from shardprop.propagation import producing, uses, walk
from shardprop.splitting.cost import price
from shardprop.splitting.split import PlanPricer

MODELS = {
    "transformer block": lambda: bench.transformer(True, d_model=32, d_ff=64, batch=4, seq=8),
    "flax adam": lambda: bench.flax_adam(True, width=16, batch=8),
    "mlp": lambda: bench.mlp(True, width=32, batch=16, layers=2),
}


def _nothing_reused(monkeypatch):
    """No rule's result remembered, every setting of a view set walked, every backward trial run."""
    monkeypatch.setattr(walk, "memo_key", lambda node_id, operands: None)
    monkeypatch.setattr(memo_module.Variants, "walked_alike", lambda self, settings: None)
    monkeypatch.setattr(memo_module.Variants, "resolved_alike", lambda self, settings, read, resolved: None)
    monkeypatch.setattr(uses, "produce_as_remembered",
                        lambda sharded, node, target, exchanges, memo: producing._produce_as(sharded, node, target,
                                                                                              exchanges))


def _layouts(graph, model, backward):
    mesh = sp.make_mesh(*model.mesh)
    found = []
    for name, in_specs in sorted(model.experts.items()):
        # each expert layout, and its parameters unannotated (open axes, adopting what they meet)
        for specs in (in_specs, (None, *in_specs[1:])):
            pricer = PlanPricer("auto") if backward is True else None
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                sharded = sp.propagate_with(graph, specs, mesh=mesh, strict=False, conflicts="reshard",
                                            walking=sp.Walking(price=pricer, backward=backward))
            found.append((name, specs[0] is None, [s.layout for s in sharded.shardings], sharded.needs,
                          sharded.in_specs, sharded.out_specs, sorted(sharded.reshards), sorted(sharded.views),
                          sorted(sharded.priced), price(pricer.plan_for(sharded)) if pricer else None))
    return found


@pytest.mark.parametrize("backward", [True, False])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_what_the_walks_reuse_changes_no_layout(name, backward, monkeypatch):
    model = MODELS[name]()
    graph = sp.trace(model.f, *model.args)
    reused = _layouts(graph, model, backward)
    with monkeypatch.context() as patched:
        _nothing_reused(patched)
        fresh = _layouts(graph, model, backward)
    assert reused == fresh


def test_the_layout_kept_is_walked_with_shards():
    """Candidates are compared as walked without shards; the one kept is made with them (what inspection reads)."""
    model = MODELS["transformer block"]()
    graph = sp.trace(model.f, *model.args)
    in_specs = model.experts["Megatron"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sharded = sp.propagate_with(graph, in_specs, mesh=sp.make_mesh(*model.mesh), strict=False, conflicts="reshard",
                                    walking=sp.Walking(price=PlanPricer("auto")))
    sharded_axes = [a for s in sharded.shardings for a in s.axes if isinstance(a, Sharded)]
    assert sharded_axes and all(a.shards for a in sharded_axes)
