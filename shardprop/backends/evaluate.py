"""Evaluating a run of nodes on per-device blocks: the body of every stage, and of every sharded scan.

``run_nodes`` walks nodes in graph order: each operand is fetched in the layout the node needs (cut locally
out of what is held, when finer) and the node is evaluated on blocks (``blocks.evaluate``). A ``scan`` whose
body was sharded (``ShardedGraph.bodies``) becomes a ``lax.scan`` over the same per-block evaluation of its
body graph.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax.numpy as jnp
from jax import lax

from ..errors import LoweringError
from ..expr.graph import CONSTANT, PARAMETER
from ..propagation import ShardedGraph
from ..propagation.sharding import Layout, block_shape, common_layout
from .blocks import BLOCK_EVAL, Blocks, bind_on_blocks, block_index, evaluate, local_slice


def run_nodes(sharded: ShardedGraph, node_ids, received: Mapping[tuple[int, Layout], object],
              local: dict[int, object], mesh_shape: Mapping[str, int], needs=None,
              collectives: Mapping | None = None, layout=None) -> dict[int, object]:
    """Evaluate ``node_ids`` of ``sharded.graph``; ``received`` holds blocks of values computed elsewhere,
    keyed by ``(value, layout)``; ``local`` (filled in place and returned) holds the values computed here,
    each in its own layout. ``needs(node_id)`` (default: ``sharded.needs``) gives the operand layouts a node
    consumes; ``collectives[node_id]`` finishes a node's partial result across devices; ``layout(value)``
    (default: ``sharded.layout``) is the layout a value is held in once computed."""
    graph = sharded.graph
    needs = needs or sharded.needs.__getitem__
    layout = layout or sharded.layout
    collectives = collectives or {}
    for node_id in node_ids:
        node = graph.nodes[node_id]
        if node.op == CONSTANT:
            local[node.output] = jnp.asarray(node.params["value"])
            continue
        invals = []
        for v, need in zip(node.operands, needs(node_id), strict=True):
            if v in local:
                have, x = layout(v), local[v]
            else:
                have = common_layout(layout(v), need)
                x = received[(v, have)]
            invals.append(local_slice(x, have, need, mesh_shape))
        # The layout the op computes its outputs in: the plan's, except that a collective's input is the
        # partial result laid out as propagation said (a psum_scatter then makes it finer).
        computed = {v: sharded.layout(v) if node_id in collectives else layout(v) for v in node.outputs}
        blocks = Blocks(
            in_global=tuple(graph.avals[v].shape for v in node.operands),
            in_blocks=tuple(x.shape for x in invals),
            out_global=tuple(graph.avals[v].shape for v in node.outputs),
            out_blocks=tuple(block_shape(graph.avals[v].shape, computed[v], mesh_shape) for v in node.outputs),
            out_layouts=tuple(computed[v] for v in node.outputs),
            mesh_shape=mesh_shape,
            body=sharded.bodies.get(node_id),
        )
        try:
            outs = evaluate(node, invals, blocks)
        except LoweringError:
            raise
        except Exception as err:
            raise LoweringError(
                f"evaluating `{node.op}` at {node.source} on per-device blocks failed: "
                f"{type(err).__name__}: {err}") from err
        collective = collectives.get(node_id)
        if collective is None:
            pass
        elif collective.kind in ("argmax", "argmin"):  # each device found its block's winner: pick the global one
            outs = [_combine_arg(node, invals[0], outs[0], collective, mesh_shape)]
        else:  # each device holds a partial result: combine them
            outs = [_combine(x, collective) for x in outs]
        local.update(zip(node.outputs, outs, strict=True))
    return local


def _combine(x, collective):
    if collective.kind == "psum_scatter":
        return lax.psum_scatter(x, collective.mesh_axes, scatter_dimension=collective.dimension, tiled=True)
    return {"psum": lax.psum, "pmax": lax.pmax, "pmin": lax.pmin}[collective.kind](x, collective.mesh_axes)


def _combine_arg(node, block, local_index, collective, mesh_shape):
    """The global argmax (argmin) from each device's: offset the local index by the block's start, then take
    the smallest index among the devices holding the extreme value — or, as ``jnp.argmax`` does, the first
    NaN if there is any."""
    (axis,) = node.params["axes"]
    is_max = node.op == "argmax"
    index_dtype = local_index.dtype
    index = local_index + (block_index(collective.mesh_axes, mesh_shape) * block.shape[axis]).astype(index_dtype)
    value = (jnp.max if is_max else jnp.min)(block, axis=axis)
    if jnp.issubdtype(block.dtype, jnp.floating):
        nan = jnp.isnan(value)
        any_nan = lax.pmax(nan.astype(jnp.int32), collective.mesh_axes) > 0
        clean = jnp.where(nan, -jnp.inf if is_max else jnp.inf, value)
    else:
        nan = any_nan = jnp.zeros(value.shape, bool)
        clean = value
    best = (lax.pmax if is_max else lax.pmin)(clean, collective.mesh_axes)
    winner = jnp.where(any_nan, nan, clean == best)
    candidate = jnp.where(winner, index, jnp.iinfo(index_dtype).max)
    return lax.pmin(candidate, collective.mesh_axes)


def run_graph(sharded: ShardedGraph, input_blocks, mesh_shape: Mapping[str, int]) -> list:
    """All of ``sharded.graph`` on blocks: inputs in their propagated layouts, outputs in theirs."""
    graph = sharded.graph
    local = dict(zip(graph.inputs, input_blocks, strict=True))
    run_nodes(sharded, [n.id for n in graph.nodes if n.op != PARAMETER], {}, local, mesh_shape)
    return [local[v] for v in graph.outputs]


def _scan(node, invals, blocks: Blocks) -> list:
    body, params = blocks.body, node.params
    if body is None:  # the conservative rule: everything replicated, the scan as it is
        return bind_on_blocks(node, invals, blocks)
    n_consts, n_carry = params["num_consts"], params["num_carry"]
    consts, init, xs = invals[:n_consts], invals[n_consts:n_consts + n_carry], invals[n_consts + n_carry:]

    def step(carry, x):
        outs = run_graph(body, [*consts, *carry, *x], blocks.mesh_shape)
        return outs[:n_carry], outs[n_carry:]

    carry, ys = lax.scan(step, list(init), list(xs), length=params["length"], reverse=params["reverse"],
                         unroll=params["unroll"])
    return [*carry, *ys]


BLOCK_EVAL["scan"] = _scan
