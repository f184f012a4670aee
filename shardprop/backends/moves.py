"""Running a planned move (``shardprop.core.moves.plan_move``) on this device's block, inside ``jax.shard_map``.

Each ``shardprop.core.moves.Step`` is one ``lax`` call over the mesh axes the caller's ``shard_map`` names
(``check_vma=False``: the steps change which mesh axes a block varies over, which the caller states in its
``out_specs``). A step that sends nothing between devices (groups of one device) is skipped, as
``shardprop.core.moves.step_transfer`` prices it at nothing — but for the steps that put a placed value's rows in
their places (a mirror, a rotation, a route), which rearrange the block even where they send nothing. A step over
a sub-axis (``i[minor 2]``, see ``shardprop.core.subaxes``) is the collective over its mesh axis in groups
(``axis_index_groups``) of the devices that differ only on it; a slice over one cuts by the device's coordinate on
it. Steps that only move data move the bits of bfloat16 and float8 blocks: XLA:CPU would move them as wider floats,
twice the bytes priced.

    steps = plan_move(x.shape, x.dtype, have, want, mesh_shape)
    jax.shard_map(lambda b: apply_steps(b, steps, mesh_shape), mesh=mesh, in_specs=layout_to_spec(have.layout),
                  out_specs=layout_to_spec(want.layout), check_vma=False)
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..core.blocks import block_index, first_device_only
from ..core.layouts import shard_count, standard_span
from ..core.rounds import moves_rows, rotation_split
from ..core.steps import (Step, StepKind, exchanges, halo_rows, permute_pairs, realign_rounds, unspan_rows,
                          unspan_sums)
from ..core.subaxes import groups, is_whole, sizes_with, span
from ..expr import jax_adapter as jx


def apply_step(x, step: Step, mesh_shape: Mapping[str, int]):
    """This device's block after ``step`` (``x`` is its block held as ``step.before``)."""
    names = step.mesh_axes
    if step.kind is StepKind.SLICE:
        size = x.shape[step.axis] // shard_count(sizes_with(names, mesh_shape), names)
        return lax.dynamic_slice_in_dim(x, _block_index(names, mesh_shape) * size, size, step.axis)
    if step.kind is StepKind.TAKE_ONCE:
        if is_whole(names, mesh_shape):
            return first_device_only(x, names, mesh_shape)
        return lax.select(_block_index(names, mesh_shape) == 0, x, lax.full_like(x, 0))
    if step.kind is StepKind.HALO:
        return _halo(x, step, mesh_shape)
    if step.kind is StepKind.REALIGN:
        return _realign(x, step, mesh_shape)
    if step.kind is StepKind.UNSPAN:
        return _unspan(x, step, mesh_shape)
    if step.kind is StepKind.TAKE_ROWS:
        return _take_rows(x, step, mesh_shape)
    if step.kind is StepKind.MIRROR:  # each device reversed its block: its mirror device's
        return _to_mirror(x, names, mesh_shape)
    placement = step.before.placement
    if step.kind is StepKind.ROTATE:  # each device's rows lie shift rows further (the pieces kept move too)
        return _rotate(x, step.axis, placement.shift, names, mesh_shape)
    if step.kind is StepKind.ROUTE:  # each device's block holds pieces of other blocks (joined in place, or picked)
        return apply_rounds(x, placement.rounds, step.axis, names, x.shape[step.axis], placement.fill, mesh_shape)
    if not exchanges(step, mesh_shape):  # over mesh axes of size 1: the block stays as it is
        return x
    if step.kind is StepKind.PERMUTE:  # over whole mesh axes, whatever its layouts use
        return as_bits(lambda b: lax.ppermute(b, names, perm=permute_pairs(step, mesh_shape)), x)
    # over sub-axes: over their mesh axes, in groups of the devices that differ only on them
    names, within = (names, None) if is_whole(names, mesh_shape) else groups(names, mesh_shape)
    if step.kind is StepKind.ALL_GATHER:
        return as_bits(lambda b: lax.all_gather(b, names, axis=step.axis, tiled=True, axis_index_groups=within), x)
    if step.kind is StepKind.ALL_TO_ALL:
        return as_bits(lambda b: lax.all_to_all(b, names, split_axis=step.to_axis, concat_axis=step.axis,
                                                 tiled=True, axis_index_groups=within), x)
    if step.kind is StepKind.PSUM:
        return lax.psum(x, names, axis_index_groups=within)
    if step.kind is StepKind.PSUM_SCATTER:
        return lax.psum_scatter(x, names, scatter_dimension=step.axis, tiled=True, axis_index_groups=within)
    raise ValueError(f"no executor for step {step}")


