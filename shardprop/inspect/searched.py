"""What ``sp.AUTO`` chose, readable: the chosen-layout table (``print(prog.search)``, ``shardprop plan``) and, for
``sp.explain`` of a searched argument, why its layout won and what the others would have cost."""

from __future__ import annotations

from ..expr.graph import short_dtype
from .listing import format_bytes


def format_search(result) -> str:
    """The search's summary line — what it chose, what that costs, and the solver's certificate — and one row per
    searched argument (path, type, chosen spec, decided with)."""
    c = result.chosen
    limit = "" if result.memory_limit is None else f", limit {format_bytes(result.memory_limit)}"
    if result.memory_kept is not None:
        beyond, held = result.memory_limit - result.memory_kept, "as compiled" if c.compiled_memory else "in all"
        limit += (f", the problem's memory kept within {format_bytes(result.memory_kept)}: the limit "
                  f"{'less' if beyond >= 0 else 'plus'} {format_bytes(abs(beyond))}, calibrated on what plans held "
                  f"{held} {'beyond' if beyond >= 0 else 'below'} it")
    compiled = "" if c.compiled_memory is None else f", {format_bytes(c.compiled_memory)} as compiled"
    checks = "" if not result.compiled else (f"; {result.compiled} compiled to check the limit, "
                                             f"{result.compile_seconds:.2f} s")
    solution = result.solution
    what = (f"sp.AUTO chose {len(result.searched)} layout{'' if len(result.searched) == 1 else 's'}" if result.searched
            else "strategy='optimal' solved every value's layout around the arguments' specs")
    lines = [f"{what} in {result.seconds:.2f} s (one solve over {result.values:,} values' layouts, "
             f"{result.strategies:,} strategies{checks}): {format_bytes(c.moved)} moved, "
             f"{format_bytes(c.memory.total)} per device (cost model{compiled}{limit}); "
             + (f"{result.certificate}: price {format_bytes(solution.cost)} (bytes moved and work), "
                + ("at its bound" if result.gap <= 0 else "no bound" if result.status == "the leanest layout" else
                   f"bound {format_bytes(solution.bound)}")
                if not result.walked else
                f"propagation's plan kept: price {format_bytes(c.price)} (bytes moved and work), below the solve's "
                f"optimum {format_bytes(solution.cost)} by moves the solve does not model (a sum deferred past the "
                "ops that keep it partial, rows ranged over uneven blocks)")
             + ("" if not result.returned_moves else f"; the program moves {format_bytes(result.returned_moves)} "
                "more, returning updated state laid out as it came in")]
    if result.sampled:
        why = ("under memory_limit= an op's operands are varied one at a time" if result.memory_limit is not None
               else "their operands' layouts combine in too many ways to ask about each")
        shown = ", ".join(result.sampled[:3]) + (f" and {len(result.sampled) - 3} more" if len(result.sampled) > 3
                                                  else "")
        lines.append(f"  sampled ({why}): {shown}")
    rows = [(r["argument"], f"{short_dtype(leaf.dtype)}[{','.join(map(str, leaf.shape))}]", str(r["spec"]),
             "" if r["with"] is None else f"with {r['with']}")
            for r, leaf in zip(result.rows(), (result.leaves[k] for k in result.searched), strict=True)]
    widths = [max((len(row[i]) for row in rows), default=0) for i in range(3)]
    for row in rows:
        lines.append("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) +
                     (f"  {row[3]}" if row[3] else ""))
    return "\n".join(line.rstrip() for line in lines)


def explain_choice(result, leaf: int, shown: int = 5) -> tuple[str, ...]:
    """Lines for ``sp.explain`` of searched argument ``leaf``: the solver's certificate, then each layout of its group
    with every other value's layout chosen again around it (price, bytes moved, memory per device, what it adds),
    cheapest first, the chosen one marked."""
    group = result.group_of(leaf)
    if group is None:
        return ()
    alternatives = result.alternatives(leaf)
    together = [result.leaves[k].path for k in group if k != leaf]
    head = (f"chosen by the sp.AUTO solve ({result.certificate}) among {len(alternatives)} layouts"
            + (f", decided with {', '.join(together)}" if together else "")
            + " (each with every other layout chosen again around it):")
    return _alternative_lines(head, alternatives, result.chosen, result.solution.cost, shown)


