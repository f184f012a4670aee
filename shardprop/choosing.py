"""Which plan a program runs: propagation's, or the layout search's (``sp.AUTO`` leaves, ``strategy="optimal"``).

``compile_program`` (``api.py``) asks ``chosen_plan`` for the plan of a traced graph and its arguments' specs; the
search's result comes with it, to be shown (``prog.search``, ``sp.explain``).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence
from typing import Any

from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .core.transfers import total_moved
from .errors import SearchError, StrategyWarning
from .expr import jax_adapter as jx
from .expr import with_pinned_outputs
from .expr.graph import warn_at
from .mesh import as_auto_mesh
from .program import lower
from .propagation import Walking, propagate_with
from .propagation.reports import warn_fallbacks, warn_reshards
from .search import AUTO, search_layouts
from .search.build import uneven_argument
from .search.space import state_pairs
from .spellings import same_spec
from .splitting.cost import estimate, footprint, price
from .splitting.split import PlanPricer
from .splitting.strategy import Strategy


def chosen_plan(graph, specs, *, mesh: Mesh, strict: bool, strategy: str, conflicts: str, limit,
                 keyword_form: bool, donated: Sequence[int], returns_inputs: Sequence[int], mirror_state: bool):
    """``(plan, search result or None)``: the layout search's plan where it chooses (``sp.AUTO`` leaves, or
    ``strategy="optimal"``), else propagation's. Around fixed specs the walk's plan is kept where the one cost model
    prices it lower than the solve's: its moves include what the solve does not model (a sum deferred past the
    ops that keep it partial, rows ranged over uneven blocks) — and the result says so."""
    if not specs.searched and Strategy.parse(strategy) is not Strategy.OPTIMAL:
        return planned(graph, specs.tree(graph), mesh=mesh, strict=strict, strategy=strategy,
                        conflicts=conflicts), None
    uneven = None if specs.searched else uneven_argument(graph, specs.flat, dict(mesh.shape))
    if uneven is not None:  # the problem cannot hold it: propagation's plan, said at the user's call
        warn_at(jx.user_call_site(), f"shardprop: strategy='optimal' planned as 'auto': {uneven} (propagation takes "
                "its rows as ranges)", StrategyWarning)
        return planned(graph, specs.tree(graph), mesh=mesh, strict=strict, strategy=strategy,
                        conflicts=conflicts), None
    # the search builds the chosen plan: its moves between searched layouts are its priced choice
    searched = _search(graph, specs, mesh=mesh, strict=strict, strategy=strategy, conflicts=conflicts, limit=limit,
                       keyword_form=keyword_form, donated=donated, returns_inputs=returns_inputs,
                       mirror_state=mirror_state)
    plan = searched.plan
    if not specs.searched:
        kept = _walk_if_cheaper(graph, specs, searched, mesh=mesh, strict=strict, strategy=strategy,
                                conflicts=conflicts, limit=limit, donated=donated, returns_inputs=returns_inputs,
                                mirror_state=mirror_state)
        if kept is not None:
            return kept.plan, kept
    # its warnings: the fallbacks, and the conflicts of the layouts the user fixed
    warn_fallbacks(graph, plan.sharded.fallbacks, plan.sharded.fallback_causes)
    warn_reshards(graph, plan.sharded, chosen=frozenset(k for k, s in enumerate(specs.flat) if s is AUTO))
    return plan, searched


def planned(graph, in_specs: Any, *, mesh: Mesh, strict: bool, strategy: str, conflicts: str):
    """Propagation, then the split, of ``graph`` taking its arguments in ``in_specs``: the ``Plan``."""
    pricer = PlanPricer(strategy)
    return pricer.plan_for(propagate_with(graph, in_specs, mesh=mesh, strict=strict, conflicts=conflicts,
                                          walking=Walking(price=pricer)))


def with_pins(graph, pins: dict[int, PartitionSpec], auto_mesh: Mesh):
    """``graph`` returning each output ``k`` of ``pins`` constrained to ``pins[k]`` (``expr.with_pinned_outputs``)."""
    if not pins:
        return graph
    with jx.program_mesh_context(auto_mesh):
        return with_pinned_outputs(graph, {k: NamedSharding(auto_mesh, spec) for k, spec in pins.items()})


def _walk_if_cheaper(graph, specs, searched, *, mesh: Mesh, strict: bool, strategy: str, conflicts: str, limit,
                     donated: Sequence[int], returns_inputs: Sequence[int], mirror_state: bool):
    """``searched`` with propagation's plan in its place (``walked``), where ``price`` says that plan is cheaper, it
    fits the limit and returns mirrored state in its arguments' layouts as the solve's does; else None. The walk's
    own warnings are said where its plan is kept."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        walked = planned(graph, specs.tree(graph), mesh=mesh, strict=strict, strategy=strategy, conflicts=conflicts)
    memory = footprint(walked, donated)
    mirrored = all(same_spec(walked.sharded.out_specs[k], walked.sharded.in_specs[j])
                   for k, j in state_pairs(graph, returns_inputs, mirrors=mirror_state))
    if not (price(walked) < searched.chosen.price and mirrored and (limit is None or memory.total <= limit)):
        return None
    for w in said:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    chosen = dataclasses.replace(searched.chosen, price=price(walked), moved=total_moved(estimate(walked)),
                                 memory=memory)
    return dataclasses.replace(searched, chosen=chosen, walked=True, plan=walked)


def _search(graph, specs, *, mesh: Mesh, strict: bool, strategy: str, conflicts: str, limit,
            keyword_form: bool, donated: Sequence[int], returns_inputs: Sequence[int], mirror_state: bool = True):
    """The layout search's result for the ``sp.AUTO`` leaves of ``specs`` (no warnings: ``compile_program`` warns from
    the chosen plan)."""
    if strict and not any(isinstance(s, PartitionSpec) for s in specs.flat):
        raise SearchError("sp.AUTO with strict=True: every argument is sp.AUTO or unannotated, so nothing "
                          "fixed says how the program is meant to be split (strict=True takes no layout "
                          "the user did not write or imply); fix at least one argument's spec — the batch's "
                          "P('data'), say — or drop strict=True")
    auto_mesh = as_auto_mesh(mesh)
    checked = []  # the programs compiled to check the limit: the chosen plan's is the one that runs

    def compiled_memory(plan) -> int:
        checked.append(lower(plan, mesh, donated=donated))
        return checked[-1].memory()

    searched = search_layouts(graph, list(specs.flat), mesh=auto_mesh, strict=strict, conflicts=conflicts,
                              strategy=strategy, memory_limit=limit, keyword_form=keyword_form, donated=donated,
                              returns_inputs=returns_inputs, mirror_state=mirror_state,
                              pin=lambda g, pins: with_pins(g, pins, auto_mesh), compiled_memory=compiled_memory)
    program = next((p for p in checked if p.plan is searched.plan), None)
    return dataclasses.replace(searched, checked=program) if program is not None else searched
