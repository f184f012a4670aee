"""Every page under docs/ with ```python blocks runs as written and shows what it shows (tests/pages.py's runner).

The pages are discovered, not listed: a page added under docs/ is run as soon as it has a ```python block, one test
per page (its blocks share a namespace, as a reader's session does). The exceptions are the pages another test
runs (those a generator writes, and the recipes): :data:`RUN_ELSEWHERE` names that test. ``python tests/pages.py
docs/<page>.md`` writes a page's output blocks (an empty plain ``` block after a python block is filled in).
"""

from __future__ import annotations

import re

import pytest

from tests import pages

DOCS = pages.ROOT / "docs"
# a block the runner runs: the fence ```python at column 0
RUN_FENCE = re.compile(r"^```python[ \t]*$", re.M)
# a block that claims to be Python code: a python, py, python3, pycon or ipython fence at any indentation (in a
# list item, say); the runner sees only RUN_FENCE's, so any other is Python code no test runs
PYTHON_FENCE = re.compile(r"^[ \t]*```[ \t]*(?:python3?|py|pycon|ipython)[ \t]*$", re.M)

# Pages not run here, each with the test that runs it: a generator writes the first three whole (a python block on
# them is the generator's to run and to fill in), and tests/test_recipes.py runs each recipe alone, as a script of
# its own, where this runner runs a page as one session.
RUN_ELSEWHERE = {
    "docs/debugging.md": "tests/test_docs.py::test_debugging_page_is_current (docs/make_debugging_page.py)",
    "docs/inspecting.md": "tests/test_docs.py::test_inspecting_page_is_current (docs/make_inspecting_page.py)",
    "docs/rules.md": "tests/test_docs.py::test_rules_page_is_current_and_lists_every_registered_primitive "
                     "(docs/make_rules_page.py)",
    "docs/recipes.md": "tests/test_recipes.py (each block alone, as the script recipe.py)",
}


def pages_with(fence: re.Pattern) -> list[str]:
    """The pages under docs/ (names as tests/pages.py gives them) with a block that opens with ``fence``."""
    return sorted(pages.name_of(path) for path in DOCS.rglob("*.md") if fence.search(path.read_text()))


RUN = [name for name in pages_with(RUN_FENCE) if name not in RUN_ELSEWHERE]


@pytest.mark.parametrize("name", RUN)
def test_page_runs_and_shows_what_it_shows(name):
    failures = pages.failures(pages.ROOT / name)
    assert not failures, "\n\n".join(failures)


def test_every_page_with_python_code_is_run_or_excluded():
    """Every python block of a page is one the runner runs (fenced ```python at column 0), and every page with one is
    run here or named in RUN_ELSEWHERE with the test that runs it."""
    claimed = pages_with(PYTHON_FENCE)
    hidden = [name for name in [*claimed, "README.md"]
              if len(PYTHON_FENCE.findall(text := (pages.ROOT / name).read_text())) != len(RUN_FENCE.findall(text))]
    assert not hidden, f"python code fenced otherwise than ```python at column 0, which no test runs: {hidden}"
    assert not set(claimed) - set(RUN) - set(RUN_ELSEWHERE)
    assert {"docs/distributed.md", "docs/workloads.md"} <= set(RUN)


def test_the_excluded_pages_and_their_tests_exist():
    for name, covered_by in RUN_ELSEWHERE.items():
        assert (pages.ROOT / name).is_file(), f"RUN_ELSEWHERE names {name}, which is no page: drop it"
        test_file, _, test = covered_by.split()[0].partition("::")
        assert (pages.ROOT / test_file).is_file(), f"{name}: {test_file} does not exist"
        assert f"def {test or 'test_'}" in (pages.ROOT / test_file).read_text(), f"{name}: no {covered_by} test"


# --- the runner itself -----------------------------------------------------------------------------------------

SAMPLE = '''# a page

## Warned

```python
import sys, warnings
warnings.warn("shardprop: moved it\\n  in detail", UserWarning)
print(f"{sys._getframe().f_code.co_filename}:{sys._getframe().f_lineno}")
```

prints:

```
shardprop: moved it
  in detail
docs/sample.md:8
```

## Silent

```python
warnings.warn("unseen")
```

```python
>>> 1 + 1
2
>>> x = 3
>>> x
3
```

```python
raise ValueError("bad")
```
```
ValueError: bad
```
'''


def test_the_runner_shows_what_a_session_shows():
    """Warnings where they happen (shardprop's as their message), the page's own name and line numbers, the prompt's
    echo, an exception's last traceback line; a warning on a block without output is a failure."""
    found = pages.runs(SAMPLE, "docs/sample.md")
    assert [(c.line, c.mode) for c in found] == [(6, "exec"), (22, "exec"), (26, "single"), (28, "single"),
                                                  (29, "single"), (34, "exec")]
    results = pages.run_page(SAMPLE, "docs/sample.md")
    assert results[0][1].output == "shardprop: moved it\n  in detail\ndocs/sample.md:8\n"
    assert [pages.failure(c, s) is None for c, s in results] == [True, False, True, True, True, True]
    assert "warned" in pages.failure(*results[1]) and "unseen" in pages.failure(*results[1])


def test_the_rewrite_fills_an_empty_output_block(tmp_path, monkeypatch):
    """A new page's output blocks start empty; the rewrite writes what its blocks print."""
    monkeypatch.setattr(pages, "ROOT", tmp_path.resolve())
    page = tmp_path / "docs" / "sample.md"
    page.parent.mkdir()
    page.write_text("# a page\n\n```python\nprint('one')\nprint(2)\n```\n\n```\n```\n")
    pages.rewrite(page)
    assert page.read_text() == "# a page\n\n```python\nprint('one')\nprint(2)\n```\n\n```\none\n2\n```\n"
    assert pages.failures(page) == []


@pytest.mark.parametrize("expected, actual, ok", [
    (["a", "...", "d"], ["a", "b", "c", "d"], True),
    (["a", "...", "d"], ["a", "d"], True),
    (["a", "  ...", "c", "..."], ["a", "b", "c", "d", "e"], True),
    (["a", "...", "d"], ["a", "b", "c"], False),
    (["a", "c"], ["a", "b", "c"], False),
    (["...", "b"], ["a", "b", "c"], False),
])
def test_elision_stands_for_any_run_of_lines(expected, actual, ok):
    assert pages.matches(expected, actual) is ok


def test_only_wall_times_are_normalised():
    assert pages.normalise("ran in 1.23 ms (compiled in 75.96 ms), 256 B moved") == \
        "ran in <time> (compiled in <time>), 256 B moved"
    assert pages.normalise("chose 6 layouts in 1.61 s (48 plans priced; 1 compiled, 0.97 s): 5.1 MiB moved") == \
        "chose 6 layouts in <time> (48 plans priced; 1 compiled, <time>): 5.1 MiB moved"
    assert pages.normalise("8 stages, 2 programs, 4096 B, 39%") == "8 stages, 2 programs, 4096 B, 39%"


def test_a_page_is_named_by_its_path_from_the_root():
    assert pages.name_of(pages.ROOT / "docs" / "workloads.md") == "docs/workloads.md"
    assert pages.name_of(pages.ROOT / "tests" / ".." / "README.md") == "README.md"
