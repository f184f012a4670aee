"""Evaluating a run of nodes on per-device blocks: the body of every stage, and of every sharded loop or cond.

``run_nodes`` walks nodes in graph order, reading the plan view (:class:`~shardprop.splitting.Decisions`):
each operand is fetched in the layout the node needs (cut locally out of what is held, when finer; inside a
body, moved by a collective when coarser), the node is evaluated on blocks with its primitive's ``per_block``
piece, and a collective finishes it where the view says so.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import jax
import jax.numpy as jnp
from jax import lax

from ..errors import LoweringError
from ..expr.graph import CONSTANT, PARAMETER, Node
from ..ops import lookup
from ..propagation import ShardedGraph
from ..core.layouts import Layout, block_shape, layout_refines, received_layout
from ..core.collectives import Collective, CollectiveKind
from ..splitting.decisions import BodyPlan, Decisions
from ..core.blocks import Blocks, block_index, first_device_only, local_slice, move_block


def run_nodes(view: Decisions, node_ids, received: Mapping[tuple[int, Layout], object],
              local: dict[int, object]) -> dict[int, object]:
    """Evaluate ``node_ids`` of ``view.graph``; ``received`` holds blocks of values computed elsewhere, keyed
    by ``(value, layout)``; ``local`` (filled in place and returned) holds the values computed here, each in
    the layout the view holds it in."""
    graph, mesh_shape = view.graph, view.mesh_shape
    moved: dict[tuple[int, Layout], object] = {}  # inside a body: each value moved to a layout once
    for node_id in node_ids:
        node = graph.nodes[node_id]
        if node.op == CONSTANT:
            local[node.output] = jnp.asarray(node.params["value"])
            continue
        invals, in_layouts = [], []
        for v, need in view.edges(node):
            if v in local:
                have, x = view.layout(v), local[v]
                if not layout_refines(have, need):  # inside a body: no stage boundary to move it
                    if (v, need) not in moved:
                        moved[(v, need)] = move_block(x, have, need, mesh_shape)
                    x, have = moved[(v, need)], need
            else:
                have = received_layout(view.layout(v), need)
                x = received[(v, have)]
            invals.append(local_slice(x, have, need, mesh_shape))
            in_layouts.append(need)
        collective = view.collective(node_id)
        # Operands the finishing sum (or the sum deferred past the loop) must count once: on each group's first device.
        once, over = (collective.once, collective.mesh_axes) if collective is not None else (
            view.counted_once.get(node_id, ()), view.deferred.get(node_id))
        if once:
            invals = [first_device_only(x, over, mesh_shape) if k in once else x for k, x in enumerate(invals)]
        plans = view.body_plans(node_id)
        if plans is not None:
            invals = _starting_carry(plans, invals, mesh_shape)
        computed = [view.computed_layout(v) for v in node.outputs]
        blocks = Blocks(
            in_global=tuple(graph.avals[v].shape for v in node.operands),
            in_blocks=tuple(x.shape for x in invals),
            in_layouts=tuple(in_layouts),
            out_global=tuple(graph.avals[v].shape for v in node.outputs),
            out_blocks=tuple(block_shape(graph.avals[v].shape, layout, mesh_shape)
                             for v, layout in zip(node.outputs, computed, strict=True)),
            out_layouts=tuple(computed),
            mesh_shape=mesh_shape,
            bodies=None if plans is None else tuple(functools.partial(run_body, p) for p in plans),
        )
        try:
            outs = lookup(node.op).per_block(node, invals, blocks)
        except LoweringError:
            raise
        except Exception as err:
            raise LoweringError(
                f"evaluating `{node.op}` at {node.source} on per-device blocks failed: "
                f"{type(err).__name__}: {err}") from err
        if collective is not None:
            outs = finish(node, invals, outs, collective, mesh_shape)
        local.update(zip(node.outputs, outs, strict=True))
    return local


def finish(node: Node, invals: list, outs: list, collective: Collective, mesh_shape) -> list:
    """Each device holds a partial result: combine them with ``collective``."""
    kind = collective.kind
    if collective.outputs is not None:  # a loop's partial carries: summed, the other outputs as they are
        return [lax.psum(x, collective.mesh_axes) if collective.finishes(k) else x for k, x in enumerate(outs)]
    if kind in (CollectiveKind.ARGMAX, CollectiveKind.ARGMIN):  # each device found its block's winner
        return [_combine_arg(node, invals[0], outs[0], collective, mesh_shape)]
    if kind is CollectiveKind.PSUM_SCATTER:
        return [lax.psum_scatter(x, collective.mesh_axes, scatter_dimension=collective.dimension, tiled=True)
                for x in outs]
    if kind is CollectiveKind.PSUM:
        return [lax.psum(x, collective.mesh_axes) for x in outs]
    (block,) = invals
    axes = node.params["axes"]
    ties = [jnp.sum(block == jnp.expand_dims(x, axes), axis=axes, dtype=jnp.int32) for x in outs]
    return [_extreme(x, n, kind is CollectiveKind.PMAX, collective.mesh_axes) for x, n in zip(outs, ties, strict=True)]


@functools.partial(jax.custom_jvp, nondiff_argnums=(2, 3))
def _extreme(x, ties, is_max: bool, mesh_axes):
    """The maximum (minimum) of every device's ``x``, as ``jnp.max`` (``jnp.min``) would give it over the whole
    array: XLA's cross-device max and min neither propagate NaN nor tell -0 from +0, so floats are combined as
    integers in IEEE total order (one all-reduce of the same size, no flags): a NaN on any device wins, and a zero
    result takes the sign the unsharded reduction gives it (+0 for max, -0 for min)."""
    combine = lax.pmax if is_max else lax.pmin
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return combine(x, mesh_axes)
    nan = jnp.array(jnp.nan if is_max else -jnp.nan, x.dtype)  # above +inf (below -inf) in total order
    key = _total_order(jnp.where(jnp.isnan(x), nan, x))
    best = lax.bitcast_convert_type(_total_order_inverse(combine(key, mesh_axes)), x.dtype)
    return jnp.where(jnp.isnan(best), jnp.array(jnp.nan, x.dtype), best)


def _total_order(x):
    """An integer with the order of IEEE totalOrder on floats: -NaN < -inf < ... < -0 < +0 < ... < +inf < +NaN
    (the sign-magnitude bits, with the magnitude bits of negative numbers flipped)."""
    bits = lax.bitcast_convert_type(x, jnp.dtype(f"int{8 * x.dtype.itemsize}"))
    return jnp.where(bits < 0, bits ^ jnp.iinfo(bits.dtype).max, bits)


def _total_order_inverse(key):
    return jnp.where(key < 0, key ^ jnp.iinfo(key.dtype).max, key)  # flipping again is the inverse


@_extreme.defjvp
def _extreme_jvp(is_max, mesh_axes, primals, tangents):
    """``pmax``/``pmin`` have no differentiation rule; this is ``jnp.max``'s (``jnp.min``'s): the tangent of
    the elements attaining the extreme, averaged over all of them. ``x``'s tangent is already its block's average
    over the block's ``ties`` (elements equal to ``x``), so each device's share is weighted by its count."""
    (x, ties), (x_dot, _) = primals, tangents
    y = _extreme(x, ties, is_max, mesh_axes)
    weight = jnp.where(x == y, ties, 0).astype(x_dot.dtype)
    return y, lax.psum(x_dot * weight, mesh_axes) / lax.psum(weight, mesh_axes)


def _combine_arg(node, block, local_index, collective, mesh_shape):
    """The global argmax (argmin) from each device's: offset the local index by the block's start, then take
    the smallest index among the devices holding the extreme value — or, as ``jnp.argmax`` does, the first
    NaN if there is any."""
    (axis,) = node.params["axes"]
    block = lax.stop_gradient(block)  # an index has no derivative; pmax/pmin have no rule to carry one through
    is_max = collective.kind is CollectiveKind.ARGMAX
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


def run_graph(sharded: ShardedGraph, input_blocks) -> list:
    """All of ``sharded.graph`` on blocks: inputs and outputs in their propagated layouts."""
    graph = sharded.graph
    local = dict(zip(graph.inputs, input_blocks, strict=True))
    run_nodes(Decisions.propagated(sharded), [n.id for n in graph.nodes if n.op != PARAMETER], {}, local)
    return [local[v] for v in graph.outputs]


def run_body(plan: BodyPlan, input_blocks: list) -> list:
    """One execution of a body (a loop iteration, a branch) on blocks, with its decisions: inputs in the layouts
    propagated for them, outputs moved into the layouts the loop or cond takes them in."""
    view, graph = plan.decisions, plan.body.sharded.graph
    local = dict(zip(graph.inputs, input_blocks, strict=True))
    run_nodes(view, [n.id for n in graph.nodes if n.op != PARAMETER], {}, local)
    outs = []
    for v, want in zip(graph.outputs, plan.body.out_layouts, strict=True):
        have, x = view.layout(v), local[v]
        if not layout_refines(have, want):
            x, have = move_block(x, have, want, view.mesh_shape), want
        outs.append(local_slice(x, have, want, view.mesh_shape))
    return outs


def _starting_carry(plans: tuple[BodyPlan, ...], invals: list, mesh_shape) -> list:
    """A loop node's operand blocks with each initial carry its body keeps as a partial sum taken on the first device
    of each group and as zero on the others (the group's sum is the initial value)."""
    out = list(invals)
    for plan in plans:
        for carry in plan.body.carries:
            axes = plan.decisions.partial_inputs.get(carry.body_input)
            if axes is not None:
                out[carry.operand] = first_device_only(invals[carry.operand], axes, mesh_shape)
    return out
