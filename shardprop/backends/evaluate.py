"""Running the sharded IR on per-device blocks: the body of every stage's ``shard_map``, and of every sharded loop
or cond.

``run_instructions`` walks a list of ``shardprop.splitting.ir`` instructions over an environment of
blocks keyed by ``shardprop.splitting.ir.Ref``: a ``Compute`` evaluates its node with its primitive's
``per_block`` piece, a ``Move`` runs one planned step (``backends/moves.py``), a ``Finish`` combines a reduction's
partial extremes (``backends/finish.py``). There is no other evaluator of the sharded graph.

Two guards keep the blocks' numbers the unsharded function's under XLA and under differentiation: a value tested
against values computed from it (a maximum's derivative, ``x == max(x)``) is held once (``computed_once``: XLA would
compute it again, with other roundings, in each kernel reading it), and so is a piecewise op fused before it (a
concatenate's, a pad's pieces are computed on several code paths of one kernel, each rounding a multiply-add its own
way: ``compared_with_itself``); and a ranged block's padding carries no derivative (``padding_without_derivative``).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..core.blocks import Blocks, block_rows, one_unseen
from ..core.layouts import block_shape
from ..expr import jax_adapter as jx
from ..errors import LoweringError
from ..expr.graph import CONSTANT, Graph, where
from ..ops import finish_geometry, lookup
from ..ops.opdef import Family, Trait
from ..splitting.ir import BodyProgram, Compute, Finish, Move, Ref
from .finish import finish_extreme
from .moves import apply_step


def run_instructions(graph: Graph, mesh_shape: Mapping[str, int], instructions, env: dict[Ref, object],
                     hook=None) -> dict[Ref, object]:
    """Run ``instructions`` on blocks: ``env`` holds the blocks of the refs available (filled in place with every
    ref made, and returned). ``hook(instruction, env)``, if given, is called after each one."""
    for instruction in instructions:
        if isinstance(instruction, Move):
            made = [_moved(env[instruction.source], instruction.step, mesh_shape)]
        elif isinstance(instruction, Finish):
            node = graph.nodes[instruction.node]
            made = [finish_extreme(node, instruction.kind, instruction.mesh_axes, env[instruction.source],
                                   env[instruction.operand], mesh_shape, node.outputs.index(instruction.result.value),
                                   finish_geometry(graph, node, instruction.operand.type, mesh_shape))]
        else:
            made = _compute(graph, mesh_shape, instruction, env)
            if instruction.node in compared_with_itself(graph):
                made = [computed_once(x, mesh_shape) for x in made]
        refs = instruction.outputs if isinstance(instruction, Compute) else (instruction.result,)
        env.update((ref, padding_without_derivative(x, ref.type, graph.avals[ref.value].shape, mesh_shape))
                   for ref, x in zip(refs, made, strict=True))
        if hook is not None:
            hook(instruction, env)
    return env


def _moved(x, step, mesh_shape: Mapping[str, int]):
    """This device's block after one step of a move. An empty block that stays empty is made, not moved: XLA refuses
    a collective along an axis of no rows ("dimension size ... at 'all_gather_dim' cannot be zero")."""
    if x.size or jx.is_extended_dtype(x.dtype):  # (an empty array of PRNG keys has no zeros to make)
        return apply_step(x, step, mesh_shape)
    after = jax.eval_shape(lambda b: apply_step(b, step, mesh_shape), x)
    return jnp.zeros(after.shape, after.dtype) if not np.prod(after.shape) else apply_step(x, step, mesh_shape)


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



# The families XLA fuses into the kernels that read them (a reduction, a contraction is computed once and held).
_FUSED = frozenset({Family.ELEMENTWISE, Family.SHAPE, Family.SLICING, Family.PLACEMENT})
_COMPARED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def compared_with_itself(graph: Graph) -> frozenset[int]:
    """The nodes whose float result is held in memory so that values tested against each other see the same bits.

    A node is tested against values computed from it when it is read by an op whose derivative finds the elements
    attaining its result (a maximum, ``jnp.maximum``, a sort), or by a comparison and another op (through reshapes
    and broadcasts); XLA would compute it with a multiply and an add fused into every kernel that reads it, so it is
    held (``computed_once``). Inside the kernel computing it, a piecewise op (a concatenate, a pad) computes its
    positions by one code path per piece, and a multiply-add after it may be contracted on one path and not another:
    tied copies (``jnp.pad(mode="edge")``'s border and the row it repeats) would differ in their last bit, so such an
    op is held too, and its operands as the node is."""
    found = _COMPARED.get(graph)
    if found is None:
        held, roots = set(), [n for n in _compared(graph) if _contracted(graph, n)]
        while roots:
            node_id = roots.pop()
            if node_id in held:
                continue
            held.add(node_id)
            for piecewise in _piecewise_before(graph, node_id):
                if _holdable(graph, piecewise):
                    roots.append(piecewise)
                roots.extend(p for p in (graph.producer[v] for v in graph.nodes[piecewise].operands)
                             if _holdable(graph, p) and _contracted(graph, p))
        found = _COMPARED[graph] = frozenset(held)
    return found


def _holdable(graph: Graph, node_id: int) -> bool:
    node = graph.nodes[node_id]
    return (node.op != CONSTANT and len(node.outputs) == 1
            and jx.dtype_kind(graph.avals[node.outputs[0]].dtype) == "f")


def _piecewise_before(graph: Graph, node_id: int):
    """The piecewise ops XLA would fuse into the kernel computing node ``node_id`` (itself excluded); not those
    before them, which the kernel of a piecewise op held once computes (``compared_with_itself`` asks it in turn)."""
    stack, seen = [graph.producer[v] for v in graph.nodes[node_id].operands], set()
    while stack:
        node = graph.nodes[stack.pop()]
        if node.id in seen or lookup(node.op).family not in _FUSED:
            continue
        seen.add(node.id)
        if Trait.PIECEWISE in lookup(node.op).traits:
            yield node.id
            continue
        stack.extend(graph.producer[v] for v in node.operands)


def _compared(graph: Graph):
    for node in graph.nodes:
        if not _holdable(graph, node.id):
            continue
        readers, seen, equality, selecting = list(graph.consumers[node.outputs[0]]), set(), False, False
        while readers and not selecting:
            reader = graph.nodes[readers.pop()]
            if reader.id in seen:
                continue
            seen.add(reader.id)
            # a value read through a view is still compared as it was computed; an op selecting some of its
            # operand's elements tests which they are (``x == max(x)``, ``jnp.maximum``'s tie, ``x >= sort(x)[k]``)
            traits = lookup(reader.op).traits
            equality |= Trait.COMPARISON in traits
            selecting = Trait.SELECTING in traits
            if Trait.VIEW in traits:
                readers.extend(c for v in reader.outputs for c in graph.consumers[v])
        if selecting or equality and len(graph.consumers[node.outputs[0]]) + (node.outputs[0] in graph.outputs) > 1:
            yield node.id


def _contracted(graph: Graph, node_id: int) -> bool:
    """True when the ops XLA would fuse into the kernels reading node ``node_id``'s result (it and the producers of
    the fused families before it) hold both a product and a sum: a multiply-add it may contract in some kernels."""
    traits, stack, seen = set(), [node_id], set()
    while stack:
        node = graph.nodes[stack.pop()]
        if node.id in seen or lookup(node.op).family not in _FUSED:
            continue
        seen.add(node.id)
        traits |= lookup(node.op).traits
        stack.extend(graph.producer[v] for v in node.operands)
    return Trait.PRODUCT in traits and Trait.SUM in traits


def computed_once(x, mesh_shape: Mapping[str, int]):
    """``x``, computed once and held in memory, bit for bit. XLA fuses a cheap elementwise value into every op that
    reads it, computing it again in each, and XLA:CPU contracts a multiply and an add into one fused multiply-add in
    some of those kernels and not in others: the copies can differ in their last bit, and ``x == max(x)`` then misses
    the maximum its own reduction found (a gradient of ``jnp.min`` off by the whole tangent).
    ``lax.optimization_barrier`` does not stop this (XLA:CPU removes it before fusing); an integer division of
    ``x``'s bits by a 1 XLA cannot see is an op it never computes twice, and exact. Its derivative is ``x``'s."""
    if not mesh_shape or jx.dtype_kind(x.dtype) != "f" or np.dtype(x.dtype).itemsize not in (2, 4, 8):
        return x
    return _bits_divided(x, one_unseen(mesh_shape, np.int32))


@jax.custom_jvp
def _bits_divided(x, one):
    """``x``, its bits divided by ``one`` (1) as integers."""
    bits = np.dtype(f"int{8 * np.dtype(x.dtype).itemsize}")
    return lax.bitcast_convert_type(lax.div(lax.bitcast_convert_type(x, bits), one.astype(bits)), x.dtype)


@_bits_divided.defjvp
def _bits_divided_jvp(primals, tangents):
    (x, one), (x_dot, _) = primals, tangents
    return _bits_divided(x, one), x_dot


def padding_without_derivative(x, vtype, shape, mesh_shape: Mapping[str, int]):
    """``x``, a block held as ``vtype`` (of a value of ``shape``), whose padding — the positions of a ranged axis's
    blocks past the axis's ends, which nothing reads — carries no derivative. Those positions hold whatever the op
    computed from its operands' padding (a quotient by zero, a neighbour's row a slice left in place): under
    reverse-mode differentiation their zero cotangent times such a value is NaN, which the transpose of the op that
    made them would carry into the rows they alias. The primal is ``x`` itself (no work); the mask of the rows held
    is built only where the program is differentiated (in the tangent rule)."""
    if not vtype.span or not vtype.rows_in_place or jx.dtype_kind(x.dtype) not in ("f", "c"):
        return x
    # per ranged axis: its mesh axes, rows per block, the array row of device 0's first row (a haloed block starts
    # with its neighbour's rows) and the axis's size — static, the rule reads this device's block index itself
    rows = tuple((axis, tuple(mesh_axes), span.block, -span.offset - vtype.halo_of(axis)[0], shape[axis])
                 for axis, (span, mesh_axes) in enumerate(zip(vtype.span, vtype.layout, strict=True))
                 if span is not None)
    return _tangent_in_rows(x, (rows, tuple(mesh_shape.items())))


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _tangent_in_rows(x, geometry):
    return x


@_tangent_in_rows.defjvp
def _tangent_in_rows_jvp(geometry, primals, tangents):
    (x,), (x_dot,) = primals, tangents
    rows, mesh_items = geometry
    held = None
    for axis, mesh_axes, block, first, size in rows:
        row = block_rows(x.shape, axis, mesh_axes, dict(mesh_items), block, first)
        inside = lax.bitwise_and(lax.ge(row, np.int32(0)), lax.lt(row, np.int32(size)))
        held = inside if held is None else lax.bitwise_and(held, inside)
    return x, lax.select(held, x_dot, lax.full_like(x_dot, 0))
