"""How a value held as one ``shardprop.core.types.ValueType`` becomes another: the one place moves are
planned and priced.

A move is a short sequence of ``Step``\\ s — local slices, all-gathers, all-to-alls, permutes, psums,
reduce-scatters, taking a whole value once as a partial sum, halo exchanges, realignments of ranged rows, and the
mirror, rotation or route that puts a placed value's rows in their places — found by ``plan_move``, a shortest-path
search over value types that moves the fewest bytes (the ring model of ``shardprop.core.transfers``), ties
broken by fewer collectives, then fewer steps. ``step_transfer`` prices one step as the collective XLA
compiles it to; ``shardprop/backends/moves.py`` runs the same steps on per-device blocks inside ``shard_map``.
Estimate, executor and listing all read the one plan, so they cannot disagree.

    >>> mesh_shape = {"i": 4, "j": 2}
    >>> have, want = ValueType((("j",), (), ("i",))), ValueType(((), ("i", "j"), ()))
    >>> [str(s) for s in plan_move((16, 32, 24), "float32", have, want, mesh_shape)]
    ['all-to-all over i from axis 2 to axis 1', 'all-to-all over j from axis 0 to axis 1']
    >>> sum(t.moved_bytes for t in move_transfers((16, 32, 24), "float32", have, want, mesh_shape))
    7680.0

Each communicating step compiles to exactly one collective, priced as XLA prints it (checked against compiled HLO
in ``tests/core/test_moves.py``): an all-gather on any tensor axis (XLA copies the block into a transposed layout,
no extra collective), an all-to-all over one or several mesh axes as one all-to-all of a tuple, a permute as one
collective-permute that keeps its identity pairs, a psum as an all-reduce of the block, a psum-scatter as a
reduce-scatter of the result block.

Between its ends a move may cut a mesh axis in two and move the factors apart (``.subaxes``), as XLA does: on
the (4, 2) mesh above, ``P('i', 'j') -> P('j', 'i')`` of a (16, 8) value is a permute and an all-to-all over
``i[minor 2]`` (groups of two devices within ``i``), 96 B per device, where the best plan over whole axes, three
all-to-alls, moves 120 B. ``have`` and ``want`` name whole mesh axes, and so do the ends of every plan.

    >>> [str(s) for s in plan_move((8, 16), "float32", ValueType((("i",), ("j",))), ValueType((("j",), ("i",))),
    ...                            mesh_shape)]
    ['permute over i*j', 'all-to-all over i[minor 2] from axis 0 to axis 1']

Start reading at ``plan_move``; ``.move_search.Search`` holds the graph it searches (its edges, and
A*'s bound), and ``_finer_path`` searches it again with a mesh axis cut in two. One step, and its price:
``.steps``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import replace



from .layouts import block_shape, shard_count, uneven_span
from .subaxes import (cut_mesh, cut_type, cuts, is_whole, merged, parents, spelled)
from .transfers import Transfer
from .types import Reduction, ValueType


from .move_search import Search, State, Edge
from .steps import (Step, StepKind, halo_step, placing_step, step_sizes, step_span, step_transfer,
                    without_trivial)


def plan_move(shape: tuple[int, ...], dtype, have: ValueType, want: ValueType,
              mesh_shape: Mapping[str, int]) -> tuple[Step, ...]:
    """The steps that bring a value of ``shape`` held as ``have`` to ``want``, moving the fewest bytes (ring
    model), then using the fewest collectives, over the mesh axes the types name, whole or one of them cut in two
    (``.subaxes``). Raises ValueError for a type the shape or the mesh cannot hold.

    The plan does not depend on ``dtype`` (every price is proportional to the item size); it is taken so that a
    caller reads the same arguments here as in ``move_transfers``.

    >>> [str(s) for s in plan_move((8, 8), "float32", ValueType((("i",), ())), ValueType(((), ("i",))), {"i": 4})]
    ['all-to-all over i from axis 0 to axis 1']
    >>> plan_move((8,), "float32", ValueType(((),), ("i",)), ValueType((("i",),)), {"i": 4})[0].short
    'psum-scatter i@0'
    """
    if have == want:  # the common case, on almost every edge of a graph
        return ()
    if have.placement is not None:  # its rows put in their places first (a mirror, a rotation, a route)
        if want.placement is not None:
            raise ValueError(f"want: {want} holds rows out of their places, which only the op that ran in place "
                             "leaves")
        return (placing_step(have),) + plan_move(shape, dtype, have.in_place(), want, mesh_shape)
    if have.span or want.span:
        return _ranged_steps(tuple(shape), dtype, have, want, tuple(mesh_shape.items()))
    if want.halo:  # the blocks first, then the neighbours' rows
        if have.halo:  # some of them already: the rest
            if have.without_halo() != want.without_halo() or not all(
                    a <= c and b <= d for (a, b), (c, d) in zip(have.halo, want.halo, strict=True)):
                raise ValueError(f"have: {have} holds a halo {want} does not contain (a haloed value lives only "
                                 "until the op that reads it)")
            return _halo_steps(tuple(shape), have, want, tuple(mesh_shape.items()))
        core = plan_move(shape, dtype, have, want.without_halo(), mesh_shape)
        return core + _halo_steps(tuple(shape), want.without_halo(), want, tuple(mesh_shape.items()))
    return _plan(tuple(shape), have, want, tuple(mesh_shape.items()))


def move_transfers(shape: tuple[int, ...], dtype, have: ValueType, want: ValueType,
                   mesh_shape: Mapping[str, int]) -> tuple[Transfer, ...]:
    """The collectives of ``plan_move``'s plan, in order (local slices and taking a value once send nothing)."""
    if have == want:
        return ()
    return _transfers(tuple(shape), dtype, have, want, tuple(mesh_shape.items()))


