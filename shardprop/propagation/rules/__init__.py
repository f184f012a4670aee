"""The rule table: ``RULES[primitive_name] -> rule``. Importing this package fills it."""

from . import contractions, elementwise, reductions, shapes  # noqa: F401  (registration side effects)
from .fallback import conservative
from .registry import CREATED, RULES, OpenTracker, RuleConflict, RuleContext, RuleOutput, register

__all__ = ["CREATED", "RULES", "OpenTracker", "RuleConflict", "RuleContext", "RuleOutput", "conservative",
           "register"]
