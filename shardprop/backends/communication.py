"""What a program communicates: collectives read from the compiled HLO, and our estimate before compiling.

Both are lists of :class:`Transfer` (kind, mesh axes, per-device result shape and dtype, bytes), so they can
be compared with each other and with ``jax.jit``'s program on the same mesh. ``moved_bytes`` is the usual ring
model of what one device sends: ``2(n-1)/n·size`` for an all-reduce, ``(n-1)/n·size`` of the gathered result
for an all-gather, ``(n-1)·size`` of the scattered result for a reduce-scatter, ``(n-1)/n·size`` for an
all-to-all and ``size`` for a collective-permute, ``n`` being the number of devices in a group.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from ..propagation.sharding import block_shape, shard_count
from ..splitting import Plan

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")

_HLO_DTYPES = {"f16": 2, "bf16": 2, "f32": 4, "f64": 8, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "s32": 4, "u32": 4,
               "s64": 8, "u64": 8, "pred": 1, "c64": 8, "c128": 16}
_INSTRUCTION = re.compile(
    r"=\s*(?P<shape>\([^=]*?\)|[a-z0-9]+\[[0-9,]*\](?:\{[^}]*\})?)\s+"
    r"(?P<kind>all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(?P<start>-start)?\(")
_ARRAY = re.compile(r"([a-z]+[0-9]*)\[([0-9,]*)\]")


@dataclass(frozen=True, slots=True)
class Transfer:
    """One collective: ``kind`` over ``mesh_axes`` (groups of ``group_size`` devices), producing a
    per-device result of ``shape``/``dtype`` (``bytes`` of it); ``moved_bytes`` per device (ring model)."""

    kind: str
    mesh_axes: tuple[str, ...]
    group_size: int
    shape: tuple[int, ...]
    dtype: str
    bytes: int
    moved_bytes: float

    def __str__(self) -> str:
        axes = "*".join(self.mesh_axes) or "?"
        return f"{self.kind} over {axes} (groups of {self.group_size}): {self.dtype}{list(self.shape)}, " \
               f"{self.bytes} B result, ~{self.moved_bytes:.0f} B moved per device"


def moved(kind: str, n: int, size: int) -> float:
    if n <= 1:
        return 0.0
    return {"all-reduce": 2 * (n - 1) / n * size, "all-gather": (n - 1) / n * size,
            "reduce-scatter": (n - 1) * size, "all-to-all": (n - 1) / n * size,
            "collective-permute": float(size)}[kind]


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
        listed = [names.index(a.strip().strip("'")) for a in m.group(3).split(",") if a.strip()]
        rest = [k for k in range(len(sizes)) if k not in listed]
        group = ids.transpose(rest + listed).reshape(-1, math.prod(sizes[k] for k in listed))[0]
    elif (m := re.search(r"replica_groups=(\[[0-9,]+\]<=\[[0-9,]+\](?:T\([0-9,]+\))?)", line)):
        group = _iota(m.group(1), total)[0]
    elif (m := re.search(r"replica_groups=\{\{([0-9,]*)\}", line)):
        group = np.array([int(d) for d in m.group(1).split(",")])
    else:
        return mesh_names, total
    coords = np.array(np.unravel_index(np.asarray(group), mesh_sizes))
    axes = tuple(name for name, c in zip(mesh_names, coords, strict=True) if len(set(c.tolist())) > 1)
    return axes, len(group)


def _iota(text: str, total: int) -> np.ndarray:
    """``[G,S]<=[d0,d1,...]T(perm)`` (or ``[d0,d1]T(perm)``): device ids, shaped ``[G,S]``."""
    m = re.fullmatch(r"\s*(?:\[([0-9,]+)\]<=)?\[([0-9,]+)\](?:T\(([0-9,]+)\))?\s*", text)
    reshape = [int(d) for d in m.group(2).split(",")]
    ids = np.arange(total).reshape(reshape)
    if m.group(3):
        ids = ids.transpose([int(d) for d in m.group(3).split(",")])
    out = [int(d) for d in m.group(1).split(",")] if m.group(1) else [-1]
    return ids.reshape(out if len(out) > 1 else (-1,) if m.group(1) is None else out)


def parse_hlo(hlo_text: str, mesh) -> list[Transfer]:
    """The collectives in a compiled module's text (``compiled.as_text()``), asynchronous ones once."""
    names, sizes = tuple(mesh.axis_names), tuple(mesh.shape[n] for n in mesh.axis_names)
    out = []
    for line in hlo_text.splitlines():
        m = _INSTRUCTION.search(line)
        if m is None:
            continue
        arrays = _ARRAY.findall(m.group("shape"))
        if m.group("start") and len(arrays) > 1:
            arrays = arrays[-1:]  # an async start returns (operand, result): count the result
        nbytes = sum(_HLO_DTYPES.get(dt, 4) * math.prod(int(d) for d in dims.split(",") if d) for dt, dims in arrays)
        dtype, dims = arrays[0]
        shape = tuple(int(d) for d in dims.split(",") if d)
        mesh_axes, n = _groups(line, names, sizes)
        kind = m.group("kind")
        out.append(Transfer(kind, mesh_axes, n, shape, dtype, nbytes, moved(kind, n, nbytes)))
    return out


