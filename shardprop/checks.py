"""Invariant checks between passes, as tinygrad's pipeline ends with one.

Each pass can check the product it returns (``propagation/invariants.py``, ``splitting/invariants.py``):
every value sharded consistently, every node in a stage, every stage input from a source that exists earlier,
every layout using a mesh axis at most once. A failed check is an ``shardprop.InvariantError`` — a
shardprop bug, never a user's. The checks cost one more walk over the graph, so they are off unless
``SHARDPROP_CHECKS=1`` is set (the test suite sets it) or ``enable`` is called.
"""

from __future__ import annotations

import os

_enabled = os.environ.get("SHARDPROP_CHECKS", "") not in ("", "0")


def enabled() -> bool:
    return _enabled


def enable(on: bool = True) -> None:
    """Turn the checks on (or off) for this process."""
    global _enabled
    _enabled = on
