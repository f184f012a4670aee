"""``lower(plan, mesh) -> Program``: each stage becomes one ``jax.shard_map``; the program runs them all
under one ``jax.jit``, so XLA moves data between stages (the gathers) and can overlap work."""

from __future__ import annotations

from collections.abc import Sequence

import jax
from jax.sharding import Mesh, NamedSharding

from ..errors import InputMismatchError, LoweringError, MeshError, ShardingError
from ..expr import jax_adapter as jx
from ..expr.graph import Aval
from ..expr.trace import abstractify
from ..gc_pause import gc_paused
from ..mesh import as_auto_mesh
from ..splitting import Plan, Stage, StagedGraph, StageList
from .communication import Transfer, estimate, parse_hlo
from .evaluate import run_nodes


class Program:
    """A compiled plan. Call it like the original function; ``lower`` gives JAX's ``Lowered``.

    ``graph`` is the sharded graph (``print`` it for the annotated listing), ``stages`` the stage table,
    ``stage(k)`` one stage as its own jitted callable (its inputs in ``stages[k].inputs`` order).
    """

    def __init__(self, plan: Plan, mesh: Mesh):
        mesh = as_auto_mesh(mesh)
        self.plan, self.mesh = plan, mesh
        self.graph = StagedGraph.of(plan)  # prints the annotated listing, stage by stage
        self.stages = StageList(plan.stages, plan.sharded, plan.output_sources, plan.collectives, plan.layout)
        self._mesh_shape = dict(mesh.shape)
        self._stage_fns = [self._shard_map(stage) for stage in plan.stages]
        self._jitted_stages: dict[int, object] = {}
        self._jitted = jax.jit(self._run_flat)
        g = self.graph.graph
        self._in_avals = tuple(g.avals[v] for v in g.inputs)
        self._in_shardings = tuple(NamedSharding(mesh, spec) for spec in self.graph.in_specs)

    # -- building -------------------------------------------------------------------------------------
    def _shard_map(self, stage: Stage):
        sharded = self.graph
        mesh_shape = self._mesh_shape

        def body(*blocks):
            received = {(i.value, i.layout): blk for i, blk in zip(stage.inputs, blocks, strict=True)}
            local = run_nodes(sharded, stage.nodes, received, {}, mesh_shape, self.plan.needs,
                              self.plan.collectives, self.plan.layout)
            return tuple(local[v] for v in stage.outputs)

        # check_vma=False: we bind primitives directly, which skips JAX's automatic pcast insertion; the
        # replication claims in out_specs hold by construction (replicated outputs are computed from
        # gathered or replicated data only).
        return jax.shard_map(body, mesh=self.mesh, in_specs=stage.in_specs, out_specs=stage.out_specs,
                             check_vma=False)

    def _run_flat(self, *flat_args):
        results: list[Sequence[jax.Array]] = []
        for stage, fn in zip(self.plan.stages, self._stage_fns, strict=True):
            args = [flat_args[i.source[1]] if i.source[0] is None else results[i.source[0]][i.source[1]]
                    for i in stage.inputs]
            results.append(fn(*args))
        outs = [flat_args[i] if s is None else results[s][i] for s, i in self.plan.output_sources]
        # Our constants are strongly typed numpy arrays, so `s * 2` of a Python scalar `s` comes out strong;
        # give each output the weak type jax.jit gives it.
        weak = self.graph.graph.weak_outputs
        return [jx.with_weak_type(x, w) for x, w in zip(outs, weak, strict=True)]

    # -- calling --------------------------------------------------------------------------------------
    def _flat_args(self, args: tuple) -> list:
        """The argument leaves, checked against the traced shapes and dtypes.

        Shapes and (canonical) dtypes must match; weak types need not, as for a compiled ``jax.jit``
        function: the program keeps the weak types it was traced with."""
        try:
            avals, tree = abstractify(args)
        except ShardingError as err:
            raise InputMismatchError(str(err)) from None
        g = self.graph.graph
        if tree != g.in_tree:
            raise InputMismatchError(f"arguments have structure {tree}, but the program was traced with {g.in_tree}")
        problems = [
            f"  argument leaf {k}: got {Aval(tuple(a.shape), jx.as_dtype(a.dtype))}, traced with {want}"
            for k, (a, want) in enumerate(zip(avals, self._in_avals, strict=True))
            if tuple(a.shape) != want.shape or jx.as_dtype(a.dtype) != want.dtype
        ]
        if problems:
            raise InputMismatchError(
                "arguments differ from the traced ones (trace again, or call the autoshard function, which "
                "retraces per shape):\n" + "\n".join(problems))
        return jax.tree_util.tree_leaves(args)

    def __call__(self, *args):
        flat = self._flat_args(args)
        if any(isinstance(x, jax.ShapeDtypeStruct) for x in flat):
            raise InputMismatchError("a Program runs on arrays; use program.lower(...) for ShapeDtypeStructs")
        flat = [jx.with_weak_type(jax.device_put(x, s), w)
                for x, s, w in zip(flat, self._in_shardings, self.graph.graph.weak_inputs, strict=True)]
        out = _internal_errors_as_lowering_errors(self._jitted, *flat)
        return jax.tree_util.tree_unflatten(self.graph.graph.out_tree, out)

    def lower(self, *args) -> jax.stages.Lowered:
        """``jax.jit(...).lower`` of the whole program: ``.compile().as_text()`` shows its HLO."""
        self._flat_args(args)
        return _internal_errors_as_lowering_errors(self._jitted.lower, *self._shaped_args())

    def _shaped_args(self) -> list[jax.ShapeDtypeStruct]:
        return [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s, weak_type=w) for a, s, w in
                zip(self._in_avals, self._in_shardings, self.graph.graph.weak_inputs, strict=True)]

    def hlo(self) -> str:
        """The compiled program's HLO text (for the traced shapes)."""
        return _internal_errors_as_lowering_errors(self._jitted.lower, *self._shaped_args()).compile().as_text()

    def communication(self) -> list[Transfer]:
        """The collectives of the compiled program, read from its HLO."""
        return parse_hlo(self.hlo(), self.mesh)

    def estimated_communication(self) -> list[Transfer]:
        """The collectives our cost model expects, before compiling."""
        return estimate(self.plan)

    def stage(self, k: int):
        """Stage ``k`` alone, jitted: call it with its inputs (``prog.stages[k].inputs`` order)."""
        if k not in self._jitted_stages:
            self._jitted_stages[k] = jax.jit(self._stage_fns[k])
        return self._jitted_stages[k]

    def __repr__(self) -> str:
        n = len(self.plan.stages)
        return f"<Program {n} stage{'' if n == 1 else 's'} on mesh {self._mesh_shape}>"


def _internal_errors_as_lowering_errors(fn, *args):
    """User mistakes are caught before this point; anything JAX or XLA raises now is shardprop's fault and
    is reported as a :class:`LoweringError`, not as a raw traceback from deep inside the lowering."""
    try:
        return fn(*args)
    except ShardingError:
        raise
    except Exception as err:
        raise LoweringError(
            f"compiling or running the sharded program failed: {type(err).__name__}: {err}\n"
            "(this is a shardprop bug: please report it with the function and in_specs)") from err


@gc_paused
def lower(plan: Plan, mesh: Mesh | None = None) -> Program:
    """Lower a split plan to a callable :class:`Program` on ``mesh`` (default: the mesh it was propagated on)."""
    mesh = plan.sharded.mesh if mesh is None else mesh
    if dict(mesh.shape) != plan.sharded.mesh_shape:
        raise MeshError(
            f"the plan was propagated on mesh {plan.sharded.mesh_shape}, it cannot be lowered on {dict(mesh.shape)}")
    return Program(plan, mesh)
