"""Running the sharded IR on per-device blocks: the body of every stage's ``shard_map``, and of every sharded loop
or cond.

``run_instructions`` walks a list of ``shardprop.splitting.ir`` instructions over an environment of
blocks keyed by ``shardprop.splitting.ir.Ref``: a ``Compute`` evaluates its node with its primitive's
``per_block`` piece, a ``Move`` runs one planned step (``backends/moves.py``), a ``Finish`` combines a reduction's
partial extremes (``backends/finish.py``). There is no other evaluator of the sharded graph.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import jax.numpy as jnp

from ..core.blocks import Blocks
from ..core.layouts import block_shape
from ..errors import LoweringError
from ..expr.graph import CONSTANT, Graph, where
from ..ops import finish_geometry, lookup
from ..splitting.ir import BodyProgram, Compute, Finish, Move, Ref
from .finish import finish_extreme
from .moves import apply_step


def run_instructions(graph: Graph, mesh_shape: Mapping[str, int], instructions, env: dict[Ref, object],
                     hook=None) -> dict[Ref, object]:
    """Run ``instructions`` on blocks: ``env`` holds the blocks of the refs available (filled in place with every
    ref made, and returned). ``hook(instruction, env)``, if given, is called after each one."""
    for instruction in instructions:
        if isinstance(instruction, Move):
            env[instruction.result] = apply_step(env[instruction.source], instruction.step, mesh_shape)
        elif isinstance(instruction, Finish):
            node = graph.nodes[instruction.node]
            env[instruction.result] = finish_extreme(node, instruction.kind, instruction.mesh_axes,
                                                     env[instruction.source], env[instruction.operand], mesh_shape,
                                                     node.outputs.index(instruction.result.value),
                                                     finish_geometry(graph, node, instruction.operand.type,
                                                                     mesh_shape))
        else:
            env.update(zip(instruction.outputs, _compute(graph, mesh_shape, instruction, env), strict=True))
        if hook is not None:
            hook(instruction, env)
    return env


def _compute(graph: Graph, mesh_shape, instruction: Compute, env: dict[Ref, object]) -> list:
    node = graph.nodes[instruction.node]
    if node.op == CONSTANT:
        return [jnp.asarray(node.params["value"])]
    invals = [env[ref] for ref in instruction.inputs]
    blocks = Blocks(
        in_global=tuple(graph.avals[v].shape for v in node.operands),
        in_blocks=tuple(x.shape for x in invals),
        in_layouts=tuple(ref.type.layout for ref in instruction.inputs),
        out_global=tuple(graph.avals[v].shape for v in node.outputs),
        out_blocks=tuple(block_shape(ref.type.frame(graph.avals[ref.value].shape, mesh_shape), ref.type.layout,
                                     mesh_shape) for ref in instruction.outputs),
        out_layouts=tuple(ref.type.layout for ref in instruction.outputs),
        mesh_shape=mesh_shape,
        in_spans=tuple(ref.type.span for ref in instruction.inputs) if any(r.type.span for r in instruction.inputs)
        else (),
        out_spans=tuple(ref.type.span for ref in instruction.outputs) if any(r.type.span for r in instruction.outputs)
        else (),
        bodies=None if instruction.bodies is None else tuple(
            functools.partial(run_body, body, mesh_shape) for body in instruction.bodies),
    )
    try:
        return lookup(node.op).per_block(node, invals, blocks)
    except LoweringError:
        raise
    except Exception as err:
        raise LoweringError(f"evaluating `{node.op}` at {where(node)} on per-device blocks failed: "
                            f"{type(err).__name__}: {err}") from err


def run_body(body: BodyProgram, mesh_shape: Mapping[str, int], input_blocks: list) -> list:
    """One execution of a body (a loop iteration, a branch) on blocks: its inputs as the loop hands them over, its
    outputs as the loop takes them back."""
    graph = body.plan.body.sharded.graph
    env = dict(zip(body.inputs, input_blocks, strict=True))
    run_instructions(graph, mesh_shape, body.instructions, env)
    return [env[ref] for ref in body.outputs]

