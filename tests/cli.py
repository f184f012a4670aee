"""The ``shardprop`` command line as the tests run it: in this process (``shardprop(...)``: no cold JAX import, the
compiles shared with the session), or as a user runs it, a subprocess (``shardprop_subprocess(...)``: one smoke test
per command keeps that path tested). Both return a ``subprocess.CompletedProcess`` with its exit code, standard
output and standard error."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys

from shardprop.cli import main


def shardprop(*argv: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """``shardprop *argv`` run in this process (its 8 virtual devices: a command asking for as many takes them),
    reading ``stdin`` as its standard input (an empty one when None)."""
    out, err = io.StringIO(), io.StringIO()
    with (contextlib.redirect_stdout(out), contextlib.redirect_stderr(err),
          _standard_input(io.StringIO(stdin or ""))):
        try:
            code = main(list(argv))
        except SystemExit as exit_:  # argparse's errors and --version end so
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 2)
    return subprocess.CompletedProcess(["shardprop", *argv], code, out.getvalue(), err.getvalue())


def shardprop_subprocess(*argv: str, stdin: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m shardprop *argv`` in a fresh process, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "shardprop", *argv], capture_output=True, text=True,
                          timeout=timeout, input=stdin)


@contextlib.contextmanager
def _standard_input(stream):
    saved, sys.stdin = sys.stdin, stream
    try:
        yield
    finally:
        sys.stdin = saved
