"""The layout search: every value's layout chosen by one integer program, optimal within the cost model and certified.

``search_layouts`` builds the program's layout problem (``.build``: every node of the traced graph picks a strategy
from what its sharding rule can do, every value read costs the one planner's move between its producer's and its
reader's choices, memory is summed at every moment), shrinks it exactly and solves it with HiGHS (``.ilp``), then
makes the solution into the plan it describes (``.realize``) — whose price, by the same cost model
(``shardprop.splitting.cost.price``), is the solution's or less. The solver proves a bound: the result states it, and
how far the choice may be from the best (``SearchResult.gap``: 0 when optimal).

Constraints: the arguments the user fixed keep their specs; arguments decided together (an optimizer's moments and
their parameter, ``.space.decision_groups``) take one layout; state the program returns for its next call (an NNX
module's, or an output mirroring an argument: ``.space.state_pairs``) is priced back into its argument's layout and
returned so; under ``memory_limit`` the cost model's memory is bounded at every moment, and the compiled program has
the last word: the optimum without the limit is compiled first (where it fits, it is the optimum within it); where it
does not, what it held as compiled beyond the problem's memory calibrates the limit the solve keeps (the user's less
that), and a plan still over the limit as compiled tightens it further and is solved again.
"""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from jax.sharding import PartitionSpec

from ..core.transfers import total_moved
from ..errors import OptionError
from ..expr.graph import where
from ..gc_pause import gc_paused
from ..splitting.cost import Footprint, estimate, footprint, price
from ..splitting.split import split
from .build import BuiltProblem, build_problem, spec_of_layout
from .ilp import Solution, solve
from .problem import FORBIDDEN
from .limited import LIMITED_GAP, Limited, fitting_unbound, solved_within
from .realize import realize
from .space import AUTO, Leaf, candidate_specs, decision_groups, leaves_of, state_pairs

# the solver's time limit (seconds) per solve; a solve stopped by it states its gap
TIME_LIMIT = 60.0


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


@dataclass(frozen=True)
class Alternative:
    """A layout of a searched argument (or of a value the solve laid out) with every other value's layout chosen
    again around it: the best plan then (``candidate``, as realized) and its ``cost`` by the problem (what the solve
    minimised: never below the chosen one's; a realized plan can be cheaper than its cost by moves the problem does
    not model, so alternatives are compared by cost)."""

    spec: PartitionSpec
    candidate: Candidate | None  # None: no plan with this layout fits the limit
    cost: float | None = None


