"""Emitting the sharded IR (``.ir``) from the decisions: the instructions of a stage, or of a loop's body.

For each node, in order: every operand is brought from the type it is available in to the type the node consumes
it in (``shardprop.core.moves.plan_move``, one ``.ir.Move`` per step, each value and type moved once),
the node runs (``.ir.Compute``), and a collective that finishes it follows: a sum, or rows the node left out of
their places (a mirror, a rotation, a route), as the moves from the type it is computed in to the type it is held in
(a psum, or a reduce-scatter where it is held finer; the step that places the rows, then any other), a maximum,
minimum, product, arg-extreme, prefix or top-k as a ``.ir.Finish``.
"""

from __future__ import annotations

import functools
from collections.abc import Container, Iterable


from ..core.collectives import CollectiveKind, finish_transfers
from ..core.moves import plan_move
from ..core.layouts import shard_count
from ..core.steps import StepKind, halo_rows, step_transfer
from ..core.types import ValueType
from ..errors import LoweringError
from ..expr.graph import CONSTANT, PARAMETER
from ..ops import finish_geometry
from .decisions import BodyPlan, Decisions
from .ir import BodyProgram, Compute, Finish, Instruction, Move, Ref


class Emitter:
    """The instructions of one stage or body being emitted, the refs available to them so far, and the refs it
    takes from outside (``importable``: what earlier stages made, and the arguments), in the order first taken."""

    def __init__(self, view: Decisions, available: Iterable[Ref] = (), importable: Container[Ref] = ()):
        self.view = view
        self.instructions: list[Instruction] = []
        self.available: set[Ref] = set(available)
        self.importable = importable
        self.imported: list[Ref] = []
        self.haloed: dict[int, list[Ref]] = {}  # value -> the haloed refs of it made here
        self.exchanged: set[tuple] = set()  # the halo exchanges made here (see _exchange)

    def held(self, value: int) -> Ref:
        """``value`` as the plan holds it — or, for a ranged value an earlier stage made (ranged rows never leave
        their stage), as that stage handed it over: its ranged axes whole (``.cut.cut_into_stages``)."""
        ref = Ref(value, self.view.type(value))
        if ref.type.span and not self.reachable(ref):
            handed = Ref(value, handed_over(ref.type))
            if self.reachable(handed):
                return handed
        return ref

    def reachable(self, ref: Ref) -> bool:
        """True when ``ref`` is available here or can be taken from outside (``has`` takes it: only a ref a move
        starts from, or an op reads, becomes a stage input)."""
        return ref in self.available or ref in self.importable

    def has(self, ref: Ref) -> bool:
        """True when ``ref`` is available here, taking it from outside if it can be."""
        if ref in self.available:
            return True
        if ref in self.importable:
            self.imported.append(ref)
            self.available.add(ref)
            return True
        return False

    def bring(self, source: Ref, want: ValueType, node: int | None, finishing: bool = False) -> Ref:
        """``source``'s value in type ``want`` for node ``node`` (``finishing``: ``source`` is ``node``'s partial
        result, summed into the type the plan holds it in, or its placed result, its rows put in their places): the
        moves that get it there, emitted once (from the
        furthest point on the way that is already available, here or from an earlier stage)."""
        target = Ref(source.value, want)
        if self.has(target):
            return target
        graph, mesh_shape = self.view.graph, self.view.mesh_shape
        aval = graph.avals[source.value]
        if want.halo:  # its blocks, then the rows not yet received for another op (XLA would merge the exchanges)
            source = self._most_halo(self.bring(source, want.without_halo(), node, finishing), want)
        steps = plan_move(aval.shape, aval.dtype, source.type, want, mesh_shape)
        at, start = source, 0
        for k in reversed(range(len(steps) - 1)):
            if self.has(Ref(source.value, steps[k].after)):
                at, start = Ref(source.value, steps[k].after), k + 1
                break
        else:
            if not self.has(source):
                raise LoweringError(f"value {source.value} is needed as {want} by node {node} but neither computed "
                                    "before it nor received (a shardprop bug)")
        for step in steps[start:]:
            after = Ref(source.value, step.after)
            exchange = _exchange(source.value, step, aval.shape, mesh_shape)
            if exchange is not None and exchange in self.exchanged:  # the same ppermute again: XLA merges them
                self._made(Move(step, at, after, None, node, finishing, merged=True))
            else:
                self._made(Move(step, at, after, _price(step, aval.shape, aval.dtype, tuple(mesh_shape.items())),
                                node, finishing))
                if exchange is not None:
                    self.exchanged.add(exchange)
            at = after
        return target

    def _most_halo(self, core: Ref, want: ValueType) -> Ref:
        """The ref of ``core``'s value with the most of ``want``'s halo already received here (``core`` if none)."""
        best, most = core, 0
        for ref in self.haloed.get(core.value, ()):
            halo = ref.type.halo
            if ref.type.without_halo() == core.type and all(
                    a <= c and b <= d for (a, b), (c, d) in zip(halo, want.halo, strict=True)):
                rows = sum(a + b for a, b in halo)
                if rows > most:
                    best, most = ref, rows
        return best

    def node(self, node_id: int) -> None:
        """Node ``node_id``: its operands brought from the types they are held in, the node, the collective that
        finishes it, and — for a result returned sliced further (it mirrors an argument) — its slice."""
        self._node(node_id)
        view = self.view
        for v in view.graph.nodes[node_id].outputs:
            for returned in dict.fromkeys(view.output_type(k) for k in view.output_indices.get(v, ())):
                if returned != view.type(v):
                    self.bring(self.held(v), returned, node_id)

    def _node(self, node_id: int) -> None:
        view = self.view
        node = view.graph.nodes[node_id]
        if node.op == CONSTANT:
            self._made(Compute(node_id, (), (self.held(node.output),)))
            return
        inputs = tuple(self.bring(self.held(v), need, node_id)
                       for v, need in view.edges(node))
        outputs = tuple(Ref(v, view.computed_type(v)) for v in node.outputs)
        plans = view.body_plans(node_id)
        bodies = None if plans is None else tuple(body_program(plan) for plan in plans)
        self._made(Compute(node_id, inputs, outputs, bodies))
        collective = view.collective(node_id)
        if collective is None:
            for ref in outputs:  # a ranged result returned: held in equal blocks (or whole)
                if ref.type.span and ref.type != view.type(ref.value):
                    self.bring(ref, view.type(ref.value), node_id)
            return
        for ref in outputs:
            held = view.type(ref.value)
            if ref.type == held:
                continue  # an output the collective does not finish (a loop's carry that was never partial)
            if collective.kind.by_moves:
                self.bring(ref, held, node_id, finishing=True)
                continue
            # a returned result finished ranged: finished in its ranges, then moved into the blocks it is returned in
            finished = ValueType(ref.type.layout, span=ref.type.span) if ref.type.span and not held.span else held
            # (a top-k's indices are finished with its values: the candidates' order)
            self._finish(node, collective, ref, finished, outputs[0] if collective.kind is CollectiveKind.TOP_K
                         else inputs[0])
            if finished != held:
                self.bring(Ref(ref.value, finished), held, node_id)

    def outside(self, node_id: int) -> None:
        """Node ``node_id`` run outside shard_map, on whole arrays: its operands as it takes them (brought there by the
        ``shard_map`` stage before; a constant as this stage builds it)."""
        view = self.view
        node = view.graph.nodes[node_id]
        inputs = []
        for v, need in view.edges(node):
            ref = Ref(v, need)
            if not self.has(ref) and view.graph.nodes[view.graph.producer[v]].op == CONSTANT:
                ref = self.held(v)
            if not self.has(ref):
                raise LoweringError(f"value {v} is needed as {need} by node {node_id}, which runs outside shard_map, "
                                    "but no stage before it brought it there (a shardprop bug)")
            inputs.append(ref)
        self._made(Compute(node_id, tuple(inputs), tuple(self.held(v) for v in node.outputs)))

    def _finish(self, node, collective, source: Ref, held: ValueType, operand: Ref) -> None:
        graph = self.view.graph
        prices = finish_transfers(collective.kind, collective.mesh_axes, graph.avals[source.value],
                                  graph.avals[node.operands[0]].dtype, held.layout, self.view.mesh_shape,
                                  finish_geometry(graph, node, operand.type, self.view.mesh_shape))
        if collective.kind is CollectiveKind.TOP_K and source.value == node.outputs[-1] and \
                not graph.consumers[source.value] and source.value not in graph.outputs:
            prices = ()  # a top-k's indices no one reads: XLA drops their gather
        self._made(Finish(node.id, collective.kind, collective.mesh_axes, source, Ref(source.value, held), operand,
                          prices))

    def _made(self, instruction: Instruction) -> None:
        self.instructions.append(instruction)
        self.available.update(instruction.outputs if isinstance(instruction, Compute) else (instruction.result,))
        if isinstance(instruction, Move) and instruction.result.type.halo:
            self.haloed.setdefault(instruction.result.value, []).append(instruction.result)


