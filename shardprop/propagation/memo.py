"""What propagation's walks reuse from one another: the rules' results, across walks that make no shards
(``propagate(memo=)``); and whole walks, across the settings of one view set (``Variants``).

In a walk without shards (``lineage=False``: the first walk of every propagation, the layout search's screens) a
rule is a function of its node and its operands' layouts — and, where an operand axis is *open* (an unannotated
argument's, a broadcast's, an iota's: it adopts what it meets), of the calls it makes on the walk's
``shardprop.core.rules.OpenTracker`` (merging open axes, asking one for a layout). Such an open axis flows
through every elementwise op that meets only replicated axes (a causal mask's through the whole attention, forward
and back), so most nodes of a first walk see one.

A memo entry is keyed by the node and its operands' layouts, each open axis named by its place among the distinct
open axes of the operands (the rule sees no more of it: it hands it to the tracker and places what the tracker
returns). For a rule that met open axes the entry keeps the calls it made on the tracker, each open axis named the
same way; a later walk *replays* them on its own tracker, with its own open axes, and places the open axes the
calls return where the rule placed them — what running the rule again would do, without running it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from ..core.layouts import Open, Sharded, TensorSharding
from ..core.rules import CREATED, OpenTracker, RuleOutput
from .product import ShardedGraph

_UNION, _REQUEST = "union", "request"


def memo_key(node_id: int, operands: list[TensorSharding]) -> tuple[tuple, list[Open]] | None:
    """What a rule's result depends on in a walk that makes no shards: the node and its operands' layouts, an open
    axis as ``-1 - k`` (the ``k``-th distinct open axis of the operands, in order); and those open axes. None where
    an axis is neither sharded, replicated nor open."""
    key: list = [node_id]
    opens: list[Open] = []
    for operand in operands:
        for a in operand.axes:
            if a is None:
                key.append(None)
            elif a.__class__ is Sharded:
                key.append((a.mesh_axes, a.span))
            elif a.__class__ is Open:
                place = next((k for k, seen in enumerate(opens) if seen is a), len(opens))
                if place == len(opens):
                    opens.append(a)
                key.append(-1 - place)
            else:
                return None
    return tuple(key), opens


class Recording:
    """The walk's tracker as one rule call on open axes sees it: each call passed on, and logged with every open axis
    named by its place in ``made`` (the operands' open axes, then what each merge returned), to be replayed
    (``replay``). ``replayable`` turns False where the rule hands the tracker an open axis not named so, or
    asks it anything else."""

    def __init__(self, tracker: OpenTracker, opens: list[Open]):
        self.tracker, self.made, self.calls, self.replayable = tracker, list(opens), [], True
        self._places = {id(o): k for k, o in enumerate(opens)}  # (the objects are kept alive by ``made``)

    def union(self, opens: list[Open]) -> Open:
        places = tuple(self._place(o) for o in opens)
        merged = self.tracker.union(opens)
        self.calls.append((_UNION, places))
        if id(merged) in self._places:  # the tracker returned an axis the rule already held (all of one class): a
            self.replayable = False     # replay would hand back a new object where running the rule hands this one
        self._places[id(merged)] = len(self.made)
        self.made.append(merged)
        return merged

    def request(self, open_axis: Open, mesh_axes: tuple[str, ...], node: int | None = None) -> None:
        self.calls.append((_REQUEST, self._place(open_axis), mesh_axes, node))
        self.tracker.request(open_axis, mesh_axes, node)

    def __getattr__(self, name: str):  # any other question of the tracker: passed on, not replayed
        self.replayable = False
        return getattr(self.tracker, name)

    def _place(self, open_axis: Open) -> int:
        place = self._places.get(id(open_axis))
        if place is None:
            self.replayable = False
            return -1
        return place

    def entry(self, result: RuleOutput) -> Recorded | None:
        """What the memo keeps of ``result`` (its outputs settled and checked): None where it cannot be replayed."""
        outputs = []
        for sharding in result.outputs:
            axes = []
            for a in sharding.axes:
                if a.__class__ is Open:
                    place = self._places.get(id(a))
                    if place is None:
                        return None
                    a = place
                axes.append(a)
            outputs.append((sharding.shape, tuple(axes)))
        creates = any(a is CREATED for sharding in result.outputs for a in sharding.axes)
        return Recorded(result, tuple(outputs), tuple(self.calls), creates)


class Recorded(NamedTuple):
    """A rule's result on open axes, to replay: the ``result``; its ``outputs`` as ``(shape, axes)``, an open axis as
    its place (an int); the ``calls`` it made on the tracker; whether it ``creates`` an axis (its outputs are then
    settled again: else they need nothing, having been checked when recorded)."""

    result: RuleOutput
    outputs: tuple
    calls: tuple
    creates: bool


def replay(entry: Recorded, tracker: OpenTracker, opens: list[Open]) -> RuleOutput:
    """The rule's result on operands whose open axes are ``opens`` (named as when it was recorded), its calls made on
    ``tracker``: what running the rule again does."""
    result, outputs, calls, _ = entry
    made = list(opens)
    for call in calls:
        if call[0] is _UNION:
            made.append(tracker.union([made[k] for k in call[1]]))
        else:
            tracker.request(made[call[1]], call[2], call[3])
    return result._replace(outputs=tuple(
        TensorSharding(shape, tuple(made[a] if a.__class__ is int else a for a in axes)) for shape, axes in outputs))


def resolutions(opens: OpenTracker) -> tuple:
    """How ``opens`` resolves every open axis it knows: its mesh axes and the node it adopted them from (an axis it
    does not know is replicated, whatever met the others)."""
    return tuple((key, opens.resolution(key), opens.adopted_from(key)) for key in sorted(opens.parent))


@dataclass(frozen=True)
class Adoption:
    """Where a view of the backward pass meets an open axis (a broadcast's, an iota's, an unannotated argument's),
    whether the axis adopts the layout asked — the value made so, all the chain making it laid out so — or the value
    is made as without the view and sliced for it (free). Each is a choice the candidates' prices decide."""

    shared: bool = False  # a created value other uses read too is made as the view asks, for all of them
    returned: bool = True  # a returned value's open axes adopt the layout of the argument it mirrors
    viewed: bool = True  # a created value one use reads is made as its view asks (a reshape between may not carry it)


ADOPTING = Adoption()  # the default: every open axis a view meets adopts what it asks


class Variants:
    """The products of one view set's walks under each ``Adoption``, and what tells that another setting makes one of
    them again: its first walk would be the same where the settings it differs in decided nothing in that walk (a
    walk is the same up to the first place a setting decides something); and a final walk sees no open axis, so the
    settings act on it only through how the first walk resolved them."""

    def __init__(self):
        self._walked: list[tuple[Adoption, frozenset[str], ShardedGraph]] = []  # settings, those read, product
        self._by_resolution: dict[tuple, ShardedGraph] = {}

    def walked_alike(self, settings: Adoption) -> ShardedGraph | None:
        """The product of a walk whose settings differ from ``settings`` only in ones it did not read."""
        return next((product for done, read, product in self._walked
                     if all(getattr(done, name) == getattr(settings, name) for name in read)), None)

    def resolved_alike(self, settings: Adoption, read: set[str], resolved: tuple) -> ShardedGraph | None:
        """The product of a walk whose first walk resolved the open axes as ``resolved`` (kept as made by these
        ``settings`` too)."""
        product = self._by_resolution.get(resolved)
        if product is not None:
            self._walked.append((settings, frozenset(read), product))
        return product

    def made(self, settings: Adoption, read: set[str], resolved: tuple, product: ShardedGraph) -> None:
        self._walked.append((settings, frozenset(read), product))
        self._by_resolution[resolved] = product
