"""``lower(plan, mesh) -> Program``: a split plan made callable — every stage a ``jax.shard_map`` that runs its IR
(its moves included: no layout change is left to XLA between stages), the program one ``jax.jit`` of them, so XLA
can overlap the stages' work.

A ``Program`` holds the products of the passes, newest first: ``prog.plan`` (the split plan, which holds
``prog.sharded``, which holds the traced graph ``prog.sharded.graph``). ``prog.graph`` prints the annotated
listing and ``prog.stages`` the stage table. A Program is immutable, built once with everything a call needs: the
plan, the mesh, the ``shardprop.signature.Signature`` it was traced with, its derivative rules, the calling
convention it was traced with and its donated leaves. How a call reaches the jit: ``dispatch.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .backends import jit_stage, parse_hlo, program_function, stage_function
from .calling import Traced
from .core.transfers import Transfer
from .derivatives import Derivatives
from .dispatch import donated_in_place, loose_if_straight
from .distributed import check_same_plan
from .errors import InputMismatchError, LoweringError, MeshError, OptionError, ShardingError
from .expr import jax_adapter as jx
from .expr.graph import Aval, value_name
from .gc_pause import gc_paused
from .inspect.listing import AnnotatedGraph, StageTable, typed_name
from .mesh import as_auto_mesh
from .propagation import ShardedGraph
from .search import SearchResult
from .signature import Signature, check_runnable
from .splitting import Plan
from .splitting.cost import estimate


@dataclass
class _Runs:
    """What a Program learns by running, kept apart from its frozen attributes: whether the processes agreed on
    its plan, and its stages jitted one by one (``stage(k)``)."""

    plan_agreed: bool
    stages: dict[int, Callable] = field(default_factory=dict)


class Program:
    """A compiled plan. Call it like the original function; ``lower`` gives JAX's ``Lowered``.

    ``plan`` and ``sharded`` are the products of splitting and propagation; ``graph`` prints the annotated
    listing (and reads like ``sharded``); ``stages`` is the stage table; ``stage(k)`` one stage as its own
    jitted callable (its inputs in ``stages[k].inputs`` order). ``signature`` is what it was traced with: a call
    with another structure, shapes or dtypes is an ``shardprop.InputMismatchError`` (weak types may differ,
    as for a compiled ``jax.jit`` function: the program keeps its own).

    Immutable: everything is given when it is built (by ``lower`` or an autoshard function). ``derivatives``
    says how to differentiate it when its graph inlined custom derivative rules (``derivatives.py``; None: its own
    ops differentiate); ``traced`` is how an autoshard function traced it with keyword or static arguments (None:
    it takes ``*args``); ``donated`` are the argument leaves (flat indices) it donates, as ``jax.jit``'s
    ``donate_argnums``: their buffers may hold the outputs, and the arrays are invalid after a call. ``search`` is
    the ``shardprop.SearchResult`` that chose the ``sp.AUTO`` arguments' layouts (None: nothing was searched);
    ``kept`` the unannotated argument leaves that kept their arrays' own layouts (as under ``jax.jit``).
    ``runs_as``: a Program of the same plan, mesh and donations already compiled (the search's memory check):
    this one runs its jit, so its first call compiles nothing again.
    """

    def __init__(self, plan: Plan, mesh: Mesh, *, derivatives: Derivatives | None = None,
                 traced: Traced | None = None, donated: Sequence[int] = (), search: SearchResult | None = None,
                 kept: frozenset[int] = frozenset(), declared: frozenset[int] = frozenset(),
                 runs_as: Program | None = None):
        self.plan, self.user_mesh, self.mesh = plan, mesh, as_auto_mesh(mesh)
        self.search, self.kept, self.declared = search, frozenset(kept), frozenset(declared)
        self.graph = AnnotatedGraph(plan)
        self.stages = StageTable(plan, spec_sources(search, self.kept, self.declared))
        self.signature = Signature.of_graph(plan.graph)
        self.derivatives, self.traced, self.donated = derivatives, traced, tuple(sorted(set(donated)))
        self._stage_fns = tuple(stage_function(plan, stage, self.mesh) for stage in plan.stages)
        self._program_fn = program_function(plan, self._stage_fns)
        self._in_shardings = tuple(NamedSharding(self.mesh, spec) for spec in plan.sharded.in_specs)
        # Where a call's host values are put: on the user's mesh, as the outputs come back typed, so that a step fed
        # its own outputs runs the executable its first call on host values compiled
        self._placements = tuple(NamedSharding(self.user_mesh, spec) for spec in plan.sharded.in_specs)
        # One jit of the program on its flat argument leaves (dispatch.py), its outputs' shardings declared: on a mesh
        # with Explicit axes they are typed on it (given as out_specs say them: P('j'), where the type would say
        # P('j', None)); and declared, they are what its derivative's jit reads its cotangents as (at jax 0.10, left
        # to JAX, that jit took the mesh from the cotangent's aval, which JAX's cache of an eager op could give from
        # another program's mesh: IndivisibleError on the second mesh a function was differentiated on)
        out_shardings = [NamedSharding(self.user_mesh, spec) for spec in plan.sharded.out_specs]
        # An empty output (a zero-length axis) leaves the jit replicated and is put in its blocks after: XLA makes
        # an empty result a constant and, told to shard it, gives every device the whole empty array under the
        # sharded claim, an array np.asarray cannot read (jax.jit's own out_shardings do so at jax 0.10)
        self._empty_outputs = tuple((k, s) for k, (s, v) in enumerate(zip(out_shardings, plan.graph.outputs,
                                                                          strict=True))
                                    if not math.prod(plan.graph.avals[v].shape) and not s.is_fully_replicated)
        for k, _ in self._empty_outputs:
            out_shardings[k] = NamedSharding(self.user_mesh, PartitionSpec())
        if runs_as is not None and (runs_as.plan is not plan or runs_as.user_mesh is not mesh
                                    or runs_as.donated != self.donated):
            raise LoweringError("a Program was asked to run another plan's executable (shardprop's bug)")
        self._jit = (runs_as._jit if runs_as is not None
                     else jax.jit(self._traced_call, donate_argnums=self.donated, out_shardings=out_shardings))

        self._devices = jx.device_list(self.mesh)
        self._several_processes = jax.process_count() > 1
        self._runs = _Runs(plan_agreed=not self._several_processes)
        self._frozen = True

    def __setattr__(self, name: str, value) -> None:
        if getattr(self, "_frozen", False):
            raise AttributeError(f"a Program is immutable: {name!r} is given when it is built (sp.lower, autoshard)")
        object.__setattr__(self, name, value)

    @property
    def sharded(self) -> ShardedGraph:
        """The product of propagation (every value's shards)."""
        return self.plan.sharded

    @property
    def in_specs(self):
        """The ``PartitionSpec`` of every argument leaf, as resolved (unannotated arguments took what they met, the
        ``sp.AUTO`` ones what the search chose), in a pytree like the arguments: ``([{"w": P(None, 'model'), ...}],
        P('data'))`` for ``f(params, x)``. ``prog.sharded.in_specs`` has them flat."""
        return jax.tree_util.tree_unflatten(self.plan.graph.in_tree, list(self.plan.sharded.in_specs))

    @property
    def out_specs(self) -> tuple:
        """The ``PartitionSpec`` every output leaf comes back laid out as."""
        return self.plan.sharded.out_specs

    # -- calling --------------------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        """The program on these arguments, called as it was traced (another structure, shape or dtype is an
        ``shardprop.InputMismatchError``): the original function's outputs, laid out as ``out_specs`` say.
        A call goes straight into the program's ``jax.jit`` unless it needs Python first (``dispatch.py``)."""
        return self.call_flat(self._leaves(args, kwargs))

    def call_flat(self, leaves: list):
        """The call (see ``__call__``) on argument leaves already in the traced structure: an autoshard function
        calls the program its call's signature maps to so."""
        loose = loose_if_straight(leaves, self._devices, self._several_processes) if self._runs.plan_agreed else None
        if loose is not None and (not self.donated or donated_in_place([leaves[k] for k in self.donated], leaves)):
            if loose:  # put where the program reads them: one executable for fresh and placed arguments alike
                leaves = list(leaves)
                placed = jx.put_all([leaves[k] for k in loose], [self._placements[k] for k in loose])
                for k, x in zip(loose, placed, strict=True):
                    leaves[k] = x
            out = as_lowering_errors(self._jit, *leaves, check_arguments=lambda: self._check_leaves(leaves))
        else:
            out = self._call_checked(leaves)
        if self._empty_outputs:
            out = list(out)
            for k, sharding in self._empty_outputs:
                if not jx.is_traced(out[k]):  # (under the caller's jit, an empty value's layout is XLA's)
                    out[k] = jx.place(out[k], sharding)
        return jax.tree_util.tree_unflatten(self.plan.graph.out_tree, out)

    def program_args(self, args: tuple, kwargs: dict | None = None) -> tuple:
        """A call's arguments as the program was traced on them: ``args`` as they are, or — for a program an
        autoshard function traced with keyword or static arguments — its dynamic ``(args, kwargs)``."""
        if self.traced is not None:
            return self.traced.program_args(args, kwargs or {})
        if kwargs:
            raise InputMismatchError(f"this Program was traced without keyword arguments; called with "
                                     f"{', '.join(kwargs)} (call the autoshard function, which traces per call form)")
        return args

    def placed_args(self, args: tuple, kwargs: dict | None = None) -> list[jax.Array]:
        """The argument leaves checked (see ``__call__``) and placed on the mesh in the program's input
        shardings, with the weak types it was traced with: what its first stage reads."""
        leaves = self._leaves(args, kwargs)
        self._check_leaves(leaves)
        return [jx.with_weak_type(x, w) for x, w in zip(self._placed(leaves), self.signature.weak_types, strict=True)]

    def agree_on_plan(self) -> None:
        """On a mesh spanning several processes, check once (before any stage runs) that every process made this
        plan: their stages' collectives must match, or they wait for each other forever. Raises
        ``shardprop.PlanMismatchError`` on every process, naming the first stage that differs. Every way of
        running the program calls it (a call, ``stage(k)``, the debugger); a single process skips it."""
        if not self._runs.plan_agreed:
            check_same_plan(self.plan)
            self._runs.plan_agreed = True

    def _run_in_trace(self, leaves: Sequence) -> list:
        """The program on its argument leaves inside its jit's trace, as flat outputs: each leaf with the weak type
        it was traced with, laid out as the program takes it.

        The one place that handles meshes with Explicit axes: where the leaves are typed on one (arrays placed on
        a ``jax.make_mesh`` mesh, or traced under ``jax.set_mesh`` of one) or the program's own mesh has them, the
        program runs on those axes made Auto and its outputs come back typed on that mesh
        (``jax.sharding.auto_axes``); otherwise it runs with its own mesh as JAX's context mesh."""
        leaves = [jx.with_weak_type(x, w) for x, w in zip(leaves, self.signature.weak_types, strict=True)]
        typed = jx.explicit_mesh_of(leaves)
        if typed is None and self.user_mesh is not self.mesh:
            typed = self.user_mesh
        if typed is not None:
            return list(jx.on_auto_axes(self._placed_program, typed, tuple(self.out_specs))(*leaves))
        with jx.program_mesh_context(self.mesh):
            return list(self._placed_program(*leaves))

    def _placed_program(self, *leaves) -> tuple:
        return tuple(self._program_fn(*(jx.place(x, s) for x, s in zip(leaves, self._in_shardings, strict=True))))

    def _traced_call(self, *leaves) -> list:
        """The body of the program's jit: the leaves checked against the signature (when it traces: a call that
        hits the jit's cache costs nothing here), then the program; returns the output leaves."""
        self.signature.check(Signature.of(jax.tree_util.tree_unflatten(self.signature.tree, leaves)))
        return self._run_in_trace(leaves)

    def _leaves(self, args: tuple, kwargs: dict | None) -> list:
        """A call's argument leaves, in the structure it was traced with (else an InputMismatchError)."""
        plain = self.traced is None and not kwargs
        leaves, tree = jax.tree_util.tree_flatten(args if plain else self.program_args(args, kwargs))
        self.signature.check_structure(tree)
        return leaves

    def _check_leaves(self, leaves: list) -> None:
        """Raise the ``shardprop.InputMismatchError`` these leaves deserve, if any: another shape or dtype, a
        leaf that is not an array, a ShapeDtypeStruct, a deleted array."""
        self.signature.check_call(jax.tree_util.tree_unflatten(self.signature.tree, leaves))
        check_runnable(leaves)

    def _call_checked(self, leaves: list) -> list:
        """A call through Python first (``dispatch.py``): the arguments checked, concrete ones placed on the mesh
        (host values checked to be the same on every process), the plan agreed on, donations checked and copies
        invalidated; under a transformation, the derivative rules put around the jit. Returns the output leaves."""
        self._check_leaves(leaves)
        placed = self._placed(leaves)
        self.agree_on_plan()
        if any(jx.is_traced(x) for x in placed):
            return as_lowering_errors(self._differentiable(placed), *placed)
        self._check_donations(placed)
        out = as_lowering_errors(self._jit, *placed)
        if self.donated:
            self._invalidate_donated(leaves, placed, out)
        return out

    def _placed(self, leaves: list) -> list:
        """Concrete leaves put on the mesh in the program's input shardings; tracers as they are (the program
        lays them out inside its jit)."""
        return [x if jx.is_traced(x) else self._place(k, x, s)
                for k, (x, s) in enumerate(zip(leaves, self._in_shardings, strict=True))]

    def _place(self, k: int, x, sharding):
        try:
            return jx.place(x, sharding)
        except jx.DiffersAcrossProcesses:
            v = self.plan.graph.inputs[k]
            raise InputMismatchError(
                f"argument leaf {k} ({value_name(v)}:{self.plan.graph.avals[v]}) is a host array that differs between "
                f"the processes; on a mesh spanning {jax.process_count()} processes a NumPy (or Python) argument is "
                "the global value and must be the same on every process (seed random data alike), or be built from "
                "each process's own rows: sp.distributed.process_local(rows, mesh, spec)") from None

    def _differentiable(self, placed: list) -> Callable:
        """The program's jit, differentiated as the user's function is when the graph inlined custom derivative
        rules (relu, a custom_vjp): see ``shardprop/derivatives.py``."""
        if not self.plan.graph.custom_derivatives:
            return self._jit
        if not any(jx.is_differentiated(x) for x in placed):
            # traced, but not differentiated (vmap; or partial evaluation: a derivative program's tangents while JAX
            # linearizes a custom rule that calls it): no rule is needed, and jax 0.12 stages a custom_jvp call out
            # whole when some of its inputs are unknown there, leaving even its primal outputs unknown
            return self._jit
        if self.derivatives is None:
            if any(jx.is_differentiated(x) for x in placed):
                kinds = ", ".join(sorted(self.plan.graph.custom_derivatives))
                raise OptionError(
                    f"this Program was lowered from a plan, without its function, and its graph inlined calls with "
                    f"custom derivative rules ({kinds}): differentiating its ops would not apply them. "
                    "Differentiate the autoshard function (or sp.compile_program's Program) instead")
            return self._jit
        return self.derivatives.wrap(self._jit)

    def _check_donations(self, placed: list) -> None:
        """One buffer cannot be donated and read in the same call (``jax.jit`` refuses ``f(donate(a), a)``)."""
        for k in self.donated:
            for m, other in enumerate(placed):
                if m != k and other is placed[k]:
                    raise InputMismatchError(
                        f"argument leaf {k} is donated, and the same array is also passed as argument leaf {m}: a "
                        "buffer cannot be donated and read in one call (as under jax.jit); pass a copy of it")

    def _invalidate_donated(self, leaves: list, placed: list, out: list) -> None:
        """A donated array that had to be copied into place is invalid afterwards too, as under ``jax.jit`` (its
        memory is what donating was for) — unless it is passed again undonated or comes back as an output."""
        kept = {id(x) for x in [*placed, *out]}
        for k in self.donated:
            x = leaves[k]
            if isinstance(x, jax.Array) and not jx.is_traced(x) and id(x) not in kept and not x.is_deleted():
                x.delete()

    # -- looking at it --------------------------------------------------------------------------------
    def lower(self, *args, **kwargs) -> jax.stages.Lowered:
        """``jax.jit(...).lower`` of the whole program (arrays or ShapeDtypeStructs of the traced shapes):
        ``.compile().as_text()`` shows its HLO."""
        leaves = self._leaves(args, kwargs)
        self.signature.check_call(jax.tree_util.tree_unflatten(self.signature.tree, leaves))
        return self._lowered()

    def _lowered(self) -> jax.stages.Lowered:
        shaped = self.signature.shape_dtype_structs(self._in_shardings)
        return as_lowering_errors(self._jit.lower, *shaped, mesh=self.mesh)

    def memory(self) -> int:
        """Bytes per device the compiled program holds — arguments + outputs + temporaries - aliased, as
        ``compiled.memory_analysis()`` reports them (what ``memory_limit=`` bounds)."""
        stats = as_lowering_errors(lambda: self._lowered().compile().memory_analysis())
        return int(stats.argument_size_in_bytes + stats.output_size_in_bytes + stats.temp_size_in_bytes
                   - stats.alias_size_in_bytes)

    def hlo(self) -> str:
        """The compiled program's HLO text (for the traced shapes)."""
        return as_lowering_errors(lambda: self._lowered().compile().as_text())

    def communication(self) -> list[Transfer]:
        """The collectives of the compiled program, read from its HLO."""
        return parse_hlo(self.hlo(), self.mesh)

    def estimated_communication(self) -> list[Transfer]:
        """The collectives the cost model expects, before compiling."""
        return estimate(self.plan)

    def stage(self, k: int):
        """Stage ``k`` alone, jitted: call it with its inputs in ``prog.stages[k].inputs`` order (whole arrays;
        other shapes or dtypes are an ``shardprop.InputMismatchError`` naming what the stage expects)."""
        stage = self.plan.stage_at(k)
        self.agree_on_plan()
        if stage.id not in self._runs.stages:
            self._runs.stages[stage.id] = _checked_stage(self.plan, stage, jit_stage(stage, self._stage_fns[stage.id],
                                                                                     self.mesh), self.mesh)
        return self._runs.stages[stage.id]

    def __repr__(self) -> str:
        """One line for a few arguments; a table, one argument leaf per row, for a model's many."""
        n = len(self.plan.stages)
        graph = self.plan.graph
        head = (f"<Program {n} stage{'' if n == 1 else 's'}, {len(graph.nodes)} nodes, strategy "
                f"{self.plan.strategy}, on mesh {dict(self.mesh.shape)}")
        sources = spec_sources(self.search, self.kept, self.declared)
        rows = [(name, str(graph.avals[v]), str(spec), f"({sources[k]})" if k in sources else "")
                for k, (v, name, spec) in enumerate(zip(graph.inputs, graph.argument_names,
                                                        self.plan.sharded.in_specs, strict=True))]
        if len(rows) <= 3:
            short = [f"{name}: {aval}@{spec}" + (f" {source}" if source else "") for name, aval, spec, source in rows]
            return f"{head}; inputs {', '.join(short)}>"
        widths = [max(len(row[c]) for row in rows) for c in range(3)]
        table = ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, [*widths, 0], strict=True)).rstrip()
                 for row in rows]
        return "\n".join([f"{head}; {len(rows)} inputs:", *table]) + ">"


