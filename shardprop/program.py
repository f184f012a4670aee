"""``lower(plan, mesh) -> Program``: a split plan made callable — every stage a ``jax.shard_map``, the program
one ``jax.jit`` of them, so XLA moves data between stages (the gathers) and can overlap work.

A :class:`Program` holds the products of the passes, newest first: ``prog.plan`` (the split plan, which holds
``prog.sharded``, which holds the traced graph ``prog.sharded.graph``). ``prog.graph`` prints the annotated
listing and ``prog.stages`` the stage table.
"""

from __future__ import annotations

import jax
from jax.sharding import Mesh, NamedSharding

from .backends import parse_hlo, program_function, stage_function
from .calling import Traced
from .errors import InputMismatchError, LoweringError, MeshError, OptionError, ShardingError
from .expr import jax_adapter as jx
from .expr.graph import Aval, value_name
from .expr.trace import abstractify
from .gc_pause import gc_paused
from .inspect.listing import AnnotatedGraph, StageTable
from .mesh import as_auto_mesh
from .propagation import ShardedGraph
from .splitting import Plan
from .core.transfers import Transfer
from .splitting.cost import estimate


class HotPathMiss(Exception):
    """The call cannot take the hot path (``Program.call_hot``); the checked path takes it."""


def _raise(err: Exception):
    raise err