def estimate(plan: Plan) -> list[Transfer]:
    """Our cost model's view of ``plan`` before compiling: an all-gather for every stage input that arrives
    coarser than it was produced (or than the argument's spec), an all-reduce for every collective."""
    sharded = plan.sharded
    graph, mesh_shape = sharded.graph, sharded.mesh_shape
    out = []
    seen = set()
    for stage in plan.stages:
        for i in stage.inputs:
            produced = plan.layout(i.value)
            if produced == i.layout or (i.value, i.layout) in seen:
                continue
            seen.add((i.value, i.layout))
            gathered = tuple(name for p, t in zip(produced, i.layout, strict=True) for name in p[len(t):])
            out.append(_transfer("all-gather", gathered, graph.avals[i.value], i.layout, mesh_shape))
        for n in stage.nodes:
            c = plan.collectives.get(n)
            if c is not None:
                kind = "reduce-scatter" if c.kind == "psum_scatter" else "all-reduce"
                for v in graph.nodes[n].outputs:
                    out.append(_transfer(kind, c.mesh_axes, graph.avals[v], plan.layout(v), mesh_shape))
                    if c.kind in ("argmax", "argmin"):  # the extreme values (and for floats a NaN flag) too
                        operand_dtype = np.dtype(graph.avals[graph.nodes[n].operands[0]].dtype)
                        extra = [operand_dtype] + ([np.dtype(np.int32)] if operand_dtype.kind == "f" else [])
                        out.extend(_transfer(kind, c.mesh_axes, _like(graph.avals[v], dt), plan.layout(v), mesh_shape)
                                   for dt in extra)
    return out


def _like(aval, dtype):
    return type(aval)(aval.shape, np.dtype(dtype))


def _transfer(kind, mesh_axes, aval, layout, mesh_shape) -> Transfer:
    shape = block_shape(aval.shape, layout, mesh_shape)
    nbytes = int(np.dtype(aval.dtype).itemsize * math.prod(shape))
    n = shard_count(mesh_shape, mesh_axes)
    dtype = {"float32": "f32", "int32": "s32", "bool": "pred"}.get(np.dtype(aval.dtype).name, np.dtype(aval.dtype).name)
    in_mesh_order = tuple(name for name in mesh_shape if name in mesh_axes)  # as the HLO reports groups
    return Transfer(kind, in_mesh_order, n, shape, dtype, nbytes, moved(kind, n, nbytes))


def total_moved(transfers: Iterable[Transfer]) -> float:
    return sum(t.moved_bytes for t in transfers)
