"""Graph splitting (start with :func:`split`): stages with in/out specs, cut where data must be gathered.

``collectives.py`` holds the words (:class:`Strategy`, :class:`Collective`), ``decisions.py`` the plan view
(:class:`Decisions`: which layout each node consumes, each value is held in), ``strategies.py`` the steps
that revise it, ``cost.py`` the one cost model, ``split.py`` the pass and ``plan.py`` its product.
"""

from ..core.collectives import Collective, CollectiveKind
from .strategy import Strategy
from .decisions import Decisions
from .plan import Plan, Source, Stage, StageInput
from .cut import needs_gather
from .split import split

__all__ = ["Collective", "CollectiveKind", "Decisions", "Plan", "Source", "Stage", "StageInput", "Strategy",
           "needs_gather", "split"]