class Program:
    """A compiled plan. Call it like the original function; ``lower`` gives JAX's ``Lowered``.

    ``plan`` and ``sharded`` are the products of splitting and propagation; ``graph`` prints the annotated
    listing (and reads like ``sharded``); ``stages`` is the stage table; ``stage(k)`` one stage as its own
    jitted callable (its inputs in ``stages[k].inputs`` order).
    """

    def __init__(self, plan: Plan, mesh: Mesh):
        self.user_mesh = mesh
        mesh = as_auto_mesh(mesh)
        self.plan, self.mesh = plan, mesh
        self.graph = AnnotatedGraph(plan)
        self.stages = StageTable(plan)
        self._stage_fns = [stage_function(plan, stage, mesh) for stage in plan.stages]
        self._jitted_stages: dict[int, object] = {}
        self._program_fn = program_function(plan, self._stage_fns)
        self._jitted = jax.jit(self._program_fn)
        self._hot: dict[bool, object] = {}  # the hot path (see call_hot), made on the first call that takes it
        self.donated: tuple[int, ...] = ()  # argument leaves donated to the whole-program jit
        self._hot_donated: tuple[int, ...] | None = ()  # the arguments the hot path donates (None: it cannot)
        # How to differentiate it when its graph inlined custom derivative rules (see derivatives.py): set by
        # autoshard, which knows the function; None otherwise.
        self.derivatives = None
        graph = plan.graph
        self._in_avals = tuple(graph.avals[v] for v in graph.inputs)
        self._in_shardings = tuple(NamedSharding(mesh, spec) for spec in plan.sharded.in_specs)
        # The hot path takes the arguments as the user's mesh types them (Explicit axes: on that mesh), one per argument
        self._hot_shardings = jax.tree_util.tree_unflatten(graph.in_tree, tuple(
            NamedSharding(self.user_mesh, spec) for spec in plan.sharded.in_specs))
        # How an autoshard function traced it (keyword or static arguments), or None: traced on ``*args``.
        self.traced: Traced | None = None
        self._single_process = jax.process_count() == 1
        self._plan_agreed = self._single_process

    def donate(self, leaves: tuple[int, ...]) -> None:
        """Donate these argument leaves (flat indices) to the whole-program jit, as ``jax.jit``'s
        ``donate_argnums``: their buffers may hold the outputs, and the arrays are invalid after a call."""
        leaves = tuple(sorted(set(leaves)))
        if leaves != self.donated:
            self.donated = leaves
            self._jitted = jax.jit(self._program_fn, donate_argnums=leaves)
            self._hot = {}
            # The hot path donates whole arguments (jax.jit's donate_argnums): where the donated leaves are exactly
            # some arguments' leaves, those arguments; otherwise donated calls stay on the checked path.
            counts = [child.num_leaves for child in self.plan.graph.in_tree.children()]
            starts = [sum(counts[:k]) for k in range(len(counts))]
            whole = tuple(k for k, (start, n) in enumerate(zip(starts, counts, strict=True))
                          if n and set(range(start, start + n)) <= set(leaves))
            covered = {leaf for k in whole for leaf in range(starts[k], starts[k] + counts[k])}
            self._hot_donated = whole if covered == set(leaves) else None

    @property
    def sharded(self) -> ShardedGraph:
        """The product of propagation (every value's shards)."""
        return self.plan.sharded

    @property
    def in_specs(self) -> tuple:
        """The ``PartitionSpec`` of every argument leaf, as resolved (unannotated arguments took what they met)."""
        return self.plan.sharded.in_specs

    @property
    def out_specs(self) -> tuple:
        """The ``PartitionSpec`` every output leaf comes back laid out as."""
        return self.plan.sharded.out_specs

    # -- calling --------------------------------------------------------------------------------------
    def _flat_args(self, args: tuple) -> list:
        """The argument leaves, checked against the traced shapes and dtypes.

        Shapes and (canonical) dtypes must match; weak types need not, as for a compiled ``jax.jit``
        function: the program keeps the weak types it was traced with."""
        try:
            avals, tree = abstractify(args)
        except ShardingError as err:
            raise InputMismatchError(str(err)) from None
        graph = self.plan.graph
        if tree != graph.in_tree:
            raise InputMismatchError(f"arguments have structure {tree}, but the program was traced with "
                                     f"{graph.in_tree}")
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

    def program_args(self, args: tuple, kwargs: dict | None = None) -> tuple:
        """A call's arguments as the program was traced on them: ``args`` as they are, or — for a program an
        autoshard function traced with keyword or static arguments — its dynamic ``(args, kwargs)``."""
        kwargs = kwargs or {}
        if self.traced is not None:
            return self.traced.program_args(args, kwargs)
        if kwargs:
            raise InputMismatchError(f"this Program was traced without keyword arguments; called with "
                                     f"{', '.join(kwargs)} (call the autoshard function, which traces per call form)")
        return args

    def placed_args(self, args: tuple, kwargs: dict | None = None) -> list[jax.Array]:
        """The argument leaves checked (see ``__call__``) and placed on the mesh in the program's input
        shardings, with the weak types it was traced with: what its first stage reads."""
        flat = self._flat_args(self.program_args(args, kwargs))
        if any(isinstance(x, jax.ShapeDtypeStruct) for x in flat):
            raise InputMismatchError("a Program runs on arrays; use program.lower(...) for ShapeDtypeStructs")
        if any(jx.typed_on_explicit_axes(x) for x in flat):
            raise MeshError(
                "transformed (jax.jit, jax.grad, jax.vmap, ...) under jax.set_mesh of a mesh with Explicit axes, "
                "where shardings are part of the types: shardprop programs run on Auto axes. Call the autoshard "
                "function untransformed there (it is one jitted program already, and works under that set_mesh), "
                "or set a mesh with Auto axes (jax.make_mesh(..., axis_types=(AxisType.Auto,) * n)) around the "
                "transformation")
        return [jx.with_weak_type(self._place(k, x, s), w)
                for k, (x, s, w) in enumerate(zip(flat, self._in_shardings, self.plan.graph.weak_inputs, strict=True))]

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

    def agree_on_plan(self) -> None:
        """On a mesh spanning several processes, check once (before any stage runs) that every process made this
        plan: their stages' collectives must match, or they wait for each other forever. Raises
        :class:`~shardprop.PlanMismatchError` on every process, naming the first stage that differs. Every way of
        running the program calls it (a call, ``stage(k)``, the debugger); a single process skips it."""
        if not self._plan_agreed:
            from .distributed import check_same_plan

            check_same_plan(self.plan)
            self._plan_agreed = True

    def __call__(self, *args, **kwargs):
        if not kwargs:
            try:
                return self.call_hot(args)
            except HotPathMiss:
                pass
        return self.call_checked(args, kwargs)

    def call_hot(self, args: tuple, weak_types: bool = False):
        """The call on the hot path — ``jax.jit`` of the call's own arguments with the program's ``in_shardings``,
        so JAX's C++ dispatch checks the arguments' types and places them, and a call costs what a ``jax.jit`` call
        costs — or :class:`HotPathMiss`, and the checked path (``__call__``) takes the call and raises its errors.
        It runs the traced call only: another signature (with ``weak_types``, another weak type too) raises while
        tracing, and ``jax.jit`` refuses an argument laid out otherwise (the checked path moves it). On a user mesh
        with Explicit axes the arguments and outputs are typed on that mesh, as the checked path gives them back.
        Calls with tracers (a transformation: derivative rules), keyword or static arguments, an
        unchecked plan on several processes, host arrays there (the checked path makes sure they are the same on
        every process), and donated leaves that are not whole arguments, not laid out as the program takes them
        (the checked path copies them into place and invalidates them) or passed twice take the checked path."""
        if not (self._plan_agreed and self._hot_donated is not None and self.traced is None):
            raise HotPathMiss
        several = not self._single_process
        leaves = jax.tree_util.tree_leaves(args)
        for x in leaves:
            if jx.is_traced(x) or (several and not isinstance(x, jax.Array)):
                raise HotPathMiss
        if self.donated and not self._donated_in_place(leaves):
            raise HotPathMiss
        jitted = self._hot.get(weak_types)
        if jitted is None:
            jitted = self._hot[weak_types] = jax.jit(self._traced_call(weak_types),
                                                     in_shardings=tuple(self._hot_shardings),
                                                     out_shardings=self._hot_out_shardings,
                                                     donate_argnums=self._hot_donated)
        try:
            return jitted(*args)
        except Exception as err:  # noqa: BLE001 -- not the traced call, or a failure: the checked path says which
            if any(leaves[k].is_deleted() for k in self.donated):
                # It ran and consumed its donated buffers: another run cannot take them; report this failure as
                # the checked path reports one.
                as_lowering_errors(_raise, err)
            raise HotPathMiss from err

    @property
    def _hot_out_shardings(self):
        """On a user mesh with Explicit axes, the outputs' shardings on it (specs as the checked path gives them);
        otherwise None: jax.jit keeps the program's own."""
        if self.user_mesh is self.mesh:
            return None
        return jax.tree_util.tree_unflatten(self.plan.graph.out_tree, [
            NamedSharding(self.user_mesh, spec) for spec in self.out_specs])

    def _donated_in_place(self, leaves: list) -> bool:
        """Every donated leaf is an array laid out as the program takes it, passed once: ``jax.jit`` donates its
        buffer as it is (no copy that the checked path would have to invalidate)."""
        if len(leaves) != len(self._in_shardings):
            return False
        donated = [leaves[k] for k in self.donated]
        hot = jax.tree_util.tree_leaves(self._hot_shardings)  # on the user's mesh, as the hot path takes them
        if any(not isinstance(x, jax.Array) or x.sharding != hot[k]
               for x, k in zip(donated, self.donated, strict=True)):
            return False
        ids = [id(x) for x in leaves]
        return all(ids.count(id(x)) == 1 for x in donated)

    def _traced_call(self, weak_types: bool):
        """The program as a function of the call's own arguments, refusing at trace time any other signature."""
        graph = self.plan.graph
        want = [(tuple(a.shape), a.dtype) for a in self._in_avals]
        if weak_types:
            want = [(*w, weak) for w, weak in zip(want, graph.weak_inputs, strict=True)]
        program = self._program_fn
        if self.user_mesh is not self.mesh:  # typed on the user's Explicit axes: the program runs on them made Auto
            program = jx.on_auto_axes(lambda *xs: tuple(self._program_fn(*xs)), self.user_mesh,
                                      tuple(jax.tree_util.tree_leaves(self._hot_out_shardings)))

        def traced_call(*args):
            leaves, tree = jax.tree_util.tree_flatten(args)
            got = [(tuple(x.shape), jx.as_dtype(x.dtype)) + ((bool(jax.typeof(x).weak_type),) if weak_types else ())
                   for x in leaves]
            if tree != graph.in_tree or got != want:
                raise HotPathMiss
            leaves = [jx.with_weak_type(x, w) for x, w in zip(leaves, graph.weak_inputs, strict=True)]
            return jax.tree_util.tree_unflatten(graph.out_tree, list(program(*leaves)))

        return traced_call

    def call_checked(self, args: tuple, kwargs: dict):
        """A call through the checks: arguments checked against the traced ones and placed in Python, derivative
        rules, donations, the user's Explicit mesh. Every error a call can raise is raised here. Traced arguments
        typed on a mesh's Explicit axes (``jax.jit`` or ``jax.grad`` of arrays placed on a ``jax.make_mesh`` mesh)
        are seen on those axes made Auto, and the outputs come back typed on it (``jax.sharding.auto_axes``)."""
        typed = jx.explicit_mesh_of(jax.tree_util.tree_leaves((args, kwargs)))
        if typed is not None:
            specs = jax.tree_util.tree_unflatten(self.plan.graph.out_tree, list(self.out_specs))
            return jx.on_auto_axes(lambda *a: self._call_checked(a, kwargs), typed, specs)(*args)
        return self._call_checked(args, kwargs)

    def _call_checked(self, args: tuple, kwargs: dict):
        placed = self.placed_args(args, kwargs)
        self.agree_on_plan()
        self._check_donations(placed)
        out = as_lowering_errors(self._differentiable(placed), *placed, mesh=self.mesh)
        if self.donated:
            self._invalidate_donated(jax.tree_util.tree_leaves(self.program_args(args, kwargs)), placed, out)
        if self.user_mesh is not self.mesh:  # the user's mesh has Explicit axes: give the outputs back on it
            out = [jx.place(x, NamedSharding(self.user_mesh, x.sharding.spec))
                   if not jx.is_traced(x) and isinstance(x.sharding, NamedSharding) else x for x in out]
        return jax.tree_util.tree_unflatten(self.plan.graph.out_tree, out)

    def _differentiable(self, placed: list):
        """The whole-program jit, differentiated as the user's function is when the graph inlined custom
        derivative rules (relu, a custom_vjp): see ``shardprop/derivatives.py``."""
        if not self.plan.graph.custom_derivatives or not any(jx.is_traced(x) for x in placed):
            return self._jitted  # concrete arguments: nothing differentiates this call
        if self.derivatives is None:
            if any(jx.is_differentiated(x) for x in placed):
                kinds = ", ".join(sorted(self.plan.graph.custom_derivatives))
                raise OptionError(
                    f"this Program was lowered from a plan, without its function, and its graph inlined calls with "
                    f"custom derivative rules ({kinds}): differentiating its ops would not apply them. "
                    "Differentiate the autoshard function (or sp.compile_program's Program) instead")
            return self._jitted
        return self.derivatives.wrap(self._jitted)

    def _check_donations(self, placed: list) -> None:
        """One buffer cannot be donated and read in the same call (``jax.jit`` refuses ``f(donate(a), a)``)."""
        for k in self.donated:
            for m, other in enumerate(placed):
                if m != k and other is placed[k]:
                    raise InputMismatchError(
                        f"argument leaf {k} is donated, and the same array is also passed as argument leaf {m}: a "
                        "buffer cannot be donated and read in one call (as under jax.jit); pass a copy of it")

    def _invalidate_donated(self, flat: list, placed: list, out: list) -> None:
        """A donated array that had to be copied into place is invalid afterwards too, as under ``jax.jit`` (its
        memory is what donating was for) — unless it is passed again undonated or comes back as an output."""
        kept = {id(x) for x in [*placed, *out]}
        for k in self.donated:
            x = flat[k]
            if isinstance(x, jax.Array) and not jx.is_traced(x) and id(x) not in kept and not x.is_deleted():
                x.delete()

    def lower(self, *args, **kwargs) -> jax.stages.Lowered:
        """``jax.jit(...).lower`` of the whole program: ``.compile().as_text()`` shows its HLO."""
        self._flat_args(self.program_args(args, kwargs))
        return as_lowering_errors(self._jitted.lower, *self._shaped_args(), mesh=self.mesh)

    def _shaped_args(self) -> list[jax.ShapeDtypeStruct]:
        return [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s, weak_type=w) for a, s, w in
                zip(self._in_avals, self._in_shardings, self.plan.graph.weak_inputs, strict=True)]

    # -- looking at it --------------------------------------------------------------------------------
    def hlo(self) -> str:
        """The compiled program's HLO text (for the traced shapes)."""
        return as_lowering_errors(self._jitted.lower, *self._shaped_args(), mesh=self.mesh).compile().as_text()

    def communication(self) -> list[Transfer]:
        """The collectives of the compiled program, read from its HLO."""
        return parse_hlo(self.hlo(), self.mesh)

    def estimated_communication(self) -> list[Transfer]:
        """The collectives the cost model expects, before compiling."""
        return estimate(self.plan)

    def stage(self, k: int):
        """Stage ``k`` alone, jitted: call it with its inputs in ``prog.stages[k].inputs`` order (whole arrays;
        other shapes or dtypes are an :class:`~shardprop.InputMismatchError` naming what the stage expects)."""
        self.agree_on_plan()
        if k not in self._jitted_stages:
            self._jitted_stages[k] = _checked_stage(self.plan, self.plan.stages[k], jax.jit(self._stage_fns[k]),
                                                    self.mesh)
        return self._jitted_stages[k]

    def __repr__(self) -> str:
        n = len(self.plan.stages)
        graph = self.plan.graph
        inputs = ", ".join(f"{graph.avals[v]}@{spec}"
                           for v, spec in zip(graph.inputs, self.plan.sharded.in_specs, strict=True))
        return (f"<Program {n} stage{'' if n == 1 else 's'}, {len(graph.nodes)} nodes, strategy "
                f"{self.plan.strategy}, on mesh {dict(self.mesh.shape)}; inputs {inputs}>")


