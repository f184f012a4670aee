"""``scan``: sharded through when the body provably needs no communication.

The body is traced into its own graph and propagated with the carry, the constants and one slice of the
scanned inputs (axis 0 needed whole) as its inputs. The carry must come out laid out as it went in; when it
does not, the carry layout is coarsened (or refined, if the initial carry can be sliced locally) and the body
propagated again, a few times at most. If the body then needs no gather anywhere, the scan runs per block
inside its stage with those layouts; otherwise it falls back to the conservative rule, with a warning.
``cond`` and ``while`` have no rule: they use the conservative fallback.
"""

from __future__ import annotations

from ...errors import ShardingError
from ...expr import trace_jaxpr
from ..sharding import Sharded, TensorSharding, common_layout, layout_refines
from .fallback import conservative
from .registry import RuleContext, RuleOutput, register


def _needs_no_gather(body) -> bool:
    return all(layout_refines(body.layout(v), need) for node in body.graph.nodes
               for v, need in zip(node.operands, body.needs[node.id], strict=True))


def _sharded_like(ctx: RuleContext, shape, layout, operands) -> TensorSharding:
    """Shards for ``layout`` whose parents are the same-numbered blocks of every operand axis laid out over
    the same mesh axes (what a communication-free body computes each block from)."""
    axes = []
    for k, (n, mesh_axes) in enumerate(zip(shape, layout, strict=True)):
        if not mesh_axes:
            axes.append(None)
            continue
        sources = [a for op in operands for a in op.axes if isinstance(a, Sharded) and a.mesh_axes == mesh_axes]
        axes.append(ctx.derive(k, n, sources) if sources else ctx.root(k, n, mesh_axes))
    return TensorSharding(tuple(shape), tuple(axes))


@register("scan")
def scan(ctx: RuleContext, *operands: TensorSharding, jaxpr, num_consts, num_carry, **params) -> RuleOutput:
    consts, init, xs = operands[:num_consts], operands[num_consts:num_consts + num_carry], \
        operands[num_consts + num_carry:]
    graph = trace_jaxpr(jaxpr)
    carry = [op.layout for op in init]
    body = None
    for _ in range(2 * sum(len(op.shape) for op in init) + 2):
        try:
            body = ctx.propagate_body(graph, [op.layout for op in consts] + carry + [op.layout[1:] for op in xs])
        except ShardingError:
            body = None
            break
        out = [body.layout(v) for v in graph.outputs[:num_carry]]
        if out == carry:
            break
        # Refine where the initial carry can be sliced locally; otherwise keep only what both agree on.
        carry = [o if layout_refines(c_in, o) else common_layout(c_in, o)
                 for c_in, o in zip(carry, out, strict=True)]
    else:
        body = None
    if body is None or not _needs_no_gather(body) or any(
            body.layout(v) != c for v, c in zip(graph.outputs[:num_carry], carry, strict=True)):
        return conservative(ctx, *operands)._replace(fallback=True)
    out_avals = ctx.out_avals
    carry_out = [_sharded_like(ctx, a.shape, layout, operands)
                 for a, layout in zip(out_avals[:num_carry], carry, strict=True)]
    ys = [_sharded_like(ctx, a.shape, ((),) + body.layout(v), operands)
          for a, v in zip(out_avals[num_carry:], graph.outputs[num_carry:], strict=True)]
    needs = tuple(op.layout for op in consts) + tuple(carry) + tuple(((),) + op.layout[1:] for op in xs)
    return RuleOutput(tuple(carry_out + ys), needs, body=body)
