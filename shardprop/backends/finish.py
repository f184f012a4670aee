"""Finishing a maximum, minimum, product or arg-extreme over sharded axes (a
``shardprop.splitting.ir.Finish``): each device reduced its own block; one collective combines the devices'
results into what the unsharded reduction gives — NaN, signed zeros, ties and first indices included."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from ..core.blocks import block_index, block_rows
from ..core.collectives import NO_GEOMETRY, CollectiveKind, FinishGeometry
from ..core.layouts import Span
from ..errors import LoweringError
from ..ops import lookup
from ..ops.windows import extreme
from .moves import as_bits
from ..expr import jax_adapter as jx
from ..expr.graph import Node


def finish_extreme(node: Node, kind: CollectiveKind, mesh_axes: tuple[str, ...], partial, block, mesh_shape,
                   output: int = 0, geometry: FinishGeometry = NO_GEOMETRY):
    """The devices' partial results ``partial`` of output ``output`` of reduction ``node`` (``block``: this device's
    operand block; for a top-k, its values' partial result) combined by ``kind`` over ``mesh_axes``, where
    ``geometry`` says (a top-k's axis, an arg-extreme's ranged rows)."""
    rows = geometry.rows
    if kind.by_moves:  # a sum or a placement is a planned move (backends/moves.py), never a Finish
        raise LoweringError(f"a {kind} finish of `{node.op}` reached the Finish executor (a shardprop bug: emit "
                            "plans it as moves)")
    if kind is CollectiveKind.TOP_K:  # each device's k best: the candidates
        return _finish_top_k(node, mesh_axes, partial, block, output)
    if kind is CollectiveKind.PREFIX:  # each device scanned its block
        return _finish_prefix(node, mesh_axes, partial, mesh_shape)
    if kind in (CollectiveKind.ARGMAX, CollectiveKind.ARGMIN):  # each device found its block's winner
        return _combine_arg(node, block, partial, kind, mesh_axes, mesh_shape, rows)
    if kind is CollectiveKind.PPROD:  # each device multiplied its block (a ranged axis's padding as ones)
        return _product(partial, mesh_axes)
    if geometry.elementwise:  # a scatter's, of integers (ops/scatters.py): no NaN, no zero's sign, no derivative
        return (lax.pmax if kind is CollectiveKind.PMAX else lax.pmin)(partial, mesh_axes)
    fill = None if geometry.fill_count == 0 else geometry.fill
    return _extreme(partial, block, _held_rows(block, rows or (), mesh_shape), tuple(node.params["axes"]),
                    kind is CollectiveKind.PMAX, mesh_axes, fill, geometry.fill_count)


def _finish_top_k(node: Node, mesh_axes: tuple[str, ...], partial, values, output: int):
    """A top-k finished: every device's ``k`` candidates (its block's best, their indices offset to the whole axis)
    all-gathered, and the ``k`` best of them taken — ties and NaN ordered as ``lax.top_k`` orders them, the
    candidates lying in the order of the indices they came from. The indices take the values' order (their gather is
    the values' own, which XLA merges)."""
    axis, k = node.params["axis"] % partial.ndim, node.params["k"]
    gathered = as_bits(lambda b: lax.all_gather(b, mesh_axes, axis=axis, tiled=True), values)
    best, order = lax.top_k(jnp.moveaxis(gathered, axis, -1), k)
    if output == 0:
        return jnp.moveaxis(best, -1, axis)
    indices = lax.all_gather(partial, mesh_axes, axis=axis, tiled=True)
    return jnp.moveaxis(jnp.take_along_axis(jnp.moveaxis(indices, axis, -1), order, axis=-1), -1, axis)


