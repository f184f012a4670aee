"""The backward walk: from boxes of some values to the input elements they depend on, one node at a time with
the ``lineage`` piece of each primitive's record (``shardprop.ops.lookup``)."""

from __future__ import annotations

from ...core.boxes import Box, LineageContext, normalize
from ...expr.graph import CONSTANT, PARAMETER, Graph
from ...ops import lookup


def dependencies(graph: Graph, value: int, boxes: list[Box]) -> tuple[dict[int, list[Box]], bool]:
    """The input elements that ``boxes`` of ``value`` depend on: ``({flat input index: boxes}, exact)``.

    One backward walk from ``value``'s producer, visiting each node at most once."""
    return seeded_dependencies(graph, {value: boxes})


def seeded_dependencies(graph: Graph, seeds: dict[int, list[Box]]) -> tuple[dict[int, list[Box]], bool]:
    """``dependencies`` of several values at once (``{value: boxes}``), in one backward walk."""
    regions: dict[int, list[Box]] = {}
    exact = True
    for value, boxes in seeds.items():
        regions[value], seed_exact = normalize(list(boxes))
        exact = exact and seed_exact
    found: dict[int, list[Box]] = {i: [] for i in range(len(graph.inputs))}
    regions = {v: boxes for v, boxes in regions.items() if boxes}
    if not regions:
        return found, exact
    producer, avals = graph.producer, graph.avals
    for node in reversed(graph.nodes[: max(producer[v] for v in regions) + 1]):
        asked = [(k, regions.pop(v)) for k, v in enumerate(node.outputs) if v in regions]
        if not asked:
            continue
        if node.op == PARAMETER:
            found[node.params["index"]] = asked[0][1]
            continue
        if node.op == CONSTANT:
            continue
        ctx = LineageContext(tuple(avals[v].shape for v in node.operands),
                             tuple(avals[v].shape for v in node.outputs), seeded_dependencies)
        op = lookup(node.op)
        per_operand: list[list[Box]] = [[] for _ in node.operands]
        for k, out_boxes in asked:
            for box in out_boxes:
                for i, operand_boxes in enumerate(op.lineage(ctx, box, k, **node.params)):
                    per_operand[i].extend(operand_boxes)
        exact = exact and op.lineage_exact and ctx.exact
        for v, new in zip(node.operands, per_operand, strict=True):
            if new:
                merged, merged_exact = normalize(regions.get(v, []) + new)
                regions[v] = merged
                exact = exact and merged_exact
    return found, exact
