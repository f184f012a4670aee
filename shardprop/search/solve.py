"""The layout search: the ``sp.AUTO`` arguments' layouts that make the cheapest plan within a memory limit.

Every candidate is priced by the pipeline itself — propagate, split, and the cost model (bytes moved and work,
``shardprop.splitting.cost.price``; memory, ``shardprop.splitting.cost.footprint``) — so the search sees
what the compiled program will move. It is a coordinate descent over decision groups (an argument and the arguments
shaped like it further down its path, ``.space.decision_groups``):

1. starts: every searched argument adopting what it meets (as an unannotated argument does), and the layouts an
   expert would write (``.space.expert_seeds``: data parallel, FSDP, Megatron, Megatron with FSDP);
2. from the cheapest start (``DESCENTS``), each group tries its layouts — the ``PREFILTER`` the rough screen
   (the forward walk's operand moves, no split) ranks first — keeping a change only when the plan gets strictly
   cheaper (fitting the limit first): first with the layers of a stack tied (one layout per bundle,
   ``.space.tied``), then — under a memory limit, for a few layers alike — each on its own; then the small
   arguments (biases, norms' scales) adopt what they meet, all in one plan, where that is cheaper;
3. the descent screens with a quick propagation (one setting of its backward pass) that makes no shards, its walks
   sharing the rules' results and the backward pass's trials (``propagate(memo=)``: a candidate re-runs the rules
   only where its layouts differ); the cheapest assignment it saw is priced as ``autoshard``
   builds it and chosen — under a memory limit, the cheapest (``FINALISTS_LIMITED``), then the two leanest, are
   priced so and compiled in turn, and the first whose compiled program fits is chosen.

Groups and layouts are tried in a fixed order and a tie keeps the earlier, so the choice is the same on every run and
every process.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import jax
from jax.sharding import PartitionSpec

from ..core.moves import move_bytes
from ..core.transfers import total_moved
from ..core.types import ValueType
from ..errors import MemoryLimitError, NoRuleError, OptionError, SearchError, ShardingConflictError
from ..propagation import propagate
from ..splitting.cost import Footprint, estimate, footprint, price, whole_work
from ..splitting.split import PlanPricer
from .space import AUTO, Leaf, candidate_specs, decision_groups, expert_seeds, leaves_of, tied

# a bundle holding less than this share of the searched bytes is left to adopt what it meets, after the others
SMALL = 0.02
# under a memory limit, a bundle of this many groups or fewer is searched group by group after the tied phase (layers
# alike may need different layouts to fit: the first two sharded, the third not); a deeper stack's layers, and every
# stack's without a limit, keep one layout (layers alike cost alike; refining each never paid in the benchmark and
# costs a sweep per layer)
UNTIE_AT_MOST = 4
# the starts the descent runs from (the cheapest first)
DESCENTS = 1
# the layouts of a bundle the screen prices, of those the rough screen ranks first (the forward walk's operand
# moves alone: no split, a fifth of the screen's time)
PREFILTER = 2
# the screened assignments priced in full at the end (each as autoshard builds it: ~3x a screen); under a memory limit,
# more, and the two leanest (candidates for the compiled check)
FINALISTS, FINALISTS_LIMITED = 1, 4
# the finalists compiled, at most, to check a memory limit on the compiled program
COMPILED_CHECKS = 4
# how far over the limit the cost model's footprint may be for a candidate still to be compiled and checked
SLACK = 0.3


@dataclass(frozen=True)
class Candidate:
    """One assignment of every argument's spec, priced: ``price`` (bytes moved plus work in bytes' worth),
    ``moved`` (bytes per device), ``memory`` (per device); ``excess`` is how far it is over the memory limit."""

    specs: tuple[PartitionSpec, ...]
    price: float
    moved: float
    memory: Footprint
    excess: int
    compiled_memory: int | None = None  # memory_analysis()'s, where the limit was checked on the compiled program

    @property
    def rank(self) -> tuple:
        """What the search minimises: the bytes over the limit first, then the price, then the memory."""
        return (self.excess, self.price, self.memory.total)


@dataclass(frozen=True)
class Alternative:
    """A group's layout the search weighed, with every other group as chosen."""

    spec: PartitionSpec
    candidate: Candidate | None  # None: propagation refused it (strict=True: a conflict or no rule)