def _checked_stage(plan: Plan, stage, jitted, mesh: Mesh):
    """``jitted`` (stage ``stage``), checking its arguments against the stage's inputs first."""
    from .inspect.listing import typed_name

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


def as_lowering_errors(fn, *args, mesh: Mesh | None = None):
    """User mistakes are caught before this point; anything JAX or XLA raises now is shardprop's fault and
    is reported as a :class:`LoweringError`, not as a raw traceback from deep inside the lowering.

    With ``mesh`` (the program's, Auto axes), ``fn`` runs with it as JAX's context mesh: a user calling under
    ``jax.set_mesh`` of a mesh with Explicit axes would otherwise have ``shard_map`` refuse our mesh."""
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
        raise LoweringError(
            f"compiling or running the sharded program failed: {type(err).__name__}: {err}\n"
            "(this is a shardprop bug: please report it with the function and in_specs)") from err


@gc_paused
def lower(plan: Plan, mesh: Mesh | None = None) -> Program:
    """Lower a split plan to a callable :class:`Program` on ``mesh`` (default: the mesh it was propagated on)."""
    mesh = plan.sharded.mesh if mesh is None else mesh
    if dict(mesh.shape) != plan.mesh_shape:
        raise MeshError(
            f"the plan was propagated on mesh {plan.mesh_shape}, it cannot be lowered on {dict(mesh.shape)}")
    return Program(plan, mesh)