@dataclass(frozen=True)
class SearchResult:
    """What the search chose and why. ``chosen`` is the winning ``Candidate``; ``searched`` the flat arguments it
    decided (``leaves[k].path`` names them); ``groups`` the arguments decided together (led by their first);
    ``solution`` the solver's answer on the cost model — its ``cost``, the ``bound`` it proved, its ``status``
    ("optimal"; "priced limit" where the priced limit's answer stood — within ``LIMITED_GAP`` of its bound, or, a
    probe whose certified answer broke the limit as compiled, beyond it; "relative gap" where the integer program's
    answer stood within it; "time limit") — so ``gap`` is how far the choice can be from the best (0: optimal);
    ``values`` and ``strategies`` the size of the problem; ``seconds`` the time; ``compiled`` the plans compiled to
    check a memory limit, taking ``compile_seconds`` of it."""

    chosen: Candidate
    leaves: tuple[Leaf, ...]
    searched: tuple[int, ...]
    groups: tuple[tuple[int, ...], ...]
    memory_limit: int | None
    solution: Solution
    values: int
    strategies: int
    seconds: float
    compiled: int
    compile_seconds: float
    plan: object = field(repr=False, compare=False)
    _alternatives: Callable = field(repr=False, compare=False)
    _value_alternatives: Callable = field(repr=False, compare=False)
    # bytes per device the built program moves beyond the chosen plan (0 now that returned state is priced)
    returned_moves: float = 0.0
    # strategy="optimal" kept propagation's plan: the cost model prices it below the solve's (``chosen`` is it)
    walked: bool = False
    # the nodes whose layouts combine in too many ways to ask about each (``menu.Menu.sampled``), as `op` at line
    sampled: tuple[str, ...] = ()
    # what the memory check compiled for ``plan`` (a ``shardprop.Program``; None: nothing): the program runs it
    checked: object = field(default=None, repr=False, compare=False)
    # under a limit the unlimited optimum broke as compiled: the limit on the problem's memory the chosen plan's solve
    # kept — the user's calibrated on what compiled plans held beyond the problem's memory (None: the user's itself)
    memory_kept: int | None = None

    @property
    def bound(self) -> float:
        """A cost no layout of this program can beat, by the cost model (the solver's proof); under a limit the
        unlimited optimum broke as compiled, none whose memory by the problem is within ``memory_kept``."""
        return self.solution.bound

    @property
    def status(self) -> str:
        return self.solution.status

    @property
    def gap(self) -> float:
        """``(cost - bound) / cost``: 0 when the choice is proved optimal."""
        return self.solution.gap or 0.0

    @property
    def certificate(self) -> str:
        """``optimal`` or ``within 0.4% of the bound`` (of the solve; ``walked``: the walk's plan, cheaper still; where
        the limit kept was calibrated, within it; where some node's layouts were ``sampled``, of the strategies asked
        about; the leanest layout, where no solve's plan fit, proves nothing)."""
        if self.walked:
            return "the walk's plan, below the solve's optimum by moves the solve does not model"
        if self.status == "the leanest layout":
            return "not proved: the leanest layout, found to fit as compiled"
        proved = "optimal" if self.gap <= 0 else f"within {100 * self.gap:.2g}% of the bound"
        if self.memory_kept is not None:
            proved += " under the limit kept"
        if self.sampled:
            count = len(self.sampled)
            return f"{proved} among the layouts asked about, {count} node{'' if count == 1 else 's'} sampled"
        return proved

    def group_of(self, leaf: int) -> tuple[int, ...] | None:
        """The searched arguments decided with flat argument ``leaf`` (None: it was not searched)."""
        return next((g for g in self.groups if leaf in g), None)

    def alternatives(self, leaf: int) -> tuple[Alternative, ...]:
        """Every layout of ``leaf``'s group, every other value's layout chosen again around it (one solve each, on
        first asking), cheapest first."""
        return self._alternatives(leaf)

    def value_alternatives(self, value: int) -> tuple[Alternative, ...]:
        """Every layout the solve could hold ``value`` in (a value of the traced graph), every other value's layout
        chosen again around it (one solve each, on first asking), cheapest first; () where the plan that runs is
        propagation's (``walked``) or ``value`` is not the solve's."""
        return () if self.walked else self._value_alternatives(value)

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


@dataclass
class _Session:
    """One search's settings and what its solves share (the problem, built once)."""

    graph: object
    mesh: object
    built: BuiltProblem
    fixed: frozenset[int]
    pairs: tuple[tuple[int, int], ...]
    strategy: str
    conflicts: str
    donated: tuple[int, ...]
    pin: Callable | None
    compiled_memory: Callable | None
    checks: list[float] = field(default_factory=list)
    unbound: Solution | None = None  # the problem's optimum without a limit, once solved: where limited solves start

    def solved(self, usage_limit: float | None, allowed: dict[int, tuple[int, ...]] | None = None, *,
               probe: bool = False) -> Solution:
        """The problem solved within ``usage_limit`` bytes per device, the nodes ``allowed`` names held to the
        strategies it lists; ``probe``: the priced limit's answer whatever its gap (``ilp.solve``'s), to measure."""
        problem = replace(self.built.problem, usage_limit=usage_limit)
        gap = 0.0 if usage_limit is None else LIMITED_GAP  # (under a limit every answer stands within it of its bound)
        if allowed:
            costs = list(problem.costs)
            for node, indices in allowed.items():
                costs[node] = np.where(np.isin(np.arange(len(costs[node])), indices), costs[node], FORBIDDEN)
            return solve(replace(problem, costs=tuple(costs)), time_limit=TIME_LIMIT, priced_gap=gap, relative_gap=gap)
        if usage_limit is not None:
            return solve(problem, time_limit=TIME_LIMIT, priced_gap=gap, relative_gap=gap, unlimited=self.unbound,
                         probe=probe)
        if self.unbound is None:
            self.unbound = solve(problem, time_limit=TIME_LIMIT)
        return self.unbound

    def leanest(self) -> Solution:
        """The assignment holding the fewest bytes summed over every value (moves free): where no plan fits a limit,
        the one to report."""
        problem = self.built.problem
        lean = replace(problem, costs=problem.usages, usage_limit=None,
                       edge_costs=tuple(np.where(m >= FORBIDDEN, FORBIDDEN, 0.0) for m in problem.edge_costs))
        return solve(lean, time_limit=TIME_LIMIT)

    def planned(self, solution: Solution):
        """The plan ``solution`` describes, its state returned in its arguments' layouts."""
        chosen = self.built.chosen(solution.strategies)
        graph = self.graph
        held = {v: t for node, s in zip(graph.nodes, chosen, strict=True) for v, t in zip(node.outputs, s.outputs,
                                                                                        strict=True)}
        pins = {k: spec_of_layout(held[graph.inputs[j]].even_layout) for k, j in self.pairs
                if held[graph.outputs[k]].even_layout != held[graph.inputs[j]].even_layout}
        pinned = self.pin(graph, pins) if pins and self.pin is not None else graph
        sharded = realize(self.built, solution.strategies, self.mesh, graph=pinned, fixed=self.fixed,
                          conflicts=self.conflicts)
        return split(sharded, strategy=self.strategy)

    def candidate(self, plan, limit: int | None) -> Candidate:
        memory = footprint(plan, self.donated)
        return Candidate(tuple(plan.sharded.in_specs), price(plan), total_moved(estimate(plan)), memory,
                         0 if limit is None else max(0, memory.total - limit))

    def compiled(self, plan) -> int:
        began = time.perf_counter()
        memory = self.compiled_memory(plan)
        self.checks.append(time.perf_counter() - began)
        return memory