def _to_mirror(reversed_block, mesh_axes: tuple[str, ...], mesh_shape):
    """A reversal finished: each device's reversed block sent to the device at the mirrored position along every
    reversed axis (``n - 1 - i`` of its ``n`` blocks), one ``ppermute`` over ``mesh_axes``."""
    # every mesh axis named lays out a reversed axis (a block index over (i, j) mirrors as i and j both mirror), so
    # the pairs are the same in any order of the axes: named in mesh order, as ppermute numbers the devices (jax
    # 0.12 refuses another order, where 0.10.2 sorted it)
    mesh_axes = tuple(name for name in mesh_shape if name in mesh_axes)
    sizes = [mesh_shape[name] for name in mesh_axes]
    devices = list(itertools.product(*(range(n) for n in sizes)))
    pairs = [(d, devices.index(tuple(n - 1 - c for n, c in zip(sizes, coords, strict=True))))
             for d, coords in enumerate(devices)]
    return as_bits(lambda b: lax.ppermute(b, mesh_axes, perm=pairs), reversed_block)  # bfloat16 as 16 bits


def _rotate(x, axis: int, shift: int, mesh_axes: tuple[str, ...], mesh_shape):
    """Each device's block of the rows ``shift`` rows further around the axis: the rest of the block ``q`` devices
    further and the start of the next (``shift = q·B + r``), one ``ppermute`` around the devices for each that is not
    the device itself."""
    count = shard_count(mesh_shape, mesh_axes)
    parts = []
    for first, stop, away in rotation_split(x.shape[axis], shift, count):
        piece = lax.slice_in_dim(x, first, stop, axis=axis)
        parts.append(piece if away == 0 else rotated(piece, mesh_axes, away, mesh_shape))
    return lax.concatenate(parts, axis) if len(parts) > 1 else parts[0]


def apply_steps(x, steps: Iterable[Step], mesh_shape: Mapping[str, int]):
    """This device's block after every step of a move, in order."""
    for step in steps:
        x = apply_step(x, step, mesh_shape)
    return x


def _halo(x, step: Step, mesh_shape: Mapping[str, int]):
    """``x`` with the rows of a halo step added on its side: sliced from every device's own block (the rows before
    its halo), shifted ``step.shift`` devices along the axis's mesh axes by one ``ppermute``. A device with no
    device that far away receives zeros, as past the ends of the array (the op masks them where it pads otherwise)."""
    axis = step.axis
    lo, hi = step.before.halo_of(axis)
    block = x.shape[axis] - lo - hi
    first, rows = halo_rows(step, block)
    piece = lax.slice_in_dim(x, lo + first, lo + first + rows, axis=axis)
    names, pairs = _shift_pairs(step.mesh_axes, step.shift, mesh_shape)
    got = as_bits(lambda b: lax.ppermute(b, names, perm=pairs), piece) if pairs else lax.full_like(piece, 0)
    before = step.after.halo_of(axis)[0] != lo
    return lax.concatenate([got, x] if before else [x, got], axis)


def _realign(x, step: Step, mesh_shape: Mapping[str, int]):
    """Rows moved into other blocks along an axis (``shardprop.core.steps.realign_rounds``): per round, each
    device cuts the piece it sends (where it starts in its block differs by device: a table indexed by the
    device's block), one ``ppermute`` (none for the pieces a device keeps), and each device places the piece it
    received where it lands. A position no piece lands on holds the span's fill (the rows no device holds), or
    zeros (past the axis's ends: nothing reads them)."""
    axis, names = step.axis, step.mesh_axes
    count = shard_count(mesh_shape, names)
    wanted = step.after.span_of(axis)
    block = wanted.block if wanted is not None else step.length // count
    held = step.before.span_of(axis)
    fill = held.fill if held is not None and held.fill is not None else 0
    return apply_rounds(x, realign_rounds(step, count), axis, names, block, fill, mesh_shape)


