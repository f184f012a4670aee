"""``sp.AUTO``: the layouts of the arguments a user leaves to shardprop, chosen by pricing whole plans.

``autoshard(f, mesh=mesh, in_specs=(sp.AUTO, P("data")), memory_limit=...)`` traces ``f`` once, then searches the
``sp.AUTO`` arguments' layouts (``search_layouts``), pricing each candidate with the same propagation, splitting
and cost model the chosen program is built by; ``prog.search`` is the ``SearchResult``.
"""

from .solve import Alternative, Candidate, SearchResult, check_memory_limit, search_layouts
from .space import AUTO, candidate_specs, decision_groups, is_spec_leaf, leaves_of, tied

__all__ = ["AUTO", "Alternative", "Candidate", "SearchResult", "candidate_specs", "check_memory_limit",
           "decision_groups", "is_spec_leaf", "leaves_of", "search_layouts", "tied"]
