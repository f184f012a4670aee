"""Each stage as one ``jax.shard_map`` running its sharded IR, and the whole program as the stages in order.

The program runs under one ``jax.jit`` (see ``shardprop.Program``). Every layout change is a move of the IR,
run inside a stage's ``shard_map``; between stages, each value passes in the layout its source made it in, so XLA
has nothing to reshard.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding

from ..core.layouts import block_shape, layout_to_spec
from ..core.subaxes import is_whole
from ..core.types import ValueType
from ..expr import jax_adapter as jx
from ..splitting import Plan, Stage
from ..splitting.ir import Compute, Instruction, Ref, reads, results
from .evaluate import run_instructions
from .runner import StageRunner


def stage_function(plan: Plan, stage: Stage, mesh: Mesh) -> Callable:
    """Stage ``stage`` as a ``shard_map``: called with its inputs (``stage.inputs`` order), it returns its
    outputs (``stage.outputs`` order), each laid out as the stage's specs say. A stage ``outside_shard_map``
    runs its nodes on the whole arrays as they are (its layouts are replicated), under the caller's jit."""
    return instructions_function(plan, stage, mesh, stage.instructions, [i.ref for i in stage.inputs],
                                 stage.output_refs)


def jit_stage(stage: Stage, fn: Callable, mesh: Mesh, out_layouts: Sequence | None = None):
    """``fn`` (stage ``stage``'s function, or a part of it returning ``out_layouts``) under a ``jax.jit`` of its
    own, to run the stage alone. Left to itself, XLA places what a stage outside shard_map returns as it likes (a
    host callback's result on one device, claimed on all), which the next stage's ``shard_map`` cannot take: such
    outputs are held as the plan says, on the mesh."""
    if not stage.outside_shard_map:
        return jax.jit(fn)
    layouts = stage.out_layouts if out_layouts is None else out_layouts
    return jax.jit(fn, out_shardings=tuple(NamedSharding(mesh, layout_to_spec(layout)) for layout in layouts))


def instructions_function(plan: Plan, stage: Stage, mesh: Mesh, instructions: Sequence[Instruction],
                          inputs: Sequence[Ref], outputs: Sequence[Ref]) -> Callable:
    """``instructions`` of ``stage`` as a ``shard_map`` reading the blocks of ``inputs`` and returning those of
    ``outputs`` — a partial one summed (the debugger reads a partial value out as what it is; a stage never
    outputs one)."""
    graph, mesh_shape = plan.graph, plan.mesh_shape

    def body(*blocks):
        env = run_instructions(graph, mesh_shape, instructions, dict(zip(inputs, blocks, strict=True)))
        return tuple(lax.psum(env[r], r.type.partial) if r.type.partial else env[r] for r in outputs)

    if stage.outside_shard_map:
        return body
    # An empty value (a zero-length axis: a gradient's pad of nothing, a split's empty piece) holds no data: it is
    # made where it is read, never passed. Shardy takes an empty operand of a manual computation for a constant
    # and refuses a body none of whose operands is a block it cut ("expected at least one operand ... produced by
    # a GlobalToLocalShape"), under a caller's jit.
    avals = graph.avals

    def frame(r: Ref) -> tuple[int, ...]:  # the global shape its blocks make up
        return r.type.frame(avals[r.value].shape, mesh_shape)

    def passed(r: Ref) -> bool:  # (an empty array of PRNG keys has no zeros to make: passed as it is)
        return bool(math.prod(frame(r))) or jx.is_extended_dtype(avals[r.value].dtype)

    passed_in, passed_out = [r for r in inputs if passed(r)], [r for r in outputs if passed(r)]

    def blocks_body(*blocks):
        given = dict(zip(passed_in, blocks, strict=True))
        made = (given[r] if r in given else jnp.zeros(block_shape(frame(r), r.type.layout, mesh_shape),
                                                       avals[r.value].dtype) for r in inputs)
        outs = dict(zip(outputs, body(*made), strict=True))
        return tuple(outs[r] for r in passed_out)

    # check_vma=False: we bind primitives directly, which skips JAX's automatic pcast insertion; the
    # replication claims in out_specs hold by construction (replicated outputs are computed from gathered or
    # replicated data only).
    mapped = jax.shard_map(blocks_body, mesh=mesh, in_specs=tuple(layout_to_spec(r.type.layout) for r in passed_in),
                           out_specs=tuple(layout_to_spec(r.type.layout) for r in passed_out), check_vma=False)

    def stage_blocks(*values):
        given = dict(zip(inputs, values, strict=True))
        got = dict(zip(passed_out, mapped(*(given[r] for r in passed_in)) if passed_out else (), strict=True))
        return tuple(got[r] if r in got else jnp.zeros(frame(r), avals[r.value].dtype) for r in outputs)

    return stage_blocks


