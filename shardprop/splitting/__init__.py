"""Graph splitting (start with :func:`split`): stages with in/out specs, cut where data must be gathered."""

from .listing import StagedGraph, format_listing
from .split import needs_gather, split
from .stage import Plan, Source, Stage, StageInput, StageList, format_stages

__all__ = ["Plan", "Source", "Stage", "StageInput", "StageList", "StagedGraph", "format_listing", "format_stages",
           "needs_gather", "split"]
