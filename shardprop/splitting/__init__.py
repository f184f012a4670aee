"""Graph splitting (start with ``split``): stages with in/out specs, cut where data must be gathered, each
with its sharded IR.

``strategy.py`` holds ``Strategy``, ``decisions.py`` the plan view (``Decisions``: the type each node
consumes each operand in, each value is held and computed in, the collective that finishes a node),
``strategies.py`` and ``partial_sums.py`` the steps that revise it, ``cost.py`` the one cost model, ``cut.py`` the
stages, ``emit.py`` and ``ir.py`` their IR, ``split.py`` the pass and ``plan.py`` its product.
"""

from ..core.collectives import Collective, CollectiveKind
from .strategy import Strategy
from .decisions import Decisions
from .plan import Plan, Source, Stage, StageInput
from .cut import needs_gather
from .split import split

__all__ = ["Collective", "CollectiveKind", "Decisions", "Plan", "Source", "Stage", "StageInput", "Strategy",
           "needs_gather", "split"]
