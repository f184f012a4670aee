r"""What the debugger hands back: a device's block of a value (``DeviceBlock``), a value gathered from every
process (``Gathered``), and what one step did (``StageReport``, with its ``Port``\ s)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.transfers import Transfer, total_moved
from ..inspect.listing import format_bytes, format_ms, ops_summary


def format_device(device: int, coords: dict[str, int]) -> str:
    """``device 3 (i=1, j=1)``."""
    return f"device {device} ({', '.join(f'{k}={v}' for k, v in coords.items())})"


def format_ranges(index) -> str:
    """``[4:8, 0:4]``: global index ranges, one ``start:stop`` per axis."""
    return f"[{', '.join(f'{a}:{b}' for a, b in index)}]"


@dataclass(frozen=True)
class DeviceBlock:
    """One device's block of a value: the device ``id``, its mesh ``coords``, the global ``index`` ranges
    (``(start, stop)`` per axis, from the value's shards) and the block ``data``."""

    device: int
    coords: dict[str, int]
    index: tuple[tuple[int, int], ...]
    data: Any

    @property
    def slices(self) -> tuple[slice, ...]:
        """``index`` as slices: ``value[block.slices]`` is the part of the global value this block holds."""
        return tuple(slice(start, stop) for start, stop in self.index)

    def where(self) -> str:
        """``device 3 (i=1, j=1) [4:8, 0:4]``."""
        return f"{format_device(self.device, self.coords)} {format_ranges(self.index)}"

    def __str__(self) -> str:
        return f"{self.where()}\n{self.data}"


@dataclass(frozen=True)
class Gathered:
    """A value as every process sees it after a gather: ``whole`` (NumPy, the global value as JAX places its
    blocks; PRNG keys as key data) and ``blocks`` (every device's own, replicas kept apart)."""

    whole: np.ndarray
    blocks: list[DeviceBlock]


@dataclass(frozen=True)
class Port:
    """A stage input or output: the value, its type as laid out (``c:f32[16@i,8]``), its spec, and for an
    input its source and how the stage moves it: ``moved`` says it (``all-gather over i on axis 0``, ``all-to-all
    over i from axis 1 to axis 0``, or empty), with the bytes per device."""

    value: str
    type: str
    spec: str
    source: str | None = None
    moved: str = ""
    moved_bytes: float = 0.0

    def __str__(self) -> str:
        text = f"{self.type}  {self.spec}"
        if self.source is not None:
            text += f"  <- {self.source}"
        if self.moved:
            text += f", {self.moved} ({format_bytes(self.moved_bytes)})"
        return text

    def to_dict(self) -> dict[str, Any]:
        out = {"value": self.value, "type": self.type, "spec": self.spec}
        if self.source is not None:
            out.update(source=self.source, moved=self.moved, moved_bytes=self.moved_bytes)
        return out


@dataclass(frozen=True)
class StageReport:
    """What one step did: the stage, its ops, inputs and outputs (typed names with specs), wall time of the
    run (compiling excluded: ``compile_time``), and the collectives in its compiled HLO."""

    stage: int
    ops: tuple[str, ...]
    inputs: tuple[Port, ...]
    outputs: tuple[Port, ...]
    wall_time: float
    compile_time: float
    transfers: tuple[Transfer, ...] = field(repr=False)
    outside_shard_map: bool = False
    moves: bool = False  # the stage runs moves (one with no ops does nothing else)

    @property
    def collective_bytes(self) -> float:
        """Bytes one device moves in this stage's collectives (the gathers of its inputs included)."""
        return total_moved(self.transfers)

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "ops": list(self.ops), "outside_shard_map": self.outside_shard_map,
                "inputs": [p.to_dict() for p in self.inputs], "outputs": [p.to_dict() for p in self.outputs],
                "wall_time_s": self.wall_time, "compile_time_s": self.compile_time,
                "collective_bytes": self.collective_bytes,
                "transfers": [{"kind": str(t.kind), "mesh_axes": list(t.mesh_axes), "group_size": t.group_size,
                               "shape": list(t.shape), "dtype": t.dtype, "bytes": t.bytes,
                               "moved_bytes": t.moved_bytes} for t in self.transfers]}

    def __repr__(self) -> str:
        return (f"<StageReport stage {self.stage}: {len(self.ops)} ops, {format_ms(self.wall_time)}, "
                f"{format_bytes(self.collective_bytes)} moved>")

    def __str__(self) -> str:
        where = ", outside shard_map" if self.outside_shard_map else ""
        ops = ops_summary(list(self.ops), counted=True, moves=self.moves)
        lines = [f"stage {self.stage}: {ops}{where} — ran in {format_ms(self.wall_time)} "
                 f"(compiled in {format_ms(self.compile_time)}), {format_bytes(self.collective_bytes)} moved per "
                 "device"]
        lines += [f"  in  {port}" for port in self.inputs]
        lines += [f"  out {port}" for port in self.outputs]
        return "\n".join(lines)
