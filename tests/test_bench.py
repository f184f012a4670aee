"""``shardprop bench``: the quick run as a user runs it (a subprocess: the command sets its own device count), and
how the goals name the rows that miss them."""

import json
import subprocess
import sys

import pytest

from shardprop.bench.goals import UNEXPLAINED, row_misses, summarize
from tests.cli import shardprop


@pytest.mark.slow  # a (quick) benchmark run: 25 s of the default run's budget
def test_quick_run_writes_the_table_json_plots_and_page(tmp_path):
    result = subprocess.run([sys.executable, "-m", "shardprop", "bench", "--quick", "--out", str(tmp_path)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    doc = json.loads((tmp_path / "benchmarks.json").read_text())
    rows = doc["rows"]
    assert len(rows) >= 5 and {r["kind"] for r in rows} >= {"own", "library"}
    for row in rows:
        assert row["error"] is None and row["correct"], row
        assert set(row["strategies"]) == {"gather", "collective", "auto", "optimal"}
        for compiled in [s["compiled"] for s in row["strategies"].values()] + [row["jit"]]:
            assert compiled["bytes"] >= 0 and compiled["peak_memory"] > 0
        assert row["runtime"]["rounds"] == 5 and row["runtime"]["ratio"] > 0
    # the Nx design's gathers move far more than jax.jit's all-reduces on the Nx example
    (nx,) = [r for r in rows if r["name"] == "nx_example"]
    assert nx["strategies"]["gather"]["compiled"]["bytes"] > 100 * nx["jit"]["bytes"] > 0
    assert [p["nodes"] > 0 for p in doc["scaling"]] == [True, True]
    assert {o["arguments"] for o in doc["overhead"]} == {"jax.Array", "NumPy"}
    page = (tmp_path / "benchmarks.md").read_text()
    assert "| workload | parallel | equals unsharded |" in page and "## Goals" in page
    assert "| bytes auto | bytes optimal | bytes jax.jit |" in page
    assert "`shardprop bench --quick --out" in page
    for image in ("bench_bytes.png", "bench_runtime.png", "bench_scaling.png"):
        assert f"](img/{image})" in page
        assert (tmp_path / "img" / image).read_bytes()[:4] == b"\x89PNG"
    assert "nx_example" in result.stdout and "goals" in result.stdout


def test_an_unmatched_only_pattern_is_an_error(tmp_path):
    result = shardprop("bench", "--only", "no-such-row", "--out", str(tmp_path))  # (tests/test_cli_bench.py: as a
    assert result.returncode == 2 and "no workload matches" in result.stderr  # user runs it, in a subprocess)


def _row(name, ours, jit, ratio, known_gap=None, fewer_expected=None):
    compiled = {"bytes": ours}
    return {"name": name, "parallel": "data", "error": None, "correct": True, "known_gap": known_gap,
            "fewer_expected": fewer_expected, "jit": {"bytes": jit},
            "strategies": {"auto": {"correct": True, "max_abs_error": 0.0, "compiled": compiled}},
            "runtime": {"ratio": ratio, "ratio_q1": ratio, "ratio_q3": ratio}}


def test_a_missed_goal_carries_the_known_reason_or_is_unexplained():
    known = row_misses(_row("a", 200, 100, 1.0, known_gap="XLA fuses better"))
    assert [(m.goal, m.reason) for m in known] == [("bytes ≤ jax.jit", "XLA fuses better")]
    slow = row_misses(_row("b", 100, 100, 1.3))
    assert [(m.goal, m.reason) for m in slow] == [("runtime ≤ 1.10× jax.jit", UNEXPLAINED)]
    same = row_misses(_row("c", 100, 100, 1.0, fewer_expected="a reduce-scatter"))
    assert [m.goal for m in same] == ["bytes < jax.jit"]
    assert row_misses(_row("d", 50, 100, 0.9, fewer_expected="a reduce-scatter")) == []


def test_the_run_wide_goals_read_the_geomean_and_the_overhead():
    rows = [_row("a", 1, 1, 0.9), _row("b", 1, 1, 1.2)]
    overhead = [{"program_ratio": 1.02, "autoshard_ratio": 1.12}]
    goals = {g["goal"]: g for g in summarize(rows, overhead)["goals"]}
    assert not goals["runtime geomean ≤ 1.00× jax.jit"]["met"]  # sqrt(0.9 × 1.2) = 1.04
    assert not goals["no row above 1.10× jax.jit"]["met"]
    assert not goals["per-call overhead of a cached Program within 10% of jax.jit's"]["met"]
    quick = summarize(rows, overhead, judge_runtime=False)  # a quick run's few rounds: noise, not a verdict
    goals = {g["goal"]: g for g in quick["goals"]}
    assert goals["runtime geomean ≤ 1.00× jax.jit"]["met"] is None
    assert goals["no row above 1.10× jax.jit"]["met"] is None
    assert quick["misses"] == []


def test_rows_of_a_missing_library_are_skipped_and_patterns_select_rows():
    from shardprop.bench.run import missing_modules
    from shardprop.bench.run import workloads
    from shardprop.bench.workloads import select

    assert missing_modules(("numpy", "no_such_library_for_shardprop")) == ["no_such_library_for_shardprop"]
    rows = workloads()
    assert {w.kind for w in select(rows, quick=False, only="flax")} == {"library"}
    assert [(w.name, w.parallel) for w in select(rows, quick=False, only="mlp_train_step/2-D")] == \
        [("mlp_train_step", "2-D")]
    assert all(w.quick for w in select(rows, quick=True, only=None))


def test_a_full_run_rewrites_the_performance_pages_section_between_its_markers():
    """docs/performance.md's summary is generated (from the committed full run here): goals, one line per row."""
    import json
    import pathlib

    from shardprop.bench.report import PERFORMANCE_BEGIN, PERFORMANCE_END, replace_performance_section

    doc = json.loads((pathlib.Path(__file__).parents[1] / "docs" / "benchmarks.json").read_text())
    page = f"# title\n\nbefore\n\n{PERFORMANCE_BEGIN}\nold numbers\n{PERFORMANCE_END}\n\nafter\n"
    text = replace_performance_section(page, doc)
    assert text.startswith("# title\n\nbefore\n\n") and text.endswith(f"{PERFORMANCE_END}\n\nafter\n")
    assert "old numbers" not in text and doc["meta"]["command"] in text
    assert all(goal["goal"] in text for goal in doc["summary"]["goals"])
    assert text.count("\n| ") == len([r for r in doc["rows"] if not r["error"]]) + 1  # a header and one per row
    assert replace_performance_section("no markers", doc) is None
