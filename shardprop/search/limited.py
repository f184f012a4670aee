"""The layout search under ``memory_limit=``: the solve keeps the problem's memory within the limit, and the compiled
program has the last word.

The optimum without the limit is solved and compiled first (``fitting_unbound``): where it fits, it is the optimum
within the limit too. Where it does not, the problem's memory is calibrated on the program: each limited solve keeps
it within the limit less what a compiled plan held beyond it — first the unlimited optimum — and every plan it
compiles recalibrates the next, halving the interval between too little and enough where it would go round
(``solved_within``). A plan whose arguments and outputs alone hold more than the limit (what ``memory_analysis()``
counts of them is exact: ``Footprint.least``) is not compiled: the cost model's footprint says what it holds beyond.
The plan chosen is the cheapest that fits as compiled, and its certificate is its own solve's: optimal among the
assignments whose memory by the problem is within the limit that solve kept. ``session`` is ``.solve``'s
``_Session``: the problem, its solves, plans and compiled checks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..errors import MemoryLimitError
from .ilp import Solution
from .problem import evaluate, peak_usage

# under a limit, the solves at most, each with the limit kept calibrated by what the last plan held as compiled beyond
# the problem's memory
LIMIT_ATTEMPTS = 4
# a plan that fits confirms the calibration it was solved with where it held at least that much beyond the problem's
# memory, less this share of the limit — no looser limit is tried then: plans alike differ by about as much as
# compiled (a KV decode with a cache of 64: two plans of one cost and one peak usage held 385.3 and 389.4 KB, a limit
# of 393 KB; a cache of 128: three plans 61.8-62.1 KB beyond), and a solve under a limit takes seconds
CALIBRATION_SLACK = 0.02

# under a memory limit an answer stands within this of its bound (relative), its gap stated: the certificate the search
# promises. The priced limit's first (the KV decode's: 0.4% above its bound, the linear relaxation's own gap, which
# HiGHS took 2.4 s to close, where the priced solves took 0.3 s); past it the integer program over every strategy
# decides, stopped there too: a calibration's limit is the compiled memory's estimate, and proving 0.1% more under it
# cost an unseen Mixer block at 75% of its memory HiGHS's full minute (its bound 0.08% below the answer it had), a
# GPT block 13-25 s a solve; an equinox MLP under a scan at 70-80% of its memory: 24-44 s -> 19-36 s, within 0.6-0.9%.
# A calibration's answer is compiled first, whatever its gap (a probe), and certified only where it fits
LIMITED_GAP = 1e-2


@dataclass(frozen=True)
class Limited:
    """The search's choice under a limit: the ``solution`` (its certificate), its ``plan`` and ``candidate``, and
    ``kept``, the limit on the problem's memory its solve kept (None: the user's own, where the unlimited optimum
    fits)."""

    solution: Solution
    plan: object
    candidate: object
    kept: int | None = None


def fitting_unbound(session, limit: int) -> tuple[Limited | None, int]:
    """The optimum without the limit, its plan measured against ``limit`` as compiled (where it fits, it is the
    optimum within the limit too), or None where the problem has no assignment; and how much more than the problem's
    memory that plan held as compiled: the calibration a limited solve starts from."""
    solution = session.solved(None)
    if solution.cost is None:
        return None, 0
    plan, candidate, beyond = _measured(session, solution, limit)
    return Limited(solution, plan, candidate), beyond


def _measured(session, solution: Solution, limit: int):
    """``solution``'s plan, its Candidate against ``limit`` (its compiled memory, where a compiled check is given and
    the plan's arguments and outputs do not break the limit already, else the cost model's footprint, has the last
    word) and how many bytes that memory is beyond the problem's peak usage for the solution."""
    plan = session.planned(solution)
    candidate = session.candidate(plan, limit)
    # a plan whose arguments and outputs alone break the limit breaks it as compiled too: its compile is spared, and
    # the cost model's footprint says how much it holds beyond the problem's memory
    compiled = session.compiled_memory is not None and candidate.memory.least <= limit
    memory = session.compiled(plan) if compiled else candidate.memory.total
    candidate = replace(candidate, compiled_memory=memory if compiled else None, excess=max(0, memory - limit))
    return plan, candidate, int(memory - peak_usage(session.built.problem, solution.strategies))


