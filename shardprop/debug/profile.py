"""``dbg.profile()``: per stage, median wall time, the bytes its compiled HLO moves and the cost model's
estimate, side by side, so the slow or chatty stage stands out."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import jax
from rich import box
from rich.table import Table

from ..backends import parse_hlo
from ..inspect.listing import format_bytes, format_ms, stage_ops
from ..inspect.pictures import as_text
from ..program import as_lowering_errors
from ..splitting.cost import instructions_transfers
from ..core.transfers import total_moved


@dataclass(frozen=True)
class StageProfile:
    stage: int
    ops: int
    median_time: float
    times: tuple[float, ...]
    measured_bytes: float
    estimated_bytes: float
    collectives: int

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "ops": self.ops, "median_time_s": self.median_time, "times_s": list(self.times),
                "measured_bytes": self.measured_bytes, "estimated_bytes": self.estimated_bytes,
                "collectives": self.collectives}


@dataclass(frozen=True)
class Profile:
    """A rich renderable; ``str()`` is the table as plain text; ``rows`` for tools."""

    rows: tuple[StageProfile, ...]
    repeats: int

    def __rich__(self) -> Table:
        total = sum(r.median_time for r in self.rows)
        table = Table(title=f"per-stage profile (median of {self.repeats} runs, each stage on its own)",
                      box=box.SIMPLE_HEAVY, caption=f"total {format_ms(total)}; moved per device: measured "
                      f"{format_bytes(sum(r.measured_bytes for r in self.rows))}, estimated "
                      f"{format_bytes(sum(r.estimated_bytes for r in self.rows))}")
        for name in ("stage", "ops", "median", "share", "collectives", "moved (HLO)", "moved (estimate)"):
            table.add_column(name, justify="right")
        for r in self.rows:
            share = f"{100 * r.median_time / total:.0f}%" if total else "-"
            table.add_row(str(r.stage), str(r.ops), format_ms(r.median_time, 3), share, str(r.collectives),
                          format_bytes(r.measured_bytes), format_bytes(r.estimated_bytes))
        return table

    def __str__(self) -> str:
        return as_text(self, width=120)

    def to_dict(self) -> dict[str, Any]:
        return {"repeats": self.repeats, "stages": [r.to_dict() for r in self.rows]}


def profile(session, repeats: int) -> Profile:
    """Every stage run ``repeats`` times on its inputs (the program is run to the end first if needed)."""
    if not session.done:
        session.run_to(len(session.plan.stages))
    plan = session.plan
    rows = []
    for stage in plan.stages:
        compiled, _ = session.compiled_stage(stage)
        inputs = session.stage_inputs(stage)
        jax.block_until_ready(as_lowering_errors(compiled, *inputs, mesh=session.mesh))  # warm
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            jax.block_until_ready(as_lowering_errors(compiled, *inputs, mesh=session.mesh))
            times.append(time.perf_counter() - start)
        measured = parse_hlo(compiled.as_text(), session.mesh)
        ops = len(stage_ops(plan, stage))
        rows.append(StageProfile(stage.id, ops, statistics.median(times), tuple(times), total_moved(measured),
                                 total_moved(instructions_transfers(stage.instructions)), len(measured)))
    return Profile(tuple(rows), repeats)
