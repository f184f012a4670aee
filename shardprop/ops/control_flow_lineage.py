"""Lineage inside loops and branches: which operand elements a block of a loop's or a ``cond``'s output reads.

A block of ``ys`` reads the same iterations of ``xs`` (and, through the carry, every earlier iteration). The body
is walked with the same rules, seeded with what the output block asks of one iteration. Whatever that needs of
the incoming carry is asked of the previous iteration's outgoing carry, and so on until the carry regions stop
growing: the union of everything asked on the way is sound for every iteration. A scan whose ``ys`` block needs
nothing of the carry (a ``map``) is exact: iterations ``[s, e)`` of ``xs`` only. A ``while`` loop is grown the same
way from the block and from what its condition reads (which decides how many iterations run). A ``cond`` reads its
index whole and, of each operand, the union of what every branch reads (exact when there is one branch).
"""

from __future__ import annotations

import functools

from ..expr import Graph, trace_jaxpr
from ..core.boxes import Box, LineageContext, contains, full_box, normalize


@functools.lru_cache(maxsize=128)
def body_graph(jaxpr) -> Graph:
    """The traced graph of a sub-computation's (closed) jaxpr, traced once."""
    return trace_jaxpr(jaxpr)


# Rounds of carry growth before giving up and asking for the whole carry (always a fixed point).
MAX_CARRY_ROUNDS = 16


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


def _grow_carry(walk, body: Graph, num_consts: int, num_carry: int, carry_asked: dict[int, list[Box]],
                asked_of: dict[int, list[Box]]) -> tuple[dict[int, list[Box]], bool]:
    """The carry regions every iteration reads, from ``carry_asked`` (``{body input: boxes}`` asked of the last
    incoming carry): what one iteration needs of its incoming carry is asked of the previous iteration's outgoing
    carry, until the regions stop growing (or, after a few rounds, the whole carry: always a fixed point). What
    the body reads of its other inputs on the way is added to ``asked_of``."""
    carry_in = range(num_consts, num_consts + num_carry)
    exact = True
    frontier = carry_asked
    for _ in range(MAX_CARRY_ROUNDS):
        if not any(frontier.values()):
            return carry_asked, exact
        found, step_exact = walk(body, _seeds(body, num_consts, frontier))
        exact = exact and step_exact
        for i, boxes in found.items():
            asked_of[i].extend(boxes)
        frontier = {c: [] if _covered(found[c], carry_asked[c]) else found[c] for c in carry_in}
        carry_asked = {c: normalize(carry_asked[c] + found[c])[0] for c in carry_in}
    # Still growing: ask for the whole carry.
    carry_asked = {c: [full_box(body.avals[body.inputs[c]].shape)] for c in carry_in}
    found, _ = walk(body, _seeds(body, num_consts, carry_asked))
    for i, boxes in found.items():
        asked_of[i].extend(boxes)
    return carry_asked, False


def scan_lineage(ctx: LineageContext, box: Box, output: int, *, jaxpr, length, reverse=False, num_consts, num_carry,
         **params) -> list[list[Box]]:
    n_xs = len(ctx.in_shapes) - num_consts - num_carry
    if length == 0:
        ctx.exact = False
        return [[full_box(shape)] for shape in ctx.in_shapes]
    body = body_graph(jaxpr)
    carry_in = list(range(num_consts, num_consts + num_carry))
    is_y = output >= num_carry
    # What one iteration's outputs are asked for: a y block drops its leading (iteration) axis.
    found, exact = ctx.walk(body, {body.outputs[output]: [box[1:] if is_y else box]})
    asked_of = {i: list(found[i]) for i in range(len(ctx.in_shapes))}
    carry_asked = {c: normalize(found[c])[0] for c in carry_in}
    uses_carry = any(carry_asked.values())
    carry_asked, grow_exact = _grow_carry(ctx.walk, body, num_consts, num_carry, carry_asked, asked_of)
    exact = exact and grow_exact

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


def while_lineage(ctx: LineageContext, box: Box, output: int, *, cond_jaxpr, body_jaxpr, cond_nconsts,
                  body_nconsts, **params) -> list[list[Box]]:
    """A block of a while loop's final carry reads that block of the initial carry (no iteration may run) and,
    through the body, what every iteration reads to produce it; the condition decides how many iterations run,
    so whatever it reads of the carry (and of its constants) is read too, on every iteration. Never exact: the
    trip count is known only when the loop runs."""
    ctx.exact = False
    cond, body = body_graph(cond_jaxpr), body_graph(body_jaxpr)
    n_carry = len(body.outputs)
    found, _ = ctx.walk(cond, {cond.outputs[0]: [full_box(cond.avals[cond.outputs[0]].shape)]})
    asked_of = {i: [] for i in range(len(body.inputs))}
    carry_asked = {body_nconsts + k: normalize(found[cond_nconsts + k] + ([box] if k == output else []))[0]
                   for k in range(n_carry)}
    carry_asked, _ = _grow_carry(ctx.walk, body, body_nconsts, n_carry, carry_asked, asked_of)
    answer = [found[i] for i in range(cond_nconsts)]
    answer += [asked_of[i] for i in range(body_nconsts)]
    answer += [normalize(carry_asked[body_nconsts + k] + asked_of[body_nconsts + k])[0] for k in range(n_carry)]
    return answer


def cond_lineage(ctx: LineageContext, box: Box, output: int, *, branches, **params) -> list[list[Box]]:
    answer: list[list[Box]] = [[full_box(ctx.in_shapes[0])]] + [[] for _ in ctx.in_shapes[1:]]
    exact = len(branches) == 1
    for branch in branches:
        body = body_graph(branch)
        found, branch_exact = ctx.walk(body, {body.outputs[output]: [box]})
        exact = exact and branch_exact
        for i in range(len(ctx.in_shapes) - 1):
            answer[i + 1].extend(found[i])
    merged = [normalize(boxes) for boxes in answer]
    ctx.exact = ctx.exact and exact and all(widened_not for _, widened_not in merged)
    return [boxes for boxes, _ in merged]
