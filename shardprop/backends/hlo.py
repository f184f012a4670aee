"""What a compiled program communicates: its collectives, read from the HLO text.

``parse_hlo`` turns every collective of ``compiled.as_text()`` into a ``shardprop.splitting.cost.Transfer``
(kind, mesh axes, per-device result shape and dtype, bytes, bytes moved by the ring model), the records the
cost model's estimate is made of, so estimate, measurement and ``jax.jit``'s program compare field by field.
"""

from __future__ import annotations

import math
import re

import numpy as np

from ..core.transfers import Transfer, TransferKind, hlo_itemsize, moved

# A tuple's type may carry comments (``/*index=5*/`` from its sixth element on) and nest one level (a combined
# async collective's ``((operands), (results))``).
_TUPLE_ITEM = r"(?:/\*[^*]*\*/|[^=()])"  # one character (or one comment): no nested quantifier, no backtracking
_INSTRUCTION = re.compile(
    rf"=\s*(?P<shape>\((?:{_TUPLE_ITEM}|\({_TUPLE_ITEM}*\))*\)|[a-z0-9]+\[[0-9,]*\](?:\{{[^}}]*\}})?)\s+"
    r"(?P<kind>all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(?P<start>-start)?\(")
_ARRAY = re.compile(r"([a-z][a-z0-9]*)\[([0-9,]*)\]")


def _groups(line: str, mesh_names: tuple[str, ...], mesh_sizes: tuple[int, ...]) -> tuple[tuple[str, ...], int]:
    """Mesh axes and group size from ``replica_groups=`` in its spellings: explicit ``{{0,1},...}``, iota
    ``[G,S]<=[dims]T(perm)``, and the mesh form ``mesh['axis_0'=4,...] [device_ids=(iota)] {'axis_k',...}``.
    Device ids are positions in the mesh, so the first group's ids tell which of our mesh axes it spans."""
    total = math.prod(mesh_sizes)
    m = re.search(r"replica_groups=mesh\[([^\]]*)\](?:,\s*device_ids=\((.*?)\))?\s*\{([^}]*)\}", line)
    if m:
        names = [k.strip().strip("'") for k, _ in (p.split("=") for p in m.group(1).split(","))]
        sizes = [int(v) for _, v in (p.split("=") for p in m.group(1).split(","))]
        ids = _iota(m.group(2), total).reshape(sizes) if m.group(2) else np.arange(total).reshape(sizes)
        group = _mesh_group(ids, names, sizes, m.group(3))
    elif (m := re.search(r"replica_groups=(\[[0-9,]+\]<=\[[0-9,]+\](?:T\([0-9,]+\))?)", line)):
        group = _iota(m.group(1), total)[0]
    elif (m := re.search(r"replica_groups=\{\{([0-9,]*)\}", line)):
        group = np.array([int(d) for d in m.group(1).split(",")])
    else:
        return mesh_names, total
    coords = np.array(np.unravel_index(np.asarray(group), mesh_sizes))
    axes = tuple(name for name, c in zip(mesh_names, coords, strict=True) if len(set(c.tolist())) > 1)
    return axes, len(group)


