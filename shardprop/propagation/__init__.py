"""Shard propagation (start with ``propagate``): every value gets per-axis shards with parents.

``sharding.py`` is the Nx data model, ``context.py`` what a rule sees, ``propagate.py`` the pass,
``product.py`` its product (``ShardedGraph``), ``origins.py`` the walk back through shard parents. The
rules themselves are the primitives' records in ``shardprop.ops``.
"""

from .product import RuleName, ShardedGraph
from .propagate import propagate
from ..core.layouts import Layout, Open, Shard, Sharded, TensorSharding

__all__ = ["Layout", "Open", "RuleName", "Shard", "Sharded", "ShardedGraph", "TensorSharding", "propagate"]
