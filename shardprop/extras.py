"""The optional features' packages: one check, one message naming the extra that installs them (the viewer's
``viewer`` extra, the site's ``docs`` extra)."""

from __future__ import annotations

import importlib.util

from .errors import ExtraNotInstalledError


def require(module: str, *, extra: str) -> None:
    """Raise ``ExtraNotInstalledError`` naming ``extra`` unless ``module`` can be imported.

    Checked before the module is imported, so a feature fails with the fix rather than a raw ``ImportError``."""
    top = module.split(".")[0]
    if importlib.util.find_spec(top) is None or (top != module and importlib.util.find_spec(module) is None):
        raise ExtraNotInstalledError(
            f"{module} is not installed; it comes with shardprop's `{extra}` extra: "
            f'python -m pip install "shardprop[{extra}]" (from a clone: python -m pip install -e ".[{extra}]")')
