"""How a value held in one layout reaches a consumer that needs another: a local slice, an all-to-all (the same
mesh axes, other tensor axes) or a gather — table-driven, then checked block by block on devices."""

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from shardprop.core.blocks import local_slice
from shardprop.core.layouts import layout_from_spec, layout_to_spec, received_layout
from shardprop.splitting.cost import movement

MESH = {"i": 4, "j": 2}


def L(*spec):  # noqa: N802 - reads like P
    return layout_from_spec(P(*spec), (16, 16), MESH, "test")


@pytest.mark.parametrize("have,need,received,move", [
    (L("i"), L("i"), L("i"), "a local slice"),
    (L("i"), L("i", "j"), L("i"), "a local slice"),                       # finer: slice locally
    (L(None, "i"), L("i"), L("i"), "all-to-all over i"),                   # x.T's layout to x's
    (L("i", "j"), L("j", "i"), L("j", "i"), "all-to-all over i*j"),
    (L(("i", "j")), L("i", "j"), L("i", "j"), "all-to-all over j"),        # i stays, j changes axis
    (L(("i", "j")), L(None, ("i", "j")), L(None, ("i", "j")), "all-to-all over i*j"),
    (L("i", None), L(None, "j"), L(), "gathered over i"),                  # j is new: gather i, slice j
    (L("i", "j"), L("j"), L(), "gathered over i*j"),                       # i is dropped: no all-to-all
    (L("i", "j"), L(None, "i"), L(), "gathered over i*j"),
])
def test_received_layout_and_movement(have, need, received, move):
    assert received_layout(have, need) == received
    assert str(movement(have, need)) == move


@pytest.mark.parametrize("have,need", [(P(None, "i"), P("i")), (P("i", "j"), P("j", "i")),
                                        (P(("i", "j")), P("i", "j")), (P("i"), P(None, "j"))])
def test_every_device_gets_its_block_of_the_needed_layout(mesh, have, need):
    """Moved by XLA between two shard_maps (as between stages), then sliced locally: each device holds the
    block the needed layout assigns it — compared with slicing the whole array."""
    x = np.arange(256, dtype=np.float32).reshape(16, 16)
    h, n = layout_from_spec(have, x.shape, MESH, "t"), layout_from_spec(need, x.shape, MESH, "t")
    got_in = received_layout(h, n)
    produce = jax.shard_map(lambda b: b, mesh=mesh, in_specs=have, out_specs=have, check_vma=False)
    consume = jax.shard_map(lambda b: local_slice(b, got_in, n, MESH), mesh=mesh,
                            in_specs=layout_to_spec(got_in), out_specs=need, check_vma=False)
    out = jax.jit(lambda a: consume(produce(a)))(jax.device_put(x, NamedSharding(mesh, have)))
    np.testing.assert_array_equal(np.asarray(out), x)
    for shard in out.addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), x[shard.index])
    assert out.sharding.is_equivalent_to(NamedSharding(mesh, need), 2)
