"""What shardprop knows about each JAX primitive: one ``OpDef`` record per primitive (start there).

Each family module (``elementwise.py``, ``reductions.py``, ...) defines the pieces for its ops — the sharding
rule, the lineage rule, the per-block evaluation, the collective that may finish it — next to each other, and
lists its records in ``OPS``. ``table`` collects those lists (a name defined twice is an error); every pass
reads a primitive's knowledge through ``lookup``::

    lookup("reduce_sum").finish            # the piece that finishes a sum over sharded axes with a psum
    lookup("while").is_fallback            # False: while loops have a record of their own

The family modules speak the vocabulary of ``shardprop.core`` (layouts, rule context, boxes, blocks,
collectives) and nothing above it: ``ops`` never imports a pass. What a record needs of a pass — a loop's body
propagated, walked or run on blocks — the pass hands it (``RuleContext.propagate_body``, ``LineageContext.walk``,
``Blocks.bodies``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from types import MappingProxyType

from . import (contractions, control_flow, convolutions, elementwise, linalg, lookups, placement, pooling, random,
               range_routes, ranges, reductions, reshape, scans, scatters, shapes, slicing)
from ..core.collectives import FinishGeometry
from ..core.layouts import shard_count
from .fallback import fallback_for
from .opdef import Family, OpDef, defs, first_sentence

FAMILIES = (elementwise, reductions, scans, shapes, reshape, ranges, slicing, lookups, scatters, contractions,
            convolutions, pooling, linalg, control_flow, random, placement)


def finish_geometry(graph, node, operand_type, mesh_shape) -> FinishGeometry:
    """Where the finish of ``node`` works (``shardprop.core.collectives.FinishGeometry``), given the type its
    first operand is read in: a top-k's axis; a concatenation's axis, rotation (``.range_routes.rotation``) and
    route rounds; a strided slice's route rounds (``.range_routes.slice_geometry``); the ranged rows a single-axis
    reduction reads."""
    if node.op == "top_k":
        return FinishGeometry(axis=node.params["axis"])
    if node.op == "concatenate":
        return range_routes.concatenate_geometry(graph, node, operand_type, mesh_shape)
    if node.op == "slice":
        return range_routes.slice_geometry(graph, node, operand_type, mesh_shape)
    axes = node.params.get("axes") if lookup(node.op).family is Family.REDUCTION else None
    shape = graph.avals[node.operands[0]].shape
    rows = tuple((k, operand_type.layout[k], operand_type.span_of(k), shape[k]) for k in axes or ()
                 if operand_type.span_of(k) is not None)
    if not rows:
        return FinishGeometry()
    filled = [(k, span) for k, _, span, _ in rows if span.fill is not None]
    if not filled:
        return FinishGeometry(rows=rows)
    # the rows of the one filled axis no device holds (reductions.FinishReduction reads at most one ranged filled),
    # once for every element of the other reduced axes
    (k, span), = filled
    count = shard_count(mesh_shape, operand_type.layout[k])
    unheld = shape[k] - sum(stop - first for first, stop in (span.held(d, shape[k]) for d in range(count)))
    others = math.prod(shape[j] for j in axes if j != k)
    return FinishGeometry(rows=rows, fill=span.fill, fill_count=unheld * others)


def _collect() -> Mapping[str, OpDef]:
    records: dict[str, OpDef] = {}
    for module in FAMILIES:
        for op in module.OPS:
            if op.name in records:
                raise ValueError(f"primitive {op.name!r} is defined twice ({module.__name__} and "
                                 f"{records[op.name].propagate.__module__})")
            records[op.name] = op
    return MappingProxyType(records)


_TABLE = _collect()


def table() -> Mapping[str, OpDef]:
    """``{primitive name: OpDef}`` for every primitive shardprop has a record for."""
    return _TABLE


def lookup(name: str) -> OpDef:
    """The record of primitive ``name``: its own, or the conservative one (``is_fallback``) when it has none."""
    op = _TABLE.get(name)
    return _fallback(name) if op is None else op


@functools.cache
def _fallback(name: str) -> OpDef:
    return fallback_for(name)


def has_record(name: str) -> bool:
    return name in _TABLE


def names(family: Family) -> frozenset[str]:
    """The primitives of one family."""
    return frozenset(name for name, op in _TABLE.items() if op.family is family)


__all__ = ["FAMILIES", "Family", "OpDef", "defs", "first_sentence", "has_record", "lookup", "names", "table"]
