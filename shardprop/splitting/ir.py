"""The sharded IR: what each stage (and each loop body) runs, as a list of instructions over typed values.

After splitting, every value a stage handles is a ``Ref`` — a graph value in one
``shardprop.core.types.ValueType`` (a layout, and the mesh axes over which it is still a partial sum). Three
instructions make a stage:

* ``Compute`` runs one graph node on per-device blocks: its operands as the refs it consumes them in, its
  results as the refs it computes (partial, where a collective finishes them);
* ``Move`` is one step of moving a value from one type to another — a local slice, an all-gather, an
  all-to-all, a permute, a psum, a reduce-scatter, taking a whole value once as a partial sum — with its price;
* ``Finish`` combines the devices' partial maxima, minima or arg-extremes right after their reduction (it
  reads the reduction's operand block too: ties, offsets).

Lowering runs these instructions; the cost model sums their prices; the listing, ``sp.explain``, ``sp.to_json``,
the stage table, the plan fingerprint and the debugger read them. Nothing re-derives a move from a pair of
layouts: ``shardprop.core.moves.plan_move`` planned each once, when the IR was emitted (``emit.py``).

A listing prints a stage's instructions one per line, moves included::

    c:f32[16@i,8] = all-gather[j, axis=1] c                 # 64 B per device
    e:f32[16@i] = reduce_sum[axes=(1,)] c                   # f.py:10
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Iterable
from typing import NamedTuple, Union

from ..core.collectives import CollectiveKind
from ..core.steps import Step
from ..core.transfers import Transfer
from ..core.types import ValueType


class Ref(NamedTuple):
    """Graph value ``value`` held as ``type``: one IR value. A value moved to another layout is another ref."""

    value: int
    type: ValueType


@dataclass(frozen=True, slots=True)
class Compute:
    """Node ``node`` run on blocks: ``inputs`` are its operands as it consumes them, ``outputs`` its results as it
    computes them; ``bodies`` are a loop's or a cond's bodies, each an IR program of its own."""

    node: int
    inputs: tuple[Ref, ...]
    outputs: tuple[Ref, ...]
    bodies: tuple[BodyProgram, ...] | None = None


@dataclass(frozen=True, slots=True)
class Move:
    """One step of a move: ``source`` becomes ``result`` by ``step``; ``transfer`` is what it sends (None for a
    local step). ``node`` is the node it serves — the consumer it brings an operand to, or the node whose
    partial sum it finishes; None for a body's output brought to the type its loop takes it in. ``finishes``: the move
    combines ``node``'s partial results (a psum, a reduce-scatter) rather than bringing it an operand. ``merged``: a
    halo step whose rows an earlier step of its stage already exchanged — the same ``ppermute``, which XLA merges
    into the earlier one, so it sends nothing more (``transfer`` None)."""

    step: Step
    source: Ref
    result: Ref
    transfer: Transfer | None
    node: int | None
    finishes: bool = False
    merged: bool = False


@dataclass(frozen=True, slots=True)
class Finish:
    """The partial maximum (minimum, arg-extreme) ``source`` of reduction ``node``, combined by ``kind`` over
    ``mesh_axes`` into ``result``; ``operand`` is the reduction's operand block (ties, offsets); ``transfers``
    what it sends."""

    node: int
    kind: CollectiveKind
    mesh_axes: tuple[str, ...]
    source: Ref
    result: Ref
    operand: Ref
    transfers: tuple[Transfer, ...]

    @property
    def finishes(self) -> bool:
        """Always: a ``Finish`` combines its node's partial results (as a finishing ``Move`` does)."""
        return True


Instruction = Union[Compute, Move, Finish]


@dataclass(frozen=True, eq=False)
class BodyProgram:
    """A body's IR: ``inputs`` are its graph inputs as the loop hands them over (one iteration's), ``outputs``
    its results as the loop takes them back; ``repeats`` times per run of the loop (a scan's length; None:
    unknown, a while loop). ``plan`` is the body with its decisions (``shardprop.splitting.BodyPlan``)."""

    plan: object
    inputs: tuple[Ref, ...]
    instructions: tuple[Instruction, ...]
    outputs: tuple[Ref, ...]

    @property
    def repeats(self) -> int | None:
        body = self.plan.body
        return (body.repeats if body.carries else 1)


@dataclass(frozen=True)
class NodeIR:
    """What the IR does for one graph node: the moves that bring its operands (``moves_in``), the node itself
    (``compute``), and the instructions that finish its results (``finishes``: a psum, a reduce-scatter, a
    ``Finish``)."""

    compute: Compute
    moves_in: tuple[Move, ...]
    finishes: tuple[Move | Finish, ...]


def index_nodes(instructions: Iterable[Instruction]) -> dict[int, NodeIR]:
    """``NodeIR`` of every node ``instructions`` compute (not inside their bodies). A node's ``moves_in`` are
    the whole chain of moves that made each operand ref it reads — also when an earlier consumer's moves made it
    (``t = b.T`` read by ``a + t`` and then ``a * t``), or an earlier stage's."""
    instructions = list(instructions)
    computes = {i.node: i for i in instructions if isinstance(i, Compute)}
    made_by: dict[Ref, Move] = {}  # each ref a move brings an operand to, and the move that made it
    finishes: dict[int, list[Move | Finish]] = {}
    for instruction in instructions:
        if isinstance(instruction, Compute) or instruction.node is None:
            continue  # a node, or a body's output moved at its end
        if instruction.finishes:
            finishes.setdefault(instruction.node, []).append(instruction)
        else:
            made_by.setdefault(instruction.result, instruction)
    out = {}
    for n, compute in computes.items():
        moves_in: dict[int, Move] = {}  # by identity, in order: two operands may share a chain
        for ref in compute.inputs:
            chain, seen = [], {ref}
            # (a value moved there and back — a's all-to-all, then back for another use — would loop: stop at a ref
            # already on the chain)
            while (move := made_by.get(ref)) is not None and move.source not in seen:
                chain.append(move)
                ref = move.source
                seen.add(ref)
            moves_in.update((id(m), m) for m in reversed(chain))
        out[n] = NodeIR(compute, tuple(moves_in.values()), tuple(finishes.get(n, ())))
    return out


def results(instruction: Instruction) -> tuple[Ref, ...]:
    """The refs ``instruction`` makes."""
    return instruction.outputs if isinstance(instruction, Compute) else (instruction.result,)


def reads(instruction: Instruction) -> tuple[Ref, ...]:
    """The refs ``instruction`` reads."""
    if isinstance(instruction, Compute):
        return instruction.inputs
    if isinstance(instruction, Finish):
        return (instruction.source, instruction.operand)
    return (instruction.source,)


def transfers_of(instruction: Instruction) -> tuple[Transfer, ...]:
    """What ``instruction`` sends between devices, once (a loop's bodies: see ``body_transfers``)."""
    if isinstance(instruction, Move):
        return () if instruction.transfer is None else (instruction.transfer,)
    if isinstance(instruction, Finish):
        return instruction.transfers
    return ()
