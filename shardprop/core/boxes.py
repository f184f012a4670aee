"""Boxes: the sets of tensor elements lineage talks about.

A ``Box`` is one ``(start, stop)`` per axis; a region is a list of boxes whose *union* is the set. Regions
stay small: overlapping and adjacent boxes are merged, and a region that would grow past
``MAX_BOXES`` is widened to its bounding box — still sound (a superset), no longer exact, so such a
region is flagged.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

Box = tuple[tuple[int, int], ...]


class LineageContext:
    """What a lineage rule may know besides its params: the shapes of the node's operands and outputs, and
    ``walk`` — the backward walk itself, ``walk(graph, {value: boxes}) -> ({input: boxes}, exact)``, for a rule
    whose op has a body (a loop's lineage walks its body). A rule that has to widen its answer past the exact set
    (too many pieces) sets ``exact = False``.

    A lineage rule (the ``lineage`` piece of a primitive's ``shardprop.ops.OpDef``) has one signature::

        rule(ctx: LineageContext, box: Box, output: int, **params) -> list[list[Box]]

    It gets one box of output ``output`` and returns, per operand, the boxes that box reads.
    """

    __slots__ = ("in_shapes", "out_shapes", "exact", "walk")

    def __init__(self, in_shapes: tuple[tuple[int, ...], ...], out_shapes: tuple[tuple[int, ...], ...],
                 walk: Callable | None = None):
        self.in_shapes, self.out_shapes, self.exact, self.walk = in_shapes, out_shapes, True, walk

MAX_BOXES = 64


def full_box(shape: tuple[int, ...]) -> Box:
    return tuple((0, n) for n in shape)


def is_empty(box: Box) -> bool:
    return any(start >= stop for start, stop in box)


def volume(box: Box) -> int:
    return math.prod(max(0, stop - start) for start, stop in box)


def contains(outer: Box, inner: Box) -> bool:
    return all(a <= c and d <= b for (a, b), (c, d) in zip(outer, inner, strict=True))


def hull(boxes: list[Box]) -> Box:
    return tuple((min(b[k][0] for b in boxes), max(b[k][1] for b in boxes)) for k in range(len(boxes[0])))


def product(per_axis: list[list[tuple[int, int]]]) -> tuple[list[Box], bool]:
    """Every box of the cartesian product of per-axis interval lists: ``(boxes, exact)``, widened as
    ``bounded_product`` does."""
    return bounded_product([[(interval,) for interval in intervals] for intervals in per_axis])


def bounded_product(parts: list[list[Box]]) -> tuple[list[Box], bool]:
    """Every concatenation of one piece per part (each part a list of boxes over some consecutive axes):
    ``(boxes, exact)``. Past ``MAX_BOXES`` boxes the part with the most pieces is widened to its hull
    until the product is small again — before it is built, so a strided slice of a large tensor stays
    cheap — and ``exact`` is False."""
    parts = [list(part) for part in parts]
    exact = True
    while math.prod(len(part) for part in parts) > MAX_BOXES:
        widest = max(range(len(parts)), key=lambda k: len(parts[k]))
        parts[widest] = [hull(parts[widest])]
        exact = False
    return [sum(combo, ()) for combo in itertools.product(*parts)], exact


def _merge_pair(a: Box, b: Box) -> Box | None:
    """``a ∪ b`` as one box when it is one (equal on every axis but one, touching or overlapping there)."""
    differ = [k for k in range(len(a)) if a[k] != b[k]]
    if len(differ) > 1:
        return None
    if not differ:
        return a
    k = differ[0]
    (s0, e0), (s1, e1) = a[k], b[k]
    if s1 > e0 or s0 > e1:
        return None
    return a[:k] + ((min(s0, s1), max(e0, e1)),) + a[k + 1:]


def normalize(boxes: list[Box]) -> tuple[list[Box], bool]:
    """Drop empty and covered boxes, merge the ones whose union is a box; returns ``(boxes, exact)``, where
    ``exact`` is False when the result had to be widened to its bounding box."""
    boxes = [b for b in dict.fromkeys(boxes) if not is_empty(b)]
    if len(boxes) <= 1:
        return boxes, True
    if len(boxes) > 8 * MAX_BOXES:  # merging is quadratic: far too many pieces go straight to the hull
        return [hull(boxes)], False
    changed = True
    while changed:
        changed = False
        boxes.sort(key=volume, reverse=True)
        kept: list[Box] = []
        for box in boxes:
            if any(contains(k, box) for k in kept):
                continue
            for i, other in enumerate(kept):
                merged = _merge_pair(other, box)
                if merged is not None:
                    kept[i] = merged
                    changed = True
                    break
            else:
                kept.append(box)
        boxes = kept
    if len(boxes) > MAX_BOXES:
        return [hull(boxes)], False
    return sorted(boxes), True


def mask(shape: tuple[int, ...], boxes: list[Box]):
    """A boolean numpy array of ``shape``, True inside the union of ``boxes`` (for tests and pictures)."""
    import numpy as np

    out = np.zeros(shape, dtype=bool)
    for box in boxes:
        out[tuple(slice(s, e) for s, e in box)] = True
    return out
