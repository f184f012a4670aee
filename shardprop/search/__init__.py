"""``sp.AUTO``: the layouts of the arguments a user leaves to shardprop, chosen by pricing whole plans.

``autoshard(f, mesh=mesh, in_specs=(sp.AUTO, P("data")), memory_limit=...)`` traces ``f`` once, then chooses every
value's layout, the ``sp.AUTO`` arguments' among them, by one integer program over the traced graph (``build.py``
the problem, ``ilp.py`` the solver, ``reduce.py`` its exact shrinking, ``realize.py`` the plan a solution describes;
``search_layouts`` in ``solve.py`` drives them); ``prog.search`` is the ``SearchResult``, with the bound the solver
proved.
"""

from .solve import Alternative, Candidate, SearchResult, check_memory_limit, search_layouts
from .space import AUTO, candidate_specs, decision_groups, is_spec_leaf, leaves_of, state_pairs

__all__ = ["AUTO", "Alternative", "Candidate", "SearchResult", "candidate_specs", "check_memory_limit",
           "decision_groups", "is_spec_leaf", "leaves_of", "search_layouts", "state_pairs"]
