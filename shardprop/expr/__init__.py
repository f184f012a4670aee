"""Tracing: a user's function becomes a flat :class:`Graph` (start with :func:`trace`)."""

from .graph import CONSTANT, PARAMETER, Aval, Graph, Node
from .trace import trace

__all__ = ["Aval", "CONSTANT", "Graph", "Node", "PARAMETER", "trace"]