def _mesh_group(ids: np.ndarray, names: list[str], sizes: list[int], listed_text: str) -> np.ndarray:
    """The first group of the mesh form: the devices spanning the listed axes. An entry may be a sub-axis,
    ``'axis_1':(2)2`` (Shardy's notation: the factor of size 2 after a major factor of size 2 — XLA groups
    over part of an axis when it moves data between tensor axes)."""
    factors = [[size] for size in sizes]  # each mesh axis as its factors, major first
    listed: list[tuple[int, int]] = []    # (axis, factor index) pairs, as listed
    for entry in (e.strip() for e in listed_text.split(",") if e.strip()):
        sub = re.fullmatch(r"'?([^':]+)'?(?::\((\d+)\)(\d+))?", entry)
        axis = names.index(sub.group(1))
        if sub.group(2) is None:
            listed.append((axis, -1))
            continue
        pre, size = int(sub.group(2)), int(sub.group(3))
        factors[axis] = [f for f in (pre, size, sizes[axis] // (pre * size))]
        listed.append((axis, 1))
    flat_index = {}
    for axis, parts in enumerate(factors):
        for k in range(len(parts)):
            flat_index[(axis, k)] = len(flat_index)
    shaped = ids.reshape([f for parts in factors for f in parts])
    chosen = [flat_index[(axis, 0 if k == -1 else k)] for axis, k in listed]
    rest = [d for d in range(shaped.ndim) if d not in chosen]
    return shaped.transpose(rest + chosen).reshape(-1, math.prod(shaped.shape[d] for d in chosen))[0]


def _iota(text: str, total: int) -> np.ndarray:
    """``[G,S]<=[d0,d1,...]T(perm)`` (or ``[d0,d1]T(perm)``): device ids, shaped ``[G,S]``."""
    m = re.fullmatch(r"\s*(?:\[([0-9,]+)\]<=)?\[([0-9,]+)\](?:T\(([0-9,]+)\))?\s*", text)
    reshape = [int(d) for d in m.group(2).split(",")]
    ids = np.arange(total).reshape(reshape)
    if m.group(3):
        ids = ids.transpose([int(d) for d in m.group(3).split(",")])
    out = [int(d) for d in m.group(1).split(",")] if m.group(1) else [-1]
    return ids.reshape(out if len(out) > 1 else (-1,) if m.group(1) is None else out)


_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*\(.*\{\s*$")
_WHILE = re.compile(r"\bwhile\(.*?condition=%?([\w.\-]+),\s*body=%?([\w.\-]+)")
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_CALLED = re.compile(r"(?:calls|to_apply|true_computation|false_computation)=%?([\w.\-]+)|"
                     r"branch_computations=\{([^}]*)\}")


def _executions(lines: list[str]) -> list[tuple[int, bool]]:
    """How many times each line runs per execution of the module, and whether a while loop of unknown trip count
    encloses it: an instruction inside a while loop's body as many times as XLA's ``known_trip_count`` says (once
    when unknown), its condition once more; nested loops multiply. Computations called otherwise (fusions,
    branches, reducers) run as often as their caller."""
    owner: list[str | None] = []
    calls: dict[str, list[tuple[str, int]]] = {}
    entry, current = None, None
    for line in lines:
        m = _COMPUTATION.match(line)
        if m:
            current = m.group(1)
            entry = current if line.startswith("ENTRY") else entry
            calls.setdefault(current, [])
        elif line.startswith("}"):
            owner.append(current)
            current = None
            continue
        owner.append(current)
        if current is None:
            continue
        if (w := _WHILE.search(line)):
            t = _TRIP_COUNT.search(line)
            trips = int(t.group(1)) if t else 1
            calls[current] += [(w.group(1), trips + 1, t is None), (w.group(2), trips, t is None)]
        for c in _CALLED.finditer(line):
            for name in [c.group(1)] if c.group(1) else re.findall(r"%?([\w.\-]+)", c.group(2)):
                calls[current].append((name, 1, False))
    times: dict[str, int] = {}
    unknown: set[str] = set()

    def visit(name: str, n: int, in_unknown: bool) -> None:
        times[name] = times.get(name, 0) + n
        if in_unknown:
            unknown.add(name)
        for callee, k, unknown_trips in calls.get(name, []):
            visit(callee, n * k, in_unknown or unknown_trips)

    if entry is not None:
        visit(entry, 1, False)
    return [(times.get(o, 1), o in unknown) if o is not None else (1, False) for o in owner]


def _started(shape: str) -> list[tuple[str, str]]:
    """The results of an async start, whose type is ``(operand, result)``, ``((operands), (results))`` when
    combined, or ``(operand, result, u32[], u32[])`` (a collective-permute's context scalars)."""
    groups = re.findall(r"\(([^()]*)\)", shape[1:-1])
    if groups:
        return _ARRAY.findall(groups[-1])
    arrays = [a for a in _ARRAY.findall(shape) if a[1] or a[0] not in ("u32", "s32")]  # drop context scalars
    return arrays[len(arrays) // 2:] if len(arrays) > 1 else arrays


def parse_hlo(hlo_text: str, mesh) -> list[Transfer]:
    """The collectives in a compiled module's text (``compiled.as_text()``), asynchronous ones once; one inside a
    loop carries how many times it runs (``Transfer.repeats``)."""
    names, sizes = tuple(mesh.axis_names), tuple(mesh.shape[n] for n in mesh.axis_names)
    out = []
    lines = hlo_text.splitlines()
    for line, (repeats, unknown_trips) in zip(lines, _executions(lines), strict=True):
        m = _INSTRUCTION.search(line)
        if m is None:
            continue
        arrays = _started(m.group("shape")) if m.group("start") and m.group("kind") != "all-reduce" else \
            _ARRAY.findall(m.group("shape"))
        nbytes = int(sum(hlo_itemsize(dt) * math.prod(int(d) for d in dims.split(",") if d) for dt, dims in arrays))
        dtype, dims = arrays[0]
        shape = tuple(int(d) for d in dims.split(",") if d)
        mesh_axes, n = _groups(line, names, sizes)
        kind = TransferKind(m.group("kind"))
        out.append(Transfer(kind, mesh_axes, n, shape, dtype, nbytes, moved(kind, n, nbytes), repeats, len(arrays),
                            unknown_trips))
    return out
