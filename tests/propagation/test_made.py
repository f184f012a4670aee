"""A value made from less — a broadcast of a small operand, an ``iota`` made from nothing — is made in the layout
its use needs rather than moved there (propagation/walk.py's ``_remade_cost``, the ``(node, MADE)`` views of
propagation/uses.py), where that use is its one reader; readers that disagree leave it made as held. Each program
runs sharded and is compared with the unsharded function, its bytes with jax.jit's on the same input shardings."""

import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import shardprop as sp
from shardprop.expr.graph import value_name
from tests.conftest import assert_like_unsharded

X = np.arange(8 * 64, dtype=np.float32).reshape(8, 64) / 100
V = np.arange(8, dtype=np.float32) + 1
Y = np.arange(8 * 64, dtype=np.float32).reshape(8, 64) / 50 + 1


@pytest.fixture(scope="module")
def mesh():
    return sp.make_mesh((4, 2), ("data", "model"))


def _broadcast_read_twice(x, v, y):
    b = jnp.broadcast_to(v[:, None], (8, 64))
    return x + b, b * y


def _broadcast_read_twice_through_sin(x, v, y):
    b = jnp.broadcast_to(v[:, None], (8, 64))
    return (x + b) * 2, jnp.sin(b) * y


def _broadcast_beside_its_operand(x, v, y):
    b = jnp.broadcast_to(v[:, None], (8, 64))
    return (b + x) * 2, v * 3


@pytest.mark.parametrize("f", [_broadcast_read_twice, _broadcast_read_twice_through_sin,
                               _broadcast_beside_its_operand], ids=lambda f: f.__name__)
def test_a_broadcast_meeting_a_crosswise_operand_moves_no_more_than_jit(mesh, f):
    """x over model by rows meets v's broadcast over data by rows. Where the broadcast has one reader it is made as
    x needs it (v gathered: 12 B); read twice, readers disagree and it is made as held — pricing it as remade there
    had the walk move the broadcast, 1,024 B where 512 B do."""
    specs = (P("model", None), P("data"), P("data", None))
    prog = sp.autoshard(f, mesh=mesh, in_specs=specs).trace(X, V, Y)
    assert_like_unsharded(prog(X, V, Y), f, (X, V, Y), rtol=1e-5, atol=1e-5)
    comparison = sp.compare_with_jit(f, mesh, specs, X, V, Y, program=prog)
    assert comparison.shardprop_bytes <= comparison.jit_bytes, str(comparison)


def test_an_iota_returned_like_an_argument_is_made_so_and_explained(mesh):
    """An iota returned for an argument laid out over data (a mirrored output) is made over data (no move), and
    explain says so for it and for what is computed from it."""
    def f(x, v):
        return jnp.arange(128.0).reshape(16, 8).T + x, jnp.arange(16.0) * 3.0

    x, v = np.arange(128, dtype=np.float32).reshape(8, 16), np.arange(16, dtype=np.float32)
    prog = sp.autoshard(f, mesh=mesh, in_specs=(P("data", "model"), P("data"))).trace(x, v)
    assert_like_unsharded(prog(x, v), f, (x, v), rtol=0, atol=0)
    assert prog.communication() == [] and prog.out_specs[1] == P("data")
    texts = [str(sp.explain(prog, value_name(out))) for node in prog.plan.graph.nodes for out in node.outputs]
    assert any("makes" in text and "backward from output 1" in text for text in texts)


def test_an_unannotated_argument_still_says_which_use_laid_it_out(mesh):
    a, b = np.ones((16, 8), np.float32), np.ones((16, 8), np.float32)
    prog = sp.autoshard(lambda a, b: a.T @ b, mesh=mesh, in_specs=(None, P("data", "model"))).trace(a, b)
    assert "backward from a use" in str(sp.explain(prog, "a"))
