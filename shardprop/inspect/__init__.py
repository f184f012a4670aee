"""Inspection: read the products of the passes (a Program, Plan or ShardedGraph) and show them.

Everything here reads one ``shardprop.Plan`` (``products.as_plan``) through its view methods and
changes nothing:

* ``show`` — the annotated listing, stage by stage, and the stage table (``str(prog.graph)`` is the listing);
* ``sp.lineage`` (``shardprop.inspect.lineage.lineage``) — which input elements one block of a value depends
  on (boxes; sound, and exact where the dependency is block-shaped);
* ``sp.explain`` (``shardprop.inspect.explain.explain``) — for each axis of a value, the chain of rules, ops
  and source lines behind its sharding;
* ``to_dot`` / ``render`` — graphviz pictures with stage clusters;
* ``blocks`` / ``show_blocks`` — which device holds which block of any tensor (``rich``);
* ``stage_table`` — per stage: ops, inputs, outputs, collectives, bytes moved (``rich``);
* ``to_json`` — everything as JSON for tools, following ``SCHEMA``.
"""

from .dot import render, to_dot
# ``explain`` and ``lineage`` are not re-exported here: the names would shadow their modules
# (``import shardprop.inspect.lineage`` must give the lineage package). ``compare`` compiles the function
# (it imports the pipeline, which imports the listing from here), so it is not imported here either.
# ``shardprop`` exports all three.
from .axis_origins import Step
from .explain import AxisWhy, Explanation
from .export import SCHEMA, to_json
from .lineage import Lineage
from .listing import AnnotatedGraph, StageTable, format_listing, format_stages
from .pictures import as_text, blocks, show, show_blocks, stage_table

__all__ = ["SCHEMA", "AnnotatedGraph", "AxisWhy", "Explanation", "Lineage", "StageTable", "Step", "as_text",
           "blocks", "format_listing", "format_stages", "render", "show", "show_blocks", "stage_table", "to_dot",
           "to_json"]
