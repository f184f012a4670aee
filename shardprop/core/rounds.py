"""Rows moved between the blocks of one axis in pieces (``Piece``): the arithmetic of a realignment of ranged rows, a
route of rows joined in place, a rotation (a roll) — which rows of which device's block land where, and in which
rounds of ``ppermute`` (every device sending at most one piece and receiving at most one in each). Priced by
``.steps.step_transfer`` and run by ``shardprop/backends/moves.py``, as every other step of a move."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from .layouts import Span


@dataclass(frozen=True, slots=True)
class Piece:
    """Rows ``[source_at, source_at + rows)`` of device ``source``'s block, landing at ``[target_at, target_at + rows)``
    of device ``target``'s (devices by block index along the axis)."""

    source: int
    target: int
    source_at: int
    target_at: int
    rows: int


@functools.lru_cache(maxsize=4096)
def span_rounds(held: Span, wanted: Span, length: int, count: int) -> tuple[tuple[Piece, ...], ...]:
    """The rounds that carry the rows of an axis of ``length`` in ``count`` blocks from where ``held`` says each
    device holds them to where ``wanted`` says (a realign step's pieces): only rows of the axis move."""
    pieces = []
    for target in range(count):
        start = target * wanted.block - wanted.offset
        first, stop = max(start, 0), min(start + wanted.block, length)
        for source in range(count):
            at = source * held.block - held.offset
            lo, hi = max(first, at), min(stop, at + held.block)
            if lo < hi:
                pieces.append(Piece(source, target, lo - at, lo - start, hi - lo))
    return in_rounds(pieces)


@functools.lru_cache(maxsize=1024)
def route_rounds(lengths: tuple[int, ...], count: int) -> tuple[tuple[Piece, ...], ...]:
    """The rounds that carry a concatenation of operands of ``lengths`` rows, each in ``count`` equal blocks and joined
    in place (device ``d``'s block: each operand's block ``d``, in order), into the ``count`` equal blocks of the
    result: every piece of a joined block goes to the block its rows land in, the pieces of all operands sharing
    rounds.

    >>> rounds = route_rounds((64, 64), 8)   # x | a over 8 devices: x's blocks go to devices 0-3, a's to 4-7
    >>> sum(map(moves_rows, rounds)), rounds_rows(rounds)   # two permutes of 8 rows (each operand realigned apart: 4)
    (2, 16)
    """
    out_block = sum(lengths) // count
    pieces, offset, at = [], 0, 0
    for n in lengths:
        block = n // count
        for d in range(count):
            first = offset + d * block  # the result's row of the block's first row
            for t in range(first // out_block, (first + block - 1) // out_block + 1):
                lo, hi = max(first, t * out_block), min(first + block, (t + 1) * out_block)
                pieces.append(Piece(d, t, at + lo - first, lo - t * out_block, hi - lo))
        offset, at = offset + n, at + block
    return in_rounds(pieces)


def realign_rows(held: Span, wanted: Span, length: int, count: int) -> int:
    """Rows one device sends to realign an axis of ``length`` from the rows ``held`` says to those ``wanted`` says."""
    return rounds_rows(span_rounds(held, wanted, length, count))


def moves_rows(pieces: tuple[Piece, ...]) -> bool:
    """True for a round of pieces sent between devices (one ``ppermute``); False for one of pieces devices keep."""
    return any(p.source != p.target for p in pieces)


def rounds_rows(rounds: tuple[tuple[Piece, ...], ...]) -> int:
    """Rows one device sends over ``rounds`` (the rounds of pieces kept send none): each round's longest piece."""
    return sum(max(p.rows for p in pieces) for pieces in rounds if moves_rows(pieces))


def in_rounds(pieces) -> tuple[tuple[Piece, ...], ...]:
    """``pieces`` in rounds, every device sending at most one piece in each and receiving at most one: first the
    pieces devices keep (local copies), then the others, each round one ``ppermute``, those from the same number of
    blocks away together."""
    kept: list[list[Piece]] = []
    rounds: list[list[Piece]] = []
    ordered = sorted(pieces, key=lambda p: (p.source != p.target, p.source - p.target, p.target))
    for piece in ordered:
        into = kept if piece.source == piece.target else rounds
        for found in into:
            if all(p.source != piece.source and p.target != piece.target for p in found):
                found.append(piece)
                break
        else:
            into.append([piece])
    return tuple(tuple(r) for r in kept) + tuple(tuple(r) for r in rounds)


def rotation_pieces(block: tuple[int, ...], axis: int, shift: int, count: int) -> list[tuple[int, ...]]:
    """The pieces a rotation by ``shift`` rows along ``axis`` (of ``count`` blocks of ``block``) sends: positions
    ``[0, B - r)`` of each device's block come from the block ``q`` devices further (around the end), positions
    ``[B - r, B)`` from the one ``q + 1`` further (``shift = q·B + r``); a piece from the device itself sends nothing.

    >>> rotation_pieces((4, 8, 2), 1, 63, 8)   # jnp.roll by 1 of 64 rows in blocks of 8: one row from the device before
    [(4, 1, 2)]
    """
    return [tuple(n if k != axis else stop - first for k, n in enumerate(block))
            for first, stop, away in rotation_split(block[axis], shift, count) if away]


def rotation_split(rows: int, shift: int, count: int) -> list[tuple[int, int, int]]:
    """``(first, stop, away)``: rows ``[first, stop)`` of the block ``away`` devices further (around the end) make up
    each device's block rotated by ``shift`` rows — in order, the empty pieces left out; ``away`` 0 is its own."""
    q, r = divmod(shift % (rows * count), rows)
    return [(first, stop, away) for first, stop, away in ((r, rows, q % count), (0, r, (q + 1) % count))
            if stop > first]
