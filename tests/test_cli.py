"""The `shardprop demo` command, run as a user would."""

import subprocess
import sys


def test_demo_runs_checks_and_says_so():
    result = subprocess.run([sys.executable, "-m", "shardprop", "demo"], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "mesh: {'i': 4, 'j': 2} on 8 cpu devices" in out
    assert "c:f32[16@i,8@j] = add a b" in out                      # the annotated graph
    assert "in  c:f32[16@i,8@j]  P('i', 'j')  <- stage 0 output 0" in out   # the stage table
    assert "all_gather[j axis=1] c -> c:f32[16@i,8], 64 B" in out
    assert "check nx_example: sharded (16, 8) == unsharded" in out
    assert out.count("== unsharded") == 4 and "!=" not in out
    assert "psum[j] e -> e:f32[16@i], 16 B (finishes `reduce_sum`)" in out   # the default strategy, auto
    assert out.rstrip().endswith("all sharded results equal the unsharded ones")
