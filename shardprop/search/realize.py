"""A solution of the layout problem (``.build``) made into the program it describes: the arguments laid out as
chosen, every node handed its operands in the layouts its strategy names, every created axis laid out as chosen
(``propagation.propagate.propagate_decided``), then split; ``mismatches`` says where the walk's product is not what
the solution chose (an empty list: realized exactly).

Where the user's own fixed layouts clash at a node — its operands are the arguments the user fixed, and its rule
refuses them as laid out — the node is walked as propagation walks it (no view): the conflict is resolved, and warned
about, or refused under ``conflicts='error'``, as without the search.
"""

from __future__ import annotations

import functools

from ..expr.graph import CONSTANT, PARAMETER
from ..ops import lookup
from ..propagation.propagate import propagate_body, propagate_decided
from ..propagation.uses import View
from .build import BuiltProblem
from .menu import probe


def realize(built: BuiltProblem, solution, mesh, *, graph=None, fixed: frozenset[int] = frozenset(),
            conflicts: str = "reshard"):
    """The ``ShardedGraph`` of ``solution`` (one strategy index per node of ``built.problem``) over ``graph``
    (``built.graph``, or it with nodes appended: constraints returning state). ``fixed``: the flat arguments whose
    layouts the user wrote (a clash among them alone is the user's)."""
    graph = built.graph if graph is None else graph
    chosen = built.chosen(solution)
    held = {}
    for node, strategy in zip(built.graph.nodes, chosen, strict=True):
        for k, v in enumerate(node.outputs):
            held[v] = strategy.laid_out(k)  # (a reduce-scatter is the split's, where every reader slices it)
    inputs = [held[v] for v in graph.inputs]
    clashes = _clashes(built, held, fixed, mesh)
    views = {}
    for node, strategy in zip(built.graph.nodes, chosen, strict=True):
        if node.id in clashes:
            continue
        for k, v in enumerate(node.operands):
            if strategy.handed and strategy.handed[k] != held[v]:
                views[(node.id, k)] = View(strategy.handed[k], held[v], node.id, exact=True)
    created = {(v, k): axes for v, layout in held.items() for k, axes in enumerate(layout) if axes}
    return propagate_decided(graph, inputs, mesh, views=views, created=created, conflicts=conflicts)


def _clashes(built: BuiltProblem, held, fixed: frozenset[int], mesh) -> set[int]:
    """The nodes whose operands are the user's fixed arguments themselves (or constants) and that their rule refuses
    as the user laid them out: a clash of the user's own layouts. A value computed in between has the layout the
    solve chose for it, and a move before its reader is the solve's priced choice, realized exactly (no warning)."""
    graph = built.graph
    users = set()  # values laid out as the user wrote: fixed arguments and constants
    out = set()
    mesh_shape = dict(mesh.shape)
    bodies = functools.partial(propagate_body, mesh=mesh, conflicts="reshard")  # a loop's or a cond's, as build's
    for node in graph.nodes:
        if (node.op == PARAMETER and node.params["index"] in fixed) or node.op == CONSTANT:
            users.update(node.outputs)
            continue
        if len(node.operands) > 1 and all(v in users for v in node.operands) and probe(
                graph, node, lookup(node.op), tuple(held[v] for v in node.operands), mesh_shape, bodies) is None:
            out.add(node.id)
    return out


def mismatches(built: BuiltProblem, solution, sharded) -> list[str]:
    """Where ``sharded`` (``realize``'s) differs from the solution: a node consuming or holding otherwise."""
    out = []
    for node, strategy in zip(built.graph.nodes, built.chosen(solution), strict=True):
        for k, v in enumerate(node.outputs):
            if sharded.layout(v) != strategy.laid_out(k):
                out.append(f"node {node.id} `{node.op}` output {k}: {sharded.layout(v)} != {strategy.laid_out(k)}")
        if strategy.handed and not strategy.collective:
            rule = tuple(sharded.needs[node.id])
            want = tuple(n.even_layout for n in strategy.needs)
            if rule != want:
                out.append(f"node {node.id} `{node.op}` needs {rule} != {want}")
    return out