def apply_rounds(x, rounds, axis: int, names: tuple[str, ...], block: int, fill, mesh_shape: Mapping[str, int]):
    """Blocks of ``block`` rows along ``axis`` (laid out over ``names``) made of the pieces of ``rounds``
    (``shardprop.core.rounds.Piece``: rows of one device's block ``x`` landing in another's), one ``ppermute``
    per round but the first (the pieces each device keeps); a position no piece lands on holds ``fill``."""
    count = shard_count(mesh_shape, names)
    here = block_index(names, mesh_shape)
    out = lax.full(tuple(block if k == axis else n for k, n in enumerate(x.shape)), fill, x.dtype)
    position = lax.broadcasted_iota(np.int32, tuple(block if k == axis else 1 for k in range(x.ndim)), axis)
    for pieces in rounds:
        if not pieces:
            continue
        rows = max(p.rows for p in pieces)
        sent, landed = np.zeros(count, np.int32), np.zeros((2, count), np.int32)
        for p in pieces:
            sent[p.source] = p.source_at
            landed[:, p.target] = (p.target_at, p.rows)
        padded = lax.pad(x, lax.full((), 0, x.dtype), [(0, rows, 0) if k == axis else (0, 0, 0) for k in range(x.ndim)])
        piece = lax.dynamic_slice_in_dim(padded, jnp.asarray(sent)[here], rows, axis)
        if moves_rows(pieces):  # (the pieces kept stay where they are)
            piece = _permuted(piece, names, [(p.source, p.target) for p in pieces], mesh_shape)
        at, length = jnp.asarray(landed[0])[here], jnp.asarray(landed[1])[here]
        spread = lax.pad(piece, lax.full((), 0, x.dtype), [(block, block, 0) if k == axis else (0, 0, 0)
                                                           for k in range(x.ndim)])
        placed = lax.dynamic_slice_in_dim(spread, block - at, block, axis)
        out = jnp.where((position >= at) & (position < at + length), placed, out)
    return out


def rotated(piece, names: tuple[str, ...], away: int, mesh_shape: Mapping[str, int]):
    """``piece`` of the device ``away`` blocks further along an axis laid out over ``names``, around its end (one
    ``ppermute``)."""
    count = shard_count(mesh_shape, names)
    return _permuted(piece, names, [((b + away) % count, b) for b in range(count)], mesh_shape)


def _permuted(piece, names: tuple[str, ...], pairs, mesh_shape: Mapping[str, int]):
    """``piece`` sent from block ``source`` to block ``target`` for each pair (blocks along an axis laid out over
    ``names``), by one ``ppermute``."""
    ordered, device_of = _block_devices(names, mesh_shape)
    perm = [(device_of[source], device_of[target]) for source, target in pairs]
    return as_bits(lambda b: lax.ppermute(b, ordered, perm=perm), piece)


def _unspan(x, step: Step, mesh_shape: Mapping[str, int]):
    """A ranged axis gathered whole: each device sends the rows it holds (as many as the most any holds, padded),
    one ``all_gather``, and the rows are laid end to end — or, where that padding would move more, each places its
    rows among zeros along the whole axis and one ``psum`` of their bits joins them (``unspan_sums``). The rows
    no device holds are the span's fill."""
    axis, names, length = step.axis, step.mesh_axes, step.length
    span = step.before.span_of(axis)
    count = shard_count(mesh_shape, names)
    held = [span.held(d, length) for d in range(count)]
    most = unspan_rows(step, count)
    if most == 0:  # no device holds a row: all the fill (or nothing: an axis of no rows)
        return lax.full(tuple(length if k == axis else n for k, n in enumerate(x.shape)),
                        0 if span.fill is None else span.fill, x.dtype)
    starts = np.array([first - (d * span.block - span.offset) if stop > first else 0
                       for d, (first, stop) in enumerate(held)], np.int32)
    padded = lax.pad(x, lax.full((), 0, x.dtype), [(0, most, 0) if k == axis else (0, 0, 0) for k in range(x.ndim)])
    mine = lax.dynamic_slice_in_dim(padded, jnp.asarray(starts)[block_index(names, mesh_shape)], most, axis)
    join = _summed_rows if unspan_sums(step, count, x.dtype) else _gathered_rows
    rows = join(mine, axis, names, held, length, mesh_shape)
    first, stop = min(f for f, t in held if t > f), max(t for f, t in held if t > f)
    if first or stop < length:  # rows no device holds: the fill
        row = lax.broadcasted_iota(np.int32, tuple(length if k == axis else 1 for k in range(x.ndim)), axis)
        rows = jnp.where((row >= first) & (row < stop), rows, jnp.asarray(span.fill, x.dtype))
    return rows


def _gathered_rows(mine, axis: int, names, held, length: int, mesh_shape):
    """Each device's rows (``mine``: the first of them, padded to the most any holds) all-gathered and laid end to
    end along the whole axis (zeros where no device holds a row)."""
    most = mine.shape[axis]
    gathered = as_bits(lambda b: lax.all_gather(b, names, axis=axis, tiled=True), mine)
    pieces = [lax.slice_in_dim(gathered, d * most, d * most + stop - first, axis=axis)
              for d, (first, stop) in enumerate(held) if stop > first]
    rows = lax.concatenate(pieces, axis) if len(pieces) > 1 else pieces[0]
    first, stop = min(f for f, t in held if t > f), max(t for f, t in held if t > f)
    return lax.pad(rows, lax.full((), 0, mine.dtype), [(first, length - stop, 0) if k == axis else (0, 0, 0)
                                                        for k in range(mine.ndim)])