# Instructions per read-out segment. XLA's compile time grows faster than linearly with the number of values one
# computation returns (on CPU: ~0.5 ms a value up to a few thousand, then much more), and reading every value
# of a 10^4-node stage out of one computation took minutes; segments keep it linear.
READOUT_NODES = 512


@dataclass(frozen=True)
class Segment:
    """A run of a stage's instructions that returns every value it computes (as the plan holds it): it reads
    ``inputs`` (stage inputs) and ``carried`` (refs earlier segments made) and returns ``outputs`` — the held refs
    of the values it computes (``values``), then the refs later segments read."""

    instructions: tuple[Instruction, ...]
    inputs: tuple[Ref, ...]
    carried: tuple[Ref, ...]
    values: tuple[int, ...]
    outputs: tuple[Ref, ...]


def readout_segments(plan: Plan, stage: Stage, size: int | None = None) -> list[Segment]:
    """Stage ``stage``'s instructions cut into segments of about ``size`` (default ``READOUT_NODES``) whose
    outputs are every value it computes (the debugger's intermediates), each in the type the plan holds it in."""
    chunks = _chunks(stage.instructions, size or READOUT_NODES, plan.mesh_shape) or [()]
    stage_inputs = {i.ref for i in stage.inputs}
    made_in: dict[Ref, int] = {}
    for k, chunk in enumerate(chunks):
        for instruction in chunk:
            for ref in results(instruction):
                made_in.setdefault(ref, k)
    needed_later: list[dict[Ref, None]] = [{} for _ in chunks]
    reads_of: list[dict[Ref, None]] = [{} for _ in chunks]
    for k, chunk in enumerate(chunks):
        for instruction in chunk:
            for ref in reads(instruction):
                where = made_in.get(ref)
                if where is not None and where < k:
                    needed_later[where].setdefault(ref)
                reads_of[k].setdefault(ref)
    segments = []
    for k, chunk in enumerate(chunks):
        values = tuple(dict.fromkeys(r.value for i in chunk if isinstance(i, Compute) for r in i.outputs))
        held = tuple(Ref(v, plan.type(v)) for v in values)
        inputs = tuple(r for r in reads_of[k] if r in stage_inputs and made_in.get(r, k) >= k)
        carried = tuple(r for r in reads_of[k] if made_in.get(r, k) < k)
        segments.append(Segment(tuple(chunk), inputs, carried, values, held + tuple(needed_later[k])))
    return segments


def unframed(x, vtype: ValueType, shape: tuple[int, ...], mesh_shape) -> jax.Array:
    """A value read out in a ranged type (``x``: the frame its blocks make up, ``count * block`` rows along each
    ranged axis, device ``d``'s rows at ``[d * block, (d + 1) * block)``) as the value itself: row ``r`` is frame row
    ``r + offset``, or the span's fill where no device holds it."""
    for k, span in enumerate(vtype.span):
        if span is None:
            continue
        frame = x.shape[k]
        index = np.arange(shape[k]) + span.offset
        held = (index >= 0) & (index < frame)
        x = jnp.take(x, np.clip(index, 0, frame - 1), axis=k)
        if span.fill is not None and not held.all():
            mask = held.reshape(tuple(-1 if j == k else 1 for j in range(x.ndim)))
            x = jnp.where(mask, x, jnp.asarray(span.fill, x.dtype))
    return x


def _chunks(instructions: Sequence[Instruction], size: int, mesh_shape) -> list[tuple[Instruction, ...]]:
    """``instructions`` in runs of about ``size``, a run extended until no pending value it made (partial, or
    placed) is still to be read (one is never carried between segments, where it would be taken as whole and in
    place), nor a move's intermediate laid out over a sub-axis (``i[minor 2]``: no spec names one)."""
    last_read: dict[Ref, int] = {}
    for k, instruction in enumerate(instructions):
        for ref in reads(instruction):
            last_read[ref] = k
    chunks, start, open_until = [], 0, -1
    for k, instruction in enumerate(instructions):
        for ref in results(instruction):
            if ref.type.pending or not all(is_whole(m, mesh_shape) for m in ref.type.layout):
                open_until = max(open_until, last_read.get(ref, k))
        if k + 1 - start >= size and k >= open_until:
            chunks.append(tuple(instructions[start:k + 1]))
            start = k + 1
    if start < len(instructions):
        chunks.append(tuple(instructions[start:]))
    return chunks


def segment_function(plan: Plan, stage: Stage, segment: Segment, mesh: Mesh) -> Callable:
    """``segment`` of ``stage`` as a ``shard_map`` (see ``Segment``); called with its inputs, then its
    carried refs."""
    return instructions_function(plan, stage, mesh, segment.instructions, segment.inputs + segment.carried,
                                 segment.outputs)


def program_function(plan: Plan, stage_fns: Sequence[Callable]) -> Callable:
    """The whole program on flat arguments: every stage in order (the ``.runner.StageRunner``), returning the
    flat outputs."""
    return StageRunner(plan, lambda stage, inputs: stage_fns[stage.id](*inputs))