@dataclass(frozen=True)
class SearchResult:
    """What the search chose and why. ``chosen`` is the winning ``Candidate``; ``searched`` the flat
    arguments it decided (``leaves[k].path`` names them); ``groups`` the arguments decided together (led by their
    first); ``finalists`` the whole assignments priced in full at the end, cheapest first; ``bound`` a price no
    layout can beat (no byte moved, every device doing an equal share of the work), so ``gap`` is how far the choice
    can be from the best; ``evaluations`` the plans priced (rough and quick screens, full prices), ``seconds`` the
    time; ``compiled`` the finalists compiled to check a memory limit, taking ``compile_seconds`` of it."""

    chosen: Candidate
    leaves: tuple[Leaf, ...]
    searched: tuple[int, ...]
    groups: tuple[tuple[int, ...], ...]
    finalists: tuple[Candidate, ...]
    memory_limit: int | None
    bound: float
    evaluations: int
    seconds: float
    compiled: int
    compile_seconds: float
    _options: dict = field(repr=False, compare=False)
    _price: _Evaluator = field(repr=False, compare=False)
    # bytes per device the built program moves beyond the chosen plan: returning updated NNX state in its
    # arguments' layouts (api.compile_program pins them after the search)
    returned_moves: float = 0.0

    @property
    def gap(self) -> float:
        """``1 - bound / price``: the most the chosen plan's price can be above the best possible one, as a fraction."""
        return 0.0 if self.chosen.price <= 0 else max(0.0, 1.0 - self.bound / self.chosen.price)

    def group_of(self, leaf: int) -> tuple[int, ...] | None:
        """The searched arguments decided with flat argument ``leaf`` (None: it was not searched)."""
        return next((g for g in self.groups if leaf in g), None)

    @property
    def plan(self):
        """The chosen assignment's plan, as ``autoshard`` builds it (propagated once, by the search's full pricing)."""
        return self._price.plan(self.chosen.specs)

    def alternatives(self, leaf: int) -> tuple[Alternative, ...]:
        """Every layout of ``leaf``'s group, with every other argument as chosen, priced in full (on first asking:
        one plan per layout), cheapest first."""
        group = self.group_of(leaf)
        if group is None:
            return ()
        found = []
        for spec in self._options[group[0]]:
            specs = list(self.chosen.specs)
            for k in group:
                specs[k] = spec
            found.append(Alternative(spec, self._price(specs)))
        return tuple(sorted(found, key=lambda a: (a.candidate is None, a.candidate.rank if a.candidate else ())))

    def __str__(self) -> str:
        from ..inspect.searched import format_search  # inspection reads the product

        return format_search(self)

    def rows(self) -> list[dict]:
        """One row per searched argument: its path, shape, dtype, chosen spec and the argument it was decided with."""
        out = []
        for k in self.searched:
            leaf, group = self.leaves[k], self.group_of(k)
            out.append({"argument": leaf.path, "shape": list(leaf.shape), "dtype": str(leaf.dtype),
                        "spec": self.chosen.specs[k],
                        "with": None if group[0] == k else self.leaves[group[0]].path})
        return out