def _finish_prefix(node: Node, mesh_axes: tuple[str, ...], scanned, mesh_shape):
    """A cumulative op finished: every device's block total (its scan's last row; first, reversed) all-gathered, the
    totals of the blocks before this one (after it, reversed) combined, and that combined into each row of its
    scan by the op's ``combine`` piece (a sum added, a product multiplied, a maximum taken, a log-sum-exp
    log-added)."""
    axis, reverse = node.params["axis"], node.params.get("reverse", False)
    rows = scanned.shape[axis]
    if rows == 0:
        return scanned
    total = lax.slice_in_dim(scanned, 0, 1, axis=axis) if reverse else lax.slice_in_dim(scanned, rows - 1, rows,
                                                                                          axis=axis)
    totals = as_bits(lambda b: lax.all_gather(b, mesh_axes, axis=axis, tiled=True), total)  # bfloat16 as 16 bits
    index = lax.broadcasted_iota(jnp.int32, totals.shape, axis)
    here = block_index(mesh_axes, mesh_shape)
    earlier = index > here if reverse else index < here
    return lookup(node.op).combine(node, scanned, totals, earlier)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _product(x, mesh_axes):
    """The product of every device's ``x``: one all-reduce multiplying them (``jx.pprod``)."""
    return jx.pprod(x, mesh_axes)


@_product.defjvp
def _product_jvp(mesh_axes, primals, tangents):
    """A product's rule: each device's tangent times the other devices' factors (all-gathered, this device's own
    left out: no division, so a zero factor is no trouble), summed."""
    (x,), (x_dot,) = primals, tangents
    y = _product(x, mesh_axes)
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        return y, x_dot
    factors = lax.all_gather(x, mesh_axes)
    device = lax.broadcasted_iota(jnp.int32, factors.shape, 0)
    others = jnp.prod(jnp.where(device == lax.axis_index(mesh_axes), jnp.ones((), x.dtype), factors), axis=0)
    return y, lax.psum(x_dot * others, mesh_axes)


@functools.partial(jax.custom_jvp, nondiff_argnums=(3, 4, 5, 6, 7))
def _extreme(x, block, held, axes, is_max: bool, mesh_axes, fill, fill_count: int):
    """The maximum (minimum) of every device's ``x`` (its ``block``'s, reduced over ``axes``) and of ``fill`` (the
    value of the rows no device holds, when ``fill_count`` elements are), as ``jnp.max`` (``jnp.min``) would give it
    over the whole array: XLA's cross-device max and min neither propagate NaN nor tell -0 from +0, so floats are
    combined as integers in IEEE total order (one all-reduce of the same size, no flags): a NaN on any device wins,
    and a zero result takes the sign the unsharded reduction gives it (+0 for max, -0 for min)."""
    combine = lax.pmax if is_max else lax.pmin
    if not jnp.issubdtype(x.dtype, jnp.floating):
        best = combine(x, mesh_axes)
        if fill is None:
            return best
        return (jnp.maximum if is_max else jnp.minimum)(best, jnp.asarray(fill, x.dtype))
    nan = jnp.array(jnp.nan if is_max else -jnp.nan, x.dtype)  # above +inf (below -inf) in total order
    key = combine(_total_order(jnp.where(jnp.isnan(x), nan, x)), mesh_axes)
    if fill is not None:
        fill = jnp.asarray(fill, x.dtype)
        key = (jnp.maximum if is_max else jnp.minimum)(key, _total_order(jnp.where(jnp.isnan(fill), nan, fill)))
    best = lax.bitcast_convert_type(_total_order_inverse(key), x.dtype)
    return jnp.where(jnp.isnan(best), jnp.array(jnp.nan, x.dtype), best)


def _total_order(x):
    """An integer with the order of IEEE totalOrder on floats: -NaN < -inf < ... < -0 < +0 < ... < +inf < +NaN
    (the sign-magnitude bits, with the magnitude bits of negative numbers flipped)."""
    bits = lax.bitcast_convert_type(x, jnp.dtype(f"int{8 * x.dtype.itemsize}"))
    return jnp.where(bits < 0, bits ^ jnp.iinfo(bits.dtype).max, bits)


def _total_order_inverse(key):
    return jnp.where(key < 0, key ^ jnp.iinfo(key.dtype).max, key)  # flipping again is the inverse


