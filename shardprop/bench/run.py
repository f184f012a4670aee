"""A whole benchmark run: measure the selected rows, the per-call overhead and the pass scaling into one document,
then write it (terminal table, JSON, plots, ``benchmarks.md``)."""

from __future__ import annotations

import datetime
import importlib.util
import os
import platform
import sys
import time
from pathlib import Path

from . import plots, report
from .goals import summarize
from .measure import measure
from .timing import first_calls, scaling, small_call_overhead
from .libraries import LIBRARIES
from .workloads import LOOPS, MESHES, OWN, Workload, select

# Blocks of the scaling graph: about 10^3, 10^4 and 10^5 nodes (the quick run stops at 10^4).
SCALING_LAYERS = (72, 715, 7143)


def workloads() -> list[Workload]:
    """Every benchmark row, the project's own first, then the loops, then the real-library models."""
    return OWN + LOOPS + LIBRARIES


def missing_modules(requires) -> list[str]:
    return [name for name in requires if importlib.util.find_spec(name) is None]


def machine() -> dict:
    import jax

    devices = jax.devices()
    return {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "jax": jax.__version__, "devices": f"{len(devices)} {devices[0].platform} devices"}


def run_benchmark(*, quick: bool, rounds: int, only: str | None, command: str, say=print) -> dict:
    """Measure and return the run's document (what the JSON holds). ``say`` reports progress."""
    from ..mesh import make_mesh

    start = time.perf_counter()
    chosen = select(workloads(), quick=quick, only=only)
    skipped, rows = [], []
    for w in chosen:
        missing = missing_modules(w.requires)
        if missing:
            skipped.append({"row": f"{w.name}/{w.parallel}", "missing": missing})
            say(f"skipping {w.name}/{w.parallel}: {', '.join(missing)} not installed "
                "(pip install \"shardprop[bench]\")")
    chosen = [w for w in chosen if not missing_modules(w.requires)]
    for k, w in enumerate(chosen, 1):
        t0 = time.perf_counter()
        row = measure(w, rounds).to_dict()
        rows.append(row)
        status = "ERROR" if row["error"] else ("ok" if row["correct"] else "WRONG")
        say(f"[{k}/{len(chosen)}] {w.name}/{w.parallel}: {status} ({time.perf_counter() - t0:.1f}s)")
    mesh = make_mesh(*MESHES["2-D"])
    overhead, points, first = [], [], {}
    if only is None:
        if rounds:  # a timing: none with 0 rounds (--repeats 0 skips every runtime ratio)
            say("per-call overhead ...")
            overhead = small_call_overhead(mesh, rounds)
        say("a training loop's first calls ...")
        first = first_calls(mesh)
        layers = SCALING_LAYERS[:2] if quick else SCALING_LAYERS
        say(f"pass scaling at {', '.join(str(n) for n in layers)} layers of the deep graph (about 14 nodes each) ...")
        points = scaling(mesh, layers)
    doc = {"meta": {"command": command, "date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
                    "machine": machine(), "quick": quick, "rounds": rounds, "only": only},
           "rows": rows, "skipped": skipped, "overhead": overhead, "first_calls": first, "scaling": points}
    doc["summary"] = summarize(rows, overhead, judge_runtime=not quick)
    doc["meta"]["wall_seconds"] = time.perf_counter() - start
    return doc


def write(doc: dict, *, out: Path, json_path: Path, with_plots: bool, say=print) -> list[Path]:
    """The JSON at ``json_path``; with ``with_plots`` the PNGs in ``out/img``; ``out/benchmarks.md`` (its image
    links relative to it). Returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    report.write_json(doc, json_path)
    written.append(json_path)
    images = []
    if with_plots:
        try:
            images = plots.write_plots(doc, out / "img")
        except ImportError:
            say("no plots: matplotlib is not installed (pip install \"shardprop[bench]\")")
    written += images
    page = out / "benchmarks.md"
    page.write_text(report.markdown(doc, [str(p.relative_to(out)) for p in images]))
    written.append(page)
    performance = out / "performance.md"  # the project's docs: its summary section follows each full run
    if performance.exists() and not doc["meta"]["quick"] and doc["meta"]["only"] is None:
        updated = report.replace_performance_section(performance.read_text(), doc)
        if updated is not None:
            performance.write_text(updated)
            written.append(performance)
    return written


def stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
