"""Today's language models as their authors shard them (``shardprop/examples/llama.py``, ``moe.py``): each layout
gives the unsharded function's result, moves no more bytes per device than ``jax.jit`` given the same input
shardings (the compiled HLO's collectives), warns about nothing the user's layouts do not clash on, and returns a
KV cache in the layout it came in (so the next decoding step compiles nothing)."""

import warnings

import pytest
from jax.sharding import PartitionSpec as P

import shardprop as sp
from shardprop.expr.graph import value_name
from shardprop.bench import experts
from tests.conftest import assert_like_unsharded

DECODE = experts.kv_decode(batch=8, seq=64)
_PARAMS, _CACHE = 0, (1, 2)

# the cache [batch, seq, kv_heads, d_head] over heads or over the sequence, the query heads over model (Megatron) or
# the parameters replicated; the tokens over data
LAYOUTS = {
    "Megatron, cache over heads": DECODE.experts["Megatron, cache over heads"],
    "Megatron, cache over sequence": DECODE.experts["Megatron, cache over sequence"],
    "cache over sequence": DECODE.experts["data parallel"][:1] + (P("data", "model"),) * 2 + DECODE.experts[
        "data parallel"][3:],
}


@pytest.fixture(scope="module")
def mesh():
    return sp.make_mesh(*DECODE.mesh)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_grouped_query_decoding_moves_no_more_than_jit(mesh, layout):
    """The all-to-all a cache over the sequence needs under Megatron's heads moves the 2 KV heads before
    ``jnp.repeat`` expands them to 8 (it moved the 8: 3.4x jit's bytes), the new token's key is written where the
    cache holds that position (no warning), and the caches come back as they came in."""
    specs = LAYOUTS[layout]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prog = sp.autoshard(DECODE.f, mesh=mesh, in_specs=specs).trace(*DECODE.args)
        comparison = sp.compare_with_jit(DECODE.f, mesh, specs, *DECODE.args, program=prog)
    assert not [str(w.message) for w in caught if issubclass(w.category, (sp.ReshardWarning, sp.FallbackWarning))]
    got = prog(*DECODE.args)
    assert_like_unsharded(got, DECODE.f, DECODE.args, rtol=1e-5, atol=1e-5)
    assert comparison.shardprop_bytes <= comparison.jit_bytes, str(comparison)
    _, new_k, new_v = got
    for cache, spec in zip(new_k + new_v, [specs[1]] * len(new_k) + [specs[2]] * len(new_v), strict=True):
        assert cache.sharding.spec == spec or tuple(cache.sharding.spec) == tuple(spec) + (None,) * (
            len(cache.sharding.spec) - len(spec))


MOE = experts.mixture_of_experts(groups=8, tokens=16)


def test_expert_parallel_moves_tokens_only():
    """The top-2 MoE step with the experts over ``data`` beside the token groups (expert parallelism): the tokens
    go to their experts and back by all-to-all, the small load-balancing sums are all-reduced, and nothing else
    moves. It gathered the activations for the router's gradient (24 KiB) and returned the router laid out over its
    experts: the mean's gradient, broadcast from an expert vector the reduce-scatter had left over ``data``, met the
    groups over ``data`` in an `add_any`, and the walk moved the other operand — where gathering the 8-vector and
    broadcasting it as the groups are laid out costs 24 B. ``jax.nn.one_hot``'s iota is made replicated as its
    `eq` takes it (it was all-gathered). jax.jit gathers every expert's weights instead."""
    specs = MOE.experts["expert parallel"]
    mesh = sp.make_mesh(*MOE.mesh)
    prog = sp.autoshard(MOE.f, mesh=mesh, in_specs=specs).trace(*MOE.args)
    comparison = sp.compare_with_jit(MOE.f, mesh, specs, *MOE.args, program=prog)
    assert_like_unsharded(prog(*MOE.args), MOE.f, MOE.args, rtol=1e-4, atol=1e-5)
    kinds = sorted(t.kind.value for t in comparison.shardprop)
    assert kinds == ["all-reduce"] * 2 + ["all-to-all"] * 3, str(comparison)  # (jit: 3 all-gathers, 2 all-reduces)
    assert comparison.shardprop_bytes <= comparison.jit_bytes / 3, str(comparison)
    assert tuple(prog.out_specs[0]) in ((), (None, None)), prog.out_specs  # the router, as it came in
    iotas = [value_name(n.outputs[0]) for n in prog.plan.graph.nodes if n.op == "iota" and "moe.py" in n.source]
    assert iotas and all("made so it is moved nowhere" in str(sp.explain(prog, name)) for name in iotas[:1])
