"""shardprop: symbolic sharding propagation for JAX functions, in the style of Nx's sharding design.

The pipeline reads like the design: ``trace → propagate → split → lower``::

    import shardprop as sp
    mesh = sp.make_mesh((4, 2), ("i", "j"))
    fs = sp.autoshard(f, mesh=mesh, in_specs=(P("i", "j"), None))
    out = fs(a, b)                  # equal to f(a, b), sharded on the mesh
    prog = fs.trace(a, b)
    print(prog.graph)               # the graph with per-axis shard annotations
    print(prog.stages)              # stages with their in/out specs

or step by step: ``sp.trace(f, *args)``, ``sp.propagate(graph, in_specs, mesh=mesh)``, ``sp.split(sharded)``,
``sp.lower(plan, mesh)``. To look inside: ``sp.show(prog)``, ``sp.explain(prog, "e")``,
``sp.lineage(prog, output=0, block=(0, 1))``, ``sp.to_dot(prog)``, ``sp.show_blocks(prog, "c")``.
"""

from . import distributed
from .api import AutoSharded, autoshard, compile_program
from .debug import Debugger
from .program import Program, lower
from .errors import (
    ArtifactError,
    ConflictKind,
    DuplicateMeshAxisError,
    ExtraNotInstalledError,
    FallbackWarning,
    StrategyWarning,
    IndivisibleAxisError,
    InputMismatchError,
    InvariantError,
    MemoryLimitError,
    LoweringError,
    RenderError,
    SearchError,
    ReshardWarning,
    MeshError,
    NoRuleError,
    NotComputedError,
    OptionError,
    OutOfStepError,
    PlanMismatchError,
    ReferenceEvaluationError,
    ShardingConflictError,
    ShardingError,
    SpecError,
    SpecRankError,
    SpecTreeError,
    StageIndexError,
    TraceError,
    UnknownMeshAxisError,
    UnknownValueError,
    UnsupportedDtypeError,
    UnsupportedJaxError,
)
from .expr import Graph, Node, trace
from .inspect import Explanation, Lineage, blocks, render, show, show_blocks, stage_table, to_dot, to_json
from .compare import Comparison, compare_with_jit
from .inspect.explain import explain
from .inspect.lineage import lineage
from .inspect.model_explorer import model_explorer_overlays, to_model_explorer
from .inspect.viewer import Viewer, visualize
from .mesh import make_mesh
from .search import AUTO, SearchResult
from .ops import OpDef
from .propagation import Shard, ShardedGraph, TensorSharding, Walking, propagate, propagate_with
from .splitting import Collective, Decisions, Plan, Stage, StageInput, Strategy, split

__version__ = "0.1.0"

__all__ = [
    "distributed",
    "AUTO", "ArtifactError", "AutoSharded", "Collective", "Comparison", "ConflictKind", "Debugger", "Decisions",
    "DuplicateMeshAxisError", "Explanation", "ExtraNotInstalledError", "FallbackWarning", "StrategyWarning", "Graph",
    "IndivisibleAxisError", "InputMismatchError", "InvariantError", "Lineage", "LoweringError", "MemoryLimitError",
    "MeshError",
    "NoRuleError", "Node",
    "NotComputedError", "OpDef", "OptionError", "OutOfStepError", "Plan", "PlanMismatchError", "Program",
    "ReferenceEvaluationError", "RenderError", "SearchError", "SearchResult",
    "ReshardWarning", "Shard", "ShardedGraph", "ShardingConflictError", "ShardingError", "SpecError",
    "SpecRankError", "SpecTreeError", "Stage", "StageIndexError", "StageInput", "Strategy", "TensorSharding",
    "TraceError", "UnknownMeshAxisError", "UnknownValueError", "UnsupportedDtypeError", "UnsupportedJaxError",
    "Viewer", "Walking", "autoshard", "blocks",
    "compare_with_jit", "compile_program", "explain", "lineage", "lower", "make_mesh", "model_explorer_overlays",
    "propagate", "propagate_with", "render", "show", "show_blocks", "split", "stage_table", "to_dot", "to_json",
    "to_model_explorer", "trace", "visualize",
]
