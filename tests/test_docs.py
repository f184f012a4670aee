"""The docs stay true: the rule table lists every registered primitive, the README's commands are the CI's."""

import pathlib
import re

from shardprop.ops import table
from tests.releases import compared_parts

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_rules_page_is_current_and_lists_every_registered_primitive():
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_rules_page", ROOT / "docs" / "make_rules_page.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = (ROOT / "docs" / "rules.md").read_text()
    assert text == module.page(), "run `python docs/make_rules_page.py`"
    listed = set(re.findall(r"`([a-z_0-9-]+)`", text))
    assert set(table()) <= listed


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    command = 'python -m pip install ".[test]" && python -m pytest -q'
    assert command in readme
    assert command in (ROOT / ".ci" / "run").read_text()


def test_inspecting_page_is_current():
    """docs/inspecting.md pastes the real output of the commands it shows."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_inspecting_page", ROOT / "docs" / "make_inspecting_page.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # (on a JAX release other than the documented one, the parts it traces otherwise are run but not compared)
    written, now = (compared_parts("docs/inspecting.md", text)
                    for text in ((ROOT / "docs" / "inspecting.md").read_text(), module.page()))
    assert written == now, "run `python docs/make_inspecting_page.py`"


def test_debugging_page_is_current():
    """docs/debugging.md pastes the real output of the snippets and commands it shows (timings aside)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_debugging_page", ROOT / "docs" / "make_debugging_page.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    written = module.normalized((ROOT / "docs" / "debugging.md").read_text())
    assert written == module.normalized(module.page()), "run `python docs/make_debugging_page.py`"
