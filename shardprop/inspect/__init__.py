"""Inspection: read the products of the passes and show them.

* :func:`lineage` — which input elements one block of a value depends on (boxes, sound and mostly exact);
"""

from .lineage import Lineage, lineage

__all__ = ["Lineage", "lineage"]
