"""``compare_with_jit``: the same function compiled by shardprop and by ``jax.jit`` (GSPMD/Shardy) with the
same input shardings on the same mesh, their collectives and bytes side by side."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .api import autoshard
from .backends import parse_hlo
from .errors import OptionError
from .expr.trace import abstractify
from .mesh import as_auto_mesh
from .program import Program
from .spellings import same_devices
from .stateful import returning_state, state_leaves, stateful_positions
from .core.transfers import Transfer, total_moved


@dataclass(frozen=True)
class Comparison:
    """Both programs' collectives (``Transfer`` lists) and output specs."""

    shardprop: list[Transfer]
    jit: list[Transfer]
    shardprop_out_specs: tuple[PartitionSpec, ...]
    jit_out_specs: tuple[PartitionSpec, ...]
    program: Program
    output_names: tuple[str, ...] = ()  # a name per output leaf where its key path says less (an NNX state leaf)

    @property
    def shardprop_bytes(self) -> float:
        return total_moved(self.shardprop)

    @property
    def jit_bytes(self) -> float:
        return total_moved(self.jit)

    def __str__(self) -> str:
        """Both programs' collectives and bytes; their output specs on the same line for a few outputs, or as a
        table, one output leaf per row named by its key path, for a model's many."""
        many = len(self.shardprop_out_specs) > 4
        lines = [f"{'':10} {'collectives':>11} {'bytes moved/device':>19}  output specs"]
        for name, transfers, specs in (("shardprop", self.shardprop, self.shardprop_out_specs),
                                       ("jax.jit", self.jit, self.jit_out_specs)):
            listed = f"{len(specs)} outputs, below" if many else ", ".join(str(s) for s in specs)
            lines.append(f"{name:10} {len(transfers):>11} {total_moved(transfers):>19.0f}  {listed}")
            lines.extend(f"    {t}" for t in transfers)
        if many:
            graph = self.program.plan.graph
            paths = jax.tree_util.tree_flatten_with_path(
                jax.tree_util.tree_unflatten(graph.out_tree, list(range(len(graph.outputs)))))[0]
            names = self.output_names or [jax.tree_util.keystr(path) or "(the output)" for path, _ in paths]
            rows = [("output", "shardprop", "jax.jit")] + [
                (name, str(ours), str(theirs))
                for name, ours, theirs in zip(names, self.shardprop_out_specs, self.jit_out_specs, strict=True)]
            widths = [max(len(r[c]) for r in rows) for c in range(2)]
            lines += [f"  {r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]}" for r in rows]
        return "\n".join(lines)


def compare_with_jit(f: Callable, mesh: Mesh, in_specs: Any, *args, strategy: str = "auto",
                     memory_limit: int | float | None = None, program: Program | None = None) -> Comparison:
    """Compile ``f`` with shardprop and with ``jax.jit(in_shardings=...)`` on ``mesh`` and compare.

    ``jax.jit`` gets the input shardings shardprop resolved (unannotated inputs as they adopted), so both
    start from the same layout; where ``sp.AUTO`` chose them (a searched program), it gets the output shardings
    the search chose too, so that both compute the same function from and to the same layouts. ``args`` may be
    arrays or ShapeDtypeStructs. A step that updates flax NNX arguments in place is compared with the state both
    return, as ``nnx.jit`` compiles it. ``program``: the shardprop side already traced
    (``autoshard(f, ...).trace(*args)``), whose compiled executable is read as it is — one compile fewer; else ``f``
    is traced with ``in_specs``, ``strategy`` and ``memory_limit`` (bytes per device, as ``autoshard`` takes it).

        fs = sp.autoshard(f, mesh=mesh, in_specs=(P("i"),))
        print(sp.compare_with_jit(f, mesh, (P("i"),), x, program=fs.trace(x)))
    """
    mesh = as_auto_mesh(mesh)
    if program is None:
        program = autoshard(f, mesh=mesh, in_specs=in_specs, strategy=strategy, memory_limit=memory_limit).trace(*args)
    elif not same_devices(program.mesh, mesh):
        raise OptionError(f"compare_with_jit: the program runs on mesh {dict(program.mesh.shape)} over devices "
                          f"{program.mesh.devices.ravel().tolist()}, the comparison is on mesh {dict(mesh.shape)} "
                          f"over {mesh.devices.ravel().tolist()}: trace the program on the comparison's mesh")
    # flax NNX arguments updated in place: both sides return their state (as nnx.jit does), or XLA would drop the
    # update — the backward pass and the optimizer — from jax.jit's program
    positions = stateful_positions(args)
    like_program = returning_state(f, positions) if positions else f
    out_specs = program.out_specs if program.search is not None else None
    compiled = lower_with_jit(like_program, mesh, program.sharded.in_specs, *args, out_specs=out_specs).compile()
    jit_out = tuple(getattr(s, "spec", PartitionSpec()) for s in jax.tree_util.tree_leaves(compiled.output_shardings))
    names = ()
    if positions:  # the state leaves named after the argument leaves they update
        graph = program.plan.graph
        updated = state_leaves(args, positions, jax.tree_util.tree_leaves(args))
        paths = jax.tree_util.tree_flatten_with_path(
            jax.tree_util.tree_unflatten(graph.out_tree, list(range(len(graph.outputs)))))[0]
        returned = [jax.tree_util.keystr(path[1:]) or "(the output)" for path, _ in paths[:len(paths) - len(updated)]]
        names = (*returned, *(f"{graph.argument_names[j]} (updated)" for j in updated))
    return Comparison(program.communication(), parse_hlo(compiled.as_text(), mesh), program.out_specs,
                      jit_out, program, names)


def lower_with_jit(f: Callable, mesh: Mesh, flat_specs: Any, *args,
                   out_specs: tuple | None = None) -> jax.stages.Lowered:
    """``jax.jit(f)`` lowered for ``args`` (arrays or ShapeDtypeStructs) with ``in_shardings`` on ``mesh`` from
    ``flat_specs``, one ``PartitionSpec`` per argument leaf (a program's ``graph.in_specs``), and with
    ``out_shardings`` from ``out_specs`` (one per output leaf) when given."""
    structs, tree = abstractify(args)  # arrays, ShapeDtypeStructs and Python scalars (weakly typed), as autoshard
    shardings = [NamedSharding(mesh, spec) for spec in flat_specs]
    shaped = [jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s, weak_type=x.weak_type)
              for x, s in zip(structs, shardings, strict=True)]

    def flat_f(*flat):
        return f(*jax.tree_util.tree_unflatten(tree, flat))

    if out_specs is None:
        return jax.jit(flat_f, in_shardings=shardings).lower(*shaped)

    def flat_out(*flat):  # the output leaves, as flat as the specs
        return tuple(jax.tree_util.tree_leaves(flat_f(*flat)))

    out_shardings = tuple(NamedSharding(mesh, spec) for spec in out_specs)
    return jax.jit(flat_out, in_shardings=shardings, out_shardings=out_shardings).lower(*shaped)