@_extreme.defjvp
def _extreme_jvp(axes, is_max, mesh_axes, fill, fill_count, primals, tangents):
    """``pmax``/``pmin`` have no differentiation rule; this is ``jnp.max``'s (``jnp.min``'s): the tangent of
    the elements attaining the extreme, averaged over all of them — every device's ``held`` elements of its block
    equal to it, and the ``fill_count`` rows no device holds where the fill attains it (their tangent is zero). Read
    from the blocks themselves: a device's own result's tangent averages over its block's padding too."""
    (x, block, held), (_, block_dot, _) = primals, tangents
    y = _extreme(x, block, held, axes, is_max, mesh_axes, fill, fill_count)
    at = held & (block == jnp.expand_dims(y, axes))
    total = lax.psum(jnp.sum(jnp.where(at, block_dot, jnp.zeros((), block_dot.dtype)), axis=axes), mesh_axes)
    count = lax.psum(jnp.sum(at, axis=axes, dtype=jnp.int32), mesh_axes)
    if fill is not None:
        count = count + jnp.where(y == jnp.asarray(fill, y.dtype), fill_count, 0)
    return y, total / count.astype(block_dot.dtype)


def _held_rows(block, rows, mesh_shape):
    """True where ``block`` holds an element of the array: along each ranged axis of ``rows`` (``(axis, mesh axes,
    span, length)``), not in its padding."""
    held = jnp.ones((), bool)
    for axis, names, span, length in rows:
        row = block_rows(block.shape, axis, names, mesh_shape, span.block, -span.offset)
        held = held & (row >= 0) & (row < length)
    return jnp.broadcast_to(held, block.shape)


def _without_padding(block, axis: int, rows: tuple[Span, int], mesh_axes, mesh_shape, identity):
    """``(block with the padding of its ranged axis set to identity, the global row its first position holds)``."""
    span, length = rows
    row = block_rows(block.shape, axis, mesh_axes, mesh_shape, span.block, -span.offset)
    return jnp.where((row >= 0) & (row < length), block, identity), block_index(mesh_axes, mesh_shape) * span.block \
        - span.offset


def _combine_arg(node, block, local_index, kind: CollectiveKind, mesh_axes, mesh_shape, rows=None):
    """The global argmax (argmin) from each device's: offset the local index by the block's start, then take
    the smallest index among the devices holding the extreme value — or, as ``jnp.argmax`` does, the first
    NaN if there is any. Along a ranged axis (``rows``: its span and length) the block's first row is the span's,
    its padding is masked, and a device holding no row has no candidate."""
    (axis,) = node.params["axes"]
    block = lax.stop_gradient(block)  # an index has no derivative; pmax/pmin have no rule to carry one through
    is_max = kind is CollectiveKind.ARGMAX
    index_dtype = local_index.dtype
    holds = True
    if rows is None:
        start = block_index(mesh_axes, mesh_shape) * block.shape[axis]
    else:
        (_, _, span, length), = rows
        block, start = _without_padding(block, axis, (span, length), mesh_axes, mesh_shape,
                                        extreme(block.dtype, lowest=is_max))
        holds = (start < length) & (start + span.block > 0)
    index = local_index + start.astype(index_dtype)
    value = (jnp.max if is_max else jnp.min)(block, axis=axis)
    if jnp.issubdtype(block.dtype, jnp.floating):
        nan = jnp.isnan(value)
        any_nan = lax.pmax(nan.astype(jnp.int32), mesh_axes) > 0
        clean = jnp.where(nan, -jnp.inf if is_max else jnp.inf, value)
    else:
        nan = any_nan = jnp.zeros(value.shape, bool)
        clean = value
    best = (lax.pmax if is_max else lax.pmin)(clean, mesh_axes)
    winner = jnp.where(any_nan, nan, clean == best)
    candidate = jnp.where(winner & holds, index, jnp.iinfo(index_dtype).max)
    return lax.pmin(candidate, mesh_axes)
