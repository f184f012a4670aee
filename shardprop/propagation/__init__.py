"""Shard propagation (start with :func:`propagate`): every value gets per-axis shards with parents."""

from .product import ShardedGraph
from .propagate import propagate
from .sharding import Layout, Open, Shard, Sharded, TensorSharding

__all__ = ["Layout", "Open", "Shard", "Sharded", "ShardedGraph", "TensorSharding", "propagate"]
