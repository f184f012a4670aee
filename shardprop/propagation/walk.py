"""One walk of the propagation pass over a graph (``Walk``): each node's sharding rule applied to its operands'
shardings in program order, open axes recorded or resolved, conflicts resolved by moving an operand (or refused),
the conservative rule where no rule applies, loop and branch bodies propagated by the callback the driver passes
(``propagate.py`` runs the walks and builds the ``ShardedGraph`` from the last)."""

from __future__ import annotations

import collections
import functools
import itertools
import math


from ..errors import ConflictKind, ShardingConflictError, SpecError
from ..expr.graph import CONSTANT, PARAMETER, Graph, Node, argument_label, short_dtype, value_name, where
from ..ops import lookup
from ..ops.opdef import Trait
from ..core.rules import CREATED, OpenTracker, RuleConflict, RuleContext
from ..core.layouts import (Layout, Open, Sharded, TensorSharding, layout_refines, shard_count, uneven_span,
                            uses_mesh_axes_once)
from .memo import ADOPTING, Adoption, Recording, memo_key, replay
from .origins import trace_origin
from .product import MADE, RETURNED, RuleName, ShardedGraph
from .reports import move_cost


@functools.lru_cache(maxsize=1024)
def _replicated_sharding(shape: tuple[int, ...]) -> TensorSharding:
    """A value of ``shape`` held whole on every device (a constant's): one immutable object per shape."""
    return TensorSharding(shape, (None,) * len(shape))


def _argument_axis(ctx: RuleContext, axis: int, size: int, mesh_axes: tuple[str, ...]):
    """An argument's axis laid out over ``mesh_axes`` as its spec says: equal blocks, or — where they do not divide
    it — ranges, the last blocks short (the argument arrives whole along it, as a JAX array cannot be uneven, and
    each device takes its rows)."""
    if not mesh_axes:
        return None
    span = uneven_span(size, shard_count(ctx.mesh_shape, mesh_axes))
    if span is None:
        return ctx.root(axis, size, mesh_axes)
    return ctx.ranged(axis, size, mesh_axes, span, [])


