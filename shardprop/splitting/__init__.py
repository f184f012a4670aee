"""Graph splitting (start with :func:`split`): stages with in/out specs, cut where data must be gathered.

``collectives.py`` holds the words (:class:`Strategy`, :class:`Collective`), ``decisions.py`` the plan view
(:class:`Decisions`: which layout each node consumes, each value is held in), ``strategies.py`` the steps
that revise it, ``cost.py`` the one cost model, ``split.py`` the pass and ``plan.py`` its product.
"""

from .collectives import Collective, CollectiveKind, Strategy
from .decisions import Decisions
from .plan import Plan, Source, Stage, StageInput
from .split import needs_gather, split

# Names that lived here before the printers moved to shardprop.inspect.listing (0.2); kept as aliases.
_MOVED = {"StagedGraph": "AnnotatedGraph", "StageList": "StageTable", "format_listing": "format_listing",
          "format_stages": "format_stages"}


def __getattr__(name: str):
    if name in _MOVED:
        from ..inspect import listing

        return getattr(listing, _MOVED[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Collective", "CollectiveKind", "Decisions", "Plan", "Source", "Stage", "StageInput", "Strategy",
           "needs_gather", "split"]
