"""Reading a program's sharded IR in tests: which moves and collectives it makes (observable facts the assertions
compare with the compiled HLO or with what the plan promises)."""

from __future__ import annotations

from shardprop.splitting.ir import Compute, Finish, Move


def instructions(prog, bodies: bool = True):
    """Every instruction of every stage, in order; with ``bodies``, each loop's and cond's bodies' after it."""
    out = []

    def walk(items):
        for instruction in items:
            out.append(instruction)
            if bodies and isinstance(instruction, Compute):
                for body in instruction.bodies or ():
                    walk(body.instructions)

    for stage in prog.plan.stages:
        walk(stage.instructions)
    return out


def steps(prog, bodies: bool = True, sending: bool = True) -> list[tuple[str, tuple[str, ...]]]:
    """``(step kind, mesh axes)`` of every move (only those that send something, with ``sending``) and
    ``(collective kind, mesh axes)`` of every finish."""
    out = []
    for instruction in instructions(prog, bodies):
        if isinstance(instruction, Move) and (instruction.transfer is not None or not sending):
            out.append((str(instruction.step.kind), instruction.step.mesh_axes))
        elif isinstance(instruction, Finish):
            out.append((str(instruction.kind), instruction.mesh_axes))
    return out


def finishes(prog, node_id: int):
    """The instructions that finish node ``node_id``'s results (a psum, a reduce-scatter, a ``Finish``)."""
    ir = prog.plan.node_ir(node_id)
    return () if ir is None else ir.finishes


def held_partial(prog) -> list[int]:
    """The values the plan holds as partial sums (their psum waits for a later value)."""
    plan = prog.plan
    return [v for v in range(len(plan.graph.avals)) if plan.type(v).partial]