class _Evaluator:
    """Prices an assignment of specs once (cached by the assignment): propagate, split, cost model. ``backward`` is
    propagation's: True weighs every setting of its backward pass, each priced by its plan, as ``autoshard`` builds
    the program; "quick" one setting, its candidates compared by their operand moves (as ``propagate`` compares them
    without a price) and only the one kept split — a fifth of the time (the search's screen); "rough" prices the
    forward walk by its operand moves alone, with no split and every axis nothing annotates replicated (one walk: the
    rough screen only orders a bundle's layouts for the screen)."""

    def __init__(self, graph, mesh, *, strict: bool, conflicts: str, strategy: str, memory_limit: int | None,
                 donated: tuple[int, ...] = (), backward: bool | str = True, memo: dict | None = None,
                 returns_inputs: tuple[int, ...] = ()):
        self.graph, self.mesh, self.strict, self.conflicts, self.strategy = graph, mesh, strict, conflicts, strategy
        self.memory_limit, self.donated, self.backward = memory_limit, donated, backward
        self.returns_inputs = returns_inputs  # the last outputs are these arguments' new values (NNX state)
        self._seen: dict[tuple, Candidate | None] = {}
        self.memo = {} if memo is None else memo  # the rules' results, shared by the evaluators of one search
        self._plans: dict[tuple, object] = {}  # the full pricing's plans (a few finalists): the chosen one is built so

    @property
    def evaluations(self) -> int:
        return len(self._seen)

    def seen(self) -> list[Candidate]:
        """Every candidate priced so far, in the order first priced."""
        return [c for c in self._seen.values() if c is not None]

    def __call__(self, specs: Sequence[PartitionSpec | None]) -> Candidate | None:
        key = tuple(specs)
        if key not in self._seen:
            self._seen[key] = self._price(key)
        return self._seen[key]

    def plan(self, specs: Sequence):
        """The split plan of ``specs`` (None: strict=True refuses it); no warnings (a candidate's reshards are the
        search's to weigh). The full pricing keeps its plans."""
        key = tuple(specs)
        if key in self._plans:
            return self._plans[key]
        # (the screen compares the backward pass's candidates by their operand moves, and splits the one it keeps)
        pricer = PlanPricer(self.strategy)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                sharded = propagate(self.graph, as_tree(self.graph, specs), mesh=self.mesh, strict=self.strict,
                                    conflicts=self.conflicts, price=pricer if self.backward is True else None,
                                    backward=self.backward, lineage=self.backward is True, memo=self.memo)
            except (ShardingConflictError, NoRuleError):  # strict=True refuses this layout: not a candidate
                return None
        plan = pricer.plan_for(sharded)
        if self.backward is True:
            self._plans[key] = plan
        return plan

    def _price(self, specs: tuple) -> Candidate | None:
        if self.backward == "rough":  # the forward walk, priced by its operand moves (no split: no finishes, no work)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    sharded = propagate(self.graph, as_tree(self.graph, specs), mesh=self.mesh, strict=self.strict,
                                        conflicts=self.conflicts, backward=False, lineage=False, memo=self.memo,
                                        adopt=False)
                except (ShardingConflictError, NoRuleError):
                    return None
            moved = sharded.edge_move_bytes() + self._returning(sharded)
            return Candidate(tuple(sharded.in_specs), moved, moved, Footprint(0, 0, 0), 0)
        plan = self.plan(specs)
        if plan is None:
            return None
        memory = footprint(plan, self.donated)  # (also without a limit: of two plans as cheap, the leaner)
        excess = 0 if self.memory_limit is None else max(0, memory.total - self.memory_limit)
        returning = self._returning(plan.sharded)
        return Candidate(tuple(plan.sharded.in_specs), price(plan) + returning, total_moved(estimate(plan)) + returning,
                         memory, excess)

    def _returning(self, sharded) -> float:
        """Bytes per device to return each updated state laid out as its argument (the program moves it back:
        ``api.compile_program``'s ``returns_inputs``), so a layout that computes an update elsewhere pays for it."""
        graph, base = self.graph, len(self.graph.outputs) - len(self.returns_inputs)
        total = 0.0
        for i, j in enumerate(self.returns_inputs):
            aval, want = graph.avals[graph.outputs[base + i]], sharded.layout(graph.inputs[j])
            have = sharded.output_layout(base + i)
            if have != want:
                total += move_bytes(aval.shape, aval.dtype, ValueType(have), ValueType(want), sharded.mesh_shape)
        return total


