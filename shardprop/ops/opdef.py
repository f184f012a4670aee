"""One record per primitive: ``OpDef`` holds every piece of knowledge shardprop has about a primitive.

    propagate      how shardings flow through it (the propagation pass)
    lineage        which operand elements one box of an output reads (``sp.lineage``, ``sp.explain``)
    per_block      how to evaluate it on per-device blocks inside ``shard_map`` (lowering)
    finish         the collective that finishes a partial result computed on blocks, with the types the op then
                   consumes its operands in (an operand the sum counts once: a partial type), or None: the op is
                   given its operands whole instead (the split pass cuts or gathers before it)
    pull           which operand layouts give its output in a wanted layout, or None (the ``"auto"`` strategy
                   moves gathers upwards through ops that have one)
    linear         how a partial sum passes through it (``Linearity``): where it does, a sum's ``psum`` may
                   wait until after it (a loop's carry accumulating gradients keeps its partial sum)
    work           the multiply-adds one device does, given its operand and output blocks — optional, for ops
                   whose work grows faster than their data (contractions, convolutions): the cost model weighs
                   the redundant work a gather causes against the bytes a collective moves
    halo           the rows past its block each operand's block must come with, given the types the op consumes
                   its operands in — optional, for windowed ops (a convolution, a pooling window) whose output
                   block is computed from the operand's block and its neighbours' edges
    finished_operand   the layout in which the op, where its finish may combine partial results, asks for an
                   operand (a product's contracted axes sliced as the other operand holds them: each device multiplies
                   its blocks, a psum adds them; its free axes as its rule needs them) — optional; without it, such an
                   op takes an operand as it is held
    alternative    another way to take its operands than its rule's, which the plan prices (a lookup's indices gathered
                   where they share a mesh axis with the table's whole window) — optional
    combine        how a prefix finish combines the totals of the blocks before a device's into its block's scan (a
                   cumulative op's: added, multiplied, log-added, the extreme taken) — optional
    geometry       where its ``Finish`` works, given the type its first operand is read in (a top-k's axis, the
                   ranged rows a reduction reads: ``FinishGeometry``) — optional (none: the result's layout says)
    placement      where it leaves each device's rows when its finish is a placement (a reversal's mirror, a
                   concatenation's rotation or route, a strided slice's route: ``Placement``) — for those ops
    factors        per operand, per axis, the factor the axis carries (Shardy's ``OpShardingRule``: a contraction's
                   batch pair one factor, its contracting pair one, each free axis its own; None for an axis taken
                   whole, an elementwise operand's broadcast one; None for a node it has no factors for) — optional:
                   the layout search asks the rule about every way to lay the mesh axes over the factors rather than
                   about every combination of its operands' layouts (``shardprop.search.menu``)
    finish_follows_needs   True for an op whose finish combines results computed from its operands as the op
                   consumes them (a contraction's, a reduction's, a convolution's partial sums): a view of the
                   backward pass may change how it takes them; another finish reads its operands as they are held
    reads_ranges   True for a rule that reads ranged axes (the rows a slice, pad or concatenation along a sharded
                   axis left each device, ``shardprop.core.layouts.Span``); other rules see them replicated
    runs_outside_shard_map   True for a primitive run on whole arrays outside ``shard_map`` (the records of
                   primitives without one of their own); False by default
    traits         what a pass asks of the op's arithmetic or form (``Trait``: a view, a comparison, a selection, a
                   product, a sum, a broadcast, a layout annotation), so that no pass names a primitive

Every field up to ``linear`` is required: a family module that defines an op says what each piece is, or that it
has none (``finish=None``), so a missing piece is a construction error rather than a silent default. The signatures::

    propagate(ctx: RuleContext, *operands: TensorSharding, **params) -> RuleOutput
    lineage(ctx: LineageContext, box: Box, output: int, **params) -> list[list[Box]]   # per operand
    per_block(node: Node, invals: list, blocks: Blocks) -> list                      # output blocks
    finish(decisions: Decisions, node: Node) -> (operand need types, Collective) | None
    pull(graph: Graph, node: Node, target: Layout) -> operand needs | None
    work(node: Node, operand_blocks: list[Shape], out_block: Shape) -> float
    halo(node: Node, in_shapes, needs: tuple[ValueType, ...], mesh_shape) -> tuple[ValueType, ...]  # with halos
    finished_operand(node: Node, j: int, held: list[Layout], needed: Layout, in_shapes, mesh_shape) -> Layout
    alternative(node: Node, in_shapes, held: list[Layout], needs: list[Layout]) -> {operand: Layout}
    combine(node: Node, scanned, totals, earlier) -> block                              # inside shard_map
    geometry(graph: Graph, node: Node, operand_type: ValueType, mesh_shape) -> FinishGeometry
    placement(graph: Graph, node: Node, operand_type: ValueType, collective: Collective, mesh_shape) -> Placement
    factors(node: Node, in_shapes) -> tuple[tuple[int | None, ...], ...] | None        # per operand, per axis
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from enum import StrEnum
from typing import Any

import jax.numpy as jnp


class Family(StrEnum):
    """Op families: the vocabulary passes and docs group primitives by."""

    ELEMENTWISE = "elementwise"
    REDUCTION = "reduction"
    SCAN = "scan and sort"          # cumulative ops, sorts, top-k: an axis needed whole, the others kept
    SHAPE = "shape"
    SLICING = "slicing"
    INDEXING = "indexing"
    CONTRACTION = "contraction"
    WINDOW = "window"               # convolutions and windowed reductions
    LINALG = "linear algebra"       # batched matrix and FFT ops: leading batch axes kept, core axes whole
    CONTROL_FLOW = "control flow"
    RANDOM = "random"
    PLACEMENT = "placement"         # device_put and sharding constraints
    FALLBACK = "no rule"            # the record of a primitive shardprop knows nothing about


class Trait(StrEnum):
    """A fact about an op that a pass asks about, rather than naming primitives (``OpDef.traits``)."""

    VIEW = "view"              # only moves or copies elements: a value read through it is the value (a reshape)
    COMPARISON = "comparison"  # compares elements (``eq``, ``lt``, ...)
    SELECTING = "selecting"    # selects some operand elements; its derivative tests which (a maximum, a sort)
    PRODUCT = "product"        # multiplies (``mul``, ``div``, ``square``, ``integer_pow``)
    SUM = "sum"                # adds (``add``, ``sub``, ``add_any``)
    BROADCAST = "broadcast"    # spreads its operand over more elements: its value is its operand's own
    ANNOTATION = "annotation"  # the user's layout annotation inside the function (a sharding constraint)
    PIECEWISE = "piecewise"    # computes its elements by more than one code path (a concatenate's operands, a pad's
    #                            border and body): XLA:CPU may round a multiply-add fused after it differently on each
    WRITES = "writes"          # writes its other operands into its first, a buffer (a KV cache's new token): they
    #                            take the buffer's layout, moved there where held otherwise — no clash of layouts


class Linearity(StrEnum):
    """How a partial sum — each device of a group holding one summand of the value — passes through an op: the op
    applied to each device's summand sums to the op applied to the sum, so the sum's ``psum`` may wait."""

    NONE = "none"      # not linear: a partial operand must be summed first
    JOINT = "joint"    # linear in all operands jointly (add, sub, concatenate): partial when every operand is
    FIRST = "first"    # linear in its first operand, the others fixed (neg, reshape, reduce_sum, x / y, slices)
    EITHER = "either"  # bilinear (mul, dot_general): partial when exactly one operand is
    FIRST_IF_FLOAT = "first, float results"  # x / y: integer results round (not linear)

    def passes(self, partial: list[bool], dtype) -> bool:
        """True when the op's result (of ``dtype``) is a partial sum given which operands are (``partial[i]``).

        >>> Linearity.EITHER.passes([True, False], jnp.float32), Linearity.EITHER.passes([True, True], jnp.float32)
        (True, False)
        """
        if not any(partial):
            return False
        if self is Linearity.JOINT:
            return all(partial)
        if self is Linearity.FIRST_IF_FLOAT and not jnp.issubdtype(dtype, jnp.inexact):
            return False
        if self in (Linearity.FIRST, Linearity.FIRST_IF_FLOAT):
            return partial[0] and not any(partial[1:])
        if self is Linearity.EITHER:
            return sum(partial) == 1
        return False


@dataclass(frozen=True)
class OpDef:
    """Everything shardprop knows about primitive ``name`` (see the module docstring)."""

    name: str
    family: Family
    propagate: Callable[..., Any]
    lineage: Callable[..., Any]
    lineage_exact: bool
    per_block: Callable[..., list]
    finish: Callable[..., Any] | None
    pull: Callable[..., Any] | None
    linear: Linearity
    work: Callable[..., float] | None = None
    halo: Callable[..., Any] | None = None
    finished_operand: Callable[..., Any] | None = None
    alternative: Callable[..., Any] | None = None
    combine: Callable[..., Any] | None = None
    geometry: Callable[..., Any] | None = None
    placement: Callable[..., Any] | None = None
    factors: Callable[..., Any] | None = None
    finish_follows_needs: bool = False
    # True for the ops whose rule reads ranged axes (``shardprop.core.layouts.Span``: a slice, a pad, a
    # concatenation along a sharded axis); every other rule is given them replicated (it reads them whole).
    reads_ranges: bool = False
    # True when the primitive runs on whole arrays in a stage of its own outside ``shard_map`` (a primitive without
    # a record: its ``per_block`` is ``bind_globally``), a stage boundary on either side.
    runs_outside_shard_map: bool = False
    traits: frozenset[Trait] = frozenset()

    @property
    def is_fallback(self) -> bool:
        """True for the conservative record of a primitive without one of its own."""
        return self.family is Family.FALLBACK

    @cached_property
    def rule_name(self) -> str:
        """``family_module.function`` of the propagation rule, as listings and ``sp.explain`` print it."""
        return f"{self.propagate.__module__.rsplit('.', 1)[-1]}.{self.propagate.__name__}"

    @property
    def why(self) -> str:
        """The first sentence of the propagation rule's module docstring (or its own): the why lives next to
        the rule."""
        return first_sentence(sys.modules[self.propagate.__module__].__doc__ or self.propagate.__doc__)


def defs(names: Iterable[str], family: Family, *, linear: Linearity | Mapping[str, Linearity],
         traits: Mapping[str, Iterable[Trait]] | None = None, **pieces) -> list[OpDef]:
    """One ``OpDef`` per name, all with the same pieces (a family helper, like JAX's
    ``defvectorized``); ``linear`` is one for all, or per name (the names it leaves out are not linear); ``traits``
    per name (the names it leaves out have none)."""
    def linearity(name: str) -> Linearity:
        return linear if isinstance(linear, Linearity) else linear.get(name, Linearity.NONE)

    traits = traits or {}
    return [OpDef(name, family, linear=linearity(name), traits=frozenset(traits.get(name, ())), **pieces)
            for name in names]


def first_sentence(text: str | None) -> str:
    text = " ".join((text or "").split())
    end = text.find(". ")
    return text if end < 0 else text[: end + 1]