def _summed_rows(mine, axis: int, names, held, length: int, mesh_shape):
    """Each device's rows (``mine``, padded: integers) placed among zeros along the whole axis and summed over the
    devices: one device holds each row, so the sum is each row exactly. (Floats are gathered: XLA:CPU's sum flushes
    subnormals and turns -0.0 into 0.0, and a sum of their bits has no transpose under jax >= 0.12.1's grad.)"""
    return lax.psum(_placed(mine, axis, names, held, length, mesh_shape), tuple(names))


def _placed(mine, axis: int, names, held, length: int, mesh_shape):
    """This device's rows (the first of ``mine``) at their place along the whole axis, zeros elsewhere."""
    here, most = block_index(names, mesh_shape), mine.shape[axis]
    firsts = np.array([first for first, _ in held], np.int32)
    counts = np.array([stop - first for first, stop in held], np.int32)
    position = lax.broadcasted_iota(np.int32, tuple(most if k == axis else 1 for k in range(mine.ndim)), axis)
    mine = jnp.where(position < jnp.asarray(counts)[here], mine, lax.full((), 0, mine.dtype))
    zeros = lax.full(tuple(length + most if k == axis else n for k, n in enumerate(mine.shape)), 0, mine.dtype)
    return lax.slice_in_dim(lax.dynamic_update_slice_in_dim(zeros, mine, jnp.asarray(firsts)[here], axis), 0, length,
                            axis=axis)


def _take_rows(x, step: Step, mesh_shape: Mapping[str, int]):
    """A whole axis cut into ranged rows: each device takes the rows of its block (past the axis's ends, whatever the
    padding holds: nothing reads them)."""
    axis, names = step.axis, step.mesh_axes
    span = step.after.span_of(axis) or standard_span(step.length, shard_count(mesh_shape, names))
    block, length = span.block, x.shape[axis]
    padded = lax.pad(x, lax.full((), 0, x.dtype),
                     [(block, block, 0) if k == axis else (0, 0, 0) for k in range(x.ndim)])
    start = block_index(names, mesh_shape) * block - span.offset + block
    return lax.dynamic_slice_in_dim(padded, jnp.clip(start, 0, length + block), block, axis)


def _shift_pairs(layout_axes: tuple[str, ...], shift: int, mesh_shape: Mapping[str, int]):
    """``(mesh axes in mesh order, pairs)`` for a ``ppermute`` that sends each device's piece to the device ``shift``
    blocks further along an axis laid out over ``layout_axes`` (major first)."""
    ordered, device_of = _block_devices(layout_axes, mesh_shape)
    return ordered, [(device_of[b], device_of[b + shift]) for b in sorted(device_of) if b + shift in device_of]


def _block_devices(layout_axes: tuple[str, ...], mesh_shape: Mapping[str, int]):
    """``(mesh axes in mesh order, block index -> ppermute device number)`` along an axis laid out over
    ``layout_axes`` (major first): ``ppermute`` numbers the devices of several mesh axes in mesh order, whatever
    order the layout names them in."""
    ordered = tuple(name for name in mesh_shape if name in layout_axes)
    device_of = {}
    for d, coords in enumerate(itertools.product(*(range(mesh_shape[name]) for name in ordered))):
        at = dict(zip(ordered, coords, strict=True))
        index = 0
        for name in layout_axes:
            index = index * mesh_shape[name] + at[name]
        device_of[index] = d
    return ordered, device_of


def _block_index(names: tuple[str, ...], mesh_shape: Mapping[str, int]):
    """This device's block number along an axis laid out over ``names`` (mesh axes or sub-axes), major first."""
    if is_whole(names, mesh_shape):
        return block_index(names, mesh_shape)
    index = 0
    for name in names:
        parent, minor, size = span(name, mesh_shape)
        index = index * size + lax.axis_index(parent) // minor % size
    return index


def as_bits(move, x):
    """``move(x)`` on the bits of a bfloat16 or float8 ``x``, as unsigned integers of its width: XLA:CPU widens
    those floats in a collective (bfloat16 to float32, float8 to float16), moving twice the bytes; bits move as
    they are on every backend. Sums cannot do this: a psum of bfloat16 on CPU moves float32. The derivative is the
    move's own (a tangent moves as numbers: integers carry none)."""
    if jx.dtype_kind(x.dtype) != "f" or np.dtype(x.dtype).kind != "V":  # numpy's own floats move as they are
        return move(x)
    return _moved_bits(move, x)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _moved_bits(move, x):
    bits = np.dtype(f"uint{8 * x.dtype.itemsize}")
    return lax.bitcast_convert_type(move(lax.bitcast_convert_type(x, bits)), x.dtype)


@_moved_bits.defjvp
def _moved_bits_jvp(move, primals, tangents):
    (x,), (x_dot,) = primals, tangents
    return _moved_bits(move, x), move(x_dot)
