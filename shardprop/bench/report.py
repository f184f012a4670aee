"""Writing a benchmark run: the terminal table (rich), the JSON document and ``benchmarks.md``.

Everything reads the run's document (the dict the JSON holds), so the three always say the same thing.
"""

from __future__ import annotations

import json
from pathlib import Path

from . import plots
from .goals import GEOMEAN_LIMIT, ROW_RUNTIME_LIMIT, UNEXPLAINED, row_label

HEADERS = ("workload", "parallel", "equals unsharded", "bytes gather", "bytes collective", "bytes auto",
           "bytes optimal", "bytes jax.jit", "collectives auto / jit", "peak memory auto / jit",
           "output / device auto / jit", "our passes", "XLA compile ours / jit",
           "runtime auto / jit (IQR)", "goals")


def _verdict(met: bool | None, yes: str, no: str, unjudged: str) -> str:
    return unjudged if met is None else yes if met else no


def human_bytes(n: float | None) -> str:
    if n is None:
        return "–"
    if n < 1024:
        return f"{n:.0f} B"
    if n < 1024 ** 2:
        return f"{n / 1024:.1f} KiB"
    return f"{n / 1024 ** 2:.2f} MiB"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.0f} ms"


def row_cells(row: dict, misses: list[dict]) -> list[str]:
    """One table row: the cells under ``HEADERS``."""
    if row["error"]:
        return [row["name"], row["parallel"], "ERROR", *["–"] * (len(HEADERS) - 4), "runs: " +
                row["error"].splitlines()[0][:60]]
    by = row["strategies"]
    auto, jit = by["auto"]["compiled"], row["jit"]
    wrong = [s for s, r in by.items() if not r["correct"]]
    runtime = row["runtime"]
    mine = [m for m in misses if m["row"] == row_label(row)]
    goals = "met" if not mine else "; ".join(
        f"{m['goal']}{' (unexplained)' if m['reason'] == UNEXPLAINED else ''}" for m in mine)
    return [
        row["name"], row["parallel"], "yes" if not wrong else f"WRONG ({', '.join(wrong)})",
        *(human_bytes(by[s]["compiled"]["bytes"]) if s in by else "–"
          for s in ("gather", "collective", "auto", "optimal")),
        human_bytes(jit["bytes"]), f"{auto['collectives']} / {jit['collectives']}",
        f"{human_bytes(auto['peak_memory'])} / {human_bytes(jit['peak_memory'])}",
        f"{human_bytes(auto.get('output_bytes'))} / {human_bytes(jit.get('output_bytes'))}",
        _ms(row["passes_seconds"]), f"{_ms(auto['compile_seconds'])} / {_ms(jit['compile_seconds'])}",
        "–" if not runtime else
        f"{runtime['ratio']:.3f}× ({runtime['ratio_q1']:.2f}–{runtime['ratio_q3']:.2f})",
        goals,
    ]


def print_table(doc: dict, console=None) -> None:
    """The rows, the overhead and the scaling as rich tables, then each goal's verdict."""
    from rich.console import Console
    from rich.table import Table

    if console is None:  # piped to a file, rich would wrap to 80 columns
        console = Console()
        console = console if console.is_terminal else Console(width=200)
    table = Table(title=f"shardprop vs jax.jit ({len(doc['rows'])} rows; gather and collective bytes: the JSON and "
                        "benchmarks.md)")
    columns = [k for k, h in enumerate(HEADERS) if h not in ("bytes gather", "bytes collective", "bytes optimal")]
    for k in columns:
        table.add_column(HEADERS[k], overflow="fold")
    for row in doc["rows"]:
        cells = row_cells(row, doc["summary"]["misses"])
        table.add_row(*(cells[k] for k in columns))
    console.print(table)
    for title, body in (("per-call overhead", overhead_lines(doc["overhead"])),
                        ("a training loop's first calls", first_calls_lines(doc.get("first_calls", {}))),
                        ("pass scaling", scaling_lines(doc["scaling"]))):
        if body:
            console.print(f"\n{title}\n" + "\n".join(body), highlight=False)
    console.print("\ngoals", highlight=False)
    for goal in doc["summary"]["goals"]:
        console.print(f"  {_verdict(goal['met'], 'met   ', 'MISSED', '-     ')}  {goal['goal']}: {goal['measured']}",
                      highlight=False)


def first_calls_lines(first: dict) -> list[str]:
    """Seconds per call of a training loop's first steps, shardprop beside jax.jit (compiles included)."""
    if not first:
        return []
    names = list(first)
    lines = [f"{'call':6}" + "".join(f"{n:>12}" for n in names)]
    for k in range(len(first[names[0]])):
        lines.append(f"{k + 1:<6}" + "".join(f"{first[n][k]:>11.3f}s" for n in names))
    return lines


