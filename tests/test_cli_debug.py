"""`shardprop debug`, run as a user would (a subprocess): stage by stage, JSON, arrays from files, a saved
stage, the interactive prompt, and one-line errors."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

EXAMPLE = Path(__file__).parent / "inspection" / "nx_example.py"
BASE = [sys.executable, "-m", "shardprop", "debug", f"{EXAMPLE}:f", "--mesh", "i=4,j=2", "--strategy", "gather",
        "--repeats", "2"]
ARGS = ["--arg", "f32[16,8]@P(i,j)", "--arg", "f32[16,8]"]


def run(*extra, check=True, stdin=None):
    result = subprocess.run([*BASE, *extra], capture_output=True, text=True, timeout=300, input=stdin)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def test_text_steps_every_stage_compares_and_profiles():
    out = run(*ARGS).stdout
    assert "2 stage(s), 9 nodes, strategy gather" in out
    assert "stage 0: 2 ops (add, sub)" in out and "stage 1: 5 ops (reduce_sum×2, broadcast_in_dim×2, add)" in out
    assert "c:f32[16@i,8@j]  P('i', 'j')  <- stage 0 output 0, all-gather over j on axis 1 (64 B)" in out
    assert out.count("vs unsharded: all") == 2
    assert "all 7 values agree with the unsharded function" in out
    assert "every device holds what the plan says it holds" in out
    assert "per-stage profile (median of 2 runs" in out and "measured 256 B, estimated 256 B" in out


def test_json_has_every_stage_and_the_verdict(tmp_path):
    out = tmp_path / "debug.json"
    run(*ARGS, "--format", "json", "-o", str(out))
    doc = json.loads(out.read_text())
    assert doc["program"]["stages"] == 2 and doc["agree"] is True and doc["divergence"] is None
    assert [s["stage"] for s in doc["stages"]] == [0, 1]
    assert [v["value"] for v in doc["stages"][1]["comparison"]["values"]] == ["e", "f", "g", "h", "i"]
    assert doc["findings"] == [] and doc["nonfinite"] is None
    assert [s["measured_bytes"] for s in doc["profile"]["stages"]] == [0, 256]


def test_arrays_from_files_and_a_non_finite_value(tmp_path):
    a = np.arange(128, dtype=np.float32).reshape(16, 8)
    a[3, 2] = np.inf
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", np.ones((16, 8), np.float32))
    out = run("--arg", f"@{tmp_path / 'a.npy'}@P(i,j)", "--arg", f"@{tmp_path / 'b.npy'}").stdout
    assert "first non-finite: argument a holds inf: a[3, 2] on device 0 (i=0, j=0)" in out


def test_save_stage(tmp_path):
    out = run(*ARGS, "--save-stage", "1", str(tmp_path / "repro")).stdout
    assert f"stage 1 saved: python {tmp_path / 'repro' / 'run_stage_1.py'}" in out
    assert (tmp_path / "repro" / "stage_1.jax_export").is_file()


def test_interactive_prompt():
    commands = "\n".join(["break e", "break", "continue", "print c", "blocks e", "print zz", "print", "print 4",
                          "next", "where", "compare", "quit"]) + "\n"
    out = run(*ARGS, "--interactive", stdin=commands).stdout
    assert "breakpoint before stage 1" in out
    assert "stage 0: 2 ops (add, sub)" in out and "next: stage 1 of 2" in out
    assert "c =\n" in out
    assert "NotComputedError: e is computed by stage 1, which has not run yet" in out
    assert "UnknownValueError: no value 'zz'" in out
    assert "before stage 1: e" in out and "usage: print NAME" in out
    assert "stage 1: 5 ops" in out and "finished" in out
    assert "all 7 values agree" in out


@pytest.mark.parametrize("extra,message", [
    (["--arg", "f32[16,8]@P(i,j)"], "TraceError: tracing 'f' failed"),
    (["--arg", "@/no/such/file.npy@P(i)", "--arg", "f32[16,8]"], "cannot read '/no/such/file.npy'"),
    ([*ARGS, "--save-stage", "7", "/tmp/x"], "StageIndexError: no stage 7: this program has 2 stages"),
    ([*ARGS, "--repeats", "0"], "--repeats 0"),
    ([*ARGS, "--interactive", "--format", "json"], "--interactive is a text prompt"),
])
def test_bad_input_is_a_one_line_error(extra, message):
    result = run(*extra, check=False)
    assert result.returncode == 2, result.stdout
    assert message in result.stderr and "Traceback" not in result.stderr