def move_bytes(shape: tuple[int, ...], dtype, have: ValueType, want: ValueType, mesh_shape: Mapping[str, int]) -> float:
    """Bytes one device sends to bring a value of ``shape`` and ``dtype`` from ``have`` to ``want`` (ring model):
    the one price of a move, for the strategies, the conflict warnings and the branches' meeting layout.

    >>> move_bytes((8, 8), "float32", ValueType((("i",), ())), ValueType(((), ())), {"i": 4})
    192.0
    """
    return sum(t.moved_bytes for t in move_transfers(shape, dtype, have, want, mesh_shape))


@functools.lru_cache(maxsize=65536)
def _transfers(shape: tuple[int, ...], dtype, have: ValueType, want: ValueType,
               mesh: tuple[tuple[str, int], ...]) -> tuple[Transfer, ...]:
    # the passes price the same few moves on every edge of a graph (a Transfer is immutable: shared)
    mesh_shape = dict(mesh)
    found = (step_transfer(s, shape, dtype, mesh_shape) for s in plan_move(shape, dtype, have, want, mesh_shape))
    return tuple(t for t in found if t is not None)


def plan_bytes(shape: tuple[int, ...], dtype, steps: tuple[Step, ...], mesh_shape: Mapping[str, int]) -> float:
    """Bytes one device sends along ``steps`` (ring model)."""
    found = (step_transfer(s, shape, dtype, mesh_shape) for s in steps)
    return sum(t.moved_bytes for t in found if t is not None)


def describe(shape: tuple[int, ...], steps: tuple[Step, ...], mesh_shape: Mapping[str, int]) -> str:
    """One line per step with the block it leaves each device: a listing of a move.

    >>> have, want = ValueType((("i",), ())), ValueType(((), ("i",)))
    >>> print(describe((8, 8), plan_move((8, 8), "float32", have, want, {"i": 4}), {"i": 4}))
    all-to-all over i from axis 0 to axis 1  -> [8, 2]
    """
    return "\n".join(f"{s}  -> {list(block_shape(shape, s.after.layout, step_sizes(s, mesh_shape)))}" for s in steps)


def is_mesh_type(vtype: ValueType, mesh_shape: Mapping[str, int]) -> bool:
    """True when ``vtype`` names mesh axes only and holds no halo and no ranged rows, as a value between stages does;
    the types between the steps of a move may name sub-axes (``.subaxes``), which no ``shard_map`` spec can, and
    a haloed or ranged block is no block of the array: such a type stays inside its stage."""
    return not vtype.halo and not vtype.span and all(is_whole(m, mesh_shape) for m in vtype.layout) and \
        is_whole(vtype.partial, mesh_shape)


