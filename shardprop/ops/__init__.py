"""What shardprop knows about each JAX primitive: one :class:`OpDef` record per primitive (start there).

Each family module (``elementwise.py``, ``reductions.py``, ...) defines the pieces for its ops — the sharding
rule, the lineage rule, the per-block evaluation, the collective that may finish it — next to each other, and
lists its records in ``OPS``. :func:`table` collects those lists (no import side effects; a name defined
twice is an error); every pass reads a primitive's knowledge through :func:`lookup`::

    lookup("reduce_sum").finish.kind   # CollectiveKind.PSUM: a sum over sharded axes can finish with a psum
    lookup("while").is_fallback        # True: the conservative record

The family modules import the vocabulary each piece speaks (``propagation.context``, ``inspect.lineage.boxes``,
``backends.blocks``, ``splitting.collectives``), so the table is built on first use, when every package is
loaded.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Mapping
from types import MappingProxyType

from .opdef import Family, OpDef, defs, first_sentence

FAMILY_MODULES = ("elementwise", "reductions", "scans", "shapes", "reshape", "slicing", "indexing",
                  "contractions", "convolutions", "linalg", "control_flow", "random", "placement")


@functools.cache
def table() -> Mapping[str, OpDef]:
    """``{primitive name: OpDef}`` for every primitive shardprop has a record for."""
    records: dict[str, OpDef] = {}
    for module_name in FAMILY_MODULES:
        module = importlib.import_module(f"{__name__}.{module_name}")
        for op in module.OPS:
            if op.name in records:
                raise ValueError(f"primitive {op.name!r} is defined twice ({module_name} and "
                                 f"{records[op.name].propagate.__module__})")
            records[op.name] = op
    return MappingProxyType(records)


def lookup(name: str) -> OpDef:
    """The record of primitive ``name``: its own, or the conservative one (``is_fallback``) when it has none."""
    op = table().get(name)
    return _fallback(name) if op is None else op


@functools.cache
def _fallback(name: str) -> OpDef:
    from .fallback import fallback_for

    return fallback_for(name)


def has_record(name: str) -> bool:
    return name in table()


def names(family: Family) -> frozenset[str]:
    """The primitives of one family."""
    return frozenset(name for name, op in table().items() if op.family is family)


__all__ = ["FAMILY_MODULES", "Family", "OpDef", "defs", "first_sentence", "has_record", "lookup", "names", "table"]