def overhead_lines(overhead: list[dict]) -> list[str]:
    """The per-call overhead table: per kind of argument, called with the same shapes every time and (where
    measured) alternating between two shapes."""
    if not overhead:
        return []
    lines = [f"{'arguments':10} {'shapes':12} {'jax.jit':>9} {'Program':>9} {'ratio':>6} {'autoshard':>10} "
             f"{'ratio':>6}"]
    for o in overhead:
        for shapes, m in (("same", o), ("alternating", o.get("alternating"))):
            if m is not None:
                lines.append(f"{o['arguments']:10} {shapes:12} {m['jit_us']:>7.0f}µs {m['program_us']:>7.0f}µs "
                             f"{m['program_ratio']:>6.2f} {m['autoshard_us']:>8.0f}µs {m['autoshard_ratio']:>6.2f}")
    return lines


def scaling_lines(points: list[dict]) -> list[str]:
    if not points:
        return []
    lines = [f"{'nodes':>8} {'trace':>8} {'propagate':>10} {'split':>8} {'total':>8} {'µs/node':>8}"]
    lines += [f"{p['nodes']:>8,} {p['trace_s']:>7.2f}s {p['propagate_s']:>9.2f}s {p['split_s']:>7.2f}s "
              f"{p['total_s']:>7.2f}s {p['total_s'] / p['nodes'] * 1e6:>8.0f}" for p in points]
    return lines


def write_json(doc: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, default=str) + "\n")


def _markdown_table(headers, rows) -> list[str]:
    def cell(text) -> str:
        return str(text).replace("|", "\\|").replace("\n", " ")

    return ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers),
            *("| " + " | ".join(cell(c) for c in r) + " |" for r in rows)]


def markdown(doc: dict, images: list[str]) -> str:
    """``benchmarks.md``: how the run was made, the goals and every row that misses one with its reason, the
    table, the plots (``images``, paths relative to the page), the overhead, the scaling and the warnings."""
    summary = doc["summary"]
    out = _markdown_header(doc["meta"])
    out += [f"- {_verdict(g['met'], '**met**', '**missed**', 'not judged')}: {g['goal']} — {g['measured']}"
            for g in summary["goals"]]
    if summary["misses"]:
        out += ["", "Rows that miss a goal (a reason from the workload's `known_gap`, or *unexplained*):", ""]
        out += _markdown_table(("row", "goal", "measured", "why"), [
            (m["row"], m["goal"], m["measured"], f"**{m['reason']}**" if m["reason"] == UNEXPLAINED else m["reason"])
            for m in summary["misses"]])
    else:
        out += ["", "No row misses a per-row goal."]
    slow = sorted((r for r in doc["rows"] if not r["error"] and r["runtime"] and r["runtime"]["ratio"] > 1.0),
                  key=lambda r: -r["runtime"]["ratio"])
    mean = summary["runtime_geomean"]
    if mean is not None and mean > GEOMEAN_LIMIT:
        out += ["", f"The runtime geomean is {mean:.3f}×; the rows slower than `jax.jit` pull it up: " + ", ".join(
            f"{row_label(r)} {r['runtime']['ratio']:.2f}×" + (f" ({r['known_gap']})" if r["known_gap"] else "")
            for r in slow) + "."]
    out += ["", "## Results", ""]
    out += _markdown_table(HEADERS, [row_cells(r, summary["misses"]) for r in doc["rows"]])
    if doc["skipped"]:
        out += ["", "Skipped (a library missing; `pip install \"shardprop[bench]\"`): " +
                ", ".join(f"{s['row']} (needs {', '.join(s['missing'])})" for s in doc["skipped"]) + "."]
    for title, name in (("Bytes per device", plots.BYTES),
                        (f"Runtime ratio (the dashed line is {ROW_RUNTIME_LIMIT:.2f}×)", plots.RUNTIME)):
        match = [i for i in images if i.endswith(name)]
        if match:
            out += ["", f"### {title}", "", f"![{title}]({match[0]})"]
    out += _markdown_appendix(doc, images)
    return "\n".join(out).rstrip() + "\n"


def _markdown_header(meta: dict) -> list[str]:
    """The page's title, how the run was made and what each column means, up to the goals' heading."""
    machine = meta["machine"]
    return ["# Benchmarks: shardprop against jax.jit", "",
            "<!-- Generated by `shardprop bench`; edits are overwritten by the next run. -->", "",
            f"Generated by `{meta['command']}` on {meta['date']} in {meta['wall_seconds'] / 60:.1f} min "
            f"({'the quick subset' if meta['quick'] else 'the full run'}, {meta['rounds']} interleaved rounds per "
            "row).",
            f"Machine: {machine['platform']}, {machine['cpus']} CPU core(s), Python {machine['python']}, "
            f"jax {machine['jax']}, {machine['devices']}.", "",
            "Each row runs one function through shardprop under each strategy and through `jax.jit` (GSPMD/Shardy) "
            "with the same input shardings on the same mesh: *data* parallel is the batch over the 8 devices of "
            "`data`, *tensor* parallel hidden units, heads or classes over the 8 devices of `model`, *2-D* both on a "
            "(4, 2) mesh, *spatial* the rows of the images over 8 devices, *sequence* the positions of a sequence "
            "over 8 devices. *Equals unsharded*: every strategy's result against `jax.jit` of the function on unplaced "
            "inputs (one device), each output within `atol + rtol × max|expected|` (the row's tolerances are in the "
            "JSON). *Bytes*: collective bytes moved per device, read from each compiled HLO (ring model; a collective "
            "in a loop counted once per iteration); *bytes optimal* is `strategy=\"optimal\"`'s program (every value's "
            "layout chosen by the search's one solve around the row's specs, an unannotated argument's too: "
            "[docs/auto.md](auto.md#around-fixed-specs-strategyoptimal)), not yet the default. *Collectives*: "
            "collective instructions in the HLO. *Peak "
            "memory* and *output / device* (the outputs each device holds): per device, from "
            "`compiled.memory_analysis()`. "
            "*Our passes*: trace + propagate + split + lower "
            "for the `auto` program; *XLA compile*: compiling our program, and `jax.jit`'s lowering and compile. "
            "*Runtime*: the median of per-round ratios auto / `jax.jit` over interleaved rounds on the same placed "
            "inputs, with the interquartile range. These machines are small and shared: read ratios, not times.",
            "", "## Goals", ""]


