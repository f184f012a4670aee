"""Lowering (start with :func:`lower`): each stage becomes a ``jax.shard_map``, the program one ``jax.jit``."""

from .shard_map import Program, lower

__all__ = ["Program", "lower"]
