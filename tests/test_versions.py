"""The JAX releases shardprop supports: declared once in pyproject.toml, checked once at import (issue #32)."""

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import jax
import pytest

import shardprop as sp
from shardprop.expr.jax_adapter import versions

ROOT = Path(__file__).resolve().parents[1]


def _declared(name: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (found,) = [d for d in dependencies if re.fullmatch(rf"{name}\s*[<>=].*", d)]
    low, high = re.fullmatch(rf"{name}>=([\d.]+),<([\d.]+)", found.replace(" ", "")).groups()
    return versions.release(low), versions.release(high)


@pytest.mark.parametrize("name", ["jax", "jaxlib"])
def test_pyproject_declares_the_range_the_import_check_enforces(name):
    assert _declared(name) == (versions.OLDEST, versions.NEWER_THAN_ALL)


def test_the_installed_jax_is_inside_the_range():
    assert versions.OLDEST <= versions.release(jax.__version__) < versions.NEWER_THAN_ALL
    assert sp.expr.jax_adapter.JAX_VERSION == versions.release(jax.__version__)


@pytest.mark.parametrize("text, expected", [
    ("0.10.2", (0, 10, 2)), ("0.12.0.1", (0, 12, 0, 1)), ("0.13.0rc1", (0, 13, 0)),
    ("0.13.0.dev20261101", (0, 13, 0)), ("0.11.1+cuda", (0, 11, 1)),
])
def test_a_version_string_reads_as_its_release(text, expected):
    assert versions.release(text) == expected


OUTSIDE = ["0.9.1", "0.10.1", "0.13.0", "0.13.0.dev20261101", "1.0.0"]

# A fresh interpreter (the check runs when shardprop is first imported, before any JAX internal is read) imports
# shardprop once per pretended release, forgetting the partly imported package in between: one cold start for all.
_IMPORTS = """
import sys, jax
for pretend in sys.argv[1:]:
    jax.__version__ = pretend
    try:
        import shardprop
    except ImportError as error:
        print(f"{pretend}: {type(error).__module__}.{type(error).__name__}: {error}")
    else:
        print(f"{pretend}: imported")
    for name in [m for m in sys.modules if m == "shardprop" or m.startswith("shardprop.")]:
        del sys.modules[name]
"""


def test_importing_shardprop_with_a_jax_outside_the_range_names_both_versions():
    run = subprocess.run([sys.executable, "-c", _IMPORTS, *OUTSIDE], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    said = dict(line.split(": ", 1) for line in run.stdout.splitlines())
    for pretend in OUTSIDE:
        assert said[pretend].startswith("shardprop.errors.UnsupportedJaxError: shardprop supports jax>=0.10.2,<0.13, "
                                        f"and jax {pretend} is installed"), said[pretend]
    assert issubclass(sp.UnsupportedJaxError, ImportError)
