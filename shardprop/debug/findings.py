"""Does the compiled program keep its own promises? ``check()`` and ``first_nonfinite()``.

The plan promises, for every value, that each device holds one block of it: the devices along a mesh axis the
value is replicated over hold *equal* blocks (``shard_map`` runs with ``check_vma=False`` and trusts this), and
each block is the slice of the global value that its shards' ranges name. Both are checked here on the data the
devices really hold.

On a mesh spanning several processes every process checks every device's block (the others' are gathered), so
all find the same; every process must call them, as every process runs the program.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..distributed import any_process, whole
from ..expr import jax_adapter as jx
from ..expr.graph import CONSTANT, PARAMETER, short_source, value_name
from ..core.types import typed
from ..splitting import Plan
from .reports import Gathered, format_device, format_ranges


class FindingKind(StrEnum):
    REPLICAS_DIFFER = "replicas differ"  # devices that claim the same block hold different data
    BLOCK_MISPLACED = "block misplaced"  # a block is not the slice of the global value its shard ranges name


@dataclass(frozen=True)
class Where:
    """A value and the node that computed it: its op, source line, stage and the rule behind its sharding."""

    value: int
    typed: str
    op: str
    source: str | None
    stage: int | None
    rule: str

    @classmethod
    def of(cls, plan: Plan, v: int) -> Where:
        node = plan.graph.nodes[plan.graph.producer[v]]
        return cls(v, typed(v, plan.graph.avals[v], plan.type(v)), node.op, node.source, plan.stage_of(node.id),
                   plan.sharded.rules[node.id])

    @property
    def name(self) -> str:
        return value_name(self.value)

    def __str__(self) -> str:
        if self.op == PARAMETER:
            return f"{self.typed} (an argument)"
        stage = "" if self.stage is None else f", stage {self.stage}"
        return f"{self.typed} = `{self.op}` at {short_source(self.source, 'an unknown line')}{stage} " \
               f"(sharding by rule {self.rule})"

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.name, "type": self.typed, "op": self.op, "source": self.source, "stage": self.stage,
                "rule": self.rule}


@dataclass(frozen=True)
class Finding:
    """A broken promise: ``kind``, the value ``where`` it happened, the devices involved and what was seen."""

    kind: FindingKind
    where: Where
    devices: tuple[int, ...]
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.where}\n  {self.detail}"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": str(self.kind), **self.where.to_dict(), "devices": list(self.devices), "detail": self.detail}


@dataclass(frozen=True)
class NonFinite:
    """The first NaN or infinity in program order: the value and node, the device holding it and the global
    ``index`` of the element."""

    where: Where
    device: int
    coords: dict[str, int]
    index: tuple[int, ...]
    element: Any

    def __str__(self) -> str:
        at = f"[{', '.join(map(str, self.index))}]"
        w = self.where
        if w.op == PARAMETER:
            head = f"argument {w.name} holds {self.element}"
        else:
            stage = "" if w.stage is None else f" (stage {w.stage})"
            head = f"`{w.op}` at {short_source(w.source, 'an unknown line')}{stage} produced {self.element}"
        return f"{head}: {w.name}{at} on {format_device(self.device, self.coords)}; {w.typed}, sharding by rule " \
               f"{w.rule}"

    def to_dict(self) -> dict[str, Any]:
        return {**self.where.to_dict(), "device": self.device, "coords": self.coords, "index": list(self.index),
                "element": str(self.element)}


def is_inexact(dtype) -> bool:
    """Floating or complex (bfloat16 and the float8s too, which numpy calls kind ``V``); not a PRNG key."""
    return not jx.is_extended_dtype(dtype) and bool(jnp.issubdtype(dtype, jnp.inexact))


def as_numpy(x) -> np.ndarray:
    """A value or block as numpy, for comparing: whole (a value spanning other processes is gathered from them),
    PRNG keys as their key data, and floats numpy has no arithmetic kind for (bfloat16, float8) as float32, which
    holds them exactly."""
    if jx.is_extended_dtype(x.dtype):
        x = jax.random.key_data(x)
    a = np.asarray(whole(x))
    if a.dtype.kind == "V" and is_inexact(a.dtype):
        a = a.astype(np.float32)
    return a


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit-for-bit equal, NaN equal to NaN."""
    if a.shape != b.shape:
        return False
    if a.dtype.kind in "fc":
        return bool(np.array_equal(a, b, equal_nan=True))
    return bool(np.array_equal(a, b))


