"""Kept for code written before the primitives' records (0.2): ``RULES`` maps a primitive name to its sharding
rule. It is a read-only view of :func:`shardprop.ops.table`, where each record also holds the primitive's
lineage rule, per-block evaluation and collective finish; new code uses :func:`shardprop.ops.lookup`."""

from __future__ import annotations

from types import MappingProxyType


from ..ops.fallback import conservative  # noqa: E402, F401  (the names rule authors imported from here)
from .context import CREATED, OpenTracker, RuleConflict, RuleContext, RuleOutput  # noqa: E402, F401


def __getattr__(name: str):
    if name == "RULES":
        from ..ops import table

        return MappingProxyType({op_name: op.propagate for op_name, op in table().items()})
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
