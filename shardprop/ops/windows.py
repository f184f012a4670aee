"""The geometry of a window along a sharded axis: which rows past its own block each device reads (its *halo*).

A window op (a convolution, a pooling window, a max-pool's derivative) can keep an axis sharded when every device
computes its own block of the output from its own block of the input and a few rows of its neighbours' blocks. Those
rows arrive by a halo exchange (a move, ``StepKind.HALO``: one ``ppermute`` per neighbour the rows come from) before
the op; past the ends of the array the exchange leaves zeros, which the op turns into what it pads with. The
functions here say when that works and how many rows it takes, for the family modules (``convolutions.py``,
``pooling.py``) and their per-block pieces.

    >>> window_reach(64, 8, 64, window=3, stride=1, padding=(1, 1))   # a 3x3 SAME convolution, rows over 8 devices
    (1, 1)
"""

from __future__ import annotations

from dataclasses import replace

import jax.numpy as jnp
import numpy as np
from jax import lax

from ..core.blocks import block_rows
from ..core.layouts import Span, shard_count
from ..expr import jax_adapter as jx


def window_reach(size: int, blocks: int, out_size: int, *, window: int, stride: int, padding: tuple[int, int],
                 dilation: int = 1, base_dilation: int = 1) -> tuple[int, int] | None:
    """``(before, after)``: the rows past its block each device reads when a window of ``window`` elements (``dilation``
    apart), every ``stride`` rows of an axis of ``size`` padded by ``padding``, computes ``out_size`` outputs and the
    axis is cut in ``blocks`` even blocks — if each device can compute its own block of the output so (the output
    ``size / stride`` long, the stride dividing the block, no base dilation) and that moves less than a gather; else
    None. ``after`` is negative where a device does not read its own last rows.

    >>> window_reach(64, 8, 64, window=3, stride=1, padding=(1, 1))   # a 3x3 SAME convolution
    (1, 1)
    >>> window_reach(64, 8, 32, window=2, stride=2, padding=(0, 0))   # a 2x2 pool
    (0, 0)
    >>> window_reach(64, 8, 62, window=3, stride=1, padding=(0, 0)) is None   # VALID: the output blocks are uneven
    True
    """
    if blocks <= 1 or size % blocks or out_size * stride != size:
        return None
    found = window_rows(Span(0, size // blocks), size, blocks, out_size, window=window, stride=stride,
                        padding=padding, dilation=dilation, base_dilation=base_dilation)
    return None if found is None or found[0][0] < 0 else found[0]


def window_rows(span: Span, size: int, blocks: int, out_size: int, *, window: int, stride: int,
                padding: tuple[int, int], dilation: int = 1, base_dilation: int = 1
                ) -> tuple[tuple[int, int], Span] | None:
    """``((before, after), out span)`` for a window along an axis of ``size`` whose rows the ``blocks`` devices hold as
    ``span`` says (equal blocks, or a ranged axis: a slice's, a pad's): each device computes output rows in blocks
    ``span.block / stride`` long — equal blocks where they divide ``out_size``, else ranged (the last ones short: a
    VALID window) — from the rows it holds and ``before``/``after`` rows past them (negative: its own first or last
    rows it does not read). Rows past the ends of the array are the op's padding; rows inside it that no device holds
    are the span's fill. None unless the stride divides the block, without base dilation, and the halo reads fewer
    rows than every other block.

    >>> window_rows(Span(0, 8), 64, 8, 62, window=3, stride=1, padding=(0, 0))   # VALID: the last block 6 rows
    ((0, 2), Span(offset=0, block=8, fill=None))
    >>> window_rows(Span(-1, 4, 0.0), 33, 8, 32, window=2, stride=1, padding=(0, 0))  # over a spread pad's rows
    ((1, 0), Span(offset=0, block=4, fill=None))
    """
    if blocks <= 1 or base_dilation != 1 or span.block % stride or padding[0] < 0:
        return None
    out_block = span.block // stride
    if blocks * out_block < out_size or out_block == 0:
        return None
    before = padding[0] - span.offset  # output block d starts at row d * block - offset - before
    after = (window - 1) * dilation + 1 - stride - before
    if -before >= span.block or max(before, 0) + max(after, 0) > (blocks - 1) * span.block:
        return None  # reading past every other block: a gather moves less
    return (before, after), Span(0, out_block)


def summed_window_reach(size: int, window_size: int, blocks: int, out_size: int, *, stride: int,
                        padding: tuple[int, int], dilation: int = 1, base_dilation: int = 1,
                        window_span: Span | None = None) -> tuple[int, int] | None:
    """``window_reach`` for a convolution whose *window* axis (the kernel's, ``window_size`` long) is sharded like
    the input axis it slides over (``size`` long), both cut in ``blocks`` even blocks: each device sums the products
    of its part of the window over every output position — the kernel gradient of a spatially sharded convolution
    (its result a partial sum, finished by a ``psum``). Needs the window's blocks ``dilation`` apart to start where
    the input's do; None otherwise. A ranged window (``window_span``: the cotangent of a VALID convolution, its last
    blocks short) is summed in its blocks, their padding zeroed.

    >>> summed_window_reach(64, 64, 8, 3, stride=1, padding=(1, 1))   # the kernel gradient of a 3x3 SAME conv
    (1, 1)
    >>> summed_window_reach(64, 62, 8, 3, stride=1, padding=(0, 0), window_span=Span(0, 8))   # of a VALID one
    (0, 2)
    """
    if blocks <= 1 or base_dilation != 1 or size % blocks or padding[0] < 0:
        return None
    if window_span is None and window_size % blocks or window_span is not None and (
            window_span.offset != 0 or window_span.fill is not None):
        return None
    block = size // blocks
    window_block = window_size // blocks if window_span is None else window_span.block
    if window_block * dilation != block:
        return None
    before, after = padding[0], (out_size - 1) * stride - dilation - padding[0] + 1
    if before + max(after, 0) > (blocks - 1) * block:
        return None
    return before, after


def dilated_window_reach(size: int, blocks: int, out_size: int, *, window: int, stride: int,
                         padding: tuple[int, int], dilation: int = 1, base_dilation: int = 1):
    """``(before, after, local padding)`` for a convolution whose input is dilated (``base_dilation``: the input
    gradient of a strided convolution, a transposed convolution) along an axis of ``size`` in ``blocks`` even blocks:
    each device's output block is ``base_dilation`` times its input block; it reads ``before``/``after`` input rows
    past its block and pads the dilated rows by ``local padding`` (negative: rows it does not read). None unless
    the window moves one row at a time and the output is ``base_dilation`` times the input.

    >>> dilated_window_reach(32, 8, 64, window=3, stride=1, padding=(1, 2), base_dilation=2)  # 3x3/2 SAME's gradient
    (0, 1, (1, 0))
    """
    if blocks <= 1 or base_dilation <= 1 or stride != 1 or size % blocks or out_size != size * base_dilation:
        return None
    block, s, extent = size // blocks, base_dilation, (window - 1) * dilation + 1
    before = padding[0] // s
    after = (extent - 2 - padding[0]) // s + 1
    if padding[0] < 0 or before + max(after, 0) > (blocks - 1) * block:
        return None
    rows = block + before + max(after, 0)
    low = padding[0] - before * s
    return before, after, (low, block * s - 1 + extent - ((rows - 1) * s + 1) - low)


def window_out(size, *, window, stride, padding, dilation, base_dilation) -> int:
    """The output length of a window along an axis (lax's formula)."""
    padded = (size - 1) * base_dilation + 1 + padding[0] + padding[1]
    return max(0, (padded - ((window - 1) * dilation + 1)) // stride + 1)


def reach_or_bug(size, mesh_axes, window, reach):
    """``reach``, found for an axis the op consumes sharded (its rule keeps no other axis sharded)."""
    if reach is None:
        raise ValueError(f"a window along an axis of {size} over {mesh_axes} has no halo ({window}): the rule "
                         "keeps such an axis whole (a shardprop bug)")
    return reach


def with_halo(need, reaches: dict[int, tuple[int, int]]):
    """``need`` holding, on each axis of ``reaches``, the rows before and after its block the window reads."""
    if not reaches:
        return need
    return replace(need, halo=tuple((max(reaches[k][0], 0), max(reaches[k][1], 0)) if k in reaches else (0, 0)
                                    for k in range(len(need.layout))))


def unpadded(x, axis: int, reach: tuple[int, int]):
    """A haloed block without the rows the window does not read (a negative ``before`` or ``after``: its own first
    or last rows)."""
    before, after = reach
    first, stop = max(-before, 0), x.shape[axis] + min(after, 0)
    return x if (first, stop) == (0, x.shape[axis]) else lax.slice_in_dim(x, first, stop, axis=axis)


def identity(primitive: str, dtype):
    """What ``reduce_window_{sum,max,min}`` pads with: 0, the lowest value, the highest value."""
    if primitive == "reduce_window_sum":
        return np.zeros((), dtype)
    return extreme(dtype, lowest=primitive == "reduce_window_max")


def extreme(dtype, *, lowest: bool):
    """The lowest (highest) value of ``dtype``: the identity of a maximum (minimum) — -inf for floats.

    >>> extreme(np.int8, lowest=True), extreme(np.float32, lowest=False)
    (array(-128, dtype=int8), array(inf, dtype=float32))
    """
    kind = jx.dtype_kind(dtype)
    if kind == "f":
        return np.array(-np.inf if lowest else np.inf, dtype)
    if kind == "b":
        return np.array(not lowest, dtype)
    return np.array(np.iinfo(dtype).min if lowest else np.iinfo(dtype).max, dtype)


def past_the_ends(x, axis: int, before: int, size: int, mesh_axes, mesh_shape, fill, span: Span | None = None):
    """``x`` (a block with ``before`` halo rows first, of a ranged axis if ``span``) with ``fill`` in its rows past the
    ends of the array, and the span's fill in the rows of the array no device holds."""
    count = shard_count(mesh_shape, mesh_axes)
    span = span or Span(0, size // count)
    index = _row_index(x.shape, axis, before, mesh_axes, mesh_shape, span)
    x = jnp.where((index >= 0) & (index < size), x, jnp.asarray(fill, x.dtype))
    if span.fill is None:
        return x
    held = (index >= -span.offset) & (index < count * span.block - span.offset)
    return jnp.where(held | (index < 0) | (index >= size), x, jnp.asarray(span.fill, x.dtype))


def _row_index(shape, axis: int, before: int, mesh_axes, mesh_shape, span: Span):
    """The array row each row of this device's block (``before`` halo rows first) stands for, along ``axis``."""
    return block_rows(shape, axis, mesh_axes, mesh_shape, span.block, -span.offset - max(before, 0))


def within_the_ends(shape, axis: int, size: int, mesh_axes, mesh_shape, span: Span):
    """True on the rows of a block of ``shape`` (ranged along ``axis`` as ``span`` says) that are rows of the array
    (of ``size`` rows), False on its padding."""
    index = _row_index(shape, axis, 0, mesh_axes, mesh_shape, span)
    return (index >= 0) & (index < size)


def trivial_windows(window_dimensions, window_strides, padding, base_dilation=None, window_dilation=None):
    """Per axis: True where the window is one element with stride 1 and no padding or dilation."""
    ones = (1,) * len(window_dimensions)
    return [w == 1 and s == 1 and tuple(p) == (0, 0) and b == 1 and d == 1 for w, s, p, b, d in zip(
        window_dimensions, window_strides, padding, base_dilation or ones, window_dilation or ones, strict=True)]


def window_of(k, window_dimensions, window_strides, padding, base_dilation, window_dilation) -> dict:
    """Axis ``k``'s window of a windowed reduction (for ``window_reach``)."""
    return dict(window=window_dimensions[k], stride=window_strides[k], padding=tuple(padding[k]),
                dilation=(window_dilation or (1,) * len(window_dimensions))[k],
                base_dilation=(base_dilation or (1,) * len(window_dimensions))[k])
