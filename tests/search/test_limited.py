"""The search under ``memory_limit=`` (``shardprop.search.limited``): table-driven on a one-node problem whose
"compiled" memory is its usage plus what each strategy holds beyond the problem's memory — the limit each solve keeps,
when the calibration is confirmed, which plans are compiled, what is chosen and what its certificate says — then end
to end: a KV-cache decode compiled by XLA, limits refused, nothing fitting."""

from dataclasses import dataclass, field, replace

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import shardprop as sp
from shardprop.bench import experts as bench_experts
from shardprop.inspect.listing import format_bytes
from shardprop.search.ilp import Solution, solve
from shardprop.search.limited import fitting_unbound, solved_within
from shardprop.search.problem import Problem
from shardprop.search.solve import LIMITED_GAP, Candidate
from shardprop.splitting.cost import Footprint

# one value, four layouts: the cheaper, the fatter (cost 1..4, usage 100..40 bytes)
_PROBLEM = Problem.from_lists(intervals=[(0, 1)], costs=[[1, 2, 3, 4]], usages=[[100, 80, 60, 40]], edges=[],
                              edge_costs=[], usage_limit=None)


@dataclass
class _Built:
    problem: Problem


@dataclass
class _Session:
    """What ``limited`` asks of a search session: solves, plans (here the strategy itself), Candidates, and a compiled
    check holding each strategy's usage plus ``beyond[strategy]``."""

    beyond: tuple[int, ...]
    built: _Built = field(default_factory=lambda: _Built(_PROBLEM))
    compiled_memory: object = True
    compiles: list[int] = field(default_factory=list)

    def solved(self, usage_limit, probe=False):
        return solve(Problem(**{**_PROBLEM.__dict__, "usage_limit": usage_limit}), probe=probe)

    def planned(self, solution):
        return solution.strategies[0]

    def candidate(self, plan, limit):
        usage = int(_PROBLEM.usages[0][plan])
        return Candidate((P(),), 1.0 + plan, 0.0, Footprint(usage, 0, 0), 0 if limit is None else max(0, usage - limit))

    def compiled(self, plan):
        self.compiles.append(plan)
        return int(_PROBLEM.usages[0][plan]) + self.beyond[plan]

    def leanest(self):
        return solve(Problem(**{**_PROBLEM.__dict__, "costs": _PROBLEM.usages}))


# what each strategy holds beyond the problem's memory (the limit is 100) -> the strategy chosen, the limit its solve
# kept (None: no solve's plan fit, the leanest did), the strategies compiled in turn (the unlimited optimum first)
CASES = {
    "a constant beyond: the first calibrated solve fits and confirms it": ((30, 30, 30, 30), (2, 70, (0, 2))),
    "a plan holding less beyond loosens the next solve": ((30, 10, 10, 10), (1, 90, (0, 2, 1))),
    "a plan over the limit tightens the next solve": ((10, 30, 30, 30), (2, 70, (0, 1, 2))),
    # (strategy 1 would fit, 90 B as compiled: outside what the solve that kept 70 proved, as its certificate says)
    "a plan that confirms its calibration ends the search": ((30, 10, 30, 30), (2, 70, (0, 2))),
    "nothing within the limit kept: the leanest recalibrates, then halfway between too little and enough":
        ((70, 0, 0, 0), (1, 83, (0, 3, 2, 1))),  # (the unlimited optimum met again: not compiled again)
    "a looser limit's plan breaks it: halfway between, the cheapest plan that fit":
        ((30, 50, 10, 40), (2, 75, (0, 2, 1))),
}


@pytest.mark.parametrize("beyond, want", CASES.values(), ids=CASES.keys())
def test_the_limit_kept_is_calibrated_by_what_the_compiled_plans_held_beyond_the_problem(beyond, want):
    session = _Session(beyond)
    found, held = fitting_unbound(session, 100)
    assert found.candidate.excess and held == beyond[0]
    chosen = solved_within(session, 100, (), (), found, held)
    assert (chosen.plan, chosen.kept, tuple(session.compiles)) == want
    assert chosen.candidate.compiled_memory == _PROBLEM.usages[0][chosen.plan] + beyond[chosen.plan] <= 100
    # its certificate is its own solve's: the cheapest assignment within the limit kept
    assert chosen.solution.status == "optimal" and chosen.solution.gap == 0
    assert chosen.solution.cost == min(c for c, u in zip(_PROBLEM.costs[0], _PROBLEM.usages[0]) if u <= chosen.kept)


