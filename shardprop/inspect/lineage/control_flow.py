"""``scan`` looks inside its body: a block of ``ys`` reads the same iterations of ``xs`` (and, through the
carry, every earlier iteration); ``cond`` and ``while`` use the conservative whole-operand rule.

The body is walked with the same rules, seeded with what the output block asks of one iteration. Whatever
that needs of the incoming carry is asked of the previous iteration's outgoing carry, and so on until the
carry regions stop growing: the union of everything asked on the way is sound for every iteration. A scan
whose ``ys`` block needs nothing of the carry (a ``map``) is exact: iterations ``[s, e)`` of ``xs`` only.
"""

from __future__ import annotations

import functools

from ...expr import Graph, trace_jaxpr
from .boxes import Box, contains, full_box, normalize
from .registry import LineageContext, register
from .walk import seeded_dependencies

# Rounds of carry growth before giving up and asking for the whole carry (always a fixed point).
MAX_CARRY_ROUNDS = 16


@functools.lru_cache(maxsize=128)
def _body_graph(jaxpr) -> Graph:
    return trace_jaxpr(jaxpr)


def _covered(boxes: list[Box], by: list[Box]) -> bool:
    return all(any(contains(outer, box) for outer in by) for box in boxes)


def _seeds(body: Graph, num_consts: int, carry_boxes: dict[int, list[Box]]) -> dict[int, list[Box]]:
    """``{body value: boxes}`` asking each outgoing carry for the boxes asked of the matching incoming carry
    (two carries may be the same value: their boxes are pooled)."""
    seeds: dict[int, list[Box]] = {}
    for c, boxes in carry_boxes.items():
        if boxes:
            seeds.setdefault(body.outputs[c - num_consts], []).extend(boxes)
    return seeds


@register("scan")
def scan(ctx: LineageContext, box: Box, output: int, *, jaxpr, length, reverse=False, num_consts, num_carry,
         **params) -> list[list[Box]]:
    n_xs = len(ctx.in_shapes) - num_consts - num_carry
    if length == 0:
        ctx.exact = False
        return [[full_box(shape)] for shape in ctx.in_shapes]
    body = _body_graph(jaxpr)
    carry_in = list(range(num_consts, num_consts + num_carry))
    is_y = output >= num_carry
    # What one iteration's outputs are asked for: a y block drops its leading (iteration) axis.
    found, exact = seeded_dependencies(body, {body.outputs[output]: [box[1:] if is_y else box]})
    asked_of = {i: list(found[i]) for i in range(len(ctx.in_shapes))}
    carry_asked = {c: normalize(found[c])[0] for c in carry_in}
    uses_carry = any(carry_asked.values())
    frontier = carry_asked
    for _ in range(MAX_CARRY_ROUNDS):
        if not any(frontier.values()):
            break
        # The incoming carry of one iteration is the outgoing carry of the one before.
        found, step_exact = seeded_dependencies(body, _seeds(body, num_consts, frontier))
        exact = exact and step_exact
        for i, boxes in found.items():
            asked_of[i].extend(boxes)
        frontier = {c: [] if _covered(found[c], carry_asked[c]) else found[c] for c in carry_in}
        carry_asked = {c: normalize(carry_asked[c] + found[c])[0] for c in carry_in}
    if any(frontier.values()):  # still growing: the whole carry is a fixed point of the loop, so ask for it
        carry_asked = {c: [full_box(ctx.in_shapes[c])] for c in carry_in}
        found, _ = seeded_dependencies(body, _seeds(body, num_consts, carry_asked))
        for i, boxes in found.items():
            asked_of[i].extend(boxes)
        exact = False

    # Which iterations run code that the block reads.
    if uses_carry:
        exact = False  # the union over iterations is sound but may over-approximate a given iteration
        iterations = (box[0][0], length) if is_y and reverse else (0, box[0][1]) if is_y else (0, length)
    else:
        iterations = box[0] if is_y else ((0, 1) if reverse else (length - 1, length))
    ctx.exact = ctx.exact and exact
    answer: list[list[Box]] = []
    for i in range(len(ctx.in_shapes)):
        if i < num_consts:
            answer.append(asked_of[i])
        elif i < num_consts + num_carry:
            answer.append(carry_asked[i] if uses_carry else [])  # the initial carry feeds iteration 0
        else:
            answer.append([(iterations,) + b for b in asked_of[i]])
    assert len(answer) == num_consts + num_carry + n_xs
    return answer
