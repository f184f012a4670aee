"""Headless Chromium for the browser tests (the documentation site, the graph viewer): one way to find it, to skip
saying why when it or playwright is missing, and to keep a screenshot where ``SHARDPROP_SCREENSHOTS`` asks.

Debian's ``chromium`` is the browser (``.ci/run`` installs it when it runs as root); playwright drives it through
``executable_path``, so ``playwright install``'s own download is never needed."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

# swiftshader: WebGL without a GPU (Model Explorer draws its graph with it)
ARGS = ["--no-sandbox", "--use-gl=swiftshader", "--enable-unsafe-swiftshader", "--ignore-gpu-blocklist"]


def launch_chromium(playwright):
    """A headless Chromium from ``playwright`` (``sync_playwright()``'s), or a skip naming what is missing."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no Chromium on PATH (Debian: apt-get install chromium; .ci/run installs it as root)")
    return playwright.chromium.launch(executable_path=chromium, args=ARGS)


def sync_playwright():
    """playwright's ``sync_playwright``, or a skip: the test extra installs it."""
    return pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the test extra has it; "
                               "its own browsers are not needed)").sync_playwright


def keep_screenshot(shot: Path) -> None:
    """Copy ``shot`` into ``$SHARDPROP_SCREENSHOTS`` when set (``SHARDPROP_SCREENSHOTS=docs/img`` refreshes the
    documentation's pictures)."""
    if target := os.environ.get("SHARDPROP_SCREENSHOTS"):
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(target) / shot.name)
