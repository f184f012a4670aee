"""A traced program's layout choice as one ``Problem`` (``.problem``): every node picks a strategy (``.menu``) and
every value read by a node costs the move from the type its producer's strategy holds it in to the type the
reader's strategy consumes it in.

The nodes of the problem are the graph's nodes, in order: an argument's strategies are its candidate layouts (one,
where the user fixed it), a constant's its replicated whole, an op's its menu — its rule asked about every layout
its operands may be handed (each operand: the layouts its producer can hold it in and its own candidates), or, where
its record names its factors, every way to lay the mesh axes over them (``.menu``). An edge joins a value's producer
and each node reading it, its matrix the one planner's bytes (``core.moves.move_bytes``) summed over the distinct
types the reader consumes it in (a reader its op's finish completes among them: it is handed its operands as it
consumes them; forbidden where it is handed one value in two layouts, and a ``tied`` reader — a loop whose sums wait
— wherever the value is held otherwise than handed).

>>> built = build_problem(graph, flat_specs, mesh)   # doctest: +SKIP
>>> solution = solve(built.problem)                  # doctest: +SKIP
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from jax.sharding import PartitionSpec

from ..core.layouts import Layout, block_shape, layout_from_spec
from ..core.moves import move_bytes
from ..core.types import ValueType, held_whole
from ..errors import SearchError
from ..expr import jax_adapter as jx
from ..expr.graph import CONSTANT, PARAMETER, Graph, where
from ..propagation.propagate import propagate_body
from .menu import Menu, NodeStrategy, node_menu, node_signature
from .problem import FORBIDDEN, Problem
from .space import candidate_specs

# the most candidate layouts an operand may be handed beyond those its producer holds it in (the fewest mesh axes
# first: replicated, then each axis alone, ...)
HANDED_AT_MOST = 12


@dataclass(frozen=True)
class BuiltProblem:
    """``problem``'s node ``k`` is ``graph``'s node ``k``; ``menus[k]`` its strategies, in the problem's order;
    ``sampled`` the nodes whose menus hold only the strategies asked about (``menu.Menu``): the problem's optimum is
    the best layout only where it is empty."""

    problem: Problem
    graph: Graph
    menus: tuple[tuple[NodeStrategy, ...], ...]
    sampled: tuple[int, ...] = ()

    def chosen(self, solution) -> tuple[NodeStrategy, ...]:
        """Each node's strategy under ``solution`` (one index per node)."""
        return tuple(menu[s] for menu, s in zip(self.menus, solution, strict=True))


def layout_of_spec(spec: PartitionSpec, rank: int) -> Layout:
    """``spec`` as a layout of ``rank`` axes (``P('i', None)`` -> ``(('i',), ())``)."""
    entries = list(spec) + [None] * (rank - len(spec))
    return tuple(() if e is None else (e,) if isinstance(e, str) else tuple(e) for e in entries)


def spec_of_layout(layout: Layout) -> PartitionSpec:
    """``layout`` as the PartitionSpec a program's argument is given."""
    entries = [None if not m else m[0] if len(m) == 1 else tuple(m) for m in layout]
    while entries and entries[-1] is None:
        entries.pop()
    return PartitionSpec(*entries)


@functools.lru_cache(maxsize=65536)
def _candidate_layouts(shape: tuple[int, ...], mesh_items: tuple) -> tuple[Layout, ...]:
    return tuple(layout_of_spec(s, len(shape)) for s in candidate_specs(shape, dict(mesh_items)))