def handed_over(vtype: ValueType) -> ValueType:
    """How a ranged value made in one stage is handed to a later one: its ranged axes whole."""
    return ValueType(vtype.even_layout, vtype.partial, vtype.reduction, placement=vtype.placement)


def body_program(plan: BodyPlan) -> BodyProgram:
    """A body's IR: its nodes, then its outputs brought into the types the loop or cond takes them in."""
    view = plan.decisions
    graph = view.graph
    inputs = tuple(Ref(v, view.type(v)) for v in graph.inputs)
    emitter = Emitter(view, inputs)
    for node in graph.nodes:
        if node.op != PARAMETER:
            emitter.node(node.id)
    outputs = tuple(emitter.bring(emitter.held(v), want, None)
                    for v, want in zip(graph.outputs, plan.out_types, strict=True))
    return BodyProgram(plan, inputs, tuple(emitter.instructions), outputs)


def _exchange(value: int, step, shape, mesh_shape) -> tuple | None:
    """What a halo step's ``ppermute`` sends, as a key: the same value's rows ``[first, first + rows)`` of the block
    ``shift`` devices away along ``axis``, across the rest of a block haloed alike on the other axes. Two steps with
    one key run the same collective (None for any other step)."""
    if step.kind is not StepKind.HALO:
        return None
    before = step.before
    block = shape[step.axis] // shard_count(mesh_shape, before.layout[step.axis])
    others = tuple(before.halo_of(k) for k in range(len(shape)) if k != step.axis)
    return (value, before.layout, before.partial, step.axis, step.shift, halo_rows(step, block), others)


@functools.lru_cache(maxsize=65536)
def _price(step, shape, dtype, mesh: tuple):
    # the same few steps recur on every edge of a large graph (a Transfer is immutable: shared)
    return step_transfer(step, shape, dtype, dict(mesh))
