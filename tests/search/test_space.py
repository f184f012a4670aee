"""The search's space: each argument's candidate layouts, and which arguments are decided together (rule in,
answer out)."""

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from shardprop.search import candidate_specs, decision_groups
from shardprop.search.space import Leaf

MESH = {"data": 4, "model": 2}


@pytest.mark.parametrize("shape, expected", [
    ((), (P(),)),
    ((1024,), (P(), P("data"), P("model"), P(("data", "model")))),
    # 6 is not divisible by 4: data never shards axis 1
    ((8, 6), (P(), P("data"), P("model"), P(None, "model"), P("data", "model"), P(("data", "model")))),
    ((64, 1024), (P(), P("data"), P("model"), P(None, "data"), P(None, "model"), P("data", "model"),
                  P("model", "data"), P(("data", "model")), P(None, ("data", "model")))),
    ((3, 5), (P(),)),  # nothing divides: replicated is the only layout
])
def test_candidate_specs(shape, expected):
    assert candidate_specs(shape, MESH) == expected


def test_candidate_specs_are_replicated_first_and_never_repeat():
    found = candidate_specs((8, 8, 8), MESH)
    assert found[0] == P() and len(set(found)) == len(found)
    assert all(sum(len(e) if isinstance(e, tuple) else e is not None for e in spec) <= 2 for spec in found)


def _leaves(*paths_shapes):
    def split(path):  # the argument is the first key
        end = path.index("]") + 1
        return path[:end], path[end:]

    return [Leaf(k, path, shape, np.dtype(np.float32), *split(path)) for k, (path, shape) in enumerate(paths_shapes)]


def test_optimizer_moments_join_their_parameters():
    leaves = _leaves(("[0]['w']", (8, 8)), ("[0]['b']", (8,)), ("[1][0].count", ()),
                     ("[1][0].mu['w']", (8, 8)), ("[1][0].mu['b']", (8,)),
                     ("[1][0].nu['w']", (8, 8)), ("[1][0].nu['b']", (8,)), ("[2]", (16, 8)))
    assert decision_groups(leaves, [0, 1, 2, 3, 4, 5, 6]) == [(0, 3, 5), (1, 4, 6), (2,)]


def test_a_same_shaped_argument_on_another_path_is_decided_alone():
    leaves = _leaves(("[0]['w']", (8, 8)), ("[1]['v']", (8, 8)), ("[0]['u']", (8, 8)))
    assert decision_groups(leaves, [0, 1, 2]) == [(0,), (1,), (2,)]


def test_two_arguments_alike_are_not_one_group():
    # f(ws=[W], vs=[V]): the same path within each argument, neither nested in the other
    leaves = _leaves(("[0][0]", (8, 8)), ("[1][0]", (8, 8)), ("[2]['w']", (8, 8)), ("[3]['w']", (8, 8)))
    assert decision_groups(leaves, [0, 1, 2, 3]) == [(0,), (1,), (2,), (3,)]


def test_unannotated_moments_of_a_hand_written_optimizer_follow_their_parameters():
    # step(params, m, v): m and v have params' tree; left unannotated (None) they take params' chosen layouts —
    # the AdamW, whose moments came back in other layouts than their parameters
    leaves = _leaves(("[0]['w']", (8, 8)), ("[0]['b']", (8,)), ("[1]['w']", (8, 8)), ("[1]['b']", (8,)),
                     ("[2]['w']", (8, 8)), ("[2]['b']", (8,)))
    assert decision_groups(leaves, [0, 1, 2, 3, 4, 5], followers={2, 3, 4, 5}) == [(0, 2, 4), (1, 3, 5)]
    assert decision_groups(leaves, [0, 1, 2, 3, 4, 5]) == [(k,) for k in range(6)]  # all searched: two models