def explain_value_choice(result, value: int, shown: int = 5) -> tuple[str, ...]:
    """Lines for ``sp.explain`` of a value the solve laid out (an intermediate or an output): each layout it could be
    held in, every other value's layout chosen again around it, cheapest first, the chosen one marked."""
    alternatives = result.value_alternatives(value)
    if not alternatives:
        return ()
    head = (f"held so by the layout solve ({result.certificate}); its {len(alternatives)} layouts, each with every "
            "other value's layout chosen again around it:")
    return _alternative_lines(head, alternatives, result.chosen, result.solution.cost, shown)


def _alternative_lines(head: str, alternatives, chosen, cost: float, shown: int) -> tuple[str, ...]:
    """The alternatives' lines: bytes and memory as each plan is realized, what each adds by the problem's cost."""
    lines = [head]
    priced = [a for a in alternatives if a.candidate is not None]
    width = max((len(str(a.spec)) for a in priced[:shown]), default=0)
    for a in priced[:shown]:
        more = a.cost / cost - 1 if cost else 0.0
        mark = ("chosen" if a.candidate is chosen else
                f"{more:+.1%} price" if abs(more) < 0.1 else f"{more:+.0%} price")
        over = "" if not a.candidate.excess else f", over the limit by {format_bytes(a.candidate.excess)}"
        lines.append(f"  {str(a.spec):<{width}}  {format_bytes(a.candidate.moved)} moved, "
                     f"{format_bytes(a.candidate.memory.total)} per device{over}  ({mark})")
    if len(priced) > shown:
        lines.append(f"  ... {len(priced) - shown} more, each dearer")
    if len(priced) < len(alternatives):
        lines.append(f"  {len(alternatives) - len(priced)} with no plan within the limit")
    return tuple(lines)


def search_to_dict(result) -> dict:
    """JSON-ready: the chosen layout of every searched argument, what it costs, and how the search went."""
    def candidate(c) -> dict:
        return {"price": c.price, "moved_bytes": c.moved, "memory": {
            "arguments": c.memory.arguments, "outputs": c.memory.outputs, "temporaries": c.memory.temporaries,
            "aliased": c.memory.aliased, "total": c.memory.total, "compiled": c.compiled_memory}}

    return {
        "chosen": [{**row, "spec": spec_json(row["spec"])} for row in result.rows()],
        **candidate(result.chosen),
        "memory_limit": result.memory_limit, "status": result.status, "cost": result.solution.cost,
        "bound": result.bound, "gap": result.gap, "certificate": result.certificate, "walked": result.walked,
        "sampled": list(result.sampled), "values": result.values,
        "strategies": result.strategies, "seconds": result.seconds, "compiled": result.compiled,
        "compile_seconds": result.compile_seconds, "memory_kept": result.memory_kept,
    }


_SPEC = {"type": "array", "items": {"oneOf": [{"type": "null"}, {"type": "string"},
                                             {"type": "array", "items": {"type": "string"}}]}}


def _fields(properties: dict) -> dict:
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


_COST = {"price": {"type": "number"}, "moved_bytes": {"type": "number", "minimum": 0},
         "memory": _fields({name: {"type": "integer"} for name in ("arguments", "outputs", "temporaries", "aliased",
                                                                   "total")} | {"compiled": {"type": ["integer",
                                                                                                      "null"]}})}
# The JSON schema of ``search_to_dict`` (``sp.to_json``'s ``search``, ``shardprop plan --format json``)
SEARCH_SCHEMA = _fields({
    "chosen": {"type": "array", "items": _fields({
        "argument": {"type": "string"}, "shape": {"type": "array", "items": {"type": "integer"}},
        "dtype": {"type": "string"}, "spec": _SPEC, "with": {"type": ["string", "null"]}})},
    **_COST,
    "memory_limit": {"type": ["integer", "null"]}, "status": {"type": "string"}, "cost": {"type": "number"},
    "bound": {"type": "number"}, "gap": {"type": "number"}, "certificate": {"type": "string"},
    "walked": {"type": "boolean"}, "sampled": {"type": "array", "items": {"type": "string"}},
    "values": {"type": "integer"}, "strategies": {"type": "integer"}, "seconds": {"type": "number"},
    "compiled": {"type": "integer"}, "compile_seconds": {"type": "number"},
    "memory_kept": {"type": ["integer", "null"]},
})


def spec_json(spec) -> list:
    """A PartitionSpec as JSON: one entry per axis, None, a mesh axis name, or a list of names."""
    return [list(e) if isinstance(e, tuple) else e for e in spec]
