"""The rule table: ``RULES[primitive_name] -> rule``. Importing this package fills it."""

from . import (  # noqa: F401  (registration side effects)
    contractions, control_flow, convolutions, elementwise, indexing, random, reductions, scans, shapes, slicing,
)
from .fallback import conservative
from .registry import CREATED, RULES, OpenTracker, RuleConflict, RuleContext, RuleOutput, register

__all__ = ["CREATED", "RULES", "OpenTracker", "RuleConflict", "RuleContext", "RuleOutput", "conservative",
           "register"]
