"""The communication strategy the split pass follows (``Strategy``): an enum of strings, so
``strategy="gather"`` keeps working while code compares against members."""

from __future__ import annotations

from enum import StrEnum

from ..errors import OptionError


class Strategy(StrEnum):
    """How the split pass pays for an axis an op needs whole (see ``shardprop.split``)."""

    AUTO = "auto"              # per node, whichever the cost model says moves fewer bytes
    GATHER = "gather"          # the Nx design: cut, and the next stage gathers the operand first
    COLLECTIVE = "collective"  # finish sums, maxima, minima and contractions with a collective, no cut
    # every value's layout chosen by one solve (the layout search's integer program, ``shardprop.search``) around
    # the arguments' specs — where to change layouts, not only what each op does with the layouts it meets — and
    # the chosen graph split as under AUTO
    OPTIMAL = "optimal"

    @property
    def splitting(self) -> Strategy:
        """The strategy the split follows for this one (OPTIMAL has chosen the layouts; its split is AUTO's)."""
        return Strategy.AUTO if self is Strategy.OPTIMAL else self

    @classmethod
    def parse(cls, value: str) -> Strategy:
        """``value`` as a member; an unknown name is an ``shardprop.OptionError``."""
        try:
            return cls(value)
        except ValueError:
            raise OptionError(f"unknown strategy {value!r}; expected one of {tuple(s.value for s in cls)}") from None