def build_problem(graph: Graph, flat_specs, mesh, *, ties: Sequence[tuple[int, ...]] = (),
                  returns: Sequence[tuple[int, int]] = (), usage_limit: float | None = None) -> BuiltProblem:
    """The layout choice of ``graph`` on ``mesh``: ``flat_specs`` one per flat argument — a PartitionSpec (kept
    exactly), ``sp.AUTO`` or None (its candidates). ``ties``: flat arguments laid out alike (an optimizer's moments and
    their parameter); ``returns``: ``(output, argument)`` pairs, each output priced back into its argument's layout (the
    state a step returns for the next); ``usage_limit``: bytes per device live at any moment (each value's block from
    its producer to its last reader; arguments and outputs the whole program)."""
    bodies = functools.partial(propagate_body, mesh=mesh, conflicts="reshard")
    mesh_shape = dict(mesh.shape)
    mesh_items = tuple(mesh_shape.items())
    uneven = uneven_argument(graph, flat_specs, mesh_shape)
    if uneven is not None:
        raise SearchError(f"sp.AUTO: {uneven}. Pad it to whole blocks, lay that axis over fewer devices, or fix "
                          "every argument's spec (propagation takes its rows as ranges)")
    menus: list[tuple[NodeStrategy, ...]] = []
    held: dict[int, list[Layout]] = {}  # value -> the layouts its producer's strategies hold it in, first seen first
    seen: dict[tuple, Menu] = {}  # a node's menu by what decides it (the layers of a stack alike)
    answers: dict[tuple, tuple[NodeStrategy, ...]] = {}  # a rule's answer to a handed tuple, by node_signature
    sampled: list[int] = []
    for node in graph.nodes:
        if node.op == PARAMETER:
            aval = graph.avals[node.output]
            spec = flat_specs[node.params["index"]]
            if isinstance(spec, PartitionSpec):
                layouts = (layout_from_spec(spec, aval.shape, mesh_shape, f"argument {node.params['index']}"),)
            else:
                layouts = _candidate_layouts(aval.shape, mesh_items)
            menu = tuple(NodeStrategy((), (), (held_whole(layout),), None, 0.0, False) for layout in layouts)
        elif node.op == CONSTANT:
            aval = graph.avals[node.output]
            menu = (NodeStrategy((), (), (held_whole(((),) * len(aval.shape)),), None, 0.0, False),)
        else:
            options = tuple(_handed_options(held[v], graph.avals[v].shape, mesh_items) for v in node.operands)
            key = _menu_key(graph, node, options)
            found = seen.get(key) if key is not None else None
            if found is None:
                found = node_menu(graph, node, mesh, list(options), bodies, answers=answers)
                if key is not None:
                    seen[key] = found
            menu = found.strategies
            if found.sampled:
                sampled.append(node.id)
            if not menu:
                raise SearchError(f"sp.AUTO: the sharding rule of `{node.op}` at {where(node)} refused every layout "
                                  "its operands may take, replicated too; fix the arguments' specs instead of "
                                  "sp.AUTO, and please report it (a rule should take replicated operands)")
        menus.append(menu)
        for k, v in enumerate(node.outputs):
            held[v] = list(dict.fromkeys(s.outputs[k].even_layout for s in menu))
    costs = _costs(graph, menus)
    edges, matrices = _edges(graph, menus, mesh_shape)
    for tie in ties:  # one layout: any other pair of choices forbidden (they have the same candidates, in one order)
        for a, b in zip(tie, tie[1:], strict=False):
            u, v = graph.producer[graph.inputs[a]], graph.producer[graph.inputs[b]]
            edges.append((u, v))
            matrices.append(np.where(np.eye(len(menus[u]), len(menus[v]), dtype=bool), 0.0, FORBIDDEN))
    for k, j in returns:
        value, argument = graph.outputs[k], graph.producer[graph.inputs[j]]
        producer = graph.producer[value]
        out = graph.nodes[producer].outputs.index(value)
        aval = graph.avals[value]
        edges.append((argument, producer))
        matrices.append(np.array([[_move(aval.shape, aval.dtype, made.outputs[out], arg.outputs[0], mesh_items)
                                   for made in menus[producer]] for arg in menus[argument]]))
    intervals, usages = _liveness(graph, menus, mesh_shape)
    problem = Problem(name="program", intervals=intervals, costs=costs, usages=usages,
                      edges=np.asarray(edges, np.int64).reshape(-1, 2), edge_costs=tuple(matrices),
                      usage_limit=usage_limit)
    problem.check()
    return BuiltProblem(problem, graph, tuple(menus), tuple(sampled))


def uneven_argument(graph: Graph, flat_specs, mesh_shape) -> str | None:
    """Why the layout problem cannot hold a fixed argument — its spec splits an axis into blocks that do not divide
    it (the problem's layouts are equal blocks; propagation takes such rows as ranges) — or None."""
    for index, (spec, value) in enumerate(zip(flat_specs, graph.inputs, strict=True)):
        if not isinstance(spec, PartitionSpec):
            continue
        aval = graph.avals[value]
        layout = layout_from_spec(spec, aval.shape, mesh_shape, f"argument {graph.argument_names[index]}",
                                  uneven=True)
        for axis, (size, axes) in enumerate(zip(aval.shape, layout, strict=True)):
            count = math.prod(mesh_shape[m] for m in axes)
            if size % count:
                return (f"argument {graph.argument_names[index]} ({aval}) is fixed as {spec}: axis {axis} ({size}) in "
                        f"{count} blocks that do not divide it, and the layout solve lays values out in equal blocks")
    return None


def _menu_key(graph: Graph, node, options) -> tuple | None:
    """What a node's menu is a function of: what its rule's answers are (``menu.node_signature``) and the layouts its
    operands may be handed. None where that cannot be told (a loop's body: its menu is found for it alone)."""
    signature = node_signature(graph, node)
    return None if signature is None else (signature, options)