@functools.lru_cache(maxsize=4096)
def _ranged_steps(shape: tuple[int, ...], dtype, have: ValueType, want: ValueType,
                  mesh: tuple[tuple[str, int], ...]) -> tuple[Step, ...]:
    """A move to or from ranged rows (``shardprop.core.layouts.Span``), axis by axis (``_axis_by_axis``).
    Where ranged rows are gathered, the cheapest of: that; the rows first realigned into blocks of ``ceil(n / count)``
    (57 rows held in blocks of 32 on 2 devices: 29 each, so less padding moves); a partial sum summed first, on each
    device's rows (a sum over the batch of a sequence's ranged rows, returned whole)."""
    sizes = dict(mesh)
    steps = _axis_by_axis(shape, dtype, have, want, sizes)
    if not any(step.kind is StepKind.UNSPAN for step in steps):
        return steps
    candidates = [steps]
    balanced, at = [], have  # ranged rows first realigned into the fewest rows per device (a few rows move)
    for axis, n in enumerate(shape):
        span, mesh_axes = at.span_of(axis), at.layout[axis]
        fewest = uneven_span(n, shard_count(sizes, mesh_axes)) if span is not None and mesh_axes else None
        if fewest is not None and span.fill is None and span.block > fewest.block:
            after = _with_rows(at, axis, mesh_axes, fewest)
            balanced.append(Step(StepKind.REALIGN, mesh_axes, at, after, axis, length=n))
            at = after
    if balanced:
        candidates.append(tuple(balanced) + _axis_by_axis(shape, dtype, at, want, sizes))
    summed = ValueType(at.layout, tuple(n for n in at.partial if n in want.partial), at.reduction, at.halo, at.span)
    if summed != at:  # a partial sum summed on each device's rows, then gathered (its blocks are smaller than the axis)
        first = _blocks_moved(shape, dtype, at, summed, sizes)
        candidates.append(tuple(balanced) + first + _axis_by_axis(shape, dtype, summed, want, sizes))
    return min(candidates, key=lambda found: plan_bytes(shape, dtype, found, sizes))


def _axis_by_axis(shape: tuple[int, ...], dtype, have: ValueType, want: ValueType,
                  sizes: Mapping[str, int]) -> tuple[Step, ...]:
    """A ranged axis that ``want`` lays out over the same mesh axes is realigned (each device receives the rows it
    lacks from the devices holding them, a few rows per permute); another is gathered (the rows each device holds,
    the padding dropped); an axis ``want`` holds ranged that is whole by then is cut locally, last. The rest is an
    ordinary move of the blocks, the ranged axes as they are."""
    steps, at = [], have
    for axis, n in enumerate(shape):  # ranged rows that cannot stay in their blocks: gathered
        held, wanted = step_span(at, axis, n, sizes), step_span(want, axis, n, sizes)
        if at.span_of(axis) is not None and not _realignable(at, want, axis, held, wanted):
            after = _with_rows(at, axis, (), None)
            steps.append(Step(StepKind.UNSPAN, at.layout[axis], at, after, axis, length=n))
            at = after
    for axis, n in enumerate(shape):  # ranged rows (or equal blocks) shifted into the blocks wanted
        held, wanted = step_span(at, axis, n, sizes), step_span(want, axis, n, sizes)
        if held is not None and held != wanted and _realignable(at, want, axis, held, wanted):
            after = _with_rows(at, axis, at.layout[axis], want.span_of(axis))
            steps.append(Step(StepKind.REALIGN, at.layout[axis], at, after, axis, length=n))
            at = after
    # the ranged axes are now as wanted, or whole where want holds them ranged over other mesh axes (cut last)
    taken = [axis for axis in range(len(shape)) if want.span_of(axis) is not None and at.span_of(axis) is None]
    middle = want
    for axis in taken:
        middle = _with_rows(middle, axis, (), None)
    steps += _blocks_moved(shape, dtype, at, middle, sizes)
    at = replace(middle, span=at.span)
    for axis in taken:
        after = _with_rows(at, axis, want.layout[axis], want.span_of(axis))
        steps.append(Step(StepKind.TAKE_ROWS, want.layout[axis], at, after, axis, length=shape[axis]))
        at = after
    if at != want:
        raise ValueError(f"no move from {have} to {want} (reached {at})")
    return tuple(steps)


def _blocks_moved(shape: tuple[int, ...], dtype, have: ValueType, want: ValueType,
                  sizes: Mapping[str, int]) -> tuple[Step, ...]:
    """An ordinary move of ``have``'s blocks (its frame) to ``want``'s layout and partial sums, ``have``'s ranged axes
    riding along unchanged."""
    core = plan_move(have.frame(shape, sizes), dtype, have.without_span(), want.without_span(), sizes)
    return tuple(replace(step, before=replace(step.before, span=have.span), after=replace(step.after, span=have.span))
                 for step in core)


