"""A ``ReshardWarning`` is for clashes of the user's own layouts (propagation/reports.py): a conflict an axis
shardprop laid out takes part in — a ``one_hot``'s iota, a causal mask, a mean's gradient broadcast adopting what it
met — is its own choice, resolved silently; two layouts the user wrote meeting still warn, naming both.

Each program runs sharded and is compared with the unsharded function."""

import warnings

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import shardprop as sp
from shardprop.bench import experts
from shardprop.examples import llama
from tests.conftest import assert_same_as_unsharded

MOE = experts.mixture_of_experts(groups=8, tokens=16)
LLAMA = llama.init_llama(layers=1)
_RNG = np.random.default_rng(3)
_TOKENS = _RNG.integers(0, 128, size=(8, 16)).astype(np.int32)


def _llama_args():
    zeros = jax.tree_util.tree_map(np.zeros_like, LLAMA)
    return LLAMA, zeros, zeros, _TOKENS, _TOKENS


def _megatron_sequence():
    column, row = P(None, "model"), P("model", None)
    layer = {"attn_norm": P(), "wq": column, "wk": column, "wv": column, "wo": row, "mlp_norm": P(),
             "w_gate": column, "w_up": column, "w_down": row}
    specs = {"embed": P(), "layers": [layer], "final_norm": P(), "lm_head": P()}
    return specs, specs, specs, P("data", "model"), P("data", "model")


def _transpose_added(x):
    return x + x.T


# name -> (function, arguments, in_specs, ReshardWarnings expected)
PROGRAMS = {
    # jax.nn.one_hot's iota took the experts' layout from their weights and met the tokens' groups over data (it was
    # "resolved a sharding conflict in `eq` ... `iota` adopted it"); the load-balancing loss's means too
    "top-2 mixture of experts, expert parallel": (MOE.f, MOE.args, MOE.experts["expert parallel"], 0),
    # the sequence over model outside attention, the heads over model inside it (Megatron-SP): the causal mask's
    # iota and the scores' gradient broadcast adopt layouts that meet the heads
    "Llama step, Megatron + sequence": (llama.llama_train_step, _llama_args(), _megatron_sequence(), 0),
    # the user's own layouts clash: x over data by rows, x.T over data by columns
    "x + x.T": (_transpose_added, (np.arange(64, dtype=np.float32).reshape(8, 8),), (P("data"),), 1),
}


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_a_reshard_warning_is_for_the_users_own_clashes(name):
    f, args, specs, warned = PROGRAMS[name]
    mesh = sp.make_mesh((4, 2), ("data", "model"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert_same_as_unsharded(f, args, mesh=mesh, in_specs=specs, rtol=2e-4, atol=1e-4)
    reshards = [w for w in caught if issubclass(w.category, sp.ReshardWarning)]
    assert len(reshards) == warned, [str(w.message).splitlines()[0] for w in reshards]
    for w in reshards:  # names the user's layouts that clash
        assert "argument x" in str(w.message) and "has spec P('data',)" in str(w.message)