def as_tree(graph, flat: Sequence[PartitionSpec | None]):
    """Flat per-argument specs as an ``in_specs`` tree shaped like the arguments."""
    return jax.tree_util.tree_unflatten(graph.in_tree, list(flat))


def search_layouts(graph, flat_specs: Sequence, *, mesh, strict: bool = False, conflicts: str = "reshard",
                   strategy: str = "auto", memory_limit: int | None = None,
                   compiled_memory: Callable[[object], int] | None = None, keyword_form: bool = False,
                   donated: Sequence[int] = (), returns_inputs: Sequence[int] = ()) -> SearchResult:
    """Choose a spec for every ``sp.AUTO`` entry of ``flat_specs`` (one per flat argument of ``graph``; the
    others are kept exactly) minimising the plan's price within ``memory_limit`` bytes per device.

    The descent screens layouts with a quick propagation (one setting of its backward pass); the best assignment it
    saw is then priced as ``autoshard`` builds it and chosen. With a limit, the cost model's footprint screens;
    ``compiled_memory`` (the compiled memory of a plan) has the last word: the ``FINALISTS_LIMITED`` cheapest
    screened, then the two leanest, are priced in full in turn, each within ``SLACK`` of the limit is compiled
    (at most ``COMPILED_CHECKS`` of the cheapest), and the first within the limit is chosen.
    ``keyword_form``: the program was traced on ``(args, kwargs)`` (see ``.space.leaves_of``); ``donated``: the
    argument leaves the program donates (their buffers may hold outputs).
    Raises ``shardprop.MemoryLimitError`` when no layout found fits, ``shardprop.SearchError`` when
    ``strict=True`` refuses every layout weighed."""
    started = time.perf_counter()
    leaves = leaves_of(graph, keyword_form)
    searched = [k for k, s in enumerate(flat_specs) if s is AUTO]
    mesh_shape = dict(mesh.shape)
    groups = decision_groups(leaves, searched)
    options = {g[0]: candidate_specs(leaves[g[0]].shape, mesh_shape) for g in groups}
    # the cost model's footprint errs by up to about a third either way (splitting/cost.py footprint): with the
    # compiled program to check against, the screen lets a candidate over the limit by as much compete, and the
    # compiled memory decides
    screen_limit = (memory_limit if memory_limit is None or compiled_memory is None
                    else int(memory_limit * (1 + SLACK)))
    settings = dict(strict=strict, conflicts=conflicts, strategy=strategy, donated=tuple(donated),
                    returns_inputs=tuple(returns_inputs))
    # the rules' results on operands laid out as before, and the backward pass's trials: every walk of the search
    # shares them
    memo: dict = {}
    screen = _Evaluator(graph, mesh, backward="quick", memory_limit=screen_limit, memo=memo, **settings)
    full = _Evaluator(graph, mesh, memory_limit=memory_limit, memo=memo, **settings)
    rough_screen = _Evaluator(graph, mesh, backward="rough", memory_limit=None, memo=memo, **settings)

    def assigned(base: Sequence, bundle: Sequence[tuple[int, ...]], spec) -> list:
        out = list(base)
        for group in bundle:
            for k in group:
                out[k] = spec
        return out

    # the starts: every searched argument adopting what it meets, and the layouts an expert would write
    first_use = {k: min(graph.consumers[graph.inputs[k]], default=len(graph.nodes)) for k in searched}
    busy = frozenset(name for spec in flat_specs if isinstance(spec, PartitionSpec) for entry in spec
                     for name in ((entry,) if isinstance(entry, str) else entry if isinstance(entry, tuple) else ()))
    seeds = expert_seeds(leaves, groups, options, mesh_shape, first_use, busy)
    starts: list[Candidate] = []
    for start in [assigned(flat_specs, groups, None)] + [_seeded(flat_specs, groups, chosen) for _, chosen in seeds]:
        if any(tuple(start) == c.specs for c in starts):
            continue  # the layout a start before it came to (data parallel, often, for the adopting start)
        found = screen(start)
        if found is not None:
            starts.append(found)
    if not starts:
        raise _refused(leaves, searched)

    total = sum(leaves[k].nbytes for k in searched) or 1

    def small(bundle) -> bool:  # a few hundredths of the searched bytes (biases, norms' scales): decided last
        return sum(leaves[k].nbytes for g in bundle for k in g) < SMALL * total

    def sweep(bundles: list[tuple[tuple[int, ...], ...]], current: Candidate) -> Candidate:
        """Each bundle in turn (the biggest first: they move the most bytes) tries its layouts — those the rough
        screen ranks first — keeping a change where the plan gets strictly cheaper."""
        for bundle in sorted(bundles, key=lambda b: (-sum(leaves[k].nbytes for g in b for k in g), b)):
            specs = options[bundle[0][0]]
            if len(specs) > PREFILTER:  # the rough screen keeps the few least moving (and any tied with them)
                rough = {spec: rough_screen(assigned(current.specs, bundle, spec)) for spec in specs}
                ordered = sorted((spec for spec in specs if rough[spec] is not None), key=lambda x: rough[x].rank)
                cut = rough[ordered[min(PREFILTER, len(ordered)) - 1]].rank if ordered else ()
                specs = [spec for spec in ordered if rough[spec].rank <= cut][:PREFILTER + 2]
            for spec in specs:
                found = screen(assigned(current.specs, bundle, spec))
                if found is not None and found.rank < current.rank:
                    current = found
        return current

    bundles = tied(leaves, groups)
    large = [b for b in bundles if not small(b)]

    def searched_from(start: Candidate) -> Candidate:
        found = sweep(large or bundles, start)
        untied = [(g,) for b in large if 1 < len(b) <= UNTIE_AT_MOST for g in b] if memory_limit is not None else []
        if untied:  # a few layers alike may each need their own layout to fit
            found = sweep(untied, found)
        lesser = [g for b in bundles if small(b) for g in b]
        if not large or not lesser:
            return found
        # the small arguments adopt what they meet (as unannotated arguments do: the backward pass lays each out as
        # its uses need it), all in one plan — kept only where that is strictly cheaper
        adopted = screen(assigned(found.specs, lesser, None))
        return adopted if adopted is not None and adopted.rank < found.rank else found

    # from the best few starts: the descent stops at the first layout no single change improves
    for start in sorted(dict.fromkeys(starts), key=lambda c: c.rank)[:DESCENTS]:
        searched_from(start)
    cheapest = sorted(screen.seen(), key=lambda c: c.rank)[:FINALISTS if memory_limit is None else FINALISTS_LIMITED]
    # and the leanest seen, in case the limit is tight
    leanest = [] if memory_limit is None else sorted(screen.seen(), key=lambda c: (c.memory.total, c.price))[:2]
    checks: list[float] = []  # the seconds each compiled check took

    def compiled(candidate: Candidate) -> int:
        began = time.perf_counter()
        memory = compiled_memory(full.plan(candidate.specs))
        checks.append(time.perf_counter() - began)
        return memory

    if memory_limit is not None and compiled_memory is not None:
        chosen, finalists = _compiled_within(cheapest, leanest, memory_limit, full, compiled, leaves, searched)
    else:
        finalists = sorted(dict.fromkeys(c for c in (full(x.specs) for x in cheapest + leanest) if c is not None),
                           key=lambda c: c.rank)
        if not finalists:
            raise _refused(leaves, searched)
        chosen = finalists[0]
        if chosen.excess:
            raise _over_limit(leaves, searched, chosen, memory_limit)
    bound = whole_work(graph) / mesh.size
    return SearchResult(chosen, tuple(leaves), tuple(searched), tuple(groups), tuple(finalists), memory_limit, bound,
                        rough_screen.evaluations + screen.evaluations + full.evaluations, time.perf_counter() - started,
                        len(checks), sum(checks), options, full)


