"""``autoshard``: the four passes behind one decorator-like call.

    fs = autoshard(f, mesh=mesh, in_specs=(P("i", "j"), None))
    fs(a, b)                 # == f(a, b), a jax.Array sharded on the mesh
    prog = fs.trace(a, b)    # the Program: prog.graph, prog.stages, prog.lower(a, b)
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from jax.sharding import Mesh

from .calling import Convention, Traced, constrain_outputs, user_call_site
from .errors import SpecError
from .derivatives import derivatives_for
from .expr import jax_adapter as jx
from .expr import trace
from .mesh import as_auto_mesh
from .expr.trace import abstractify
from .program import HotPathMiss, Program, lower
from .propagation import propagate
from .splitting import split


def compile_program(f: Callable, args: tuple, *, mesh: Mesh, in_specs: Any, strict: bool = False,
                    strategy: str = "auto", conflicts: str = "reshard") -> Program:
    """``trace → propagate → split → lower`` for one set of argument shapes."""
    with jx.program_mesh_context(as_auto_mesh(mesh)):  # the user's Explicit mesh would make constraints asserts
        graph = trace(f, *args)
    sharded = propagate(graph, in_specs, mesh=mesh, strict=strict, conflicts=conflicts)
    plan = split(sharded, strategy=strategy)
    program = lower(plan, mesh)
    program.derivatives = derivatives_for(graph, f, sharded.in_specs, mesh=mesh, strategy=strategy,
                                          conflicts=conflicts)
    return program


class AutoSharded:
    """``f`` sharded automatically on ``mesh``; one :class:`Program` per argument structure, shapes, dtypes and
    static values. Called as ``jax.jit`` functions are: keyword arguments (unannotated: they adopt the sharding
    they meet) and ``static_argnums`` / ``static_argnames`` (hashable values the trace depends on)."""

    def __init__(self, f: Callable, *, mesh: Mesh, in_specs: Any, strict: bool = False, strategy: str = "auto",
                 static_argnums: int | Sequence[int] = (), static_argnames: str | Sequence[str] = (),
                 out_specs: Any = None, conflicts: str = "reshard", donate_argnums: int | Sequence[int] = (),
                 donate_argnames: str | Sequence[str] = ()):
        self.f, self.mesh, self.in_specs, self.strict, self.strategy = f, mesh, in_specs, strict, strategy
        self.out_specs, self.conflicts = out_specs, conflicts
        self.convention = Convention.of(static_argnums, static_argnames, donate_argnums, donate_argnames, fun=f)
        self._programs: dict[Any, Program] = {}
        self._last: Program | None = None  # the program of the last call: the next is most likely the same
        functools.update_wrapper(self, f)

    def trace(self, *args, **kwargs) -> Program:
        """The compiled plan for these arguments (arrays or ShapeDtypeStructs), for inspection."""
        call = self.convention.split(args, kwargs)
        program_args = call.program_args()
        avals, tree = abstractify(program_args)
        key = (call.statics, tree, tuple((tuple(a.shape), str(a.dtype), a.weak_type) for a in avals))
        program = self._programs.get(key)
        if program is None:
            f = constrain_outputs(self.f, self.out_specs, as_auto_mesh(self.mesh))
            try:
                program = compile_program(call.bind(f), program_args, mesh=self.mesh,
                                          in_specs=call.in_specs(self.in_specs, len(args)), strict=self.strict,
                                          strategy=self.strategy, conflicts=self.conflicts)
            except SpecError as err:  # a bad in_specs: say which call (a constraint's error names its own line)
                if " at " in str(err):
                    raise
                raise type(err)(f"{err} (call at {user_call_site()})") from None
            if not call.plain:
                program.traced = Traced(self.convention, call.statics)
            program.donate(call.donated_leaves())
            self._programs[key] = program
        return program

    def __call__(self, *args, **kwargs):
        last = self._last
        if last is not None and not kwargs:  # the common case: called again as last time, straight into jax.jit
            try:
                return last.call_hot(args, weak_types=True)
            except HotPathMiss:
                pass
        program = self.trace(*args, **kwargs)
        self._last = program
        if not kwargs:  # the hot path's same variant as the calls after it: one compile, not one per variant
            try:
                return program.call_hot(args, weak_types=True)
            except HotPathMiss:
                pass
        return program.call_checked(args, kwargs)

    def lower(self, *args, **kwargs):
        """``jax.stages.Lowered`` of the program for these arguments."""
        return self.trace(*args, **kwargs).lower(*args, **kwargs)

    def __repr__(self) -> str:
        name = getattr(self.f, "__qualname__", None) or getattr(self.f, "__name__", None) or repr(self.f)
        traced = len(self._programs)
        return (f"<autoshard {name} on mesh {dict(self.mesh.shape)}, in_specs={self.in_specs!r}, "
                f"strategy={self.strategy!r}; {traced} program{'' if traced == 1 else 's'} traced>")


def autoshard(f: Callable, *, mesh: Mesh, in_specs: Any, strict: bool = False, strategy: str = "auto",
              static_argnums: int | Sequence[int] = (), static_argnames: str | Sequence[str] = (),
              out_specs: Any = None, conflicts: str = "reshard", donate_argnums: int | Sequence[int] = (),
              donate_argnames: str | Sequence[str] = ()) -> AutoSharded:
    """Shard ``f`` automatically on ``mesh``.

    ``in_specs`` is a pytree prefix of the arguments, as in ``shard_map``: a ``PartitionSpec`` per argument
    (``P()`` replicates) or ``None`` for an unannotated argument, which adopts the sharding it meets.
    ``strict=True`` turns the conservative fallback for primitives without a rule into ``NoRuleError``.
    ``strategy`` is ``"gather"`` (the Nx design: cut and gather at every reduction over a sharded axis),
    ``"collective"`` (finish sums, maxima, minima and contractions with ``psum``/``pmax``/``pmin`` inside
    the stage) or ``"auto"`` (the default: per node, whichever the cost model says moves fewer bytes).
    ``static_argnums`` / ``static_argnames`` are as in ``jax.jit`` (``in_specs`` then covers the positional
    arguments as called, or only the dynamic ones); keyword arguments are accepted and unannotated.
    ``out_specs`` (a pytree prefix of the outputs: ``PartitionSpec`` or None) pins the outputs' layouts, as a
    sharding constraint on each does: it propagates backwards, and the outputs come back laid out so.
    ``donate_argnums`` / ``donate_argnames`` are as in ``jax.jit``: those arguments' buffers may be reused for
    the outputs, and a donated array is invalid after the call.
    ``conflicts="reshard"`` (the default) resolves two incompatibly sharded operands by moving the one cheaper
    to move, with a ``ReshardWarning``; ``"error"`` (and ``strict=True``) raises ``ShardingConflictError``.

    >>> fs = autoshard(lambda a, b: a + b, mesh=make_mesh((8,), ("i",)), in_specs=(P("i"), None))
    >>> fs(jnp.ones(16), jnp.ones(16)).sharding.spec                                   # doctest: +SKIP
    PartitionSpec('i',)
    """
    return AutoSharded(f, mesh=mesh, in_specs=in_specs, strict=strict, strategy=strategy,
                       static_argnums=static_argnums, static_argnames=static_argnames, out_specs=out_specs,
                       conflicts=conflicts, donate_argnums=donate_argnums, donate_argnames=donate_argnames)
