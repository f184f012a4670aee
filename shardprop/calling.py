"""``jax.jit``'s calling conventions for autoshard functions: keyword arguments and static arguments.

A call ``fs(*args, **kwargs)`` splits into its *static* part (``static_argnums`` / ``static_argnames``:
hashable Python values the trace depends on — one program per value, as ``jax.jit`` retraces) and its
*dynamic* part, the program's arguments. A call with neither keywords nor static arguments is traced as it is
(the program takes ``*args``); otherwise the program is traced on ``(dynamic positional tuple, dynamic keyword
dict)`` and the Program remembers the static values it was traced with. Keyword arguments are unannotated: they
adopt the sharding they meet.

>>> Convention.of(static_argnums=1).split((x, 3), {"scale": 2.0}).statics      # doctest: +SKIP
(('argument 1', 3),)
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import jax

from .core.layouts import layout_from_spec
from .expr import jax_adapter as jx
from .expr.graph import short_source
from .errors import InputMismatchError, OptionError, SpecTreeError, abridged



@dataclass(frozen=True)
class Call:
    """One call, split: the dynamic positional ``args`` and keyword ``kwargs``, and the static values
    (``(where, value)`` pairs, positions first) with the positions they came from."""

    args: tuple
    kwargs: dict = field(default_factory=dict)
    statics: tuple = ()
    positions: tuple[int, ...] = ()
    names: tuple[str, ...] = ()
    donated_positions: tuple[int, ...] = ()   # as called (static ones are never donated)
    donated_names: tuple[str, ...] = ()

    @property
    def plain(self) -> bool:
        """No keywords and no static arguments: the program takes the positional arguments as they are."""
        return not self.kwargs and not self.statics

    def program_args(self) -> tuple:
        """What the program is traced on and called with."""
        return self.args if self.plain else (self.args, self.kwargs)

    def donated_leaves(self) -> tuple[int, ...]:
        """The program's argument leaves (flat, in ``program_args`` order) that the call donates."""
        if not self.donated_positions and not self.donated_names:
            return ()
        dynamic = [i for i in range(len(self.args) + len(self.positions)) if i not in self.positions]
        flags = tuple(jax.tree_util.tree_map(lambda _, d=(i in self.donated_positions): d, a)
                      for i, a in zip(dynamic, self.args, strict=True))
        if not self.plain:
            flags = (flags, {k: jax.tree_util.tree_map(lambda _, d=(k in self.donated_names): d, v)
                             for k, v in self.kwargs.items()})
        return tuple(k for k, donated in enumerate(jax.tree_util.tree_leaves(flags)) if donated)

    def argument_names(self, fun, args: tuple, kwargs: dict) -> tuple[str, ...] | None:
        """The names ``jax.jit`` gives this call's dynamic argument leaves (``params['w']``), in the order the
        program takes them (``args`` and ``kwargs`` as called: the static ones are left out)."""
        return jx.argument_names(fun, args, kwargs, static_argnums=self.positions, static_argnames=self.names)

    def bind(self, f):
        """``f`` as the program sees it: a function of the dynamic arguments (``program_args`` form)."""
        if self.plain:
            return f
        static_args = {int(where.split()[1]): value for where, value in self.statics if where.startswith("argument")}
        static_kwargs = {where.split()[1]: value for where, value in self.statics if where.startswith("keyword")}

        def bound(args, kwargs):
            full = list(args)
            for position in sorted(static_args):
                full.insert(position, static_args[position])
            return f(*full, **kwargs, **static_kwargs)

        for attr in ("__name__", "__qualname__", "__module__", "__doc__"):
            if hasattr(f, attr):
                setattr(bound, attr, getattr(f, attr))
        return bound

    def in_specs(self, in_specs: Any, count: int) -> Any:
        """``in_specs`` (a prefix of the positional arguments as called, or of the dynamic ones) for the
        program's arguments; keyword arguments are unannotated."""
        if self.plain:
            return in_specs
        if isinstance(in_specs, tuple | list):
            specs = list(in_specs)
            if len(specs) >= count:  # one per parameter as called (those passed by keyword after them: None)
                if any(s is not None for s in specs[count:]):
                    raise SpecTreeError(
                        f"in_specs {in_specs!r} annotates {len(specs)} positional argument(s), but the call at "
                        f"{call_site()} passes {count} positionally and the others by keyword: keyword "
                        "arguments are unannotated (as jax.jit's in_shardings cover positional arguments only); "
                        "pass the annotated ones positionally")
                specs = [s for i, s in enumerate(specs[:count]) if i not in self.positions]
            in_specs = tuple(specs)
        return in_specs, None