def max_difference(a: np.ndarray, b: np.ndarray) -> float:
    if a.shape != b.shape:
        return float("nan")
    with np.errstate(invalid="ignore", over="ignore"):
        return float(np.nanmax(np.abs(a.astype(np.complex128 if a.dtype.kind == "c" else np.float64)
                                      - b.astype(np.complex128 if b.dtype.kind == "c" else np.float64)), initial=0))


def check_value(session, v: int, gathered: Gathered) -> list[Finding]:
    """The promises of value ``v`` checked on every device's block (``gathered``: see ``Session.gathered``)."""
    plan = session.plan
    blocks = gathered.blocks
    findings = []
    groups: dict[tuple, list] = {}
    for block in blocks:
        groups.setdefault(block.index, []).append(block)
    differing = set()
    for index, members in groups.items():
        first = as_numpy(members[0].data)
        odd = [b for b in members[1:] if not same(first, as_numpy(b.data))]
        if odd:
            differing.add(index)
            worst = max(odd, key=lambda b: max_difference(first, as_numpy(b.data)))
            replicated = _replicated_over(plan, v)
            findings.append(Finding(
                FindingKind.REPLICAS_DIFFER, Where.of(plan, v), tuple(b.device for b in [members[0], *odd]),
                f"replicated over {'*'.join(replicated) or 'no mesh axis'}, but {worst.where()} differs from "
                f"{members[0].where()} (max abs difference {max_difference(first, as_numpy(worst.data)):g}; "
                f"{len(odd)} of the {len(members)} devices holding this block disagree with the first)"))
    whole = as_numpy(gathered.whole)
    for block in blocks:
        if block.index in differing:
            continue  # already reported; the global value took one of the replicas
        expected = whole[block.slices]
        data = as_numpy(block.data)
        if not same(expected, data):
            findings.append(Finding(
                FindingKind.BLOCK_MISPLACED, Where.of(plan, v), (block.device,),
                f"{block.where()} holds a block of shape {data.shape} that is not the global value's slice "
                f"{format_ranges(block.index)} (max abs difference {max_difference(expected, data):g})"))
    return findings


def _replicated_over(plan: Plan, v: int) -> list[str]:
    """The mesh axes ``v`` is replicated over (those its layout does not use)."""
    used = {m for axes in plan.layout(v) for m in axes}
    return [name for name in plan.mesh_shape if name not in used]


def check(session) -> list[Finding]:
    """Every broken promise among the values computed so far, in program order (empty when all hold)."""
    findings: list[Finding] = []
    for values in session.computed_by_stage():
        gathered = session.gathered(values)  # a stage's values at once: one gather on several processes
        for v in values:
            findings += check_value(session, v, gathered[v])
    return findings


def first_nonfinite(session, arguments: bool = True) -> NonFinite | None:
    """The first NaN or infinity among the values computed so far, in program order (constants are the
    user's own literals and are skipped; the arguments too, unless ``arguments``), or None."""
    plan = session.plan
    graph = plan.graph
    inputs = set(graph.inputs)
    for values in session.computed_by_stage():
        candidates = {v: x for v, x in values.items() if (arguments or v not in inputs) and is_inexact(x.dtype)
                      and graph.nodes[graph.producer[v]].op != CONSTANT}
        # Each process looks at its own blocks; only values that hold a non-finite element somewhere are gathered.
        here = [any(not np.isfinite(as_numpy(s.data)).all() for s in x.addressable_shards)
                for x in candidates.values()]
        flagged = {v: x for (v, x), flag in zip(candidates.items(), any_process(here), strict=True) if flag}
        if not flagged:
            continue
        for v, gathered in session.gathered(flagged).items():
            for block in gathered.blocks:
                bad = np.argwhere(~np.isfinite(as_numpy(block.data)))
                if bad.size:
                    local = tuple(int(i) for i in bad[0])
                    index = tuple(start + i for (start, _), i in zip(block.index, local, strict=True))
                    return NonFinite(Where.of(plan, v), block.device, block.coords, index, block.data[local])
    return None