@dataclass
class _Probing(_Session):
    """A session whose first probe answers strategy 3 (the leanest) 50% above its bound; every other solve, the
    optimum within the limit kept."""

    solves: list[tuple] = field(default_factory=list)
    status: str = "priced limit"  # the first probe's
    again: Solution | None = None  # the first probe solved again (None: the optimum)

    def solved(self, usage_limit, probe=False):
        first = probe and usage_limit is not None and not any(p for _, p in self.solves)
        again = not probe and usage_limit is not None and self.again is not None
        self.solves.append((usage_limit, probe))
        if first:
            return Solution((3,), 4.0, 2.0, self.status, 0.0)
        return self.again if again else super().solved(usage_limit)


# what each strategy holds beyond (the limit is 100) -> the strategy chosen, its gap, the strategies compiled in turn;
# the unlimited optimum (0) breaks the limit, so the first solve keeps 70 and its probe answers 3
PROBES = {
    "the probe fits: certified within the same limit kept, the optimum's plan fits too":
        ((30, 30, 30, 30), (2, 0.0, (0, 3, 2))),
    # (its bound raised to the optimum's, 3: what the solve again proved within the same limit kept)
    "the probe fits and the optimum's plan breaks the limit: the probe stands, its gap stated":
        ((30, 30, 45, 30), (3, 0.25, (0, 3, 2))),
}


@pytest.mark.parametrize("beyond, want", PROBES.values(), ids=PROBES.keys())
def test_a_calibration_is_probed_then_certified_where_its_plan_fits(monkeypatch, beyond, want):
    import shardprop.search.limited as limited

    monkeypatch.setattr(limited, "LIMIT_ATTEMPTS", 1)
    session = _Probing(beyond)
    found, held = fitting_unbound(session, 100)
    chosen = solved_within(session, 100, (), (), found, held)
    assert (chosen.plan, chosen.solution.gap, tuple(session.compiles)) == want
    assert chosen.candidate.compiled_memory <= 100 and session.solves[1:] == [(70, True), (70, False)]


def test_a_probe_solved_again_to_nothing_stands_with_the_higher_bound(monkeypatch):
    """The integer program over every strategy finds nothing in its time (its bound 3.0): the probe stands, its bound
    raised to what that solve proved."""
    import shardprop.search.limited as limited

    monkeypatch.setattr(limited, "LIMIT_ATTEMPTS", 1)
    session = _Probing((30, 30, 30, 30), again=Solution((), None, 3.0, "time limit", 60.0))
    found, held = fitting_unbound(session, 100)
    chosen = solved_within(session, 100, (), (), found, held)
    assert (chosen.plan, chosen.solution.bound, chosen.solution.gap) == (3, 3.0, 0.25)
    assert session.solves[1:] == [(70, True), (70, False)] and session.compiles == [0, 3]


def test_a_probe_the_integer_program_answered_is_not_solved_again(monkeypatch):
    """A probe that is already the integer program's answer (stopped at its time limit) is not solved again."""
    import shardprop.search.limited as limited

    monkeypatch.setattr(limited, "LIMIT_ATTEMPTS", 1)
    session = _Probing((30, 30, 30, 30), status="time limit")
    found, held = fitting_unbound(session, 100)
    chosen = solved_within(session, 100, (), (), found, held)
    assert chosen.plan == 3 and session.solves[1:] == [(70, True)]


def test_a_probe_over_the_limit_is_not_certified(monkeypatch):
    """Its plan breaks the limit as compiled (3 holds 61 beyond): the next solve recalibrates (keeping 39, where
    nothing fits), and nothing is solved again within 70."""
    import shardprop.search.limited as limited

    monkeypatch.setattr(limited, "LIMIT_ATTEMPTS", 2)
    session = _Probing((30, 30, 30, 61))
    found, held = fitting_unbound(session, 100)
    with pytest.raises(sp.MemoryLimitError):
        solved_within(session, 100, (), (), found, held)
    assert session.solves[1:] == [(70, True), (39, True)] and session.compiles == [0, 3]  # (then the leanest: 3)


def test_where_only_the_leanest_fits_it_is_chosen_and_proves_nothing(monkeypatch):
    import shardprop.search.limited as limited

    monkeypatch.setattr(limited, "LIMIT_ATTEMPTS", 2)  # nothing within 30 B kept; the leanest fits; 0 kept breaks it
    session = _Session((70, 0, 0, 0))
    found, held = fitting_unbound(session, 100)
    chosen = solved_within(session, 100, (), (), found, held)
    assert chosen.plan == 3 and chosen.kept is None and chosen.solution.status == "the leanest layout"
    assert chosen.solution.gap == 1.0


