"""The layout search under ``memory_limit=``: the solve keeps the problem's memory within the limit, and the compiled
program has the last word.

The optimum without the limit is solved and compiled first (``fitting_unbound``): where it fits, it is the optimum
within the limit too. Where it does not, the problem's memory is calibrated on the program: each limited solve keeps
it within the limit less what the last plan compiled held beyond it — first the unlimited optimum's — until a plan
fits and held no less beyond than its solve assumed (``solved_within``). ``session`` is ``.solve``'s ``_Session``: the
problem, its solves, plans and compiled checks.
"""

from __future__ import annotations

from dataclasses import replace

from ..errors import MemoryLimitError
from .ilp import Solution
from .problem import peak_usage

# under a limit, the solves at most: the first, then each with the limit kept calibrated by what the last plan held as
# compiled beyond the problem's memory
LIMIT_ATTEMPTS = 4
# a plan that fits confirms the calibration it was solved with where it held at least that much beyond the problem's
# memory, less this share of the limit: plans alike differ by about as much as compiled (a KV decode with a cache of
# 64: two plans of one cost and one peak usage held 385.3 and 389.4 KB, a limit of 393 KB; a cache of 128: three
# plans 61.8-62.1 KB beyond), and a solve under a limit takes seconds
CALIBRATION_SLACK = 0.02


def fitting_unbound(session, limit: int):
    """The optimum without the limit, its plan and Candidate, where it fits within ``limit`` as compiled (then it is
    the optimum within it too), else None; and how much more than the problem's memory that plan held as compiled:
    the calibration a limited solve starts from."""
    solution = session.solved(None)
    if solution.cost is None:
        return None, 0
    plan, candidate, beyond = _measured(session, solution, limit)
    return (None if candidate.excess else (solution, plan, candidate)), beyond


def _measured(session, solution: Solution, limit: int):
    """``solution``'s plan, its Candidate against ``limit`` (its compiled memory, where a compiled check is given,
    else the cost model's footprint, has the last word) and how many bytes that memory is beyond the problem's peak
    usage for the solution."""
    plan = session.planned(solution)
    candidate = session.candidate(plan, limit)
    compiled = session.compiled_memory is not None
    memory = session.compiled(plan) if compiled else candidate.memory.total
    candidate = replace(candidate, compiled_memory=memory if compiled else None, excess=max(0, memory - limit))
    return plan, candidate, int(memory - peak_usage(session.built.problem, solution.strategies))


def solved_within(session, limit: int | None, leaves, searched, beyond: int = 0):
    """The solution, its plan, its Candidate and the calibration it was solved with: within ``limit`` as compiled.
    Each solve keeps the problem's memory within ``limit`` less a calibration — first ``beyond`` (what the unlimited
    optimum held as compiled beyond the problem's memory), then what the last plan held beyond it — until a plan fits
    and held no less beyond than its solve assumed (``CALIBRATION_SLACK``): the calibration held for it, and its
    solve's bound is the certificate's. ``LIMIT_ATTEMPTS`` solves at most; the cheapest plan that fits then is held
    to the least bound found (``_held_to``)."""
    if limit is None:
        solution = session.solved(None)
        plan = session.planned(solution)
        return solution, plan, session.candidate(plan, None), 0
    fitting, smallest, bounds, calibration, tried = None, None, [], beyond, set()
    measured: dict[tuple[int, ...], tuple] = {}  # a solution met again is not compiled again
    for _ in range(LIMIT_ATTEMPTS):
        solution = session.solved(max(1, limit - calibration))
        if solution.cost is None:
            break
        bounds.append(solution.bound)
        if solution.strategies not in measured:
            measured[solution.strategies] = _measured(session, solution, limit)
        plan, candidate, held = measured[solution.strategies]
        if not candidate.excess:
            if fitting is None or solution.cost < fitting[0].cost:
                fitting = (solution, plan, candidate, calibration)
            if held >= calibration - CALIBRATION_SLACK * limit:
                return solution, plan, candidate, calibration  # the calibration held: its bound is the solve's
        elif smallest is None or _held(candidate) < _held(smallest):
            smallest = candidate
        if held in tried:  # solved with it before: the solves would go round
            break
        tried.add(calibration)
        calibration = held
    if fitting is not None:
        solution, plan, candidate, calibration = fitting
        return _held_to(solution, min(bounds)), plan, candidate, calibration
    if smallest is None:  # nothing fits by the cost model: say what the leanest layout holds
        plan = session.planned(session.leanest())
        smallest = session.candidate(plan, limit)
        if session.compiled_memory is not None:
            smallest = replace(smallest, compiled_memory=session.compiled(plan))
    raise _over_limit(leaves, searched, smallest, limit)


def _held(candidate) -> int:
    """The memory a Candidate is judged by: as compiled where checked, else the cost model's."""
    return candidate.memory.total if candidate.compiled_memory is None else candidate.compiled_memory


def _held_to(solution: Solution, bound: float) -> Solution:
    """``solution`` measured against ``bound``, the cost model's bound within the user's limit: a solve whose limit was
    tightened (the cost model's optimum held more as compiled) is optimal only where it meets that bound, else within
    its gap of it."""
    if solution.cost <= bound + 1e-9 * max(1.0, abs(bound)):
        return solution
    return replace(solution, bound=bound, status="tightened to fit as compiled")


def _names(leaves, searched, limit: int = 4) -> str:
    names = [f"argument {leaves[k].path}" for k in searched[:limit]]
    return ", ".join(names) + (f" and {len(searched) - limit} more" if len(searched) > limit else "")


def _over_limit(leaves, searched, best, limit: int) -> MemoryLimitError:
    largest = sorted(searched, key=lambda k: (-leaves[k].nbytes, k))  # the arguments that matter first
    chosen = ", ".join(f"{leaves[k].path} {best.specs[k]}" for k in largest[:6])
    m = best.memory
    how = (f"{best.compiled_memory:,} B as compiled" if best.compiled_memory is not None else
           f"{m.total:,} B (arguments {m.arguments:,} + outputs {m.outputs:,} + temporaries {m.temporaries:,})")
    return MemoryLimitError(
        f"no layout of {_names(leaves, largest)} fits memory_limit={limit:,} B per device: the smallest footprint "
        f"found is {how} with {chosen}{' ...' if len(searched) > 6 else ''}; raise the limit, use a mesh with "
        "more devices, or shard the fixed arguments")