@gc_paused  # (its menus, edges and solves allocate per strategy and free little until they return)
def search_layouts(graph, flat_specs: Sequence, *, mesh, strict: bool = False, conflicts: str = "reshard",
                   strategy: str = "auto", memory_limit: int | None = None,
                   compiled_memory: Callable[[object], int] | None = None, keyword_form: bool = False,
                   donated: Sequence[int] = (), returns_inputs: Sequence[int] = (), mirror_state: bool = True,
                   pin: Callable | None = None) -> SearchResult:
    """Choose a spec for every ``sp.AUTO`` entry of ``flat_specs`` (one per flat argument of ``graph``; PartitionSpecs
    are kept exactly, None entries laid out as the solve finds best) and a layout for every value, minimising the
    plan's price within ``memory_limit`` bytes per device; ``compiled_memory`` (the compiled memory of a plan) has the
    last word on the limit. ``keyword_form``: the program was traced on ``(args, kwargs)`` (``.space.leaves_of``);
    ``donated``: the argument leaves the program donates; ``returns_inputs``: the last outputs are these arguments'
    new values (NNX state); ``mirror_state``: outputs mirroring arguments come back in their layouts too
    (``.space.state_pairs``); ``pin(graph, {output: spec})``: the graph returning those outputs constrained so.
    Raises ``shardprop.MemoryLimitError`` when no layout fits."""
    started = time.perf_counter()
    leaves = leaves_of(graph, keyword_form)
    searched = [k for k, s in enumerate(flat_specs) if s is AUTO]
    free = [k for k, s in enumerate(flat_specs) if s is AUTO or s is None]
    groups = decision_groups(leaves, searched)
    unannotated = frozenset(free) - frozenset(searched)
    ties = [g for g in decision_groups(leaves, free, unannotated) if len(g) > 1 and any(k in searched for k in g)]
    pairs = tuple(state_pairs(graph, returns_inputs, mirrors=mirror_state))
    fixed = frozenset(k for k, s in enumerate(flat_specs) if isinstance(s, PartitionSpec))

    session = _Session(graph, mesh, build_problem(graph, flat_specs, mesh, ties=ties, returns=pairs), fixed, pairs,
                       strategy, "error" if strict else conflicts, tuple(donated), pin, compiled_memory)
    if memory_limit is None:
        found = session.solved(None)
        plan = session.planned(found)
        limited = Limited(found, plan, session.candidate(plan, None))
    else:
        unlimited, beyond = fitting_unbound(session, memory_limit)
        limited = unlimited if unlimited is not None and not unlimited.candidate.excess else None
        if limited is None:  # the limit binds: solved within it, on the same problem
            limited = solved_within(session, memory_limit, leaves, searched, unlimited, beyond)
    solution, chosen, built = limited.solution, limited.candidate, session.built
    kept = memory_limit if limited.kept is None else limited.kept  # what explain's solves keep too

    def alternatives(leaf: int) -> tuple[Alternative, ...]:
        return _alternatives(session, leaf, groups, leaves, (memory_limit, kept), chosen, solution)

    def value_alternatives(value: int) -> tuple[Alternative, ...]:
        return _value_alternatives(session, value, (memory_limit, kept), chosen, solution)

    return SearchResult(chosen, tuple(leaves), tuple(searched), tuple(groups), memory_limit, solution,
                        len(graph.nodes), built.problem.strategy_count, time.perf_counter() - started,
                        len(session.checks), sum(session.checks), limited.plan, _remembered(alternatives),
                        _remembered(value_alternatives),
                        sampled=tuple(f"`{graph.nodes[k].op}` at {where(graph.nodes[k])}" for k in built.sampled),
                        memory_kept=limited.kept)


