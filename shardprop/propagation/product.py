"""The product of propagation: a graph whose every value has a ``TensorSharding``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property

from jax.sharding import Mesh, PartitionSpec

from ..expr.graph import Graph, Node, render
from ..core.layouts import Layout, Shard, Sharded, TensorSharding, layout_refines, layout_to_spec, shard_count
from ..core.rules import Body
from ..core.moves import move_bytes
from ..core.types import ValueType, held_whole, type_string


class RuleName(StrEnum):
    """What ``ShardedGraph.rules`` says of a node that no primitive's own rule sharded."""

    INPUT_SPEC = "input spec"                # an argument laid out by its PartitionSpec
    UNANNOTATED_INPUT = "unannotated input"  # an argument whose spec was None: it adopted what it met
    CONSTANT = "constant"                    # a literal or closed-over array: replicated
    FALLBACK = "conservative fallback"       # no rule applied: operands gathered, outputs replicated



# The "node" of a use that is a program output, in the views of the backward pass ((RETURNED, k): output k).
RETURNED = -1
# The "operand" of a view asking a node made from no operand (an ``iota``) for its own value ((node, MADE)): it is
# made in the layout asked, where its uses would otherwise move it there.
MADE = -1

@dataclass(frozen=True, eq=False)
class ShardedGraph:
    """``graph`` with per-value shardings on ``mesh``.

    ``needs[node_id][i]`` is the layout in which node ``node_id`` consumes its ``i``-th operand; where it is
    coarser than the operand's own layout the data must be gathered (the split pass cuts there).
    ``rules[node_id]`` names the rule that sharded the node (``family.function``, or a ``RuleName``);
    ``fallbacks`` are the nodes that had no rule and got the conservative one.
    """

    graph: Graph
    mesh: Mesh
    shardings: tuple[TensorSharding, ...]
    needs: tuple[tuple[Layout, ...], ...]
    rules: tuple[str, ...]
    fallbacks: frozenset[int]
    # Sharded sub-computations by node id (a scan's body; a while loop's condition and body; a cond's branches).
    bodies: Mapping[int, tuple[Body, ...]] = field(default_factory=dict)
    # Conflicts resolved by moving an operand: node id -> (operand index, the conflict's message).
    reshards: Mapping[int, tuple[int, str]] = field(default_factory=dict)
    # Axes created open (unannotated arguments, new axes) that adopted a sharding: (value, axis) -> the node
    # where they met it (a sharding constraint, an op with a sharded operand).
    adoptions: Mapping[tuple[int, int], int] = field(default_factory=dict)
    # Fallbacks caused by something inside a sub-computation: node id -> what (a body primitive and its line).
    fallback_causes: Mapping[int, str] = field(default_factory=dict)
    # Nodes that consume ranged rows (``shardprop.core.layouts.Span``): node id -> per operand, per axis, the
    # ``(mesh axes, span)`` it reads that axis in, or None (``needs`` says () there: no equal blocks).
    need_spans: Mapping[int, tuple] = field(default_factory=dict)
    # True for a body (a loop's, a cond's): its inputs arrive in the blocks their shardings say, ranged ones too (a
    # loop hands its carry's blocks), and its outputs are taken by the op; a program's arguments arrive whole along
    # a ranged axis and its results come back in equal blocks or whole.
    is_body: bool = False
    # Operands a node took in the layout its value's uses need (the backward pass, propagation/uses.py):
    # (node id, operand index) -> View (the layout, the use that asked).
    views: Mapping[tuple[int, int], object] = field(default_factory=dict)
    # Conflicts (by node) the backward pass priced: producing the moved operand in the needed layout where it is
    # computed moves more, so the move is the cheapest resolution, chosen (not warned about; conflicts='error' allows
    # it). The other conflicts are clashes of the user's own layouts.
    priced: frozenset[int] = frozenset()

    @property
    def mesh_shape(self) -> dict[str, int]:
        return dict(self.mesh.shape)

    def layout(self, value: int) -> Layout:
        return self.shardings[value].layout

    def spec(self, value: int) -> PartitionSpec:
        return self.shardings[value].spec

    @cached_property
    def in_specs(self) -> tuple[PartitionSpec, ...]:
        """The resolved spec of every flat input (unannotated inputs took what they met)."""
        return tuple(self.spec(v) for v in self.graph.inputs)

    @cached_property
    def out_specs(self) -> tuple[PartitionSpec, ...]:
        """The spec every flat output comes back in (``output_layout``)."""
        return tuple(layout_to_spec(self.output_layout(k)) for k in range(len(self.graph.outputs)))

    def output_layout(self, k: int) -> Layout:
        """The layout output ``k`` comes back in: its value's ``returned_layout``, or sliced further where it
        mirrors an argument (``returned_sliced``; one value returned as two outputs may be sliced two ways)."""
        mirrored = self.returned_sliced.get(k)
        return mirrored if mirrored is not None else self.returned_layout(self.graph.outputs[k])

    def returned_layout(self, value: int) -> Layout:
        """The layout a returned ``value`` comes back in as it is held: its layout, each ranged axis in the equal
        blocks of its mesh axes where they divide it (the gradient of ``x[:, ::3]``, a pad spreading ranged rows:
        realigned to them), else whole (a JAX array cannot be uneven)."""
        sharding = self.shardings[value]
        if not sharding.spans:
            return sharding.layout
        mesh_shape = self.mesh_shape
        return tuple(m if r is None or sharding.shape[k] % shard_count(mesh_shape, r[0]) else r[0]
                     for k, (m, r) in enumerate(zip(sharding.layout, sharding.spans, strict=True)))

    @cached_property
    def views_of(self) -> dict[int, list[tuple[int, object]]]:
        """The views taken, by the node taking them: ``node id -> [(operand, view), ...]`` (the operand ``MADE`` for
        a node made in the layout asked; the node ``RETURNED`` for returned values, by output). Read per node by
        explain: one pass over the views, not one per node."""
        found: dict[int, list[tuple[int, object]]] = {}
        for (node_id, k), view in self.views.items():
            found.setdefault(node_id, []).append((k, view))
        return found

    @cached_property
    def returned_sliced(self) -> dict[int, Layout]:
        """The outputs (by index) the backward pass asked for in a finer layout than their values are computed in
        (each mirrors an argument: propagation/uses.py): returned sliced so, each device keeping its block (the
        value's readers, if any, take it as computed)."""
        found = {}
        for (node_id, k), view in self.views.items():
            value = self.graph.outputs[k] if node_id == RETURNED else None
            if value is not None and not self.shardings[value].spans and view.layout != self.layout(value) \
                    and layout_refines(self.layout(value), view.layout):
                found[k] = view.layout
        return found

    def edge_move_bytes(self) -> float:
        """Bytes per device the nodes' operand moves send (each priced alone, partial sums not yet planned): how the
        propagation compares two ways of laying out one program."""
        total, mesh_shape, avals = 0.0, self.mesh_shape, self.graph.avals
        for node in self.graph.nodes:
            for value, need in zip(node.operands, self.needs[node.id], strict=False):
                held = self.layout(value)
                if need != held:
                    total += move_bytes(avals[value].shape, avals[value].dtype, held_whole(held), held_whole(need),
                                        mesh_shape)
        return total

    def shards(self, value: int, axis: int) -> tuple[Shard, ...]:
        """The shards of ``value`` along ``axis`` (empty when that axis is replicated)."""
        a = self.shardings[value].axes[axis]
        return a.shards if isinstance(a, Sharded) else ()

    def value_type(self, value: int) -> str:
        """``f32[16@i,8@j]``."""
        return type_string(self.graph.avals[value], ValueType(self.layout(value)))

    def describe(self, value: int) -> str:
        """Every shard of ``value``: id, range and parents, one axis per line."""
        lines = [f"{self.graph.value_name(value)}:{self.value_type(value)}"]
        for axis, a in enumerate(self.shardings[value].axes):
            if isinstance(a, Sharded):
                shards = " ".join(
                    f"#{s.id}[{s.start}:{s.stop}]<-({','.join(f'#{p.id}' for p in s.parents)})" for s in a.shards)
                lines.append(f"  axis {axis} @{'*'.join(a.mesh_axes)}: {shards}")
            else:
                lines.append(f"  axis {axis}: replicated")
        return "\n".join(lines)

    def render(self, before_node=None) -> str:
        return render(self.graph, type_of=self.value_type, before_node=before_node)

    def __str__(self) -> str:
        return self.render()

    def node(self, node_id: int) -> Node:
        return self.graph.nodes[node_id]

    def is_unannotated_input(self, value: int) -> bool:
        """True for an argument whose spec was None (it adopted the shardings it met)."""
        return self.rules[self.graph.producer[value]] == RuleName.UNANNOTATED_INPUT
