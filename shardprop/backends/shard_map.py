"""Each stage as one ``jax.shard_map``, and the whole program as the stages called in order.

The program runs under one ``jax.jit`` (see :class:`shardprop.Program`), so XLA moves data between stages
(the gathers: one stage's ``out_specs`` resharded to the next one's ``in_specs``) and can overlap work.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
from jax.sharding import Mesh

from ..expr import jax_adapter as jx
from ..propagation.sharding import layout_to_spec
from ..splitting import Plan, Stage
from .evaluate import run_nodes


def stage_function(plan: Plan, stage: Stage, mesh: Mesh, extra: Sequence[int] = ()) -> Callable:
    """Stage ``stage`` as a ``shard_map``: called with its inputs (``stage.inputs`` order), it returns its
    outputs (``stage.outputs`` order), each laid out as the stage's specs say. A stage ``outside_shard_map``
    runs its nodes on the whole arrays as they are (its layouts are replicated), under the caller's jit.

    ``extra`` (values computed in the stage; the debugger's intermediates) are returned after the outputs,
    each in the layout the plan holds it in."""
    extra = tuple(extra)

    def body(*blocks):
        received = {(i.value, i.layout): blk for i, blk in zip(stage.inputs, blocks, strict=True)}
        local = run_nodes(plan, stage.nodes, received, {})
        return tuple(local[v] for v in stage.outputs + extra)

    if stage.outside_shard_map:
        return body
    out_specs = stage.out_specs + tuple(layout_to_spec(plan.layout(v)) for v in extra)

    # check_vma=False: we bind primitives directly, which skips JAX's automatic pcast insertion; the
    # replication claims in out_specs hold by construction (replicated outputs are computed from gathered or
    # replicated data only).
    return jax.shard_map(body, mesh=mesh, in_specs=stage.in_specs, out_specs=out_specs, check_vma=False)


def program_function(plan: Plan, stage_fns: Sequence[Callable]) -> Callable:
    """The whole program on flat arguments: every stage in order, each fed from the arguments and the outputs
    of earlier stages as the plan's sources say; returns the flat outputs."""

    def run(*flat_args):
        results: list[Sequence[jax.Array]] = []
        for stage, fn in zip(plan.stages, stage_fns, strict=True):
            args = [flat_args[i.source.index] if i.source.is_argument else results[i.source.stage][i.source.index]
                    for i in stage.inputs]
            results.append(fn(*args))
        outs = [flat_args[s.index] if s.is_argument else results[s.stage][s.index] for s in plan.output_sources]
        # Our constants are strongly typed numpy arrays, so `s * 2` of a Python scalar `s` comes out strong;
        # give each output the weak type jax.jit gives it.
        weak = plan.graph.weak_outputs
        return [jx.with_weak_type(x, w) for x, w in zip(outs, weak, strict=True)]

    return run