def _checked_stage(plan: Plan, stage, jitted, mesh: Mesh):
    """``jitted`` (stage ``stage``), checking its arguments against the stage's inputs first."""
    avals = [plan.graph.avals[i.value] for i in stage.inputs]
    wanted = ", ".join(typed_name(plan, i.value, i.layout) for i in stage.inputs)

    def call(*args):
        got = [Aval(tuple(getattr(a, "shape", ())), jx.as_dtype(getattr(a, "dtype", None))) for a in args]
        if len(args) != len(avals) or any(g.shape != w.shape or g.dtype != w.dtype
                                          for g, w in zip(got, avals, strict=True)):
            raise InputMismatchError(f"stage {stage.id} takes ({wanted}) — whole arrays, in prog.stages["
                                     f"{stage.id}].inputs order — but was called with ({', '.join(map(str, got))})")
        return as_lowering_errors(jitted, *args, mesh=mesh)

    return call


def as_lowering_errors(fn, *args, mesh: Mesh | None = None, check_arguments: Callable[[], None] | None = None):
    """User mistakes are caught before this point; anything JAX or XLA raises now is shardprop's fault and
    is reported as a ``LoweringError``, not as a raw traceback from deep inside the lowering.

    With ``mesh`` (the program's, Auto axes), ``fn`` runs with it as JAX's context mesh: a user calling under
    ``jax.set_mesh`` of a mesh with Explicit axes would otherwise have ``shard_map`` refuse our mesh.
    ``check_arguments`` is for a call that went into ``jax.jit`` unchecked (``dispatch.py``): when it fails, it is
    called first and raises the error the arguments deserve if they are at fault (JAX refusing a string, say) —
    the error the checked path raises for them. Either way the call is not run again."""
    try:
        if mesh is not None:
            with jx.program_mesh_context(mesh):
                return fn(*args)
        return fn(*args)
    except ShardingError:
        raise
    except Exception as err:
        if jx.refuses_transformation(err):  # JAX refusing what the user asked, as it would under jax.jit
            raise
        if check_arguments is not None:
            try:
                check_arguments()
            except ShardingError as mistake:
                raise mistake from None
        raise LoweringError(
            f"compiling or running the sharded program failed: {type(err).__name__}: {err}\n"
            "(this is a shardprop bug: please report it with the function and in_specs)") from err