def _costs(graph: Graph, menus) -> tuple[np.ndarray, ...]:
    """Each node's strategies' costs; a reduce-scatter of a value the program returns forbidden (a program returns its
    outputs as propagated: none held finer). Nodes sharing a menu (the layers of a stack) share the array."""
    returned = set(graph.outputs)
    alike: dict[tuple, np.ndarray] = {}
    costs = []
    for node, menu in zip(graph.nodes, menus, strict=True):
        key = (id(menu), bool(returned.intersection(node.outputs)))
        if key not in alike:
            alike[key] = np.array([FORBIDDEN if s.scattered and key[1] else s.cost for s in menu], np.float64)
            alike[key].flags.writeable = False
        costs.append(alike[key])
    return tuple(costs)


def _liveness(graph: Graph, menus, mesh_shape) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """Each node's interval (from itself to its outputs' last reader, half-open; an argument's and a returned value's
    to the end) and each strategy's usage (its outputs' blocks, bytes per device)."""
    end = len(graph.nodes) + 1
    last = {v: end for v in graph.outputs}
    for node in graph.nodes:
        for v in node.operands:
            last[v] = max(last.get(v, 0), node.id + 1)
    intervals = np.zeros((len(graph.nodes), 2), np.int64)
    usages = []
    blocks: dict[tuple, int] = {}  # (shape, itemsize, layout) -> bytes of a block: the layers ask alike
    alike: dict[tuple, np.ndarray] = {}  # (menu, outputs' shapes and item sizes) -> usages: a stack's layers share

    def block_bytes(aval, layout) -> int:
        key = (aval.shape, aval.dtype.itemsize, layout)
        if key not in blocks:
            blocks[key] = math.prod(block_shape(aval.shape, layout, mesh_shape)) * aval.dtype.itemsize
        return blocks[key]

    for node, menu in zip(graph.nodes, menus, strict=True):
        start = 0 if node.op == PARAMETER else node.id
        intervals[node.id] = (start, max([last.get(v, node.id + 1) for v in node.outputs] + [start]))
        avals = [graph.avals[v] for v in node.outputs]
        key = (id(menu), tuple((a.shape, a.dtype.itemsize) for a in avals))
        if key not in alike:
            alike[key] = np.array([sum(block_bytes(a, t.even_layout) for a, t in zip(avals, s.outputs, strict=True))
                                   for s in menu], np.float64)
            alike[key].flags.writeable = False
        usages.append(alike[key])
    return intervals, tuple(usages)


def _handed_options(held: list[Layout], shape, mesh_items) -> tuple[Layout, ...]:
    """What an operand may be handed: the layouts its producer can hold it in (first: taken as held), then its own
    candidates (sliced or gathered for the reader), at most ``HANDED_AT_MOST`` of those."""
    extra = [c for c in _candidate_layouts(tuple(shape), mesh_items) if c not in held][:HANDED_AT_MOST]
    return tuple(held) + tuple(extra)


def _edges(graph: Graph, menus, mesh_shape) -> tuple[list[tuple[int, int]], list[np.ndarray]]:
    """One edge per (value, reader): the bytes to bring the value from each held type to each consumed one. A matrix
    is priced between the distinct types its producer's strategies hold the value in and the distinct ways its
    reader's consume it, then spread over the strategies (a menu has many strategies and few such types); nodes alike
    (the layers of a stack share their menus) share their matrices."""
    producer = graph.producer
    mesh_items = tuple(mesh_shape.items())
    edges: list[tuple[int, int]] = []
    matrices: list[np.ndarray] = []
    alike: dict[tuple, np.ndarray] = {}
    tables: dict[tuple, _Prices] = {}  # the moves priced so far, by the values' shape and dtype
    for node in graph.nodes:
        if not node.operands:
            continue
        for v in dict.fromkeys(node.operands):
            slots = tuple(k for k, u in enumerate(node.operands) if u == v)
            p = producer[v]
            out = graph.nodes[p].outputs.index(v)
            aval = graph.avals[v]
            key = (id(menus[p]), out, id(menus[node.id]), slots, aval.shape, str(aval.dtype))
            if key not in alike:
                kind = (aval.shape, str(aval.dtype))
                if kind not in tables:
                    tables[kind] = _Prices(aval.shape, aval.dtype, mesh_items)
                alike[key] = _edge_matrix(menus[p], out, menus[node.id], slots, tables[kind])
            edges.append((p, node.id))
            matrices.append(alike[key])
    return edges, matrices


