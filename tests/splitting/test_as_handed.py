"""A finish reading its operands as the layout search hands them (``shardprop.splitting.strategies.as_handed``): an
exact view (``propagation.uses.View``) is what the node's finish reads, the move to it the node's."""

import numpy as np

import shardprop as sp
from shardprop.mesh import as_auto_mesh
from shardprop.program import lower
from shardprop.propagation.propagate import propagate_decided
from shardprop.propagation.uses import View


def test_a_finish_reads_an_operand_as_the_layout_search_hands_it():
    """A contraction the layout search hands an operand otherwise than it is held (an exact view): its finish reads
    the operand as handed — summed by a psum over the mesh axis it was handed along, the operand moved there first, as
    the search priced it — where, held as it is, the two operands' contracting axes lie over different mesh axes and
    are gathered. Either plan computes the unsharded product."""
    mesh = as_auto_mesh(sp.make_mesh((4, 2), ("i", "j")))
    x, w = np.arange(128, dtype=np.float32).reshape(8, 16) / 64, np.linspace(-1, 1, 64, dtype=np.float32).reshape(16, 4)
    graph = sp.trace(lambda x, w: x @ w, x, w)
    node = next(n for n in graph.nodes if n.op == "dot_general")
    held = [((), ("j",)), (("i",), ())]
    handed = View(((), ("i",)), held[0], node.id, exact=True)
    viewed = sp.split(propagate_decided(graph, held, mesh, views={(node.id, 0): handed}, created={}))
    plain = sp.split(propagate_decided(graph, held, mesh, views={}, created={}))
    assert viewed.collectives[node.id].mesh_axes == ("i",) and node.id not in plain.collectives
    assert viewed.needs(node.id)[0].layout == ((), ("i",))
    for plan in (viewed, plain):
        np.testing.assert_allclose(np.asarray(lower(plan, mesh)(x, w)), x @ w, rtol=1e-6, atol=1e-6)