def _compiled_within(cheapest: list[Candidate], leanest: list[Candidate], limit: int, full: _Evaluator,
                     compiled_memory, leaves, searched) -> tuple[Candidate, tuple[Candidate, ...]]:
    """The first of the screen's ``cheapest`` assignments, then of its ``leanest``, whose compiled program fits
    ``limit``, and every assignment priced in full on the way, cheapest first. Each is priced as ``autoshard`` builds
    it; one of the cheapest is compiled when its footprint is within ``SLACK`` of the limit (at most
    ``COMPILED_CHECKS`` of them), the leanest whatever their footprint (the model errs both ways)."""
    priced: list[Candidate] = []
    checked: list[Candidate] = []

    def fits(candidate: Candidate) -> bool:
        checked.append(dataclasses.replace(candidate, compiled_memory=compiled_memory(candidate)))
        return checked[-1].compiled_memory <= limit

    def found() -> tuple[Candidate, tuple[Candidate, ...]]:
        return dataclasses.replace(checked[-1], excess=0), tuple(sorted(priced, key=lambda c: c.rank))

    for screened in cheapest:
        candidate = full(screened.specs)
        if candidate is None or candidate in priced:
            continue
        priced.append(candidate)
        if candidate.memory.total <= limit * (1 + SLACK):
            if fits(candidate):
                return found()
            if len(checked) == COMPILED_CHECKS:
                break
    for screened in leanest:
        candidate = full(screened.specs)
        if candidate is None or any(c.specs == candidate.specs for c in checked):
            continue
        if candidate not in priced:
            priced.append(candidate)
        if fits(candidate):
            return found()
    if not priced:
        raise _refused(leaves, searched)
    smallest = min(checked, key=lambda c: c.compiled_memory) if checked else min(priced, key=lambda c: c.memory.total)
    raise _over_limit(leaves, searched, smallest, limit)


