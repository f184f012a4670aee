"""The lineage rule table: for each primitive, which operand elements one box of an output depends on.

A rule has one signature::

    rule(ctx: LineageContext, box: Box, output: int, **params) -> list[list[Box]]

It gets one box of output ``output`` and returns, per operand, the boxes that box reads. Rules registered
with ``exact=True`` return exactly the elements read; the others over-approximate (a gather's operand
depends on index *values*, so its rule returns the whole operand): lineage stays sound and says it is not
exact. Primitives without a rule get :func:`whole_operands`. Rules are registered by primitive name,
grouped by family in the files next to this one, the way propagation rules are::

    LINEAGE_RULES["dot_general"]   # -> (the contraction rule, exact=True)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from .boxes import Box, full_box


class LineageContext:
    """Shapes of the node's operands and outputs (what a rule may know besides its params). A rule that has
    to widen its answer past the exact set (too many pieces) sets ``exact = False``."""

    __slots__ = ("in_shapes", "out_shapes", "exact")

    def __init__(self, in_shapes: tuple[tuple[int, ...], ...], out_shapes: tuple[tuple[int, ...], ...]):
        self.in_shapes, self.out_shapes, self.exact = in_shapes, out_shapes, True


LineageRule = Callable[..., list[list[Box]]]


class Registered(NamedTuple):
    rule: LineageRule
    exact: bool


LINEAGE_RULES: dict[str, Registered] = {}


def register(*names: str, exact: bool = True) -> Callable[[LineageRule], LineageRule]:
    def wrap(rule: LineageRule) -> LineageRule:
        for name in names:
            LINEAGE_RULES[name] = Registered(rule, exact)
        return rule

    return wrap


def whole_operands(ctx: LineageContext, box: Box, output: int, **params) -> list[list[Box]]:
    """The conservative rule: every element of every operand (always sound)."""
    return [[full_box(shape)] for shape in ctx.in_shapes]


def lookup(op: str) -> Registered:
    return LINEAGE_RULES.get(op) or Registered(whole_operands, False)
