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

from .errors import InputMismatchError, OptionError, SpecTreeError



@dataclass(frozen=True)
class Call:
    """One call, split: the dynamic positional ``args`` and keyword ``kwargs``, and the static values
    (``(where, value)`` pairs, positions first) with the positions they came from."""

    args: tuple
    kwargs: dict = field(default_factory=dict)
    statics: tuple = ()
    positions: tuple[int, ...] = ()
    names: tuple[str, ...] = ()

    @property
    def plain(self) -> bool:
        """No keywords and no static arguments: the program takes the positional arguments as they are."""
        return not self.kwargs and not self.statics

    def program_args(self) -> tuple:
        """What the program is traced on and called with."""
        return self.args if self.plain else (self.args, self.kwargs)

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
                        f"in_specs {in_specs!r} annotates parameter(s) {count} and later, but the call passes "
                        f"only {count} positionally: keyword arguments are unannotated (pass it positionally to "
                        "annotate it)")
                specs = [s for i, s in enumerate(specs[:count]) if i not in self.positions]
            in_specs = tuple(specs)
        return in_specs, None


def constrain_outputs(f, out_specs: Any, mesh):
    """``f`` with each output pinned to its ``out_specs`` entry (a pytree prefix of the outputs: a
    ``PartitionSpec``, or None to leave it free) by a sharding constraint — so ``out_specs`` propagates backwards
    as any constraint does, and the outputs come back laid out exactly so."""
    if out_specs is None:
        return f
    from jax.sharding import NamedSharding, PartitionSpec

    from .propagation.sharding import layout_from_spec

    is_leaf = lambda x: x is None or isinstance(x, PartitionSpec)  # noqa: E731
    mesh_shape = dict(mesh.shape)

    def constrained(*args, **kwargs):
        outs = f(*args, **kwargs)
        leaves, tree = jax.tree_util.tree_flatten(outs)
        spec_leaves, spec_tree = jax.tree_util.tree_flatten(out_specs, is_leaf=is_leaf)
        try:
            subtrees = spec_tree.flatten_up_to(jax.tree_util.tree_unflatten(tree, [0] * len(leaves)))
        except (ValueError, TypeError) as err:
            raise SpecTreeError(f"out_specs {out_specs!r} is not a pytree prefix of the outputs (structure "
                                f"{tree}): {err}") from None
        specs = []
        for spec, sub in zip(spec_leaves, subtrees, strict=True):
            if not is_leaf(spec):
                raise SpecTreeError(f"out_specs leaf {spec!r} is neither a PartitionSpec nor None")
            specs += [spec] * len(jax.tree_util.tree_leaves(sub))
        pinned = []
        for k, (x, spec) in enumerate(zip(leaves, specs, strict=True)):
            if spec is not None:
                layout_from_spec(spec, tuple(jax.numpy.shape(x)), mesh_shape, f"out_specs for output {k}")
                x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))
            pinned.append(x)
        return jax.tree_util.tree_unflatten(tree, pinned)

    for attr in ("__name__", "__qualname__", "__module__", "__doc__"):
        if hasattr(f, attr):
            setattr(constrained, attr, getattr(f, attr))
    return constrained


@dataclass(frozen=True)
class Convention:
    """Which arguments are static: positions (negative ones count from the end) and keyword names."""

    static_argnums: tuple[int, ...] = ()
    static_argnames: tuple[str, ...] = ()

    @classmethod
    def of(cls, static_argnums: int | Iterable[int] = (), static_argnames: str | Iterable[str] = ()) -> Convention:
        nums = (static_argnums,) if isinstance(static_argnums, numbers.Integral) else tuple(static_argnums)
        names = (static_argnames,) if isinstance(static_argnames, str) else tuple(static_argnames)
        for n in nums:
            if isinstance(n, bool) or not isinstance(n, numbers.Integral):
                raise OptionError(f"static_argnums={static_argnums!r}: expected argument positions (ints)")
        for name in names:
            if not isinstance(name, str) or not name.isidentifier():
                raise OptionError(f"static_argnames={static_argnames!r}: expected argument names (strs)")
        return cls(tuple(int(n) for n in nums), names)

    def split(self, args: tuple, kwargs: dict) -> Call:
        """``args``/``kwargs`` of one call split into dynamic and static parts (a static value must be hashable:
        it keys the cache of programs, as in ``jax.jit``)."""
        count = len(args)
        positions = []
        for n in self.static_argnums:
            if not -count <= n < count:
                raise OptionError(f"static_argnums has {n}, but the call has {count} positional argument(s)")
            positions.append(n % count)
        positions = sorted(set(positions))
        statics = [(f"argument {i}", args[i]) for i in positions]
        statics += [(f"keyword {name}", kwargs[name]) for name in self.static_argnames if name in kwargs]
        for where, value in statics:
            try:
                hash(value)
            except TypeError as err:
                raise OptionError(f"static {where} = {value!r} is not hashable ({err}); a static argument keys "
                                  "the programs traced, as in jax.jit: pass a tuple instead of a list, or make it "
                                  "a dynamic (array) argument") from None
        dynamic = tuple(a for i, a in enumerate(args) if i not in positions)
        dynamic_kwargs = {k: v for k, v in kwargs.items() if k not in self.static_argnames}
        return Call(dynamic, dynamic_kwargs, tuple(statics), tuple(positions), self.static_argnames)


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
