"""The documentation site: every public name has an API entry, the site builds strictly, and a browser shows it.

The site is ``mkdocs.yml`` over ``docs/`` (``python -m pip install ".[docs]" && mkdocs build --strict``). Strict
means a broken link, a page missing from the navigation or a docstring mkdocstrings cannot render fails the build;
the pages' code runs in the tests that own it (tests/test_readme.py, tests/test_pages.py, tests/test_recipes.py,
tests/test_docs.py, tests/test_docstrings.py). The browser test opens the built site in headless Chromium (skipped,
saying why, where Chromium or playwright is missing; ``.ci/run`` installs Debian's ``chromium`` when it runs as
root) and asserts what a reader sees; ``SHARDPROP_SCREENSHOTS=docs/img`` also writes its screenshots there.
"""

from __future__ import annotations

import functools
import http.server
import os
import pathlib
import re
import subprocess
import sys
import threading

import pytest

import shardprop as sp
from tests.browser import keep_screenshot, launch_chromium, sync_playwright

ROOT = pathlib.Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference"
ENTRY = re.compile(r"^::: (?P<path>shardprop(?:\.\w+)*)\s*$", re.M)


def reference_entries() -> dict[str, str]:
    """The public names the API reference documents, each with its ``::: path`` directive, in page order.

    A directive names ``shardprop.<name>``, or the object's own module path where a submodule has the public
    name's name (``shardprop.propagation.propagate.propagate``: griffe would render the module ``propagate``)."""
    import importlib

    entries = {}
    for page in sorted(REFERENCE.glob("*.md")):
        for m in ENTRY.finditer(page.read_text()):
            module, _, name = m["path"].rpartition(".")
            obj = getattr(importlib.import_module(module), name)
            public = next((public for public in sp.__all__ if getattr(sp, public) is obj), None)
            assert public is not None, f"{page.name}: {m['path']} is not a public name of shardprop"
            assert public not in entries, f"{public} is documented twice"
            entries[public] = m["path"]
    return entries


def test_every_public_name_has_exactly_one_api_entry():
    entries = reference_entries()
    assert set(entries) == set(sp.__all__), f"missing from docs/reference: {sorted(set(sp.__all__) - set(entries))}"


def test_every_nav_page_exists_and_every_page_is_in_the_nav():
    import yaml

    class Loader(yaml.SafeLoader):  # mkdocs.yml may hold !!python/name tags; the nav needs none of them
        pass

    Loader.add_multi_constructor("", lambda loader, suffix, node: None)
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)

    def pages(nav):
        for entry in nav:
            for value in entry.values():
                yield from pages(value) if isinstance(value, list) else [value]

    listed = list(pages(config["nav"]))
    missing = [page for page in listed if not (ROOT / "docs" / page).is_file()]
    assert not missing
    on_disk = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert on_disk == set(listed), f"pages not in the nav: {sorted(on_disk - set(listed))}"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> pathlib.Path:
    """The site, built strictly from this checkout (as `mkdocs build --strict` builds it)."""
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


@pytest.mark.site
def test_the_site_builds_strictly_with_an_entry_per_public_name(site):
    api = (site / "reference" / "api" / "index.html").read_text() + (
        site / "reference" / "errors" / "index.html").read_text()
    missing = [name for name, path in reference_entries().items() if f'id="{path}"' not in api]
    assert not missing, f"no rendered API entry for {missing}"
    cli = (site / "reference" / "cli" / "index.html").read_text()
    assert "usage: shardprop inspect" in cli and "--format" in cli  # the command's own help, pasted at build


@pytest.mark.site
def test_readme_sections_are_placed_with_their_links_rewritten(site):
    article = (site / "steering" / "index.html").read_text().split("<article", 1)[1].split("</article>", 1)[0]
    assert 'id="steering"' in article  # README's section, placed by docs/hooks.py
    # README's `docs/design.md` link, rewritten to the site's page (the navigation's own links are outside <article>)
    assert 'href="../design/"' in article and "docs/design.md" not in article.replace(">docs/design.md<", "")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # a line per request would bury the test's own output
        pass


def _serve(directory: pathlib.Path):
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.site
def test_a_reader_sees_the_site_in_a_browser(site, tmp_path):
    server = _serve(site)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with sync_playwright()() as playwright:
            browser = launch_chromium(playwright)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(f"{base}/index.html")
            assert page.title() == "shardprop"
            assert page.locator("h1").first.inner_text().strip().rstrip("¶") == "shardprop"  # ¶: its permalink
            nav = page.locator("nav.md-nav--primary").inner_text()
            for section in ("Getting started", "Concepts", "How-to guides", "Reference", "Python API"):
                assert section in nav
            page.screenshot(path=str(tmp_path / "site-home.png"))
            keep_screenshot(tmp_path / "site-home.png")

            page.goto(f"{base}/reference/api/#shardprop.autoshard")
            entry = page.locator('[id="shardprop.autoshard"]')
            assert entry.is_visible()
            assert entry.inner_text().strip().startswith("autoshard")
            # the signature with its type hints, and the docstring's first line
            signature = page.locator('[id="shardprop.autoshard"] ~ div').first.inner_text()
            assert "in_specs" in signature and "mesh" in signature
            assert "Shard f automatically on mesh" in page.locator("article").inner_text()
            page.screenshot(path=str(tmp_path / "site-api-autoshard.png"))
            keep_screenshot(tmp_path / "site-api-autoshard.png")

            page.goto(f"{base}/getting-started/")
            assert "from jax.sharding import PartitionSpec as P" in page.locator("article").inner_text()
            browser.close()
    finally:
        server.shutdown()
        server.server_close()


def test_the_docs_command_names_the_extra_to_install(monkeypatch, capsys):
    import importlib.util

    from shardprop.cli import main

    find_spec = importlib.util.find_spec

    def without_material(name, *args):
        return None if name == "material" else find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", without_material)
    monkeypatch.chdir(ROOT)
    assert main(["docs"]) == 2
    message = capsys.readouterr().err
    assert "ExtraNotInstalledError" in message and 'pip install "shardprop[docs]"' in message
    assert "material is not installed" in message


def test_the_docs_command_outside_a_clone_says_where_to_run_it(tmp_path, monkeypatch, capsys):
    from shardprop.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["docs"]) == 2
    assert "the site builds from a clone of the repository" in capsys.readouterr().err
