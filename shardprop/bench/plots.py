"""The benchmark's PNG plots (matplotlib, from the ``bench`` extra, imported only here and only when plotting):
bytes per device per row, the runtime ratio per row, and the passes' time against graph size."""

from __future__ import annotations

from pathlib import Path

from .goals import ROW_RUNTIME_LIMIT, row_label

BYTES, RUNTIME, SCALING = "bench_bytes.png", "bench_runtime.png", "bench_scaling.png"
COLORS = {"gather": "#c7c7c7", "collective": "#9ecae1", "auto": "#3182bd", "jax.jit": "#e6550d"}


def _figure(width: float, height: float):
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, nothing global

    fig = Figure(figsize=(width, height), dpi=110)
    return fig, fig.add_subplot()


def bytes_plot(rows: list[dict], path: Path) -> None:
    """Grouped horizontal bars: each strategy's and jax.jit's collective bytes per device, one group per row."""
    rows = [r for r in rows if not r["error"]]
    fig, ax = _figure(9, 0.45 * len(rows) + 1.5)
    series = {name: [r["strategies"][name]["compiled"]["bytes"] for r in rows] for name in ("gather", "collective",
                                                                                            "auto")}
    series["jax.jit"] = [r["jit"]["bytes"] for r in rows]
    height = 0.8 / len(series)
    for k, (name, values) in enumerate(series.items()):
        ax.barh([i + (k - 1.5) * height for i in range(len(rows))], values, height, label=name, color=COLORS[name])
    for i in range(len(rows)):
        if not any(values[i] for values in series.values()):
            ax.text(0, i, "  no collectives", va="center", fontsize=7, color="grey")
    ax.set_yticks(range(len(rows)), [row_label(r) for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("symlog", linthresh=1024)  # zero bytes stays visible next to megabytes
    ax.set_xlabel("collective bytes moved per device (compiled HLO, ring model)")
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=len(series), fontsize=8, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)


def runtime_plot(rows: list[dict], path: Path) -> None:
    """The median runtime ratio (auto / jax.jit) per row, with its interquartile range."""
    rows = [r for r in rows if not r["error"] and r["runtime"]]
    fig, ax = _figure(8, 0.35 * len(rows) + 1.5)
    ratios = [r["runtime"]["ratio"] for r in rows]
    low = [r["runtime"]["ratio"] - r["runtime"]["ratio_q1"] for r in rows]
    high = [r["runtime"]["ratio_q3"] - r["runtime"]["ratio"] for r in rows]
    for k, (ratio, below, above) in enumerate(zip(ratios, low, high, strict=True)):
        color = COLORS["jax.jit"] if ratio > ROW_RUNTIME_LIMIT else COLORS["auto"]
        ax.errorbar(ratio, k, xerr=[[below], [above]], fmt="o", color=color, capsize=3)
    ax.axvline(1.0, color="black", lw=0.8)
    ax.axvline(ROW_RUNTIME_LIMIT, color=COLORS["jax.jit"], lw=0.8, ls="--", label=f"{ROW_RUNTIME_LIMIT:.2f}×")
    ax.set_yticks(range(len(rows)), [row_label(r) for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("runtime, shardprop (auto) / jax.jit: median of interleaved rounds, whiskers = IQR")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)


def scaling_plot(points: list[dict], path: Path) -> None:
    """Seconds of each pass against the graph's node count, log-log, with a linear reference."""
    fig, ax = _figure(6, 4.5)
    nodes = [p["nodes"] for p in points]
    for key, label in (("trace_s", "trace"), ("propagate_s", "propagate"), ("split_s", "split"),
                       ("total_s", "all three")):
        ax.plot(nodes, [p[key] for p in points], marker="o", label=label)
    if points:
        first = points[0]
        ax.plot(nodes, [first["total_s"] * n / first["nodes"] for n in nodes], ls=":", color="grey",
                label="linear in nodes")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("graph nodes")
    ax.set_ylabel("seconds")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path)


def write_plots(doc: dict, directory: Path) -> list[Path]:
    """All three plots into ``directory`` (created); the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    if any(not r["error"] for r in doc["rows"]):
        bytes_plot(doc["rows"], directory / BYTES)
        written.append(directory / BYTES)
    if any(not r["error"] and r["runtime"] for r in doc["rows"]):
        runtime_plot(doc["rows"], directory / RUNTIME)
        written.append(directory / RUNTIME)
    if doc["scaling"]:
        scaling_plot(doc["scaling"], directory / SCALING)
        written.append(directory / SCALING)
    return written
