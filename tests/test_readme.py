"""README.md runs as written: its python blocks, run in page order in one namespace, print what the page shows.

The runner, and what "shows" means (warnings, exceptions, ``...`` elisions, wall times), is tests/pages.py's; its
own tests are in tests/test_pages.py, which runs the other pages under docs/. ``python tests/test_readme.py``
(``python tests/pages.py README.md``) rewrites the page's output blocks with what its blocks show now.
"""

from __future__ import annotations

import pathlib
import sys

if __name__ == "__main__":  # run as a script: the repository's root on the path, for tests.pages
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from tests import pages  # noqa: E402

PAGE = pages.ROOT / "README.md"


def test_every_python_block_runs_and_shows_what_the_page_shows():
    """One test, not one per block: the blocks share a namespace, and the page runs once (in one xdist worker)."""
    failures = pages.failures(PAGE)
    assert not failures, "\n\n".join(failures)


def test_the_page_has_code_and_outputs():
    found = pages.runs(PAGE.read_text(), "README.md")
    assert len([c for c in found if c.mode == "exec"]) >= 20
    assert len([c for c in found if c.expected]) >= 15
    assert found[0].code.startswith('import jax\njax.config.update("jax_num_cpu_devices", 8)')


if __name__ == "__main__":
    pages.main([str(PAGE), *sys.argv[1:]])