class Walk:
    """One pass over the graph. With ``opens`` it records what open axes meet; with ``resolve`` it fixes
    every created axis to the mesh axes ``resolve((value, axis))`` returns (None: replicated)."""

    def __init__(self, graph: Graph, mesh_shape, input_layouts, propagate_body, *,
                 opens: OpenTracker | None = None, resolve=None, conflicts: str = "error", adopted_from=None,
                 views=None, priced=frozenset(), adoption: Adoption = ADOPTING, lineage: bool = True,
                 memo: dict | None = None):
        self.adoption = adoption
        self.lineage = lineage and resolve is not None
        # rule results by (node, operand layouts): only where no shards are made (else each result's are new)
        self.memo = None if self.lineage else memo
        self.conflicts = conflicts
        self.priced = priced
        self.views = views or {}
        self.views_taken: dict[tuple[int, int], object] = {}  # the views this walk's nodes took (see uses.py)
        self._reads: collections.Counter | None = None  # value -> how many operands and outputs read it
        self.settings_read: set[str] = set()  # which of the Adoption's settings decided something here
        self.adopted_from = adopted_from
        self.adoptions: dict[tuple[int, int], int] = {}  # (value, axis) -> the node whose sharding it adopted
        self.reshards: dict[int, tuple[int, str]] = {}  # node id -> (operand moved, the conflict's message)
        self.graph, self.mesh_shape, self.input_layouts = graph, mesh_shape, input_layouts
        self.propagate_body = propagate_body
        self.bodies: dict[int, ShardedGraph] = {}
        self.opens = opens if opens is not None else OpenTracker()
        self.resolve = resolve
        self.ids = itertools.count()
        self.shardings: list[TensorSharding | None] = [None] * len(graph.avals)
        self.needs: list[tuple[Layout, ...]] = []
        self.rule_names: list[str] = []
        self.fallbacks: list[int] = []
        self.fallback_causes: dict[int, str] = {}
        self.need_spans: dict[int, tuple] = {}  # node id -> the ranged rows it consumes (RuleOutput.need_spans)

    def run(self) -> None:
        # One context for the whole walk (its avals are set per node): 10^5-node graphs are the norm.
        ctx = RuleContext((), (), self.mesh_shape, self.ids, self.opens, lineage=self.lineage,
                          propagate_body=self.propagate_body, graph=self.graph)
        records: dict = {}  # primitive name -> its record, looked up once per walk
        shardings = self.shardings
        viewed = {node_id for node_id, _ in self.views}  # the nodes views name (most name none: no lookup per operand)
        for node, (in_avals, out_avals) in zip(self.graph.nodes, self.graph.node_avals, strict=True):
            ctx.node = node.id
            ctx.out_avals, ctx.in_avals = out_avals, in_avals
            if node.op == PARAMETER:
                layout = self.input_layouts[node.params["index"]]
                shape = out_avals[0].shape
                if layout is None:  # unannotated: every axis is created open
                    axes = tuple(CREATED if n > 1 else None for n in shape)
                else:
                    axes = tuple(_argument_axis(ctx, k, n, layout[k]) for k, n in enumerate(shape))
                rule_name = RuleName.INPUT_SPEC if layout is not None else RuleName.UNANNOTATED_INPUT
                outputs, needs = (TensorSharding(shape, axes),), ()
            elif node.op == CONSTANT:  # replicated: nothing to settle or check
                outputs, needs, rule_name = (_replicated_sharding(out_avals[0].shape),), (), RuleName.CONSTANT
            else:
                op = records.get(node.op)
                if op is None:
                    op = records[node.op] = lookup(node.op)
                operands = [shardings[v] for v in node.operands]
                if node.id in viewed:
                    operands = self._viewed(ctx, node, operands)
                if not op.reads_ranges:  # a ranged axis is no equal blocks: a rule that knows nothing of it reads
                    operands = [o.without_ranges() if o.spans else o for o in operands]  # it whole
                try:
                    result, outputs = self._apply(ctx, node, op, operands)
                except RuleConflict as conflict:
                    result, outputs = self._reshard(ctx, node, op, operands, conflict)
                except SpecError as err:  # an annotation inside the graph (a sharding constraint) is bad
                    raise type(err)(f"`{node.op}` at {where(node)}: {err}") from None
                needs = result.needs
                if result.need_spans is not None:
                    self.need_spans[node.id] = result.need_spans
                if result.body is not None:
                    self.bodies[node.id] = result.body
                if op.is_fallback or result.fallback:
                    rule_name = RuleName.FALLBACK
                    self.fallbacks.append(node.id)
                    if result.fallback_cause:
                        self.fallback_causes[node.id] = result.fallback_cause
                else:
                    rule_name = op.rule_name
            if node.op == PARAMETER:
                outputs = tuple(self._settle(ctx, v, s) for v, s in zip(node.outputs, outputs, strict=True))
                for sharding in outputs:
                    self._check(node, sharding)
            for value, sharding in zip(node.outputs, outputs, strict=True):
                shardings[value] = sharding
            self.needs.append(needs if type(needs) is tuple else tuple(needs))
            self.rule_names.append(rule_name)
        self._view_returned()

    def _view_returned(self) -> None:
        """The created axes of a returned value take the layout the backward pass asks for it (it mirrors an
        argument: uses.py), as a use's view asks its operand's (``_viewed``): no node reads it to ask."""
        # a value returned as several outputs mirroring differently laid out arguments adopts, per axis, what all their
        # layouts start with: each output is then its slice, free (adopting one's finer layout would make the others
        # gather it)
        shared: dict[int, Layout] = {}
        for (node_id, k), view in self.views.items():
            if node_id == RETURNED:
                value = self.graph.outputs[k]
                have = shared.get(value, view.layout)
                shared[value] = tuple(_common_start(a, b) for a, b in zip(have, view.layout, strict=True))
        for (node_id, k), view in self.views.items():
            if node_id != RETURNED:
                continue
            value = self.graph.outputs[k]
            sharding = self.shardings[value]
            # (else made as its readers need it, and returned sliced)
            opens = [(a, want) for a, want in zip(sharding.axes, shared[value], strict=True)
                     if isinstance(a, Open) and want]
            if opens:
                self.settings_read.add("returned")
            if opens and self.adoption.returned and self._adopts(value, viewed=False):
                for a, want in opens:
                    self.opens.request(a, want, RETURNED)
            if self.resolve is None:
                continue
            # the final walk: met, or returned sliced so (free: each device keeps its block of what it holds whole,
            # its readers taking it as held; ShardedGraph.returned_layout)
            if sharding.layout == view.layout or not sharding.spans and layout_refines(sharding.layout, view.layout):
                self.views_taken[(node_id, k)] = view

    def _viewed(self, ctx: RuleContext, node: Node, operands: list[TensorSharding]) -> list[TensorSharding]:
        """``operands`` as the backward pass asks ``node`` to take them: an axis sliced further (each device keeps its
        block) or gathered, so that the node produces its value in the layout its uses need."""
        viewed = list(operands)
        for j, sharding in enumerate(operands):
            view = self.views.get((node.id, j))
            if view is None or sharding.spans:
                continue
            if any(isinstance(a, Open) for a in sharding.axes) and self._adopts(node.operands[j], viewed=True):
                for a, want in zip(sharding.axes, view.layout, strict=True):
                    if isinstance(a, Open) and want:
                        self.opens.request(a, want, node.id)
                continue
            axes = []
            # a view changes the axes it asks for; an axis it leaves as the forward walk had it, now held otherwise
            # (an open axis upstream adopted a layout the views asked elsewhere), is kept so where that clashes with
            # nothing it asks: gathering it would undo the very adoption the views caused
            for k, (a, want) in enumerate(zip(sharding.axes, view.layout, strict=True)):
                elsewhere = {m for k2, w in enumerate(view.layout) if k2 != k for m in w}
                if sharding.layout[k] == want or (not view.exact and want == view.was[k] and sharding.layout[k]
                                                  and not elsewhere & set(sharding.layout[k])):
                    axes.append(a)
                elif want and sharding.shape[k] % shard_count(self.mesh_shape, want) == 0:
                    axes.append(ctx.root(k, sharding.shape[k], want))
                else:
                    axes.append(None)
            viewed[j] = TensorSharding(sharding.shape, tuple(axes))
            self.views_taken[(node.id, j)] = view
        return viewed

    def _adopts(self, value: int, *, viewed: bool) -> bool:
        """Whether a view of ``value``'s open axes lays the value itself out so (they adopt what is asked): an
        unannotated argument, or a created value (a broadcast's) this use alone reads (for a use's view — ``viewed``
        — unless ``Adoption.viewed`` says it is made as without the view, and sliced). A created value read by other
        uses too is made as they need it and sliced for this one (free) — or, with ``Adoption.shared``, made as the
        view asks for all of them."""
        if self.graph.nodes[self.graph.producer[value]].op == PARAMETER:
            return True
        if self._readers(value) == 1:
            if not viewed:
                return True
            self.settings_read.add("viewed")
            return self.adoption.viewed
        self.settings_read.add("shared")
        return self.adoption.shared

    def _readers(self, value: int) -> int:
        """How many operands and outputs read ``value``."""
        if self._reads is None:
            self._reads = collections.Counter(v for n in self.graph.nodes for v in n.operands)
            self._reads.update(self.graph.outputs)
        return self._reads[value]

    def _settle(self, ctx: RuleContext, value: int, sharding: TensorSharding) -> TensorSharding:
        """Replace created-axis markers: open in the first walk, resolved in the final one."""
        if not any(a is CREATED for a in sharding.axes):
            return sharding
        axes = list(sharding.axes)
        made = self.views.get((ctx.node, MADE)) if self.views else None
        if made is not None:  # made from nothing, in the layout its uses ask (uses.py): in both walks
            self.views_taken[(ctx.node, MADE)] = made
            return TensorSharding(sharding.shape, tuple(
                (ctx.root(k, sharding.shape[k], want) if want and uses_mesh_axes_once(made.layout)
                 and sharding.shape[k] % shard_count(self.mesh_shape, want) == 0 else None) if a is CREATED else a
                for k, (a, want) in enumerate(zip(axes, made.layout, strict=True))))
        if self.resolve is None:
            for k, a in enumerate(axes):
                if a is CREATED:
                    axes[k] = Open((value, k))
                    self.opens.find((value, k))
            return TensorSharding(sharding.shape, tuple(axes))
        used = {name for a in axes if isinstance(a, Sharded) for name in a.mesh_axes}
        for k, a in enumerate(axes):
            if a is CREATED:
                mesh_axes = self.resolve((value, k))
                fits = mesh_axes and sharding.shape[k] % shard_count(self.mesh_shape, mesh_axes) == 0
                if fits and not used.intersection(mesh_axes):
                    axes[k] = ctx.root(k, sharding.shape[k], mesh_axes)
                    used.update(mesh_axes)
                    source = None if self.adopted_from is None else self.adopted_from((value, k))
                    if source is not None:
                        self.adoptions[(value, k)] = source
                else:
                    axes[k] = None
        return TensorSharding(sharding.shape, tuple(axes))

    def _apply(self, ctx: RuleContext, node: Node, op, operands: list[TensorSharding]):
        """The rule on ``operands``: ``(RuleOutput, settled output shardings)``; a conflict is a RuleConflict. From the
        memo where an earlier walk gave the node operands laid out alike (its outputs too, settled and checked, where
        the rule creates no axis and meets no open one: settling them is then nothing); where they hold open axes, the
        rule's calls on the tracker replayed on this walk's (memo.py)."""
        keyed = None if self.memo is None else memo_key(node.id, operands)
        if keyed is None:
            return self._settled(ctx, node, op.propagate(ctx, *operands, **node.params))
        key, opens = keyed
        found = self.memo.get(key)
        if found is not None:
            if opens:
                result = replay(found, self.opens, opens)
                return self._settled(ctx, node, result) if found.creates else (result, result.outputs)
            return found if found[1] is not None else self._settled(ctx, node, found[0])
        if not opens:
            result, outputs = self._settled(ctx, node, op.propagate(ctx, *operands, **node.params))
            if result.body is None:
                created = any(a is CREATED for sharding in result.outputs for a in sharding.axes)
                self.memo[key] = (result, None if created else outputs)
            return result, outputs
        # the rule sees the tracker through its context: one that logs its calls, for a later walk to replay
        recording = Recording(self.opens, opens)
        recorded = RuleContext(ctx.in_avals, ctx.out_avals, self.mesh_shape, self.ids, recording, lineage=False,
                               propagate_body=self.propagate_body, graph=self.graph)
        recorded.node = node.id
        result = op.propagate(recorded, *operands, **node.params)
        settled = self._settled(ctx, node, result)
        entry = recording.entry(result) if recording.replayable and result.body is None else None
        if entry is not None:
            self.memo[key] = entry
        return settled

    def _settled(self, ctx: RuleContext, node: Node, result):
        """``(result, its outputs settled and checked)``."""
        outputs = tuple(self._settle(ctx, v, s) for v, s in zip(node.outputs, result.outputs, strict=True))
        for sharding in outputs:
            self._check_mesh_axes_once(sharding)
        return result, outputs

    def _check(self, node: Node, sharding: TensorSharding) -> None:
        try:
            self._check_mesh_axes_once(sharding)
        except RuleConflict as conflict:
            raise self._conflict(node, conflict) from None

    def _reshard(self, ctx: RuleContext, node: Node, op, operands: list[TensorSharding], conflict: RuleConflict):
        """Resolve ``conflict`` by moving one operand: the rule again with it as if replicated (so it is consumed
        in the layout the rule then needs: moved by an all-to-all, or gathered and sliced locally), for the operand
        cheapest to move; or the conflict error."""
        if self.conflicts != "reshard" and node.id not in self.priced:
            raise self._conflict(node, conflict) from None
        avals = self.graph.avals
        options = []
        for k, sharding in enumerate(operands):
            count = math.prod(shard_count(self.mesh_shape, m) for m in sharding.layout)
            if count == 1:
                continue  # nothing to gather
            trial = list(operands)
            trial[k] = TensorSharding(sharding.shape, (None,) * len(sharding.shape))
            try:
                result, outputs = self._apply(ctx, node, op, trial)
            except RuleConflict:
                continue
            moved = min(move_cost(avals[node.operands[k]], sharding.layout, result.needs[k], self.mesh_shape),
                        self._remade_cost(node.operands[k]))
            options.append((moved, -k, result, outputs))
        if not options:
            raise self._conflict(node, conflict) from None
        _, minus_k, result, outputs = min(options, key=lambda o: (o[0], o[1]))
        if self.resolve is not None:  # the final walk: say what was resolved (with lineage in the message)
            self.reshards[node.id] = (-minus_k, str(self._conflict(node, conflict)))
        return result, outputs

    def _remade_cost(self, value: int) -> float:
        """What making ``value`` in any layout costs beyond making it as held, where its producer makes it from less
        and the conflict's node is its one reader (the backward pass then asks the producer to make it so: ``uses.py``;
        readers that disagree leave it made as held, and moved): nothing for a value made from no operand (an
        ``iota``); gathering the operand of a broadcast (each device then slices what it needs of the result).
        Infinite else."""
        producer = self.graph.nodes[self.graph.producer[value]]
        # (only a node the backward pass may ask: one result, run inside the stage)
        if producer.op in (PARAMETER, CONSTANT) or self._readers(value) > 1 or len(producer.outputs) != 1 \
                or lookup(producer.op).runs_outside_shard_map:
            return math.inf
        if not producer.operands:
            return 0.0
        if len(producer.operands) == 1 and Trait.BROADCAST in lookup(producer.op).traits:
            operand = producer.operands[0]
            layout = self.shardings[operand].layout
            return move_cost(self.graph.avals[operand], layout, ((),) * len(layout), self.mesh_shape)
        return math.inf

    @staticmethod
    def _check_mesh_axes_once(sharding: TensorSharding) -> None:
        if uses_mesh_axes_once(sharding.layout):
            return
        seen: dict[str, int] = {}
        for k, a in enumerate(sharding.axes):
            if isinstance(a, Sharded):
                for name in a.mesh_axes:
                    if name in seen:
                        raise RuleConflict(
                            k, f"mesh axis {name!r} would shard both output axes {seen[name]} and {k}; a mesh axis "
                               "may shard at most one axis of a tensor", (sharding.layout[seen[name]], a.mesh_axes),
                            kind=ConflictKind.REUSE)
                    seen[name] = k

    def _conflict(self, node: Node, conflict: RuleConflict) -> ShardingConflictError:
        lines = [f"sharding conflict in `{node.op}` at {where(node)}"]
        for i, v in enumerate(node.operands):
            sharding = self.shardings[v]
            dtype = short_dtype(self.graph.avals[v].dtype)
            lines.append(f"  operand {i} ({value_name(v)}): {dtype}[{sharding.format_dims()}]")
            if self.lineage:  # shards exist: say where each sharded axis came from
                for axis, a in enumerate(sharding.axes):
                    if isinstance(a, Sharded):
                        lines.append(f"    axis {axis} @{'*'.join(a.mesh_axes)}: {self._origin(v, axis)}")
        on_axis = f"output axis {conflict.axis}: " if conflict.axis is not None else ""
        lines.append(f"  {on_axis}{conflict.detail}")
        lines.append("  fix: constrain one operand to the other's layout (jax.lax.with_sharding_constraint), or "
                     "change an input spec so that they agree; conflicts='reshard' (autoshard's default) moves the "
                     "operand cheaper to move")
        return ShardingConflictError("\n".join(lines), op=node.op, source=node.source, axis=conflict.axis,
                                     layouts=conflict.layouts, kind=conflict.kind)

    def _origin(self, value: int, axis: int) -> str:
        """Where the sharding of ``value``'s ``axis`` came from: the input spec (or the op that created the
        axis), and the ops in between, in program order."""
        origin = trace_origin(self.graph, self.shardings, value, axis)
        node = origin.node
        if origin.is_argument:
            root = (f"{argument_label(self.graph, node.params['index'])} has spec "
                    f"{self.shardings[origin.value].spec}")
        else:
            root = f"`{node.op}` at {where(node)} adopted it"
        ops = [f"`{n.op}` at {where(n)}" for _, _, n in origin.steps]
        if not ops:
            return root
        more = f" -> ... {len(ops) - 4} more ops" if len(ops) > 4 else ""
        return f"{root}, via {' -> '.join(ops[:4])}{more}"


def _common_start(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...]:
    """The longest run of mesh axes both layouts of one axis start with: a layout both are local slices of."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]
