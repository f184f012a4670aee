"""Shard propagation (start with ``propagate``): every value gets per-axis shards with parents.

``propagate.py`` is the pass (the API and the driver of its walks); ``walk.py`` one walk over the graph (each node's
rule applied); ``uses.py`` the backward pass (layouts from uses) and ``producing.py`` how a node could produce its
value otherwise; ``reports.py`` the warnings it gives the user; ``product.py`` its product (``ShardedGraph``);
``origins.py`` the walk back through shard parents; ``memo.py`` what walks reuse from one another;
``invariants.py`` the product's checks. The Nx data model is ``shardprop.core.layouts``; the rules themselves are
the primitives' records in ``shardprop.ops``.
"""

from .product import RuleName, ShardedGraph
from .propagate import Walking, propagate, propagate_with
from ..core.layouts import Layout, Open, Shard, Sharded, TensorSharding

__all__ = ["Layout", "Open", "RuleName", "Shard", "Sharded", "ShardedGraph", "TensorSharding", "Walking", "propagate",
           "propagate_with"]
