"""Tracing: a user's function becomes a flat ``Graph`` (start with ``trace``)."""

from .graph import CONSTANT, PARAMETER, Aval, Graph, Node
from .trace import trace, trace_jaxpr, with_pinned_outputs

__all__ = ["Aval", "CONSTANT", "Graph", "Node", "PARAMETER", "trace", "trace_jaxpr", "with_pinned_outputs"]