def constrain_outputs(f, out_specs: Any, mesh):
    """``f`` with each output pinned to its ``out_specs`` entry (a pytree prefix of the outputs: a
    ``PartitionSpec``, or None to leave it free) by a sharding constraint — so ``out_specs`` propagates backwards
    as any constraint does, and the outputs come back laid out exactly so."""
    if out_specs is None:
        return f
    from jax.sharding import PartitionSpec

    is_leaf = lambda x: x is None or isinstance(x, PartitionSpec)  # noqa: E731

    def constrained(*args, **kwargs):
        outs = f(*args, **kwargs)
        leaves, tree = jax.tree_util.tree_flatten(outs)
        spec_leaves, spec_tree = jax.tree_util.tree_flatten(out_specs, is_leaf=is_leaf)
        try:
            subtrees = spec_tree.flatten_up_to(jax.tree_util.tree_unflatten(tree, [0] * len(leaves)))
        except (ValueError, TypeError) as err:
            raise SpecTreeError(f"out_specs {abridged(repr(out_specs))} is not a pytree prefix of the outputs "
                                f"(structure {abridged(tree)}) of the call at {call_site()}: {abridged(err)}") from None
        specs = []
        for spec, sub in zip(spec_leaves, subtrees, strict=True):
            if not is_leaf(spec):
                raise SpecTreeError(f"out_specs leaf {spec!r} (call at {call_site()}) is neither a "
                                    "PartitionSpec nor None")
            specs += [spec] * len(jax.tree_util.tree_leaves(sub))
        return jax.tree_util.tree_unflatten(tree, _pinned(leaves, specs, mesh))

    for attr in ("__name__", "__qualname__", "__module__", "__doc__"):
        if hasattr(f, attr):
            setattr(constrained, attr, getattr(f, attr))
    return constrained


def pin_outputs(f, specs: dict[int, Any], mesh):
    """``f`` with its flat output ``k`` pinned to ``specs[k]`` by a sharding constraint (the others free): the
    function a program's derivative programs trace, where the program returns an updated state in its argument's
    layout (``compile_program``'s ``returns_inputs``; the program's own graph is pinned without tracing again:
    ``shardprop.expr.with_pinned_outputs``)."""
    def pinned(*args, **kwargs):
        leaves, tree = jax.tree_util.tree_flatten(f(*args, **kwargs))
        return jax.tree_util.tree_unflatten(tree, _pinned(leaves, [specs.get(k) for k in range(len(leaves))], mesh))

    for attr in ("__name__", "__qualname__", "__module__", "__doc__"):
        if hasattr(f, attr):
            setattr(pinned, attr, getattr(f, attr))
    return pinned


def _pinned(leaves: list, specs: list, mesh) -> list:
    """Each leaf under a sharding constraint to its spec (None: as it is)."""
    from jax.sharding import NamedSharding

    pinned = []
    for k, (x, spec) in enumerate(zip(leaves, specs, strict=True)):
        if spec is not None:
            where = f"out_specs for output {k} (call at {call_site()})"
            layout_from_spec(spec, tuple(jax.numpy.shape(x)), dict(mesh.shape), where)
            x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))
        pinned.append(x)
    return pinned


