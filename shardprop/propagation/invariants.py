"""The invariants of a ``ShardedGraph`` (checked when ``shardprop.checks`` is enabled).

* every value has a sharding of its shape, with no open or created axis left;
* every sharded axis is divisible by its shard count and has that many equal, contiguous shards (when
  shards exist), but a ranged one, whose shards are the ranges its span says;
* every node has one need per operand, of the operand's rank and divisible like the operand;
* no layout (value or need) uses a mesh axis twice.
"""

from __future__ import annotations

from ..checks import enabled
from ..errors import InvariantError
from .product import ShardedGraph
from ..core.layouts import Layout, Sharded, shard_count, uses_mesh_axes_once


def checked(sharded: ShardedGraph) -> ShardedGraph:
    """``sharded``, after checking its invariants when checks are enabled."""
    if enabled():
        check_sharded(sharded)
    return sharded


def check_sharded(sharded: ShardedGraph) -> None:
    graph, mesh_shape = sharded.graph, sharded.mesh_shape
    if len(sharded.shardings) != len(graph.avals) or len(sharded.needs) != len(graph.nodes):
        _fail("one sharding per value and one need tuple per node")
    for v, (sharding, aval) in enumerate(zip(sharded.shardings, graph.avals, strict=True)):
        if sharding.shape != aval.shape:
            _fail(f"value {v} has shape {aval.shape} but a sharding of shape {sharding.shape}")
        for k, a in enumerate(sharding.axes):
            if a is not None and not isinstance(a, Sharded):
                _fail(f"value {v} axis {k} is still {a!r} after propagation")
            if isinstance(a, Sharded) and a.span is not None:  # ranged: one range per device, as its span says
                count = shard_count(mesh_shape, a.mesh_axes)
                if a.shards and [(s.start, s.stop) for s in a.shards] != [a.span.held(d, aval.shape[k])
                                                                           for d in range(count)]:
                    _fail(f"value {v} axis {k}: the shards are not the ranges its span {a.span} says")
            elif isinstance(a, Sharded):
                count = shard_count(mesh_shape, a.mesh_axes)
                if aval.shape[k] % count:
                    _fail(f"value {v} axis {k} of size {aval.shape[k]} is sharded {count} ways")
                length = aval.shape[k] // count
                if a.shards and [(s.start, s.length) for s in a.shards] != [(i * length, length) for i in range(count)]:
                    _fail(f"value {v} axis {k}: the shards are not {count} equal contiguous blocks")
        _check_layout(sharding.layout, f"value {v}")
    for node, needs in zip(graph.nodes, sharded.needs, strict=True):
        if len(needs) != len(node.operands):
            _fail(f"node {node.id} (`{node.op}`) has {len(needs)} needs for {len(node.operands)} operands")
        for u, need in zip(node.operands, needs, strict=True):
            shape = graph.avals[u].shape
            if len(need) != len(shape):
                _fail(f"node {node.id} (`{node.op}`) needs operand {u} with rank {len(need)}, it has {len(shape)}")
            if any(n % shard_count(mesh_shape, m) for n, m in zip(shape, need, strict=True)):
                _fail(f"node {node.id} (`{node.op}`) needs operand {u} laid out {need}, which does not divide "
                      f"its shape {shape}")
            _check_layout(need, f"node {node.id} (`{node.op}`) need")
    if not sharded.fallbacks <= {n.id for n in graph.nodes}:
        _fail("a fallback names a node that does not exist")
    for bodies in sharded.bodies.values():
        for body in bodies:
            check_sharded(body.sharded)
            outputs = body.sharded.graph.outputs
            if len(body.out_layouts) != len(outputs):
                _fail(f"a body has {len(outputs)} outputs and {len(body.out_layouts)} output layouts")



def _check_layout(layout: Layout, what: str) -> None:
    if not uses_mesh_axes_once(layout):
        _fail(f"{what} uses a mesh axis twice: {layout}")


def _fail(message: str):
    raise InvariantError(f"propagation produced an inconsistent ShardedGraph: {message} (a shardprop bug: "
                         "please report it with the function and in_specs)")