def _edge_matrix(made_menu, out: int, reader_menu, slots: tuple[int, ...], prices: _Prices) -> np.ndarray:
    """The edge's matrix: rows the producer's strategies, columns the reader's (``_edges``)."""
    haves = {}
    rows = np.array([haves.setdefault(made.outputs[out], len(haves)) for made in made_menu], np.int64)
    reads = {}  # the types a reader consumes the value in (one per slot it reads it in), and where it is tied, as held
    columns = np.array([reads.setdefault((tuple(dict.fromkeys(reader.needs[k] for k in slots)),
                                          reader.handed[slots[0]] if reader.tied else None), len(reads))
                        if not _handed_apart(reader, slots) else -1 for reader in reader_menu], np.int64)
    wanted = {want: k for k, want in enumerate(dict.fromkeys(want for wants, _ in reads for want in wants))}
    price = prices.matrix(list(haves), list(wanted))
    small = np.full((len(haves), len(reads) + 1), FORBIDDEN)
    if all(len(wants) == 1 for wants, _ in reads):  # (a value read once by each strategy: every edge but a few)
        small[:, :-1] = price[:, [wanted[want] for (want,), _ in reads]]
    else:
        for b, (wants, _) in enumerate(reads):
            small[:, b] = price[:, [wanted[want] for want in wants]].sum(axis=1)
    for b, (_, held) in enumerate(reads):  # a tied reader: realized only where the value is held as it was handed
        if held is not None:
            small[[a for a, have in enumerate(haves) if have.even_layout != held], b] = FORBIDDEN
    return small.take(rows, 0).take(columns, 1)


class _Prices:
    """The move planner's bytes between the types of values of one shape and dtype, kept as a table by type: an
    edge's matrix is read from it at once and only the pairs not priced before are planned (a model's edges ask
    about the same few types of each shape again and again: 73,000 pairs on a transformer block, 5,400 distinct)."""

    def __init__(self, shape, dtype, mesh_items):
        self.shape, self.dtype, self.mesh_items = shape, dtype, mesh_items
        self.index: dict[ValueType, int] = {}
        self.table = np.full((0, 0), np.nan)

    def matrix(self, haves: list[ValueType], wants: list[ValueType]) -> np.ndarray:
        """The bytes from each of ``haves`` (rows) to each of ``wants`` (columns)."""
        rows, columns = self._indices(haves), self._indices(wants)
        block = self.table.take(rows, 0).take(columns, 1)
        for a, b in np.argwhere(np.isnan(block)).tolist():
            block[a, b] = self.table[rows[a], columns[b]] = _move(self.shape, self.dtype, haves[a], wants[b],
                                                                  self.mesh_items)
        return block

    def _indices(self, types: list[ValueType]) -> np.ndarray:
        index = self.index
        out = np.array([index.setdefault(t, len(index)) for t in types], np.int64)
        if len(index) > len(self.table):
            grown = np.full((2 * len(index),) * 2, np.nan)
            grown[:len(self.table), :len(self.table)] = self.table
            self.table = grown
        return out


def _handed_apart(reader: NodeStrategy, slots: tuple[int, ...]) -> bool:
    """A reader finished by a collective handed one value in two layouts (``x @ x`` read otherwise on each side):
    its finish reads the value as held (``splitting.strategies.as_handed``), not as the strategy was decided."""
    return reader.collective is not None and len({reader.handed[k] for k in slots}) > 1


@functools.lru_cache(maxsize=262144)
def _move(shape, dtype, have: ValueType, want: ValueType, mesh_items) -> float:
    """The move planner's bytes from ``have`` to ``want``. Between types of equal blocks (no halo, ranged rows or rows
    out of place) every step's bytes are linear in the element count and the item size, and which layouts divide an
    axis depends only on its greatest common divisor with the device count (every block count divides that): the
    plan of ``shape`` is its canonical shape's, the bytes scaled — one plan for the many shapes of a model's values
    (checked equal on every move of the benchmark rows' problems). Nor do the bytes depend on the order of the
    value's axes (every step is one axis's, or two axes' alike): the axes are sorted first, and a value and its
    transposes share one plan (the Llama step's 4,614 canonical moves are 1,324 so: the first search in a process
    plans them all)."""
    if 0 in shape:
        return 0.0
    if not any(t.halo or t.span or t.placement is not None for t in (have, want)):
        devices = math.prod(n for _, n in mesh_items)
        canonical = tuple(math.gcd(n, devices) for n in shape)
        scale = math.prod(shape) // math.prod(canonical) * jx.itemsize(jx.as_dtype(dtype))  # (key<fry> too)
        order = sorted(range(len(shape)), key=lambda a: (canonical[a], have.layout[a], want.layout[a]))
        return _canonical_move(tuple(canonical[a] for a in order), _axes_in(have, order), _axes_in(want, order),
                               mesh_items) * scale
    return move_bytes(shape, dtype, have, want, dict(mesh_items))


def _axes_in(vtype: ValueType, order: list[int]) -> ValueType:
    """``vtype`` (of equal blocks) with its axes in ``order``."""
    return replace(vtype, layout=tuple(vtype.layout[a] for a in order))


@functools.lru_cache(maxsize=65536)
def _canonical_move(shape, have: ValueType, want: ValueType, mesh_items) -> float:
    return move_bytes(shape, np.uint8, have, want, dict(mesh_items))