def test_a_limit_the_unlimited_optimum_keeps_is_not_calibrated():
    session = _Session((0, 0, 0, 0))
    found, held = fitting_unbound(session, 100)
    assert found.plan == 0 and not found.candidate.excess and found.kept is None and held == 0
    assert session.compiles == [0]


def test_a_plan_whose_arguments_and_outputs_break_the_limit_is_not_compiled():
    # (the one-node problem's footprint is all arguments: a usage over the limit breaks it whatever XLA does)
    session = _Session((30, 30, 30, 30))
    found, held = fitting_unbound(session, 90)
    assert found.candidate.compiled_memory is None and found.candidate.excess == 10 and held == 0
    assert session.compiles == []
    chosen = solved_within(session, 90, (), (), found, held)  # 80 kept breaks it as compiled (110), 60 kept fits
    assert (chosen.plan, chosen.kept, session.compiles) == (2, 60, [1, 2])


@pytest.mark.parametrize("beyond, smallest, tried", [((100, 100, 100, 100), 140, 2), ((10, 200, 200, 200), 110, 3)],
                         ids=["the leanest", "the unlimited optimum"])
def test_nothing_fitting_as_compiled_names_the_smallest_footprint_found(beyond, smallest, tried):
    session = _Session(beyond)
    found, held = fitting_unbound(session, 100)
    # (the smallest of the plans tried, said to be so: not a floor a user would take it for)
    with pytest.raises(sp.MemoryLimitError, match=f"of the {tried} plans it tried, the smallest held {smallest} B as "
                                                  "compiled"):
        solved_within(session, 100, (), (), found, held)


def _assert_equal(got, want, atol):
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=atol)


def test_a_limit_the_unlimited_optimum_breaks_is_solved_within_it_less_what_the_compiled_program_held_beyond(
        monkeypatch):
    """A KV-cache decode step whose cheapest layouts hold more than the limit: the unlimited optimum, compiled, held
    more than the problem's memory says; the limited solve keeps the limit less what a compiled plan held beyond it,
    its plan fits as compiled, and its certificate is that solve's (optimal, or within 1% of the bound, under the
    limit kept: its contractions' and elementwise ops' menus are laid out by their factors, none sampled; a sampled
    menu's certificate says so); the summary says what was kept. Every limited solve stands within 1% of its bound,
    the integer program's too (a calibration's limit is an estimate: proving more under it cost an unseen Mixer block
    a minute). The result equals the unsharded step's."""
    import shardprop.search.solve as solve_module

    asked = []
    monkeypatch.setattr(solve_module, "solve", lambda problem, **kw: asked.append((problem.usage_limit, kw)) or solve(
        problem, **kw))
    model = bench_experts.kv_decode(4, 32)
    mesh = sp.make_mesh(*model.mesh)
    unlimited = sp.autoshard(model.f, mesh=mesh, in_specs=model.auto_specs).trace(*model.args)
    limit = int(0.95 * unlimited.memory())
    fs = sp.autoshard(model.f, mesh=mesh, in_specs=model.auto_specs, memory_limit=limit)
    prog = fs.trace(*model.args)
    search = prog.search
    assert prog.memory() == search.chosen.compiled_memory <= limit
    assert 0 < limit - search.memory_kept < limit
    assert search.compiled >= 1 and search.sampled == () and search.solution.gap <= LIMITED_GAP
    limited = [kw for usage_limit, kw in asked if usage_limit is not None]
    assert limited and all(kw["relative_gap"] == kw["priced_gap"] == LIMITED_GAP for kw in limited)
    assert search.certificate.endswith("of the bound under the limit kept") or search.certificate == (
        "optimal under the limit kept")
    sampled = replace(search, sampled=("`mul` at decode.py:7",))
    assert sampled.certificate == search.certificate + " among the layouts asked about, 1 node sampled"
    summary = str(search).splitlines()[0]
    beyond = format_bytes(limit - search.memory_kept)
    assert (f"limit {format_bytes(limit)}, the problem's memory kept within {format_bytes(search.memory_kept)}: the "
            f"limit less {beyond}, calibrated on what plans held as compiled beyond it" in summary), summary
    assert sp.to_json(prog)["search"]["memory_kept"] == search.memory_kept
    # a model that held more than compiled plans did: the limit kept is above the user's
    above = str(replace(search, memory_kept=limit + 10240)).splitlines()[0]
    assert (f"kept within {format_bytes(limit + 10240)}: the limit plus 10.0 KiB, calibrated on what plans held as "
            "compiled below it" in above), above
    # the leanest layout, where no solve's plan fit: it proves nothing
    leanest = replace(search, solution=replace(search.solution, status="the leanest layout", bound=0.0))
    assert leanest.certificate == "not proved: the leanest layout, found to fit as compiled"
    assert str(leanest).splitlines()[0].endswith("(bytes moved and work), no bound")
    _assert_equal(fs(*model.args), jax.jit(model.f)(*model.args), atol=1e-4)


