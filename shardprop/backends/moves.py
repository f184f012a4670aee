"""Running a planned move (:func:`shardprop.core.moves.plan_move`) on this device's block, inside ``jax.shard_map``.

Each :class:`~shardprop.core.moves.Step` is one ``lax`` call over the mesh axes the caller's ``shard_map`` names
(``check_vma=False``: the steps change which mesh axes a block varies over, which the caller states in its
``out_specs``). A step that sends nothing between devices (groups of one device) is skipped, as
:func:`~shardprop.core.moves.step_transfer` prices it at nothing. A step over a sub-axis (``i[minor 2]``, see
:mod:`shardprop.core.subaxes`) is the collective over its mesh axis in groups (``axis_index_groups``) of the devices
that differ only on it; a slice over one cuts by the device's coordinate on it. Steps that only move data move the
bits of bfloat16 and float8 blocks: XLA:CPU would move them as wider floats, twice the bytes priced.

    steps = plan_move(x.shape, x.dtype, have, want, mesh_shape)
    jax.shard_map(lambda b: apply_steps(b, steps, mesh_shape), mesh=mesh, in_specs=layout_to_spec(have.layout),
                  out_specs=layout_to_spec(want.layout), check_vma=False)
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping

import numpy as np
from jax import lax

from ..core.blocks import block_index, first_device_only
from ..core.layouts import shard_count
from ..core.steps import Step, StepKind, exchanges, halo_rows, permute_pairs
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


def _shift_pairs(layout_axes: tuple[str, ...], shift: int, mesh_shape: Mapping[str, int]):
    """``(mesh axes in mesh order, pairs)`` for a ``ppermute`` that sends each device's piece to the device ``shift``
    blocks further along an axis laid out over ``layout_axes`` (major first): ``ppermute`` numbers the devices of
    several mesh axes in mesh order, whatever order the layout names them in."""
    ordered = tuple(name for name in mesh_shape if name in layout_axes)
    coordinates = list(itertools.product(*(range(mesh_shape[name]) for name in ordered)))

    def block(coords) -> int:
        at = dict(zip(ordered, coords, strict=True))
        index = 0
        for name in layout_axes:
            index = index * mesh_shape[name] + at[name]
        return index

    device_of = {block(c): d for d, c in enumerate(coordinates)}
    pairs = [(d, device_of[block(c) + shift]) for d, c in enumerate(coordinates) if block(c) + shift in device_of]
    return ordered, pairs


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
    they are on every backend. Sums cannot do this: a psum of bfloat16 on CPU moves float32."""
    if jx.dtype_kind(x.dtype) != "f" or np.dtype(x.dtype).kind != "V":  # numpy's own floats move as they are
        return move(x)
    bits = np.dtype(f"uint{8 * x.dtype.itemsize}")
    return lax.bitcast_convert_type(move(lax.bitcast_convert_type(x, bits)), x.dtype)
