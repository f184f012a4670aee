"""The debugger's state: which stages have run, what each returned, and every device's block of any value.

A ``Debugger`` runs a ``shardprop.Program`` the way it runs — stage after stage, each the same
``shard_map`` the program is made of (``backends.stage_function``), but each jitted on its own so it can be
stopped between, timed and read. Intermediates of a stage are the same stage function asked for extra outputs,
each in the layout the plan holds it in: there is no second evaluator of the sharded graph.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import time
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding

from ..backends import jit_stage, parse_hlo, stage_function
from ..backends.runner import StageRunner
from ..backends.shard_map import readout_segments, segment_function, unframed
from ..distributed import assemble, every_block, in_step
from ..errors import NotComputedError, OptionError, StageIndexError
from ..expr import jax_adapter as jx
from ..expr.graph import PARAMETER, value_name
from ..inspect.listing import moves_values, source_name, stage_ops, typed_name
from ..inspect.pictures import device_blocks, device_coords
from ..inspect.products import resolve_value
from ..program import Program, as_lowering_errors
from ..core.layouts import Sharded, layout_to_spec, shard_count
from ..splitting import Stage
from ..splitting.plan import stage_count
from .reports import DeviceBlock, Gathered, Port, StageReport
from ..splitting.ir import Move

KEEP = ("outputs", "all")


def collective(method):
    """Marks a debugger call that runs collectives (stages, gathers). On several processes every process must make
    it at the same point, which is checked on entry (``distributed.in_step``: an ``shardprop.OutOfStepError``
    instead of a deadlock); a call made inside another is covered by the outer one."""
    signature = inspect.signature(method)

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        given = ", ".join(f"{k}={v!r}" for k, v in list(bound.arguments.items())[1:])
        with self.in_step(f"{method.__name__}({given})"):
            return method(self, *args, **kwargs)

    return call


class Session:
    """Running a program's stages one at a time and reading their values (the base of ``Debugger``)."""

    def __init__(self, prog: Program, *args, keep: str = "outputs", **kwargs):
        if not isinstance(prog, Program):
            raise OptionError(f"the debugger runs a Program (fs.trace(*args) or sp.lower(plan)), not "
                              f"{type(prog).__name__}")
        if keep not in KEEP:
            raise OptionError(f"keep={keep!r}: expected 'outputs' (stage outputs only; intermediates are "
                              "recomputed when asked for) or 'all' (every value of every stage run)")
        self.program, self.plan, self.mesh, self.keep = prog, prog.plan, prog.mesh, keep
        self._stepping = False
        with self.in_step(f"Debugger(keep={keep!r})"):  # placing host arguments on several processes is collective
            self.args = prog.placed_args(args, kwargs)  # InputMismatchError for arguments it was not traced with
            prog.agree_on_plan()  # several processes: all step the same stages, or their collectives deadlock
        self._compiled: dict[tuple[int, tuple[int, ...]], Any] = {}
        # The program's routing of values between stages; each stage compiled on its own, timed (see _run).
        self.runner = StageRunner(self.plan, self._run)
        self._timings: dict[int, tuple[float, Any, float]] = {}
        self._breakpoints: dict[int, list[str]] = {}
        self._coords = device_coords(self.mesh)
        self.reset()

    # -- where we are ---------------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget every result: the next step runs stage 0 again (breakpoints are kept)."""
        self._next = 0
        self._results: dict[int, tuple[jax.Array, ...]] = {}
        self._kept: dict[int, jax.Array] = {}
        self._comparers: dict = {}
        self._last_readout: tuple[int | None, dict[int, jax.Array]] = (None, {})
        self.reports: list[StageReport] = []

    @property
    def stage(self) -> int | None:
        """The id of the next stage to run (``prog.stages[dbg.stage]`` is the Stage), or None when done."""
        return None if self.done else self._next

    @property
    def done(self) -> bool:
        return self._next >= len(self.plan.stages)

    @property
    def stages_run(self) -> tuple[Stage, ...]:
        return self.plan.stages[: self._next]

    @contextlib.contextmanager
    def in_step(self, call: str):
        """Around a call that runs collectives: on several processes, every process must make ``call`` here (an
        ``shardprop.OutOfStepError`` otherwise, instead of a deadlock). Calls inside it are not checked again."""
        if self._stepping:
            yield
            return
        in_step(call)
        self._stepping = True
        try:
            yield
        finally:
            self._stepping = False

    # -- stepping -------------------------------------------------------------------------------------
    def step(self) -> StageReport:
        """Run the next stage on its own (its own jitted ``shard_map``) and say what it did. On several processes,
        every process must step too."""
        with self.in_step(f"step() at stage {self._next}"):
            return self._step()

    def _step(self) -> StageReport:
        if not self.plan.stages:
            raise NotComputedError("this program has no stages: its outputs are its arguments")
        if self.done:
            raise NotComputedError(f"all {stage_count(len(self.plan.stages))} have run; dbg.reset() starts again")
        stage = self.plan.stages[self._next]
        outs = self.runner.step(stage, self.args, self._results)
        seconds, compiled, compile_time = self._timings.pop(stage.id)
        kept = self.readout(stage, outs) if self.keep == "all" else {}
        report = self._report(stage, seconds, compiled, compile_time)
        self._kept.update(kept)
        self.reports.append(report)
        self._next += 1
        return report

    @collective
    def run_to(self, k: int) -> list[StageReport]:
        """Run every stage before stage ``k`` (``dbg.stage == k`` afterwards; ``k = len(prog.stages)`` runs to
        the end). A ``k`` behind the current stage starts again from stage 0."""
        count = len(self.plan.stages)
        if isinstance(k, bool) or not isinstance(k, int | np.integer) or not 0 <= k <= count:
            raise StageIndexError(f"no stage {k!r}: this program has {stage_count(count)} (run_to({count}) runs to "
                                  "the end)")
        if k < self._next:
            self.reset()
        return [self.step() for _ in range(self._next, k)]

    @collective
    def run(self) -> list[StageReport]:
        """Run stages to the end, or until the next stage is one with a breakpoint (at least one stage runs,
        unless every stage has run already: then nothing runs)."""
        if self.done:
            return []
        reports = [self.step()]
        while not self.done and self._next not in self._breakpoints:
            reports.append(self.step())
        return reports

    def break_at(self, name: Any) -> int:
        """Stop ``run()`` before the stage that computes ``name`` (a listing name such as ``"e"``, a value id or
        a Node); returns that stage's id. As in pdb, ``run()`` always runs the stage it stands before: a
        breakpoint on the stage about to run stops the *next* time it is reached (after ``reset()``)."""
        v = resolve_value(self.plan, name)
        node = self.plan.graph.nodes[self.plan.graph.producer[v]]
        if node.op == PARAMETER:
            raise OptionError(f"{value_name(v)} is argument {node.params['index']}: no stage computes it (it is "
                              "readable before stage 0)")
        stage = self.plan.stage_of(node.id)
        self._breakpoints.setdefault(stage, []).append(value_name(v))
        return stage

    def clear_breakpoints(self) -> None:
        self._breakpoints.clear()

    @property
    def breakpoints(self) -> dict[int, list[str]]:
        """``{stage id: [names]}``: the stages ``run()`` stops before, and the names that put them there."""
        return {k: list(v) for k, v in self._breakpoints.items()}

    @property
    def outputs(self) -> Any:
        """The program's outputs once every stage has run: what ``prog(*args)`` returns (pytree, shardings)."""
        if not self.done:
            raise NotComputedError(f"stages {self._next} to {len(self.plan.stages) - 1} have not run yet; "
                                   "dbg.run() runs them")
        flat = self.runner.outputs(self.args, self._results)
        return jax.tree_util.tree_unflatten(self.plan.graph.out_tree, flat)

    # -- values and blocks ----------------------------------------------------------------------------
    def value(self, name: Any) -> jax.Array:
        """The global value of ``name`` (stage output or intermediate) as the program holds it on the mesh: a
        ``jax.Array`` laid out as the plan says, each device holding the block it computed."""
        return self.held(resolve_value(self.plan, name))

    def blocks(self, name: Any, all_processes: bool = False) -> list[DeviceBlock]:
        """Every device's block of ``name``, in mesh order: device id, mesh coordinates, the global index
        ranges its shards name, and the block itself (they reassemble to ``value(name)``; a value the plan holds as a
        partial sum is read out summed, so the devices of a summing group show the same block). On a mesh spanning
        several processes, the blocks of this process's devices; ``all_processes=True`` gathers the others' too
        (then every process must call it)."""
        v = resolve_value(self.plan, name)
        return self.device_blocks(v, self.held(v), all_processes=all_processes)

    def device_blocks(self, v: int, array: jax.Array, all_processes: bool = False) -> list[DeviceBlock]:
        """``array`` (value ``v``) cut into the blocks each device holds, as the plan lays it out: this process's
        devices', or with ``all_processes`` every device's (gathered from the other processes: every process
        must call it, in the same order — the debugger's analyses do)."""
        if all_processes:
            return self.gathered({v: array})[v].blocks
        array = self.laid_out(v, array)
        return self._cut(v, {int(s.device.id): s.data for s in array.addressable_shards})

    def gathered(self, values: dict[int, jax.Array]) -> dict[int, Gathered]:
        """For each ``{value: array}``, its global value and every device's block, on every process: one gather
        for all of them on several processes (every process must call it, with the same values), none on one."""
        laid = {v: self.laid_out(v, x) for v, x in values.items()}
        names = ", ".join(value_name(v) for v in list(laid)[:4]) + (", ..." if len(laid) > 4 else "")
        with self.in_step(f"blocks of {names} from every process"):
            blocks = every_block(list(laid.values()), self.mesh)
        devices = [int(d.id) for d in self.mesh.devices.flat]
        return {v: Gathered(assemble(x, b), self._cut(v, dict(zip(devices, b, strict=True))))
                for (v, x), b in zip(laid.items(), blocks, strict=True)}

    def laid_out(self, v: int, array: jax.Array) -> jax.Array:
        """``array`` on the program's mesh in the layout the plan holds value ``v`` in (a stage outside shard_map
        leaves its outputs' layout to XLA)."""
        wanted = NamedSharding(self.mesh, layout_to_spec(self.plan.layout(v)))
        if isinstance(array.sharding, NamedSharding) and array.sharding.mesh == self.mesh \
                and array.sharding.is_equivalent_to(wanted, array.ndim):
            return array
        with self.in_step(f"blocks of {value_name(v)} (laid out as the plan holds it)"):
            return jax.device_put(array, wanted)

    def _cut(self, v: int, held: dict[int, Any]) -> list[DeviceBlock]:
        """The blocks in ``held`` (``{device id: block}``) as DeviceBlocks, in mesh order. A ranged value's blocks
        are each device's real rows (its shard's range, possibly empty), cut from the whole axis it was laid out
        with."""
        vtype = self.plan.type(v)
        layout = vtype.layout if vtype.span else self.plan.layout(v)
        index_of = device_blocks(self.mesh, layout)
        out = []
        for d, data in ((int(device.id), held.get(int(device.id))) for device in self.mesh.devices.flat):
            if data is None:
                continue
            ranges = self.block_ranges(v, index_of[d], layout)
            if vtype.span:
                data = data[tuple(slice(a, b) if span is not None else slice(None)
                                  for (a, b), span in zip(ranges, vtype.span, strict=True))]
            out.append(DeviceBlock(d, self._coords[d], ranges,
                                   data if jx.is_extended_dtype(data.dtype) else np.asarray(data)))
        return out

    def block_ranges(self, v: int, block: Sequence[int], layout=None) -> tuple[tuple[int, int], ...]:
        """The global ``(start, stop)`` per axis of block ``block`` of value ``v``: from its shards where the
        plan holds it as propagated (a ranged axis's: each device's real rows), else equal blocks of the layout it is
        held in (a reduce-scatter's)."""
        sharding = self.plan.sharded.shardings[v]
        layout = layout or self.plan.layout(v)
        ranges = []
        for size, axis, mesh_axes, b in zip(sharding.shape, sharding.axes, layout, block, strict=True):
            if isinstance(axis, Sharded) and axis.mesh_axes == mesh_axes:
                shard = axis.shards[b]
                ranges.append((shard.start, shard.stop))
            else:
                length = size // shard_count(self.plan.mesh_shape, mesh_axes)
                ranges.append((b * length, (b + 1) * length))
        return tuple(ranges)

    def computed(self) -> Iterator[tuple[int, jax.Array]]:
        """``(value, array)`` for every value computed so far, in program order: the arguments, then each stage
        run, node by node. Intermediates not kept are recomputed a stage at a time (one extra compile each)."""
        for values in self.computed_by_stage():
            yield from values.items()

    def computed_by_stage(self) -> Iterator[dict[int, jax.Array]]:
        """``computed`` a group at a time, ``{value: array}`` in program order: the arguments, then each stage
        run (an analysis gathers a group at once)."""
        yield dict(zip(self.plan.graph.inputs, self.args, strict=True))
        graph = self.plan.graph
        for stage in self.stages_run:
            values = self.stage_values(stage)
            yield {v: values[v] for n in stage.nodes for v in graph.nodes[n].outputs}

    def stage_values(self, stage: Stage) -> dict[int, jax.Array]:
        """Every value stage ``stage`` computes (it must have run): kept (``keep="all"``), or read out again."""
        if stage.id not in self._results:
            raise NotComputedError(f"stage {stage.id} has not run yet (next: stage {self._next})")
        if self.keep == "all":
            return {v: self._kept[v] for v in self.readout_values(stage)}
        if self._last_readout[0] != stage.id:  # one stage's intermediates at a time
            with self.in_step(f"reading out stage {stage.id}'s intermediates"):
                self._last_readout = (stage.id, self.readout(stage))
        return self._last_readout[1]

    def readout_values(self, stage: Stage) -> tuple[int, ...]:
        """The values stage ``stage`` computes (every output of its nodes), in program order."""
        graph = self.plan.graph
        return tuple(v for n in stage.nodes for v in graph.nodes[n].outputs)

    def readout(self, stage: Stage, outputs: Sequence[jax.Array] | None = None) -> dict[int, jax.Array]:
        """Run stage ``stage`` again as segments (``backends.readout_segments``) that return every value it
        computes, each laid out as the plan holds it (a partial sum read out summed); its inputs are the arrays
        earlier stages left. The stage's outputs are those its step returned (``outputs``, in ``stage.outputs``
        order; default: the kept ones), also where a later segment reads them, so every analysis sees what
        ``value()`` shows."""
        if outputs is None:
            outputs = self.stage_outputs(stage)
        returned = dict(zip(stage.output_refs, outputs, strict=True))
        refs = {i.ref: x for i, x in zip(stage.inputs, self.stage_inputs(stage), strict=True)}
        values: dict[int, jax.Array] = {}
        for k, segment in enumerate(readout_segments(self.plan, stage)):
            args = [refs[r] for r in segment.inputs] + [returned.get(r, refs.get(r)) for r in segment.carried]
            key = ("readout", stage.id, k)
            if key not in self._compiled:
                fn = jit_stage(stage, segment_function(self.plan, stage, segment, self.mesh), self.mesh,
                               [r.type.layout for r in segment.outputs])
                self._compiled[key] = (as_lowering_errors(lambda f=fn, a=args: f.lower(*a).compile(),
                                                          mesh=self.mesh), 0.0)
            results = as_lowering_errors(self._compiled[key][0], *args, mesh=self.mesh)
            refs.update(zip(segment.outputs, results, strict=True))
            values.update((ref.value, unframed(x, ref.type, self.plan.graph.avals[ref.value].shape,
                                               self.plan.mesh_shape) if ref.type.span else x)
                          for ref, x in zip(segment.outputs[:len(segment.values)], results, strict=False))
        values.update(self.held_outputs(stage, outputs))
        return values

    def stage_at(self, k: Any) -> Stage:
        """Stage ``k`` of the program (a ``StageIndexError`` naming the range otherwise)."""
        return self.plan.stage_at(k)

    def stage_outputs(self, stage: Stage) -> tuple[jax.Array, ...]:
        """What stage ``stage`` returned (it must have run)."""
        if stage.id not in self._results:
            raise NotComputedError(f"stage {stage.id} has not run yet (next: stage {self._next})")
        return self._results[stage.id]

    # -- inside -----------------------------------------------------------------------------------------
    def stage_inputs(self, stage: Stage) -> list[jax.Array]:
        """The arrays stage ``stage`` reads (its inputs in order, as the earlier stages left them)."""
        missing = sorted({i.source.stage for i in stage.inputs if not i.source.is_argument} - set(self._results))
        if missing:
            raise NotComputedError(f"stage {stage.id} reads stage {missing[0]}, which has not run yet")
        return self.runner.inputs(stage, self.args, self._results)

    def held(self, v: int):
        """Value ``v`` as the debugger holds it (an intermediate not kept: its stage read out again)."""
        graph = self.plan.graph
        node = graph.nodes[graph.producer[v]]
        if node.op == PARAMETER:
            return self.args[node.params["index"]]
        stage_id = self.plan.stage_of(node.id)
        if stage_id >= self._next:
            raise NotComputedError(f"{value_name(v)} is computed by stage {stage_id}, which has not run yet "
                                   f"(the next stage to run is stage {self._next})")
        stage = self.plan.stages[stage_id]
        outputs = self.held_outputs(stage, self._results[stage_id])
        return outputs[v] if v in outputs else self.stage_values(stage)[v]

    def held_outputs(self, stage: Stage, arrays) -> dict[int, jax.Array]:
        """``{value: array}`` of the stage outputs (``arrays``, in ``stage.outputs`` order) that are values as the
        plan holds them (a stage may also output a value it moved, for a later stage to take)."""
        return {ref.value: x for ref, x in zip(stage.output_refs, arrays, strict=True)
                if ref.type == self.plan.type(ref.value)}

    def compiled_stage(self, stage: Stage):
        """Stage ``stage`` compiled for its inputs: ``(compiled, seconds it took)``."""
        if stage.id not in self._compiled:
            inputs = self.stage_inputs(stage)
            start = time.perf_counter()
            fn = jit_stage(stage, stage_function(self.plan, stage, self.mesh), self.mesh)
            compiled = as_lowering_errors(lambda: fn.lower(*inputs).compile(), mesh=self.mesh)
            self._compiled[stage.id] = (compiled, time.perf_counter() - start)
        return self._compiled[stage.id]

    def _run(self, stage: Stage, inputs: list) -> tuple:
        """Run ``stage`` on ``inputs`` compiled on its own, timed (the runner's ``run_stage``; the timing waits in
        ``_timings`` for the step's report)."""
        compiled, compile_time = self.compiled_stage(stage)
        start = time.perf_counter()
        results = as_lowering_errors(compiled, *inputs, mesh=self.mesh)
        jax.block_until_ready(results)
        self._timings[stage.id] = (time.perf_counter() - start, compiled, compile_time)
        return tuple(results)

    def _report(self, stage: Stage, seconds: float, compiled, compile_time: float) -> StageReport:
        plan = self.plan
        graph = plan.graph
        inputs = []
        for i in stage.inputs:
            moves = [m for m in stage.instructions if isinstance(m, Move) and m.result.value == i.value
                     and m.transfer is not None and graph.producer[i.value] not in stage.nodes]
            inputs.append(Port(value_name(i.value), typed_name(plan, i.value, i.layout), str(layout_to_spec(i.layout)),
                               source_name(plan, i.source), ", then ".join(str(m.step) for m in moves),
                               sum(m.transfer.moved_bytes for m in moves)))
        outputs = [Port(value_name(v), typed_name(plan, v, layout), str(layout_to_spec(layout)))
                   for v, layout in zip(stage.outputs, stage.out_layouts, strict=True)]
        ops = tuple(stage_ops(plan, stage))
        transfers = tuple(parse_hlo(compiled.as_text(), self.mesh))
        return StageReport(stage.id, ops, tuple(inputs), tuple(outputs), seconds, compile_time, transfers,
                           stage.outside_shard_map, moves_values(stage))
