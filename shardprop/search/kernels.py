"""The search's loops that would cost a numpy call per node, pair or strategy, compiled by numba: loaded at the first
search large enough to need one (numba's import and a kernel's load take a few tenths of a second, once per process),
kept on disk beside their modules.

>>> climb = compiled(_climb)   # doctest: +SKIP
"""

from __future__ import annotations

import functools


@functools.cache
def compiled(kernel):
    """``kernel`` compiled by numba (kept on disk: a new process loads it in a tenth of a second; where nothing is
    writable — a read-only install, no home — compiled in each process). Same arithmetic, in the same order."""
    import numba  # (imported at the first search that needs it: a small program never pays for it)

    try:
        return numba.njit(cache=True)(kernel)
    except RuntimeError:
        return numba.njit(cache=False)(kernel)