def _remembered(fn: Callable[[int], tuple]) -> Callable[[int], tuple]:
    """``fn``, each answer computed on first asking and kept (its solves are not repeated)."""
    cache: dict[int, tuple] = {}

    def remembered(key: int) -> tuple:
        if key not in cache:
            cache[key] = fn(key)
        return cache[key]

    return remembered


def _alternatives(session: _Session, leaf: int, groups, leaves, limits, chosen: Candidate,
                  chosen_solution: Solution) -> tuple[Alternative, ...]:
    """Each layout of ``leaf``'s group, the rest solved again around it within the limit the choice's solve kept
    (``limits``: the user's and that), and judged against the user's."""
    limit, kept = limits
    group = next((g for g in groups if leaf in g), None)
    if group is None:
        return ()
    graph = session.graph
    node = graph.producer[graph.inputs[group[0]]]
    mesh_shape = dict(session.mesh.shape)
    found = []
    menu = session.built.menus[node]
    for spec in candidate_specs(leaves[group[0]].shape, mesh_shape):
        index = next(i for i, s in enumerate(menu) if spec_of_layout(s.outputs[0].even_layout) == spec)
        if spec == chosen.specs[group[0]]:
            found.append(Alternative(spec, chosen, chosen_solution.cost))
            continue
        solution = session.solved(kept, {node: (index,)})
        if solution.cost is None:
            found.append(Alternative(spec, None))
            continue
        found.append(Alternative(spec, session.candidate(session.planned(solution), limit), solution.cost))
    return tuple(sorted(found, key=lambda a: _rank(a, chosen)))


def _rank(alternative: Alternative, chosen: Candidate) -> tuple:
    """Fitting first, then cheapest by the problem's cost, the chosen one first among equals; no plan last."""
    c = alternative.candidate
    return (True,) if c is None else (False, c.excess, alternative.cost, c is not chosen)


def _value_alternatives(session: _Session, value: int, limits, chosen: Candidate,
                        solution: Solution) -> tuple[Alternative, ...]:
    """Each layout the solve could hold ``value`` in, the rest solved again around it (as ``_alternatives``)."""
    limit, kept = limits
    graph, menus = session.graph, session.built.menus
    if value >= len(graph.avals) or graph.producer[value] >= len(menus):
        return ()
    node = graph.producer[value]
    out = graph.nodes[node].outputs.index(value)
    menu = menus[node]
    held = session.built.chosen(solution.strategies)[node].outputs[out].even_layout
    by_layout: dict = {}
    for index, strategy in enumerate(menu):
        by_layout.setdefault(strategy.outputs[out].even_layout, []).append(index)
    if len(by_layout) < 2:
        return ()
    found = []
    for layout, indices in by_layout.items():
        if layout == held:
            found.append(Alternative(spec_of_layout(layout), chosen, solution.cost))
            continue
        again = session.solved(kept, {node: tuple(indices)})
        found.append(Alternative(spec_of_layout(layout), None if again.cost is None else
                                 session.candidate(session.planned(again), limit), again.cost))
    return tuple(sorted(found, key=lambda a: _rank(a, chosen)))


def as_tree(graph, flat: Sequence[PartitionSpec | None]):
    """Flat per-argument specs as an ``in_specs`` tree shaped like the arguments."""
    import jax

    return jax.tree_util.tree_unflatten(graph.in_tree, list(flat))


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