def _seeded(flat_specs, groups, chosen: dict) -> list:
    """``flat_specs`` with every group laid out as ``chosen`` says (replicated where it says nothing)."""
    out = list(flat_specs)
    for group in groups:
        for k in group:
            out[k] = chosen.get(group[0], PartitionSpec())
    return out


def _names(leaves: Sequence[Leaf], searched: Sequence[int], limit: int = 4) -> str:
    names = [f"argument {leaves[k].path}" for k in searched[:limit]]
    return ", ".join(names) + (f" and {len(searched) - limit} more" if len(searched) > limit else "")


def _refused(leaves, searched) -> SearchError:
    return SearchError(f"sp.AUTO: strict=True refused every layout weighed for {_names(leaves, searched)} "
                       "(each met a sharding conflict or a primitive without a rule); fix their specs, or drop "
                       "strict=True to let propagation resolve conflicts")


def _over_limit(leaves, searched, best: Candidate, limit: int) -> MemoryLimitError:
    largest = sorted(searched, key=lambda k: (-leaves[k].nbytes, k))  # the arguments that matter first
    chosen = ", ".join(f"{leaves[k].path} {best.specs[k]}" for k in largest[:6])
    m = best.memory
    how = (f"{best.compiled_memory:,} B as compiled" if best.compiled_memory is not None else
           f"{m.total:,} B (arguments {m.arguments:,} + outputs {m.outputs:,} + temporaries {m.temporaries:,})")
    return MemoryLimitError(
        f"no layout of {_names(leaves, largest)} fits memory_limit={limit:,} B per device: the smallest footprint "
        f"found is {how} with {chosen}{' ...' if len(searched) > 6 else ''}; raise the limit, use a mesh with "
        "more devices, or shard the fixed arguments")


def check_memory_limit(memory_limit) -> int | None:
    """``memory_limit`` as an int of bytes, None for no limit; anything but a finite number of at least one byte (an
    int, a float, a NumPy scalar) is an OptionError."""
    if memory_limit is None:
        return None
    if isinstance(memory_limit, bool) or not isinstance(memory_limit, numbers.Real) or \
            not math.isfinite(memory_limit) or not memory_limit >= 1:
        raise OptionError(f"memory_limit={memory_limit!r}: expected a positive number of bytes per device (a finite "
                          "number, at least 1)")
    return int(memory_limit)