@dataclass(frozen=True)
class Convention:
    """Which arguments are static and which donated: positions (negative ones count from the end) and keyword
    names. ``parameters`` names the function's parameters that can be passed either way, by position (None
    where one cannot), so a position and a name stand for each other, as under ``jax.jit``."""

    static_argnums: tuple[int, ...] = ()
    static_argnames: tuple[str, ...] = ()
    donate_argnums: tuple[int, ...] = ()
    donate_argnames: tuple[str, ...] = ()
    parameters: tuple[str | None, ...] = ()

    @classmethod
    def of(cls, static_argnums: int | Iterable[int] = (), static_argnames: str | Iterable[str] = (),
           donate_argnums: int | Iterable[int] = (), donate_argnames: str | Iterable[str] = (),
           fun=None) -> Convention:
        """The convention (``fun`` gives the signature: ``static_argnames="n"`` then also makes ``n`` static when
        passed positionally, and ``static_argnums=1`` when the second parameter is passed by keyword)."""
        convention = cls(_positions("static_argnums", static_argnums), _names("static_argnames", static_argnames),
                         _positions("donate_argnums", donate_argnums), _names("donate_argnames", donate_argnames),
                         _parameters(fun))
        for name in set(convention.names(static=True)) & set(convention.names(static=False)):
            raise OptionError(f"argument {name!r} is both static and donated (at {call_site()}): a static "
                              "argument is not an array")
        known = _keyword_names(fun)
        for option, names in (("static_argnames", convention.static_argnames),
                              ("donate_argnames", convention.donate_argnames)):
            for name in names:
                if known is not None and name not in known:
                    raise OptionError(f"{option} names {name!r} (at {call_site()}), but "
                                      f"{getattr(fun, '__name__', 'the function')} has no such parameter; its "
                                      f"parameters: {', '.join(sorted(known)) or 'none'}")
        return convention

    def names(self, *, static: bool) -> tuple[str, ...]:
        """The keyword names that are static (donated): named, or a named parameter's position."""
        names, nums = ((self.static_argnames, self.static_argnums) if static
                       else (self.donate_argnames, self.donate_argnums))
        count = len(self.parameters)
        by_position = (self.parameters[n] for n in nums if -count <= n < count)
        return tuple(dict.fromkeys([*names, *(name for name in by_position if name)]))

    def resolve(self, *, static: bool, count: int) -> list[int]:
        """The positions of a call with ``count`` positional arguments that are static (donated). A position
        past the call is fine where it names a parameter (passed by keyword, or left to its default)."""
        option, nums = ("static_argnums", self.static_argnums) if static else ("donate_argnums", self.donate_argnums)
        for n in nums:
            if not -count <= n < count and not (0 <= n < len(self.parameters) and self.parameters[n]):
                raise OptionError(f"{option} has {n}, but the call at {call_site()} has {count} positional "
                                  "argument(s)")
        names = self.names(static=static)
        named = (i for i, name in enumerate(self.parameters[:count]) if name and name in names)
        return sorted({n % count for n in nums if -count <= n < count} | set(named))

    def split(self, args: tuple, kwargs: dict) -> Call:
        """``args``/``kwargs`` of one call split into dynamic and static parts (a static value must be hashable:
        it keys the cache of programs, as in ``jax.jit``)."""
        count = len(args)
        positions, donated = self.resolve(static=True, count=count), self.resolve(static=False, count=count)
        for n in set(positions) & set(donated):
            raise OptionError(f"argument {n} is both static and donated (static_argnums and donate_argnums) at "
                              f"{call_site()}: a static argument is not an array")
        static_names = self.names(static=True)
        statics = [(f"argument {i}", args[i]) for i in positions]
        statics += [(f"keyword {name}", kwargs[name]) for name in static_names if name in kwargs]
        for where, value in statics:
            try:
                hash(value)
            except TypeError as err:
                raise OptionError(f"static {where} = {value!r} at {call_site()} is not hashable ({err}); a "
                                  "static argument keys the programs traced, as in jax.jit: pass a tuple instead of "
                                  "a list, or make it a dynamic (array) argument") from None
        dynamic = tuple(a for i, a in enumerate(args) if i not in positions)
        dynamic_kwargs = {k: v for k, v in kwargs.items() if k not in static_names}
        return Call(dynamic, dynamic_kwargs, tuple(statics), tuple(positions), static_names,
                    tuple(donated), self.names(static=False))


def _positions(option: str, value) -> tuple[int, ...]:
    nums = (value,) if isinstance(value, numbers.Integral) else tuple(value)
    for n in nums:
        if isinstance(n, bool) or not isinstance(n, numbers.Integral):
            raise OptionError(f"{option}={value!r}: expected argument positions (ints)")
    return tuple(int(n) for n in nums)


def _names(option: str, value) -> tuple[str, ...]:
    names = (value,) if isinstance(value, str) else tuple(value)
    for name in names:
        if not isinstance(name, str) or not name.isidentifier():
            raise OptionError(f"{option}={value!r}: expected argument names (strs)")
    return names


def _keyword_names(fun) -> set[str] | None:
    """The names ``fun`` accepts by keyword, or None when it accepts any (``**kwargs``) or has no signature."""
    import inspect

    try:
        parameters = inspect.signature(fun).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None
    return {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def _parameters(fun) -> tuple[str | None, ...]:
    """``fun``'s positional parameters by position: the name of each that can also be passed by keyword."""
    import inspect

    try:
        parameters = inspect.signature(fun).parameters.values()
    except (TypeError, ValueError):  # no signature (a builtin, some callables): positions and names stay apart
        return ()
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return tuple(p.name if p.kind is p.POSITIONAL_OR_KEYWORD else None for p in positional)


@dataclass(frozen=True)
class Traced:
    """How a Program was traced: the convention and the static values, for calling it again."""

    convention: Convention
    statics: tuple

    def program_args(self, args: tuple, kwargs: dict) -> tuple:
        """The program's arguments for a call ``(*args, **kwargs)`` (its static values must be the traced ones)."""
        call = self.convention.split(args, kwargs)
        if call.statics != self.statics:
            raise InputMismatchError(
                f"this Program was traced with static values {dict(self.statics)}, called with {dict(call.statics)}"
                " (call the autoshard function, which traces one program per static value)")
        return (call.args, call.kwargs)


def call_site() -> str:
    """``file.py:12``: the user's line calling in now, as messages name lines."""
    return short_source(jx.user_call_site(), "an unknown line")