def _realignable(have: ValueType, want: ValueType, axis: int, held, wanted) -> bool:
    """True when ranged (or equal) blocks along ``axis`` can be moved into those ``want`` holds there, row by row: both
    laid out over the same mesh axes."""
    return held is not None and wanted is not None and have.layout[axis] == want.layout[axis]


def _with_rows(vtype: ValueType, axis: int, mesh_axes: tuple[str, ...], span) -> ValueType:
    """``vtype`` with ``axis`` laid out over ``mesh_axes`` holding the rows ``span`` says (None: equal blocks)."""
    layout = tuple(mesh_axes if k == axis else m for k, m in enumerate(vtype.layout))
    spans = list(vtype.span or (None,) * len(layout))
    spans[axis] = span
    return ValueType(layout, vtype.partial, vtype.reduction, vtype.halo, tuple(spans))


@functools.lru_cache(maxsize=4096)
def _halo_steps(shape: tuple[int, ...], have: ValueType, want: ValueType,
                mesh: tuple[tuple[str, int], ...]) -> tuple[Step, ...]:
    """The halo exchange that brings blocks held as ``have`` (a smaller halo, or none) to ``want``: per axis in order
    (an axis exchanged after another sends the rows the first one added, so corners arrive too), the rows before then
    the rows after, one step per neighbour they come from — the nearest first."""
    sizes = dict(mesh)
    _check(shape, want, sizes, "want")
    steps, at = [], have
    halo = [have.halo_of(axis) for axis in range(len(shape))]
    for axis, (lo, hi) in enumerate(want.halo):
        block = shape[axis] // shard_count(sizes, want.layout[axis])
        for side, rows in ((0, lo), (1, hi)):
            done = halo[axis][side]
            while done < rows:
                reach = min(rows, (done // block + 1) * block)  # up to the end of the next neighbour's block
                halo[axis] = (reach, halo[axis][1]) if side == 0 else (halo[axis][0], reach)
                after = ValueType(want.layout, want.partial, want.reduction, tuple(halo))
                steps.append(halo_step(want.layout[axis], at, after, axis, block))
                at, done = after, reach
    return tuple(steps)


@functools.lru_cache(maxsize=65536)
def _plan(shape: tuple[int, ...], have: ValueType, want: ValueType,
          mesh: tuple[tuple[str, int], ...]) -> tuple[Step, ...]:
    """The search's plan for a value of ``shape``: that of its canonical shape (each axis's greatest common divisor
    with the device count). Which layouts divide an axis depends on that alone (every block count divides the
    device count), every price is the element count times a rate, and every block's element count is the canonical
    one's times one factor, as the search's bound is (``Search.least``): the same search, the same steps, for the
    many shapes of a model's values (a step names no shape)."""
    sizes = dict(mesh)
    _check(shape, have, sizes, "have")
    _check(shape, want, sizes, "want")
    devices = math.prod(sizes.values())
    # (an empty axis stays empty: gcd(0, n) is n, and a plan for rows would gather along none)
    return _canonical_plan(tuple(math.gcd(n, devices) if n else 0 for n in shape), have, want, mesh)


@functools.lru_cache(maxsize=65536)
def _canonical_plan(shape: tuple[int, ...], have: ValueType, want: ValueType,
                    mesh: tuple[tuple[str, int], ...]) -> tuple[Step, ...]:
    sizes = dict(mesh)
    search = Search(shape, sizes, have, want)
    path = search.run()
    path = _finer_path(shape, sizes, have, want, search) or path
    if not path:  # the same sums listed in another order
        return ()
    steps = _merge_slices([_step(before, edge, after, sizes) for before, edge, after in path], sizes)
    # The ends as the caller spelled them (the order of partial axes is immaterial, mesh axes of size 1 select
    # nothing, but callers compare types).
    steps[0] = _step_between(steps[0], have, steps[0].after, sizes)
    steps[-1] = _step_between(steps[-1], steps[-1].before, want, sizes)
    return tuple(steps)


def _finer_path(shape: tuple[int, ...], sizes: Mapping[str, int], have: ValueType, want: ValueType,
                search: Search) -> list | None:
    """The cheapest path that cuts a mesh axis in two (``.subaxes``), when it moves fewer bytes than
    ``search``'s (or as many, in fewer collectives); None otherwise.

    A search over ``i[major 2]`` and ``i[minor 2]`` in place of ``i`` searches every plan over whole axes too
    (``i`` is its two factors, in order), at the same prices; one runs for each cut of each mesh axis the types
    name, under the best price so far. Skipped where ``search``'s plan is one collective at A*'s lower bound (a
    bound on plans over sub-axes too)."""
    if search.cost[1] <= 1 and search.cost[0] == search.bound(search.start):
        return None
    if search.trivial:  # mesh axes of size 1 lay out and sum nothing: only the ends (the caller's types) keep them
        have, want = (ValueType(without_trivial(t.layout, sizes), tuple(n for n in t.partial if sizes[n] > 1))
                      for t in (have, want))
    best, found = search.cost[:2], None
    for axis in search.names:
        for factors in cuts(axis, sizes):
            finer = Search(shape, cut_mesh(sizes, axis, factors), cut_type(have, axis, factors),
                            cut_type(want, axis, factors))
            path = finer.run(limit=best)
            if path is not None:
                best, found = finer.cost[:2], path
    return found


def _step(before: State, edge: Edge, after: State, sizes: Mapping[str, int]) -> Step:
    """A step of a path spelled on the mesh: adjacent factors of a mesh axis merged (the whole axis where they
    all are)."""
    kind, names, axis, to_axis = edge
    step = Step(kind, names and merged(names, sizes), ValueType(*spelled(before, sizes)),
                ValueType(*spelled(after, sizes)), axis, to_axis)
    return step if names is not None else _step_between(step, step.before, step.after, sizes)


def _step_between(step: Step, before: ValueType, after: ValueType, sizes: Mapping[str, int]) -> Step:
    """``step`` from ``before`` to ``after``; a permute runs over the mesh axes either layout uses (part of), in
    mesh order."""
    if step.kind is StepKind.PERMUTE:
        return replace(step, mesh_axes=parents({n for m in before.layout + after.layout for n in m}, sizes),
                       before=before, after=after)
    return replace(step, before=before, after=after)


def _merge_slices(steps: list[Step], sizes: Mapping[str, int]) -> list[Step]:
    """Consecutive slices of one axis as one step (the search slices one mesh axis, or factor, at a time)."""
    out: list[Step] = []
    for s in steps:
        if out and s.kind is StepKind.SLICE and out[-1].kind is StepKind.SLICE and out[-1].axis == s.axis:
            out[-1] = replace(out[-1], mesh_axes=merged(out[-1].mesh_axes + s.mesh_axes, sizes), after=s.after)
        else:
            out.append(s)
    return out


def _check(shape: tuple[int, ...], vtype: ValueType, sizes: Mapping[str, int], what: str) -> None:
    """Raise ValueError unless a value of ``shape`` can be held as ``vtype`` on the mesh and moved."""
    if len(vtype.layout) != len(shape):
        raise ValueError(f"{what}: layout {vtype.layout} has {len(vtype.layout)} axes, the value has shape {shape}")
    names = [n for m in vtype.layout for n in m] + list(vtype.partial)
    unknown = [n for n in names if n not in sizes]
    if unknown:
        raise ValueError(f"{what}: {vtype} names mesh axes {unknown} the mesh {dict(sizes)} does not have")
    if len(set(names)) != len(names):
        raise ValueError(f"{what}: {vtype} uses a mesh axis twice (each one shards one axis, or sums, once)")
    for axis, (n, m) in enumerate(zip(shape, vtype.layout, strict=True)):
        if n % shard_count(sizes, m):
            raise ValueError(f"{what}: axis {axis} of shape {shape} (size {n}) cannot be laid out over {m}: "
                             f"{shard_count(sizes, m)} blocks do not divide it")
    if vtype.halo and (len(vtype.halo) != len(shape) or any(
            lo < 0 or hi < 0 or ((lo or hi) and not m)
            for (lo, hi), m in zip(vtype.halo, vtype.layout, strict=True))):
        raise ValueError(f"{what}: {vtype} holds a halo of negative rows, or on an axis that is not sharded")
    if vtype.partial and vtype.reduction is not Reduction.SUM:
        raise ValueError(f"{what}: {vtype} is a partial {vtype.reduction}: only partial sums move (its collective "
                         "finishes it right after the op that computed it)")


