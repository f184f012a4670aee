"""The goals a benchmark run is held to, and which rows miss which.

Per row (the ``"auto"`` strategy, shardprop's default, against ``jax.jit``): the result equals the unsharded one;
the compiled collectives move no more bytes per device than ``jax.jit``'s, and fewer where the row says a
reduce-scatter or a deferred sum applies; the median runtime ratio is at most 1.10. Over the run: the geometric
mean of the runtime ratios is at most 1.00, and a cached Program's (and an autoshard function's) per-call
overhead is within 10% of ``jax.jit``'s. A row that misses a goal carries its workload's ``known_gap`` as the
reason, or is flagged "unexplained".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ROW_RUNTIME_LIMIT = 1.10
GEOMEAN_LIMIT = 1.00
OVERHEAD_LIMIT = 1.10
UNEXPLAINED = "unexplained"


@dataclass(frozen=True)
class Miss:
    """Row ``row`` (its "name/parallel") misses ``goal``: ``measured`` says by how much, ``reason`` why."""

    row: str
    goal: str
    measured: str
    reason: str

    def to_dict(self) -> dict:
        return {"row": self.row, "goal": self.goal, "measured": self.measured, "reason": self.reason}


def row_label(row: dict) -> str:
    return f"{row['name']}/{row['parallel']}"


def row_misses(row: dict, judge_runtime: bool = True) -> list[Miss]:
    """The goals ``row`` (a row's dict, as in the JSON) misses (its runtime not judged in a quick run)."""
    label, reason = row_label(row), row["known_gap"] or UNEXPLAINED
    if row["error"]:
        return [Miss(label, "runs", row["error"].splitlines()[0], UNEXPLAINED)]
    misses = []
    wrong = [s for s, r in row["strategies"].items() if not r["correct"]]
    if wrong:
        worst = max(row["strategies"][s]["max_abs_error"] for s in wrong)
        misses.append(Miss(label, "equals unsharded", f"{', '.join(wrong)} differ (max abs error {worst:.3g})",
                           UNEXPLAINED))
    ours, theirs = row["strategies"]["auto"]["compiled"]["bytes"], row["jit"]["bytes"]
    if ours > theirs + 0.5:  # bytes are ring-model estimates with fractions; half a byte is rounding
        misses.append(Miss(label, "bytes ≤ jax.jit", f"{ours:,.0f} B > {theirs:,.0f} B", reason))
    elif row["fewer_expected"] and not ours < theirs - 0.5:
        misses.append(Miss(label, "bytes < jax.jit", f"{ours:,.0f} B = {theirs:,.0f} B ({row['fewer_expected']})",
                           reason))
    runtime = row["runtime"]
    if judge_runtime and runtime and runtime["ratio"] > ROW_RUNTIME_LIMIT:
        misses.append(Miss(label, f"runtime ≤ {ROW_RUNTIME_LIMIT:.2f}× jax.jit",
                           f"{runtime['ratio']:.3f}× (IQR {runtime['ratio_q1']:.2f}–{runtime['ratio_q3']:.2f})",
                           reason))
    return misses


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def summarize(rows: list[dict], overhead: list[dict], judge_runtime: bool = True) -> dict:
    """Every goal's verdict over the run, and each row's misses: ``{"goals": [...], "misses": [...]}``. A goal's
    ``met`` is None when it is not judged: the runtime goals of a quick run, whose few rounds leave the ratios to
    noise (its IQRs say so)."""
    measured = [r for r in rows if not r["error"]]
    ratios = [r["runtime"]["ratio"] for r in measured if r["runtime"]]
    misses = [m for r in rows for m in row_misses(r, judge_runtime)]

    def verdict(goal: str, met: bool, measured_text: str, judged: bool = True) -> dict:
        if not judged:
            return {"goal": goal, "met": None, "measured": measured_text + " (not judged: a quick run's few rounds)"}
        return {"goal": goal, "met": met, "measured": measured_text}

    correct = sum(1 for r in rows if r["correct"])
    bytes_le = [r for r in measured if r["strategies"]["auto"]["compiled"]["bytes"] <= r["jit"]["bytes"] + 0.5]
    expected_fewer = [r for r in measured if r["fewer_expected"]]
    fewer = [r for r in expected_fewer if r["strategies"]["auto"]["compiled"]["bytes"] < r["jit"]["bytes"] - 0.5]
    anywhere_fewer = [r for r in measured if r["strategies"]["auto"]["compiled"]["bytes"] < r["jit"]["bytes"] - 0.5]
    mean = geomean(ratios)
    above = [r for r in measured if r["runtime"] and r["runtime"]["ratio"] > ROW_RUNTIME_LIMIT]
    worst_overhead = max((max(o["program_ratio"], o["autoshard_ratio"]) for o in overhead), default=None)
    goals = [
        verdict("every row equals the unsharded function", correct == len(rows), f"{correct} of {len(rows)} rows"),
        verdict("collective bytes ≤ jax.jit on every row", len(bytes_le) == len(measured),
                f"{len(bytes_le)} of {len(measured)} rows"),
        verdict("fewer bytes than jax.jit where a reduce-scatter or a deferred sum applies",
                len(fewer) == len(expected_fewer),
                f"{len(fewer)} of {len(expected_fewer)} such rows (fewer on {len(anywhere_fewer)} rows in all)"),
        verdict(f"runtime geomean ≤ {GEOMEAN_LIMIT:.2f}× jax.jit", mean is not None and mean <= GEOMEAN_LIMIT,
                "not measured" if mean is None else f"{mean:.3f}× over {len(ratios)} rows", judge_runtime),
        verdict(f"no row above {ROW_RUNTIME_LIMIT:.2f}× jax.jit", not above,
                f"{len(above)} row(s) above" if above else "none above", judge_runtime),
        verdict(f"per-call overhead of a cached Program within {OVERHEAD_LIMIT - 1:.0%} of jax.jit's",
                worst_overhead is not None and worst_overhead <= OVERHEAD_LIMIT,
                "not measured" if worst_overhead is None else f"worst {worst_overhead:.2f}×"),
    ]
    return {"goals": goals, "misses": [m.to_dict() for m in misses], "runtime_geomean": mean}
