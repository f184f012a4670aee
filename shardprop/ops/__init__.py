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
from collections.abc import Mapping
from types import MappingProxyType

from . import (contractions, control_flow, convolutions, elementwise, linalg, lookups, placement, pooling, random,
               ranges, reductions, reshape, scans, scatters, shapes, slicing)
from ..core.collectives import NO_GEOMETRY, Collective, FinishGeometry
from ..core.types import Placement
from ..errors import LoweringError
from .fallback import fallback_for
from .opdef import Family, OpDef, defs, first_sentence

FAMILIES = (elementwise, reductions, scans, shapes, reshape, ranges, slicing, lookups, scatters, contractions,
            convolutions, pooling, linalg, control_flow, random, placement)


def finish_geometry(graph, node, operand_type, mesh_shape) -> FinishGeometry:
    """Where the ``Finish`` of ``node`` works (``shardprop.core.collectives.FinishGeometry``), given the type its
    first operand is read in: its record's ``geometry`` piece (a top-k's axis, the ranged rows a reduction reads), or
    nothing beyond the result's layout."""
    piece = lookup(node.op).geometry
    return NO_GEOMETRY if piece is None else piece(graph, node, operand_type, mesh_shape)


def finish_placement(graph, node, operand_type, collective: Collective, mesh_shape) -> Placement:
    """Where ``node``, finished by a placement (``collective``: a mirror, a rotation, a route), leaves each device's
    rows when it reads its first operand in ``operand_type``: its record's ``placement`` piece."""
    piece = lookup(node.op).placement
    if piece is None:
        raise LoweringError(f"`{node.op}` is finished by a {collective.kind} but its record has no placement piece "
                            "(a shardprop bug)")
    return piece(graph, node, operand_type, collective, mesh_shape)


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
