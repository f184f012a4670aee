"""Each stage as one ``jax.shard_map``, and the whole program as the stages called in order.

The program runs under one ``jax.jit`` (see :class:`shardprop.Program`), so XLA moves data between stages
(the gathers: one stage's ``out_specs`` resharded to the next one's ``in_specs``) and can overlap work.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import jax
from jax import lax
from jax.sharding import Mesh

from ..expr import jax_adapter as jx
from ..core.layouts import layout_to_spec, received_layout
from ..splitting import Plan, Stage, StageInput
from .evaluate import run_nodes


def stage_function(plan: Plan, stage: Stage, mesh: Mesh) -> Callable:
    """Stage ``stage`` as a ``shard_map``: called with its inputs (``stage.inputs`` order), it returns its
    outputs (``stage.outputs`` order), each laid out as the stage's specs say. A stage ``outside_shard_map``
    runs its nodes on the whole arrays as they are (its layouts are replicated), under the caller's jit."""
    return _stage_part(plan, stage, mesh, stage.nodes, stage.inputs, (), stage.outputs, stage.out_layouts)


def _stage_part(plan: Plan, stage: Stage, mesh: Mesh, nodes: Sequence[int], inputs: Sequence[StageInput],
                carried: Sequence[int], outputs: Sequence[int], out_layouts: Sequence) -> Callable:
    """Nodes ``nodes`` of ``stage`` as a ``shard_map`` that reads ``inputs`` (stage inputs, as delivered) and
    ``carried`` (values computed earlier in the stage, as held) and returns ``outputs`` laid out as
    ``out_layouts``."""

    producer = plan.graph.producer

    def body(*blocks):
        received = {(i.value, i.layout): blk for i, blk in zip(inputs, blocks[:len(inputs)], strict=True)}
        local = run_nodes(plan, nodes, received, dict(zip(carried, blocks[len(inputs):], strict=True)))
        # A value left a partial sum (its psum waits for a later node) is read out summed: what it is. Only the
        # debugger's read-out returns one; a stage never outputs it (its chain runs within the stage).
        return tuple(local[v] if producer[v] not in plan.pending else
                     lax.psum(local[v], plan.pending[producer[v]].mesh_axes) for v in outputs)

    if stage.outside_shard_map:
        return body
    in_specs = (*(layout_to_spec(i.layout) for i in inputs), *(layout_to_spec(plan.layout(v)) for v in carried))
    out_specs = tuple(layout_to_spec(layout) for layout in out_layouts)

    # check_vma=False: we bind primitives directly, which skips JAX's automatic pcast insertion; the
    # replication claims in out_specs hold by construction (replicated outputs are computed from gathered or
    # replicated data only).
    return jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)


# Nodes per read-out segment. XLA's compile time grows faster than linearly with the number of values one
# computation returns (on CPU: ~0.5 ms a value up to a few thousand, then much more), and reading every value
# of a 10^4-node stage out of one computation took minutes; segments keep it linear.
READOUT_NODES = 512


@dataclass(frozen=True)
class Segment:
    """A run of a stage's nodes that returns every value it computes: it reads ``inputs`` (the stage inputs
    it needs) and ``carried`` (values of earlier segments, as held) and returns ``outputs``, as held."""

    nodes: tuple[int, ...]
    inputs: tuple[StageInput, ...]
    carried: tuple[int, ...]
    outputs: tuple[int, ...]


def readout_segments(plan: Plan, stage: Stage, size: int | None = None) -> list[Segment]:
    """Stage ``stage`` cut into segments of at most ``size`` nodes (default :data:`READOUT_NODES`) whose
    outputs are every value it computes (the debugger's intermediates), each in the layout the plan holds it in."""
    graph = plan.graph
    size = size or READOUT_NODES
    delivered = {(i.value, i.layout): i for i in stage.inputs}
    produced_in: dict[int, int] = {}
    chunks = _chunks(plan, stage.nodes, size) or [()]
    segments = []
    for k, chunk in enumerate(chunks):
        inputs: dict[tuple, StageInput] = {}
        carried: dict[int, None] = {}
        outputs = []
        for n in chunk:
            node = graph.nodes[n]
            for v, need in plan.edges(node):
                where = produced_in.get(v)
                if where is None:
                    key = (v, received_layout(plan.layout(v), need))
                    inputs.setdefault(key, delivered[key])
                elif where < k:
                    carried.setdefault(v)
            for v in node.outputs:
                produced_in[v] = k
                outputs.append(v)
        segments.append(Segment(tuple(chunk), tuple(inputs.values()), tuple(carried), tuple(outputs)))
    return segments


def _chunks(plan: Plan, nodes: tuple[int, ...], size: int) -> list[tuple[int, ...]]:
    """``nodes`` in runs of about ``size``, a run extended so that it also holds the finisher of every partial sum
    it starts (a partial value is never carried between segments, where it would be taken as whole)."""
    position = {n: k for k, n in enumerate(nodes)}
    chunks, start = [], 0
    while start < len(nodes):
        end = min(start + size, len(nodes))
        k = start
        while k < end:
            pending = plan.pending.get(nodes[k])
            if pending is not None:
                end = max(end, position[pending.finisher] + 1)
            k += 1
        chunks.append(nodes[start:end])
        start = end
    return chunks


def segment_function(plan: Plan, stage: Stage, segment: Segment, mesh: Mesh) -> Callable:
    """``segment`` of ``stage`` as a ``shard_map`` (see :class:`Segment`); called with its inputs, then its
    carried values."""
    return _stage_part(plan, stage, mesh, segment.nodes, segment.inputs, segment.carried, segment.outputs,
                       [plan.layout(v) for v in segment.outputs])


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
