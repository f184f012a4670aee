"""``shardprop docs [--serve] [--site-dir DIR]``: build the documentation site of a clone, strictly.

The site is ``mkdocs.yml`` over ``docs/`` in a clone of the repository (it is not part of an installed package):
``shardprop docs`` runs ``mkdocs build --strict`` there — a broken link, a page missing from the navigation or a
docstring mkdocstrings cannot render fails it — and ``--serve`` runs ``mkdocs serve`` (a local preview that
rebuilds on every change). Without the `docs` extra's packages it says which to install, rather than mkdocs naming
a theme it does not know.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from ..errors import OptionError
from ..extras import require

# the modules the site's build imports, each from a package of the `docs` extra
SITE_MODULES = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")


def add_parser(sub) -> None:
    p = sub.add_parser("docs", help="build the documentation site of a clone (mkdocs build --strict), or --serve it",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--serve", action="store_true", help="serve it locally, rebuilding on change (mkdocs serve)")
    p.add_argument("--site-dir", default=None, help="where to write the site (default: site/ next to mkdocs.yml)")
    p.add_argument("--config", default="mkdocs.yml", help="the site's mkdocs.yml (default: ./mkdocs.yml)")


def run(args, configure_devices) -> int:
    config = Path(args.config)
    if not config.is_file():
        raise OptionError(f"--config {args.config}: no such file; the site builds from a clone of the repository "
                          f"(run `shardprop docs` in its top folder)")
    for module in SITE_MODULES:
        require(module, extra="docs")
    command = [sys.executable, "-m", "mkdocs", "serve" if args.serve else "build", "--config-file", str(config)]
    if not args.serve:
        command.append("--strict")
        if args.site_dir:
            command += ["--site-dir", args.site_dir]
    # mkdocs-material's banner about its successor is not a problem of this site
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    return subprocess.call(command, env=env)