def solved_within(session, limit: int, leaves, searched, unlimited: Limited | None, beyond: int) -> Limited:
    """The cheapest plan found that fits ``limit`` as compiled. Each solve keeps the problem's memory within ``limit``
    less a calibration: first ``beyond`` (what the unlimited optimum held beyond the problem's memory), then what the
    last plan compiled held beyond it (where nothing is within the limit kept, what the leanest assignment held) —
    or, where that is not between the calibrations known too small (a plan broke the limit) and known enough (a plan
    fit), halfway between them. Each solve's answer is compiled whatever its gap (a probe: ``probe=True``); one that
    fits beyond ``LIMITED_GAP`` of its bound is solved again to within it, and that answer measured in its stead (the
    probe kept where it breaks the limit). It stops where a plan fits having held no less beyond than its solve assumed
    (``CALIBRATION_SLACK``), where nothing is left to try, or after ``LIMIT_ATTEMPTS`` solves. Raises
    ``MemoryLimitError`` where nothing fits, naming the smallest plan tried (``unlimited``'s among them) and how many
    were."""
    fitting: Limited | None = None
    over = [] if unlimited is None else [unlimited.candidate]  # the Candidates over the limit
    # a solution met again is not compiled again (the unlimited optimum's among them)
    measured: dict[tuple[int, ...], tuple] = {}
    if unlimited is not None:
        measured[unlimited.solution.strategies] = (unlimited.plan, unlimited.candidate, beyond)
    leanest = None
    slack = CALIBRATION_SLACK * limit
    calibration, tried, known = beyond, set(), [-math.inf, math.inf]  # (too small, enough)
    for _ in range(LIMIT_ATTEMPTS):
        tried.add(calibration)
        kept = max(1, limit - calibration)
        solution = session.solved(kept, probe=True)
        if solution.cost is None:  # nothing within the limit kept (or found in time): how little the leanest held
            known[1] = min(known[1], calibration)
            leanest = leanest or _leanest(session)
            solution, kept = leanest, None
        plan, candidate, held = _measured_once(session, solution, limit, measured)
        if not candidate.excess and kept is not None and solution.status == "priced limit" and \
                solution.gap > LIMITED_GAP:
            # the probe fits as compiled: certified by the integer program over every strategy within the same limit
            # kept — its answer's plan measured too, the probe kept where that one breaks the limit (its gap stated)
            solution, again = _certified(session, solution, kept)
            if again is not None:
                fitting = _preferred(fitting, Limited(solution, plan, candidate, kept))
                solution = again
                plan, candidate, held = _measured_once(session, solution, limit, measured)
        if candidate.excess:
            over.append(candidate)
            if kept is not None:
                known[0] = max(known[0], calibration)
        else:
            fitting = _preferred(fitting, Limited(solution, plan, candidate, kept))
            if kept is not None:
                known[1] = min(known[1], calibration)
                if held >= calibration - slack:
                    break  # the calibration held for the plan: a looser limit is not tried
        calibration = _next_calibration(held, *known, tried, slack)
        if calibration is None:
            break
    if fitting is not None:
        return fitting
    # (a solution met again is its one Candidate: counted once)
    raise _over_limit(leaves, searched, min(over, key=_held), limit, len({id(c) for c in over}))


def _certified(session, probe: Solution, kept: int) -> tuple[Solution, Solution | None]:
    """A probe whose plan fits, solved again within ``kept`` to within ``LIMITED_GAP`` of its bound: the probe, its
    bound the higher one that solve proved (the same limit kept), and that solve's answer (None: it found none)."""
    again = session.solved(kept)
    probe = replace(probe, bound=min(probe.cost, max(probe.bound, again.bound)))
    return probe, (again if again.cost is not None else None)


def _measured_once(session, solution: Solution, limit: int, measured: dict) -> tuple:
    """``_measured``, each solution met again (its strategies) answered from ``measured``, not compiled again."""
    if solution.strategies not in measured:
        measured[solution.strategies] = _measured(session, solution, limit)
    return measured[solution.strategies]


def _preferred(fitting: Limited | None, found: Limited) -> Limited:
    """Of the plan that fits so far (None: none) and ``found`` (which fits), the one ``_rank`` puts first."""
    if fitting is None or _rank(found.solution, found.kept) < _rank(fitting.solution, fitting.kept):
        return found
    return fitting


def _rank(solution: Solution, kept: int | None) -> tuple:
    """Cheapest first; of two as cheap, one certified (within ``LIMITED_GAP`` of its bound), one a solve proved,
    within the looser limit kept."""
    return solution.cost, solution.gap > LIMITED_GAP, kept is None, -(kept or 0)


def _next_calibration(held: int, small: float, enough: float, tried: set, slack: float) -> int | None:
    """What the last plan held beyond the problem's memory, where it is between the calibrations known too small and
    known enough and untried; else halfway between those, where they are more than ``slack`` apart; else None."""
    if small < held < enough and held not in tried:
        return held
    if math.isfinite(small) and math.isfinite(enough) and enough - small > slack:
        halfway = int((small + enough) // 2)
        return None if halfway in tried else halfway
    return None


def _leanest(session) -> Solution:
    """The assignment holding the fewest bytes summed over every value, priced by the problem: proved nothing (its
    bound is 0)."""
    lean = session.leanest()
    problem = replace(session.built.problem, usage_limit=None)
    return Solution(lean.strategies, evaluate(problem, lean.strategies), 0.0, "the leanest layout", lean.seconds)


def _held(candidate) -> int:
    """The memory a Candidate is judged by: as compiled where checked, else the cost model's."""
    return candidate.memory.total if candidate.compiled_memory is None else candidate.compiled_memory


def _names(leaves, searched, limit: int = 4) -> str:
    names = [f"argument {leaves[k].path}" for k in searched[:limit]]
    return ", ".join(names) + (f" and {len(searched) - limit} more" if len(searched) > limit else "")


def _over_limit(leaves, searched, best, limit: int, tried_count: int) -> MemoryLimitError:
    largest = sorted(searched, key=lambda k: (-leaves[k].nbytes, k))  # the arguments that matter first
    chosen = ", ".join(f"{leaves[k].path} {best.specs[k]}" for k in largest[:6])
    m = best.memory
    if best.compiled_memory is not None:
        how = f"{best.compiled_memory:,} B as compiled"
    elif m.least > limit:  # never compiled: its arguments and outputs alone break the limit
        how = f"{m.total:,} B by the cost model, its arguments {m.arguments:,} B and outputs {m.outputs:,} B alone"
    else:
        how = f"{m.total:,} B (arguments {m.arguments:,} + outputs {m.outputs:,} + temporaries {m.temporaries:,})"
    # (the smallest of the plans tried, not a floor: a user reads a single number as what any layout needs)
    tried = ("the one plan it tried held" if tried_count == 1 else
             f"of the {tried_count} plans it tried, the smallest held")
    return MemoryLimitError(
        f"the search found no layout of {_names(leaves, largest)} that fits memory_limit={limit:,} B per device: "
        f"{tried} {how} with {chosen}{' ...' if len(searched) > 6 else ''}; raise the limit, use a mesh with "
        "more devices, or shard the fixed arguments")
