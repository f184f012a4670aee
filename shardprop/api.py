"""``autoshard``: the four passes behind one decorator-like call.

    fs = autoshard(f, mesh=mesh, in_specs=(P("i", "j"), None))
    fs(a, b)                 # == f(a, b), a jax.Array sharded on the mesh
    prog = fs.trace(a, b)    # the Program: prog.graph, prog.stages, prog.lower(a, b)
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.sharding import Mesh, PartitionSpec

from .choosing import chosen_plan, planned, with_pins
from .calling import Convention, Traced, call_site, constrain_outputs, pin_outputs
from .derivatives import derivatives_for
from .errors import LoweringError, MemoryLimitError, ReshardWarning, ShardingError
from .expr import jax_adapter as jx
from .expr import trace
from .mesh import as_auto_mesh
from .program import Program, lower
from .propagation.propagate import flat_in_specs, flat_specs_of_tree
from .search import AUTO, check_memory_limit, is_spec_leaf
from .search.solve import as_tree
from .signature import Signature, call_key
from .spellings import (as_specs, context_mesh, leaves_some_unannotated, one_of, own_specs, placements,
                        program_mesh, same_spec)
from .core.transfers import total_moved
from .splitting.cost import estimate
from .stateful import (declared_specs, object_spec_trees, returned_out_specs, returning_state, state_leaves,
                       stateful_positions, write_back)


def compile_program(f: Callable, args: tuple, *, mesh: Mesh, in_specs: Any, strict: bool = False,
                    strategy: str = "auto", conflicts: str = "reshard", traced: Traced | None = None,
                    donated: Sequence[int] = (), memory_limit: int | float | None = None,
                    names: Sequence[str] | None = None, returns_inputs: Sequence[int] = (),
                    mirror_state: bool = True) -> Program:
    """``trace → (search) → propagate → split → lower`` for one set of argument shapes (arrays, ShapeDtypeStructs or
    tracers). ``sp.AUTO`` entries of ``in_specs`` are chosen by the layout search (``shardprop.search``) within
    ``memory_limit`` bytes per device; without any, a plan over the limit is a ``shardprop.MemoryLimitError``.
    An unannotated (None) argument that is an array laid out on the mesh keeps its layout, as under ``jax.jit``
    (``spellings.own_specs``); ``NamedSharding`` leaves of ``in_specs`` are read as their specs. ``names`` are the
    argument leaves' names (``params['w']``; default: as ``jax.jit`` names ``f``'s).
    The Program differentiates as ``f`` does (its custom derivative rules: a derivative program is compiled by
    this same pipeline); ``traced`` and ``donated`` are the calling convention it was traced with and the argument
    leaves it donates (see ``Program``). ``returns_inputs`` says that the last outputs are the argument leaves
    at those flat positions after the call (an NNX object's state): each comes back in its argument's layout, so
    the next call, fed them, runs the same program; so does, where the search chooses layouts, an output mirroring
    an argument unless ``mirror_state`` is False (``.search.space.state_pairs``)."""
    limit = check_memory_limit(memory_limit)
    auto_mesh = as_auto_mesh(mesh)
    with jx.program_mesh_context(auto_mesh):  # the user's Explicit mesh would make constraints asserts
        graph = trace(f, *args, names=names)
    specs = ArgumentSpecs.resolve(graph, args, in_specs, mesh)
    # an updated state whose argument's layout is known comes back in it: the traced graph returns it constrained so
    known = _known_state(specs, len(graph.outputs), returns_inputs)
    graph = with_pins(graph, known, auto_mesh)
    plan, searched = chosen_plan(graph, specs, mesh=mesh, strict=strict, strategy=strategy, conflicts=conflicts,
                                  limit=limit, keyword_form=traced is not None, donated=donated,
                                  returns_inputs=returns_inputs, mirror_state=mirror_state)
    # one whose argument's layout propagation or the search decided, computed in another: pinned, and planned again
    moved = _moved_state(plan.sharded, len(graph.outputs), returns_inputs)
    if moved:
        graph = with_pins(graph, moved, auto_mesh)
        with warnings.catch_warnings():  # its moves are this rule's, not a clash of the user's layouts
            warnings.simplefilter("ignore", ReshardWarning)
            plan = planned(graph, specs.pinned(graph, plan.sharded, returns_inputs), mesh=mesh, strict=strict,
                            strategy=strategy, conflicts=conflicts)
        if searched is not None:  # say what it moves beyond the search's plan (which priced the returns it expected)
            extra = total_moved(estimate(plan)) - searched.chosen.moved
            searched = dataclasses.replace(searched, returned_moves=max(0.0, extra))
    compile_derivative = functools.partial(autoshard, mesh=mesh, strategy=strategy, conflicts=conflicts,
                                           mirror_state=mirror_state)
    if specs.searched:  # a derivative program starts from the layouts the search chose: its moves are priced too
        compile_derivative = _without_reshard_warnings(compile_derivative)
    # (a derivative program traces f again: with the state pinned as the program returns it)
    pins = known | moved
    differentiated = pin_outputs(f, pins, auto_mesh) if pins else f
    derivatives = derivatives_for(graph, differentiated, plan.sharded.in_specs, compile=compile_derivative)
    checked = searched.checked if searched is not None else None  # the memory check's program, where it compiled one
    program = lower(plan, mesh, derivatives=derivatives, traced=traced, donated=donated, search=searched,
                    kept=specs.kept, declared=specs.declared,
                    runs_as=checked if checked is not None and checked.plan is plan else None)
    if limit is not None and searched is None and (memory := program.memory()) > limit:
        raise MemoryLimitError(f"the program needs {memory:,} B per device as compiled (arguments, outputs and "
                               f"temporaries), over memory_limit={limit:,}; shard more of the arguments, or pass "
                               "sp.AUTO for those whose layout the search may choose")
    return program


def _known_state(specs: ArgumentSpecs, outputs: int, returns_inputs: Sequence[int]) -> dict[int, PartitionSpec]:
    """``{output: spec}`` for each returned state (the last outputs) whose argument's layout is known before
    propagation (a spec the user wrote, an array's own, a Variable's declared one): the layout it is returned in."""
    return {k: specs.flat[j] for k, j in _state_outputs(outputs, returns_inputs)
            if isinstance(specs.flat[j], PartitionSpec)}


def _moved_state(sharded, outputs: int, returns_inputs: Sequence[int]) -> dict[int, Any]:
    """``{output: spec}`` for each returned state (the last outputs, the argument leaves ``returns_inputs`` after the
    call) that propagation lays out otherwise than its argument: the spec it must be returned in."""
    return {k: sharded.in_specs[j] for k, j in _state_outputs(outputs, returns_inputs)
            if not same_spec(sharded.out_specs[k], sharded.in_specs[j])}


def _state_outputs(outputs: int, returns_inputs: Sequence[int]) -> list[tuple[int, int]]:
    """``(output, argument leaf)`` per returned state: the last outputs are the leaves ``returns_inputs`` updated."""
    base = outputs - len(returns_inputs)
    return [(base + i, j) for i, j in enumerate(returns_inputs)]


@dataclasses.dataclass(frozen=True)
class ArgumentSpecs:
    """Every argument leaf's spec as the program takes it (``flat``): the user's, an unannotated leaf's own array
    layout on the mesh (its position in ``kept``, as ``jax.jit`` keeps it), its NNX Variable's declared sharding
    (``declared``), or ``sp.AUTO`` for the search (replaced by its choice in a pinned rebuild)."""

    flat: tuple
    kept: frozenset[int]
    declared: frozenset[int]

    @staticmethod
    def resolve(graph, args: tuple, in_specs: Any, mesh: Mesh) -> ArgumentSpecs:
        """The specs of ``args``' leaves, from ``in_specs`` (a tree, NamedShardings read as their specs), the arrays'
        own layouts and the NNX metadata."""
        flat = flat_in_specs(as_specs(in_specs, mesh, "in_specs"), graph, is_leaf=is_spec_leaf)
        leaves = jax.tree_util.tree_leaves(args)
        own, said = own_specs(leaves, mesh), declared_specs(args, leaves)
        kept = frozenset(k for k, (spec, mine) in enumerate(zip(flat, own, strict=True))
                         if spec is None and mine is not None)  # unannotated, its array laid out on the mesh
        declared = frozenset(k for k, (spec, spec_said) in enumerate(zip(flat, said, strict=True))
                             if k not in kept and spec is None and spec_said is not None)  # its metadata says
        flat = [own[k] if k in kept else said[k] if k in declared else spec for k, spec in enumerate(flat)]
        return ArgumentSpecs(tuple(flat), kept, declared)

    @property
    def searched(self) -> bool:
        """Whether some leaf's layout is the search's to choose (``sp.AUTO``)."""
        return any(s is AUTO for s in self.flat)

    def tree(self, graph, flat: Sequence | None = None) -> Any:
        """The specs (or ``flat``) as an ``in_specs`` tree shaped like the arguments."""
        return as_tree(graph, list(self.flat if flat is None else flat))

    def pinned(self, graph, sharded, returns_inputs: Sequence[int]) -> Any:
        """The specs of a plan whose returned state is pinned to its arguments' layouts: the leaves whose state is
        returned take the layout ``sharded`` gave them, and so do the searched ones (the search's choice), the kept
        and declared ones are left to say theirs again."""
        return self.tree(graph, [None if k in self.kept | self.declared else sharded.in_specs[k]
                                 if (k in returns_inputs and s is None) or s is AUTO else s
                                 for k, s in enumerate(self.flat)])


def _without_reshard_warnings(compile_derivative: Callable) -> Callable:
    """``compile_derivative`` whose programs say nothing of the moves between the layouts they start from."""
    def compile(fn, **options):
        sharded = compile_derivative(fn, **options)

        def call(*args, **kwargs):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ReshardWarning)
                return sharded(*args, **kwargs)

        return call

    return compile


def said_at_call(err: ShardingError) -> ShardingError:
    """``err`` ending with the user's call line (once), and without shardprop's frames below the call: what the
    user can act on. Its type and attributes stay (``except ShardingConflictError as e: e.op``)."""
    if isinstance(err, LoweringError):  # our bug, not the user's: its frames are what we need to fix it
        return err
    if "(call at " not in str(err):
        message = err.args[0] if err.args else ""
        err.args = (f"{message} (call at {call_site()})", *err.args[1:])
    return err.with_traceback(None)


class AutoSharded:
    """``f`` sharded automatically on ``mesh``; one ``Program`` per argument structure, shapes, dtypes, weak
    types and static values. Called as ``jax.jit`` functions are: keyword arguments (unannotated: they adopt the
    sharding they meet) and ``static_argnums`` / ``static_argnames`` (hashable values the trace depends on).

    A call finds its program by its static values and signature, as ``jax.jit``'s cache does (a cheap key of the
    dynamic arguments' structure, shapes, dtypes and weak types; the first call of a signature traces and compiles
    it), and goes into that program's own ``jax.jit`` (``dispatch.py``): a call costs what a ``jax.jit`` call
    costs, alternating signatures or not."""

    def __init__(self, f: Callable, *, mesh: Mesh | None, in_specs: Any, strict: bool = False,
                 strategy: str = "auto", static_argnums: int | Sequence[int] = (),
                 static_argnames: str | Sequence[str] = (), out_specs: Any = None, conflicts: str = "reshard",
                 donate_argnums: int | Sequence[int] = (), donate_argnames: str | Sequence[str] = (),
                 memory_limit: int | float | None = None, mirror_state: bool = True):
        self.f, self.mesh, self.in_specs, self.strict, self.strategy = f, mesh, in_specs, strict, strategy
        self.mirror_state = mirror_state
        self.memory_limit = check_memory_limit(memory_limit)
        self.out_specs, self.conflicts = out_specs, conflicts
        self.convention = Convention.of(static_argnums, static_argnames, donate_argnums, donate_argnames, fun=f)
        self._programs: dict[tuple, Program] = {}  # by mesh, static values, Signature and the arrays' own layouts
        self._seen: dict[tuple, Program] = {}  # by static values and call_key: the programs of calls seen
        self._statics = bool(self.convention.static_argnums or self.convention.static_argnames)
        self._adopts = leaves_some_unannotated(in_specs)  # an unannotated argument keeps its array's layout
        self._options = dict(mesh=mesh, in_specs=in_specs, strict=strict, strategy=strategy,
                             static_argnums=static_argnums, static_argnames=static_argnames, conflicts=conflicts,
                             donate_argnums=donate_argnums, donate_argnames=donate_argnames,
                             memory_limit=memory_limit, mirror_state=mirror_state)
        self._returning_state: dict[tuple[int, ...], AutoSharded] = {}  # by the positions of NNX objects
        self._writes_back = True  # NNX arguments updated in place (not by the inner function that returns them)
        self._returns_state_of: tuple[int, ...] = ()  # (the inner function) the positions whose state it returns
        functools.update_wrapper(self, f)

    def _with_state(self, positions: tuple[int, ...]) -> AutoSharded:
        """This function returning the state of its NNX arguments at ``positions`` too (``stateful.py``)."""
        inner = self._returning_state.get(positions)
        if inner is None:
            inner = AutoSharded(returning_state(self.f, positions), out_specs=returned_out_specs(self.out_specs),
                                **self._options)
            inner._writes_back = False
            inner._returns_state_of = positions
            self._returning_state[positions] = inner
        return inner

    def trace(self, *args, **kwargs) -> Program:
        """The compiled plan for these arguments (arrays or ShapeDtypeStructs), for inspection. With NNX objects
        among them, the program also returns their state after the call (what ``__call__`` writes back)."""
        positions = stateful_positions(args) if self._writes_back else ()
        if positions:
            return self._with_state(positions).trace(*args, **kwargs)
        call = self.convention.split(args, kwargs)
        program_args = call.program_args()
        try:
            mesh = program_mesh(self.mesh, self.in_specs, self.out_specs)
            in_specs = as_specs(call.in_specs(object_spec_trees(args, self.in_specs), len(args)), mesh, "in_specs")
            out_specs = as_specs(self.out_specs, mesh, "out_specs")
            leaves, tree = jax.tree_util.tree_flatten(program_args)
            flat = flat_specs_of_tree(in_specs, tree, is_leaf=is_spec_leaf)
        except ShardingError as err:  # the user's options against this call: say which call
            raise said_at_call(err) from None
        own = tuple(None if spec is not None else mine if mine is not None else said for spec, mine, said
                    in zip(flat, own_specs(leaves, mesh), declared_specs(program_args, leaves), strict=True))
        like = (mesh if self.mesh is None else None, call.statics, Signature.of(program_args))
        program = self._programs.get((*like, own)) or self._agreeing(like, own)
        if program is None:
            f = constrain_outputs(self.f, out_specs, as_auto_mesh(mesh))
            try:
                program = compile_program(call.bind(f), program_args, mesh=mesh, in_specs=in_specs,
                                          strict=self.strict, strategy=self.strategy, conflicts=self.conflicts,
                                          traced=None if call.plain else Traced(self.convention, call.statics),
                                          donated=call.donated_leaves(), memory_limit=self.memory_limit,
                                          names=call.argument_names(self.f, args, kwargs),
                                          returns_inputs=state_leaves(args, self._returns_state_of, leaves),
                                          mirror_state=self.mirror_state)
            except ShardingError as err:  # the user's mistake (never LoweringError, ours): said at their call
                raise said_at_call(err) from None
        self._programs[(*like, own)] = program
        return program

    def _agreeing(self, like: tuple, own: tuple) -> Program | None:
        """A program already built for this mesh, static values and signature whose inputs are laid out as the
        call's arrays are, wherever they have a layout of their own (a host value fits any): a training step
        called on fresh arrays and then on its own outputs compiles once."""
        for (*other, _), program in self._programs.items():
            if tuple(other) == like and all(mine is None or same_spec(mine, spec) for mine, spec
                                            in zip(own, program.sharded.in_specs, strict=True)):
                return program
        return None

    def __call__(self, *args, **kwargs):
        """``f(*args, **kwargs)``, sharded: the program of this call's static values and signature (traced and
        compiled the first time it is seen), on the call's dynamic arguments. NNX objects among the arguments are
        updated in place, as under ``nnx.jit``."""
        positions = stateful_positions(args) if self._writes_back else ()
        if positions:
            out, states = self._with_state(positions)(*args, **kwargs)
            write_back(args, positions, states)
            return out
        statics, program_args = (), args
        if kwargs or self._statics:  # split off the static values (checking the options against the call)
            call = self.convention.split(args, kwargs)
            statics, program_args = call.statics, call.program_args()
        leaves, tree = jax.tree_util.tree_flatten(program_args)
        key = call_key(tree, leaves)
        if key is not None and (self._adopts or kwargs):  # the layouts an unannotated argument would keep
            key = (key, placements(leaves))
        if key is not None and self.mesh is None:
            key = (key, context_mesh())
        program = None if key is None else self._seen.get((statics, key))
        if program is None:
            program = self.trace(*args, **kwargs)
            if key is not None:
                self._seen[statics, key] = program
        return program.call_flat(leaves)

    def lower(self, *args, **kwargs):
        """``jax.stages.Lowered`` of the program for these arguments."""
        return self.trace(*args, **kwargs).lower(*args, **kwargs)

    def __repr__(self) -> str:
        name = getattr(self.f, "__qualname__", None) or getattr(self.f, "__name__", None) or repr(self.f)
        programs = [*self._programs.values(), *(p for inner in self._returning_state.values()
                                                 for p in inner._programs.values())]
        traced = len({id(p) for p in programs})
        mesh = ("the mesh of jax.set_mesh or of its NamedShardings" if self.mesh is None
                else f"mesh {dict(self.mesh.shape)}")
        return (f"<autoshard {name} on {mesh}, in_specs={self.in_specs!r}, "
                f"strategy={self.strategy!r}; {traced} program{'' if traced == 1 else 's'} traced>")


def autoshard(f: Callable | None = None, *, mesh: Mesh | None = None, in_specs: Any = None,
              strict: bool = False, strategy: str = "auto", static_argnums: int | Sequence[int] = (),
              static_argnames: str | Sequence[str] = (), out_specs: Any = None, conflicts: str = "reshard",
              donate_argnums: int | Sequence[int] = (), donate_argnames: str | Sequence[str] = (),
              memory_limit: int | float | None = None, in_shardings: Any = None,
              out_shardings: Any = None, mirror_state: bool = True) -> AutoSharded | Callable[[Callable], AutoSharded]:
    """Shard ``f`` automatically on ``mesh``.

    ``in_specs`` is a pytree prefix of the arguments, as in ``shard_map``: a ``PartitionSpec`` per argument
    (``P()`` replicates), ``None`` for an unannotated argument, which keeps the layout of an array already laid
    out on the mesh (as ``jax.jit`` does) and otherwise adopts the sharding it meets, or ``sp.AUTO``
    for an argument whose layout the search chooses: the one that makes the cheapest plan (bytes moved and work, as
    the cost model prices the whole program) within ``memory_limit`` bytes per device (arguments, outputs and
    temporaries; none: no limit). Arguments shaped like a parameter further down its path (an optimizer's moments)
    are decided with it; ``prog.in_specs`` holds the choice, ``sp.explain(prog, "argument path")`` its reasons. An
    output mirroring an argument (its shape and dtype, in order: a step's new parameters, optimizer state or KV
    cache) comes back in that argument's layout, so that the next call, fed it, compiles nothing;
    ``mirror_state=False`` lets the search lay such outputs out as it finds cheapest.
    ``jax.jit``'s spellings work too: ``in_shardings=``/``out_shardings=`` for ``in_specs``/``out_specs``,
    ``NamedSharding`` leaves for specs, and without ``mesh=`` the mesh set by ``jax.set_mesh`` (or the one of the
    ``NamedSharding`` leaves). Called without ``f``, ``autoshard(mesh=..., in_specs=...)`` is a decorator.
    ``strict=True`` turns the conservative fallback for primitives without a rule into ``NoRuleError``.
    ``strategy`` is ``"gather"`` (the Nx design: cut and gather at every reduction over a sharded axis),
    ``"collective"`` (finish sums, maxima, minima and contractions with ``psum``/``pmax``/``pmin`` inside
    the stage), ``"auto"`` (the default: per node, whichever the cost model says moves fewer bytes) or
    ``"optimal"`` (every value's layout chosen by the search's one solve around the specs given — where layouts
    change, not only what each op does with those it meets — proved optimal by the cost model, as ``sp.AUTO``'s).
    ``static_argnums`` / ``static_argnames`` are as in ``jax.jit`` (``in_specs`` then covers the positional
    arguments as called, or only the dynamic ones); keyword arguments are accepted and unannotated.
    ``out_specs`` (a pytree prefix of the outputs: ``PartitionSpec`` or None) pins the outputs' layouts, as a
    sharding constraint on each does: it propagates backwards, and the outputs come back laid out so.
    ``donate_argnums`` / ``donate_argnames`` are as in ``jax.jit``: those arguments' buffers may be reused for
    the outputs, and a donated array is invalid after the call.
    ``conflicts="reshard"`` (the default) resolves two incompatibly sharded operands by moving the one cheaper
    to move, with a ``ReshardWarning``; ``"error"`` (and ``strict=True``) raises ``ShardingConflictError``.

    Examples:
        >>> mesh = sp.make_mesh((8,), ("i",))
        >>> fs = sp.autoshard(lambda a, b: a + b, mesh=mesh, in_specs=(P("i"), None))
        >>> fs(jnp.ones(16), jnp.ones(16)).sharding.spec == P("i")
        True

        As a decorator, with ``jax.jit``'s spelling (the mesh is the ``NamedSharding``'s):

        >>> from jax.sharding import NamedSharding
        >>> @sp.autoshard(in_shardings=NamedSharding(mesh, P("i")))
        ... def double(x):
        ...     return 2 * x
        >>> double(jnp.arange(8.0))
        Array([ 0.,  2.,  4.,  6.,  8., 10., 12., 14.], dtype=float32)
    """
    options = dict(mesh=mesh, in_specs=one_of(in_specs, in_shardings, "in_specs"), strict=strict,
                   strategy=strategy, static_argnums=static_argnums, static_argnames=static_argnames,
                   out_specs=one_of(out_specs, out_shardings, "out_specs"), conflicts=conflicts,
                   donate_argnums=donate_argnums, donate_argnames=donate_argnames, memory_limit=memory_limit,
                   mirror_state=mirror_state)
    if f is None:
        return lambda fun: AutoSharded(fun, **options)
    return AutoSharded(f, **options)
