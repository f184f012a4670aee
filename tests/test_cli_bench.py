"""Where ``shardprop bench`` writes: a folder of its own (./shardprop-bench) unless ``--out`` says otherwise, never
the ``docs/`` of the directory it runs in. (The quick run itself: tests/test_bench.py.)"""

import argparse
import json
import shlex
import subprocess
import sys

import pytest

from shardprop.cli import bench as bench_cli


def parse(*argv):
    parser = argparse.ArgumentParser(prog="shardprop")
    bench_cli.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["bench", *argv])


@pytest.mark.parametrize("argv", [(), ("--search",), ("--quick", "--no-plots")])
def test_the_default_output_is_a_folder_of_its_own(argv):
    args = parse(*argv)
    assert args.out == bench_cli.DEFAULT_OUT == "shardprop-bench"
    assert "--out" not in bench_cli.command_line(args)


def test_the_command_line_recorded_in_the_page_says_out_when_given():
    """The project's pages record `shardprop bench --out docs`: the command that regenerates them."""
    assert shlex.split(bench_cli.command_line(parse("--out", "docs"))) == ["shardprop", "bench", "--out", "docs"]
    assert bench_cli.command_line(parse("--search", "--out", "docs")) == "shardprop bench --out docs --search"


def test_a_run_leaves_the_docs_folder_of_its_directory_alone(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "performance.md").write_text("<!-- bench:begin -->\nmine\n<!-- bench:end -->\n")
    result = subprocess.run([sys.executable, "-m", "shardprop", "bench", "--only", "nx_example", "--repeats", "0",
                             "--no-plots"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert [p.name for p in docs.iterdir()] == ["performance.md"]
    assert (docs / "performance.md").read_text() == "<!-- bench:begin -->\nmine\n<!-- bench:end -->\n"
    out = tmp_path / "shardprop-bench"
    assert sorted(p.name for p in out.iterdir()) == ["benchmarks.json", "benchmarks.md"]
    assert json.loads((out / "benchmarks.json").read_text())["meta"]["command"] == \
        "shardprop bench --repeats 0 --no-plots --only nx_example"
    assert "wrote shardprop-bench/benchmarks.json, shardprop-bench/benchmarks.md" in result.stdout


def test_an_iopddl_problem_is_solved_and_its_result_written(tmp_path):
    """``--iopddl``: a contest problem (google/iopddl's example) solved exactly — its cost is the one every assignment
    tried finds (tests/search/test_ilp.py) — printed and written as JSON."""
    from pathlib import Path

    example = Path(__file__).parent / "search" / "data" / "iopddl_example.json"
    out = tmp_path / "iopddl.json"
    result = subprocess.run([sys.executable, "-m", "shardprop", "bench", "--iopddl", str(example), "--json", str(out)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "example: 5 nodes, 9 strategies, 5 edges — optimal: cost 445 (" in result.stdout
    (row,) = json.loads(out.read_text())["problems"]
    assert (row["cost"], row["bound"], row["gap"], row["status"]) == (445, 445, 0, "optimal")
    assert row["strategies_chosen"] == [0, 0, 2, 1, 0]


def test_a_time_limit_without_a_problem_is_refused():
    result = subprocess.run([sys.executable, "-m", "shardprop", "bench", "--time-limit", "5"], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode != 0 and "--time-limit applies to --iopddl" in result.stderr