@pytest.mark.parametrize("limit", [0, -5, "8MB", True, float("nan"), float("inf"), 0.5])
def test_a_memory_limit_must_be_a_positive_number(limit):
    with pytest.raises(sp.OptionError, match="memory_limit=.*positive number of bytes"):
        sp.autoshard(lambda x: x, mesh=sp.make_mesh((8,), ("i",)), in_specs=sp.AUTO, memory_limit=limit)


def test_a_numpy_integer_is_a_memory_limit():
    fs = sp.autoshard(lambda x: x, mesh=sp.make_mesh((8,), ("i",)), in_specs=sp.AUTO, memory_limit=np.int64(10**6))
    assert fs.memory_limit == 10**6


def test_a_donated_argument_counts_once_under_a_limit():
    rng = np.random.default_rng(3)
    mesh = sp.make_mesh((4, 2), ("data", "model"))
    w, x = rng.normal(size=(256, 256)).astype(np.float32), rng.normal(size=(16, 256)).astype(np.float32)

    def step(w, x, lr):
        return w - lr * jax.grad(lambda w: (x @ w).sum())(w)

    fixed = sp.autoshard(step, mesh=mesh, in_specs=(P(), P("data"), P()), donate_argnums=0)
    limit = fixed.trace(w, x, 0.1).memory()
    searched = sp.autoshard(step, mesh=mesh, in_specs=(P(), P("data"), sp.AUTO), donate_argnums=0,
                            memory_limit=limit)
    assert searched.trace(w, x, 0.1).memory() <= limit


def test_a_limit_nothing_fits_names_the_smallest_footprint_found():
    model = bench_experts.mlp(True, width=64, batch=16)
    fs = sp.autoshard(model.f, mesh=sp.make_mesh(*model.mesh), in_specs=model.auto_specs, memory_limit=4096)
    # the largest arguments first: the weights; none compiled, the arguments and outputs alone breaking the limit
    with pytest.raises(sp.MemoryLimitError, match=r"the search found no layout of argument params\[0\]\['w'\].* "
                                                  r"that fits memory_limit=4,096 B per device: (the one plan it tried "
                                                  r"held|of the \d+ plans it tried, the smallest held) [\d,]+ B by the "
                                                  r"cost model, its arguments [\d,]+ B and outputs [\d,]+ B alone "
                                                  r"with params\[0\]\['w'\] P"):
        fs.trace(*model.args)


def test_a_fixed_layout_over_the_limit_is_refused():
    x = np.ones((64, 64), np.float32)
    fs = sp.autoshard(lambda x: x * 2, mesh=sp.make_mesh((8,), ("i",)), in_specs=P(), memory_limit=4096)
    with pytest.raises(sp.MemoryLimitError, match="the program needs [\\d,]+ B per device as compiled"):
        fs.trace(x)
    assert sp.autoshard(lambda x: x * 2, mesh=sp.make_mesh((8,), ("i",)), in_specs=sp.AUTO,
                        memory_limit=8192).trace(x).in_specs[0] != P()


@pytest.mark.slow
def test_a_limit_that_binds_on_the_llama_step_is_met_within_one_percent_of_the_bound():
    """Between the Llama step's leanest layout and its unlimited optimum as compiled (1.17 and 1.42 MB): the integer
    program with memory rows found nothing in its minute and the leanest layout was returned, three times the price.
    The limit priced into the costs (``search.lagrange``) finds a plan that fits as compiled, within 1% of the bound,
    and it computes the unsharded step."""
    from shardprop.examples.llama import llama_train_step
    from shardprop.bench.search import ATOL, RTOL, compiled_footprint

    model = bench_experts.llama()
    mesh = sp.make_mesh(*model.mesh)
    limit = 1_300_000
    program = sp.autoshard(model.f, mesh=mesh, in_specs=model.auto_specs, memory_limit=limit).trace(*model.args)
    search = program.search
    assert search.solution.cost is not None and search.solution.gap <= 0.01, search.certificate
    assert "within" in search.certificate and "leanest" not in search.certificate
    assert compiled_footprint(program.lower(*model.args).compile()) <= limit
    got = sp.autoshard(model.f, mesh=mesh, in_specs=model.auto_specs, memory_limit=limit)(*model.args)
    want = jax.jit(llama_train_step)(*model.args)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=RTOL, atol=ATOL)