@gc_paused
def lower(plan: Plan, mesh: Mesh | None = None, *, derivatives: Derivatives | None = None,
          traced: Traced | None = None, donated: Sequence[int] = (), search: SearchResult | None = None,
          kept: frozenset[int] = frozenset(), declared: frozenset[int] = frozenset(),
          runs_as: Program | None = None) -> Program:
    """Lower a split plan to a callable ``Program`` on ``mesh`` (default: the mesh it was propagated on).
    The keyword arguments are the Program's (an autoshard function passes them; a plan alone needs none)."""
    mesh = plan.sharded.mesh if mesh is None else mesh
    if dict(mesh.shape) != plan.mesh_shape:
        raise MeshError(
            f"the plan was propagated on mesh {plan.mesh_shape}, it cannot be lowered on {dict(mesh.shape)}")
    return Program(plan, mesh, derivatives=derivatives, traced=traced, donated=donated, search=search, kept=kept,
                   declared=declared, runs_as=runs_as)


def spec_sources(search: SearchResult | None, kept: frozenset[int], declared: frozenset[int] = frozenset()
                 ) -> dict[int, str]:
    """Where the spec of an argument leaf came from, where the user did not write it: ``{leaf: "chosen by
    sp.AUTO"}``, ``"its array's own layout"`` (an unannotated argument already laid out on the mesh) or ``"its
    Variable's sharding metadata"`` (an unannotated NNX Variable's ``nnx.with_partitioning``)."""
    sources = {k: "its Variable's sharding metadata" for k in declared}
    sources.update({k: "its array's own layout" for k in kept})
    sources.update({k: "chosen by sp.AUTO" for k in (search.searched if search is not None else ())})
    return sources