def _markdown_appendix(doc: dict, images: list[str]) -> list[str]:
    """The sections after the results: overhead, a training loop's first calls, scaling, warnings, errors."""
    out: list[str] = []
    if doc["overhead"]:
        out += ["", "## Per-call overhead", "",
                "The Nx example at 16×8 on the (4, 2) mesh: median µs per call (blocking on each) over interleaved "
                "rounds — `jax.jit` with `in_shardings`, a cached `Program`, an autoshard function; *same*: called "
                "with 16×8 arguments every time, *alternating*: with 16×8 and 8×8 arguments in turn (train and eval "
                "batches), where `jax.jit` and the autoshard function each dispatch between two compiled programs "
                "and the `Program` column alternates between the two Programs traced.", "", "```",
                *overhead_lines(doc["overhead"]), "```"]
    if doc.get("first_calls"):
        out += ["", "## A training loop's first calls", "",
                "An MLP training step (3 layers of 512, Megatron's layouts, the batch over `data`) called on freshly "
                "initialised NumPy parameters, then on each call's own outputs; seconds per call, blocking on each, "
                "compiles included (`jax.jit` with the same `in_shardings`). Only the first call should compile.", "",
                "```", *first_calls_lines(doc["first_calls"]), "```"]
    if doc["scaling"]:
        out += ["", "## Scaling of the passes", "",
                "A deep stack of matmuls, elementwise ops and reductions over both sharded axes "
                "(`shardprop.bench.timing.deep`), traced, propagated and split at growing sizes:", "", "```",
                *scaling_lines(doc["scaling"]), "```"]
        match = [i for i in images if i.endswith(plots.SCALING)]
        if match:
            out += ["", f"![pass scaling]({match[0]})"]
    warned = [r for r in doc["rows"] if r["warnings"]]
    if warned:
        out += ["", "## Warnings during the runs", ""]
        for r in warned:
            out += [f"- {row_label(r)}:"] + [f"  - {w.splitlines()[0]}" for w in r["warnings"]]
    errors = [r for r in doc["rows"] if r["error"]]
    if errors:
        out += ["", "## Errors", ""]
        for r in errors:
            out += [f"{row_label(r)}:", "", "```", r["error"].rstrip(), "```", ""]
    return out


PERFORMANCE_BEGIN, PERFORMANCE_END = "<!-- bench:begin -->", "<!-- bench:end -->"


def performance_section(doc: dict) -> str:
    """The summary ``docs/performance.md`` shows between its bench markers: the run, the goals, bytes and runtime
    per row, the per-call overhead (the full table is benchmarks.md's)."""
    meta, summary = doc["meta"], doc["summary"]
    out = [PERFORMANCE_BEGIN,
           f"Generated by `{meta['command']}` on {meta['date']} "
           f"({meta['machine']['cpus']} cores, {meta['machine']['devices']}; the full table, the plots and the "
           "reasons for every miss: [benchmarks.md](benchmarks.md)).", ""]
    out += [f"- {_verdict(g['met'], 'met', '**missed**', 'not judged')}: {g['goal']} — {g['measured']}"
            for g in summary["goals"]]
    out += [""] + _markdown_table(
        ("workload", "parallel", "bytes auto", "bytes jax.jit", "runtime auto / jit"),
        [(r["name"], r["parallel"], human_bytes(r["strategies"]["auto"]["compiled"]["bytes"]),
          human_bytes(r["jit"]["bytes"]), f"{r['runtime']['ratio']:.3f}×" if r["runtime"] else "–")
         for r in doc["rows"] if not r["error"]])
    if doc["overhead"]:
        out += ["", "Per-call overhead (the Nx example at 16×8, alternating with 8×8; median µs per call):", "",
                "```",
                *overhead_lines(doc["overhead"]), "```"]
    return "\n".join(out + [PERFORMANCE_END])


def replace_performance_section(text: str, doc: dict) -> str | None:
    """``text`` (performance.md) with its bench section regenerated; None when it has no markers."""
    start, end = text.find(PERFORMANCE_BEGIN), text.find(PERFORMANCE_END)
    if start < 0 or end < start:
        return None
    return text[:start] + performance_section(doc) + text[end + len(PERFORMANCE_END):]
