"""docs/recipes.md runs as written: every ```python block, executed alone, prints the ```text block that follows it.

Each block is compiled under the file name ``recipe.py`` (the name the stage tables on the page show) and executed
in a fresh namespace, its standard output captured; the output must equal the page's text block line for line,
trailing whitespace aside. Every block asserts itself that its result equals the unsharded function's
(``np.testing.assert_allclose`` with the tolerance it states), so this is an oracle check as well as a check that the
page is current; a ``ReshardWarning`` or ``FallbackWarning`` from a block is an error (a recipe resolves cleanly).

The blocks begin as a script must, ``jax.config.update("jax_num_cpu_devices", 8)`` right after ``import jax``.
Here tests/conftest.py has set 8 devices and JAX may have initialised its backend before a block runs: setting the
same count again is accepted by jax 0.10.2 (only a different count raises ``RuntimeError``), so the blocks run
unchanged, line for line (``test_the_device_count_line_is_harmless_once_initialised`` keeps that true).

``python tests/test_recipes.py`` rewrites the page's text blocks with what the blocks print now.
"""

from __future__ import annotations

import contextlib
import io
import pathlib
import re
import sys
import warnings

PAGE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "recipes.md"
DEVICE_LINE = 'jax.config.update("jax_num_cpu_devices", 8)'
# a ```python block, the blank lines after it, and the ```text block that must follow it
BLOCK = re.compile(r"^```python\n(?P<code>.*?)^```\n(?P<gap>\s*?)^```text\n(?P<text>.*?)^```\n", re.S | re.M)


def blocks(page: str) -> list[tuple[str, str, str, re.Match]]:
    """(section heading, code, expected output, match) for every python block, in page order."""
    found = []
    for match in BLOCK.finditer(page):
        headings = re.findall(r"^#{2,3} (.+)$", page[:match.start()], re.M)
        found.append((headings[-1] if headings else "top", match["code"], match["text"], match))
    return found


def run(code: str) -> str:
    """The block's standard output, run in a fresh namespace as the script ``recipe.py``."""
    import shardprop as sp

    out = io.StringIO()
    with warnings.catch_warnings():
        warnings.simplefilter("error", sp.ReshardWarning)
        warnings.simplefilter("error", sp.FallbackWarning)
        with contextlib.redirect_stdout(out):
            exec(compile(code, "recipe.py", "exec"), {"__name__": "__main__"})
    return out.getvalue()


def lines(text: str) -> list[str]:
    """Lines without trailing whitespace, trailing blank lines dropped."""
    return [line.rstrip() for line in text.rstrip().splitlines()]


def _ids():
    return [re.sub(r"\W+", "_", heading).strip("_").lower() for heading, *_ in blocks(PAGE.read_text())]


def test_every_python_block_is_followed_by_its_output():
    page = PAGE.read_text()
    found = blocks(page)
    assert found and len(found) == page.count("```python\n")  # no python block without its output
    for heading, code, _, _ in found:
        assert code.startswith("import jax\n" + DEVICE_LINE + "\n"), heading  # runs as a script, 8 devices
        assert "np.testing.assert_allclose" in code, heading  # the oracle: equal to the unsharded function


def test_the_device_count_line_is_harmless_once_initialised():
    import jax

    jax.numpy.zeros(()).block_until_ready()  # the backend is up
    jax.config.update("jax_num_cpu_devices", 8)  # the blocks' line: no error
    assert jax.device_count() == 8


def pytest_generate_tests(metafunc):
    if "index" in metafunc.fixturenames:
        ids = _ids()
        metafunc.parametrize("index", range(len(ids)), ids=ids)


def test_recipe_prints_what_the_page_shows(index):
    heading, code, expected, _ = blocks(PAGE.read_text())[index]
    assert lines(run(code)) == lines(expected), f"{heading}: run `python tests/test_recipes.py` and review the diff"


def rewrite() -> None:
    """Run every block and write what it printed into the page's text blocks."""
    page = PAGE.read_text()
    parts, end = [], 0
    for heading, code, _, match in blocks(page):
        print(f"running {heading}", file=sys.stderr)
        output = "\n".join(lines(run(code)))
        parts += [page[end:match.start("text")], output + "\n" if output else ""]
        end = match.end("text")
    PAGE.write_text("".join(parts) + page[end:])


if __name__ == "__main__":
    import jax

    jax.config.update("jax_num_cpu_devices", 8)  # as tests/conftest.py does, before shardprop is imported
    rewrite()
