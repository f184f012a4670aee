"""Outputs that differ between the JAX releases shardprop supports.

The pages' outputs (README.md, docs/) and the goldens are the oldest supported release's, :data:`DOCUMENTED` (CI's
first environment runs it). A newer release may trace a program otherwise — jax 0.11 and later write tanh's derivative
as one primitive, ``one_minus_square``, where 0.10.2 wrote ``1 - t*t`` out, so an RNN gradient's listing has other
value names and one loop output fewer. On such a release:

- a golden is compared with its copy under ``golden/jax-<major>.<minor>/`` of the newest release up to the installed
  one that traced it otherwise (the goldens' generator writes one there when the release's text differs);
- a page's parts listed in :data:`TRACED_OTHERWISE` (by their heading) are run but not compared: their code still
  runs and checks its result against the unsharded function, and every other part of the page is compared exactly.
"""

from __future__ import annotations

import sys

from shardprop.expr.jax_adapter import JAX_VERSION
from shardprop.expr.jax_adapter.versions import OLDEST

DOCUMENTED = OLDEST
ON_DOCUMENTED = JAX_VERSION[:3] == DOCUMENTED
RELEASE = f"jax-{JAX_VERSION[0]}.{JAX_VERSION[1]}"

_TANH = ("jax >= 0.11 writes tanh's derivative as one primitive (one_minus_square): the RNN gradient's listing has "
         "other value names and its backward loop one output fewer")

_SOFTMAX = ("jax >= 0.12.1 writes jax.nn.softmax and log_softmax without their stop_gradient: a listing has a value "
            "fewer, its values other names, and a search over it other counts of values and strategies")

# (page, heading) -> why a newer release shows other output there
TRACED_OTHERWISE: dict[tuple[str, str], str] = {
    ("README.md", "Loops and branches"): _TANH,
    ("docs/inspecting.md", "Inside loops and branches"): _TANH,
    ("README.md", "Let the search choose layouts: `sp.AUTO`"): _SOFTMAX,
    ("docs/auto.md", "Around fixed specs: `strategy=\"optimal\"`"): _SOFTMAX,
    ("docs/workloads.md", "A transformer block, batch on `i`, hidden units on `j`"): _SOFTMAX,
}


def compared(page: str, heading: str) -> bool:
    """Whether the output under ``heading`` of ``page`` is compared with the page on the installed release."""
    return ON_DOCUMENTED or (page, heading) not in TRACED_OTHERWISE


def compared_parts(page: str, text: str) -> list[tuple[str, str]]:
    """``text`` (a markdown page) cut at its ``##`` headings into ``(heading, part)`` pairs — the part before the
    first heading under ``"top"`` — keeping those compared on the installed release."""
    parts, heading, lines = [], "top", []
    for line in text.splitlines(keepends=True):
        if line.startswith("## "):
            parts.append((heading, "".join(lines)))
            heading, lines = line[3:].strip(), []
        lines.append(line)
    parts.append((heading, "".join(lines)))
    return [(h, part) for h, part in parts if compared(page, h)]


def refuse_unless_documented(what: str) -> None:
    """Exit naming the documented release unless it is the installed one: ``what`` (a page's generator) writes its
    output."""
    if not ON_DOCUMENTED:
        sys.exit(f"{what} shows jax {'.'.join(map(str, DOCUMENTED))}'s output, and jax "
                 f"{'.'.join(map(str, JAX_VERSION))} is installed: regenerate it under that release")
