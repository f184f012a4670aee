"""The collective that finishes a node whose devices each hold a partial result (:class:`Collective`): what an
op's ``finish`` piece returns, and what the split pass decides in.

``CollectiveKind`` is an enum of strings, so ``collective.kind == "psum"`` keeps working, while code compares
against members and a typo is an error, not a silent ``False``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum



class CollectiveKind(StrEnum):
    """The collective that finishes a node whose devices each hold a partial result."""

    PSUM = "psum"
    PMAX = "pmax"
    PMIN = "pmin"
    ARGMAX = "argmax"              # each device's winning index, offset, then agreed with pmax/pmin
    ARGMIN = "argmin"
    PSUM_SCATTER = "psum_scatter"  # a psum whose result each device keeps only a block of (reduce-scatter)


@dataclass(frozen=True, slots=True)
class Collective:
    """Node output finished by ``kind`` over ``mesh_axes`` (``psum_scatter``: scattered along ``dimension``)."""

    kind: CollectiveKind
    mesh_axes: tuple[str, ...]
    dimension: int | None = None
    # The outputs (by position) it finishes; None: all of them. A loop finishes only the carries it kept partial.
    outputs: tuple[int, ...] | None = None
    # Operands (by position) the sum must count once: each group takes them on its first device, zero on the others
    # (a scatter-add's operand, to which every device adds its own updates).
    once: tuple[int, ...] = ()

    def finishes(self, position: int) -> bool:
        return self.outputs is None or position in self.outputs

    def __str__(self) -> str:
        along = "" if self.dimension is None else f" along axis {self.dimension}"
        which = "" if self.outputs is None else f" of outputs {', '.join(map(str, self.outputs))}"
        return f"{self.kind} over {'*'.join(self.mesh_axes)}{along}{which}"
