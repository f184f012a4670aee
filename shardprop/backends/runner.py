"""The one stage runner: a plan's stages in order, each fed from the arguments and the outputs of earlier stages
as its sources say (Nx's ``Graph.run``). The program and the debugger's stepping and read-outs all route values
through it; only what runs one stage differs — the program's ``shard_map`` under one ``jax.jit``, or the
debugger's stage compiled on its own and timed.

    runner = StageRunner(plan, lambda stage, inputs: fns[stage.id](*inputs))
    outputs = runner(*flat_args)                 # every stage, then the program's flat outputs
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from ..expr import jax_adapter as jx
from ..splitting import Plan, Stage


class StageRunner:
    """Runs ``plan``'s stages with ``run_stage(stage, inputs) -> outputs`` (inputs in ``stage.inputs`` order, outputs
    in ``stage.outputs`` order). Called with the program's flat arguments, it runs every stage and returns the
    program's flat outputs; ``step`` runs one, for a caller that stops between stages."""

    def __init__(self, plan: Plan, run_stage: Callable[[Stage, list], Sequence]):
        self.plan, self.run_stage = plan, run_stage

    def inputs(self, stage: Stage, args: Sequence, results: Mapping[int, Sequence]) -> list:
        """What ``stage`` reads: from the arguments and the outputs of the stages that ran (``results``, by id)."""
        return [args[i.source.index] if i.source.is_argument else results[i.source.stage][i.source.index]
                for i in stage.inputs]

    def step(self, stage: Stage, args: Sequence, results: dict[int, Sequence]) -> Sequence:
        """Run ``stage`` on what it reads, and record its outputs in ``results``."""
        results[stage.id] = self.run_stage(stage, self.inputs(stage, args, results))
        return results[stage.id]

    def outputs(self, args: Sequence, results: Mapping[int, Sequence]) -> list:
        """The program's flat outputs, once every stage has run — each with the weak type ``jax.jit`` gives it (our
        constants are strongly typed NumPy arrays, so ``s * 2`` of a Python scalar ``s`` would come out strong)."""
        outs = [args[s.index] if s.is_argument else results[s.stage][s.index] for s in self.plan.output_sources]
        return [jx.with_weak_type(x, w) for x, w in zip(outs, self.plan.graph.weak_outputs, strict=True)]

    def __call__(self, *args) -> list:
        results: dict[int, Sequence] = {}
        for stage in self.plan.stages:
            self.step(stage, args, results)
        return self.outputs(args, results)
