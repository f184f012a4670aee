"""Terminal pictures with ``rich``: per-tensor block pictures and the stage table.

``blocks`` is ``jax.debug.visualize_array_sharding`` for any tensor of the graph — before it exists: any
rank (a 2-D projection onto two axes; the other axes at one block index, said in the caption), replicated and
partially sharded tensors (a replicated axis is one block held by several devices).
"""

from __future__ import annotations

import io
import itertools
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..errors import OptionError
from ..expr.graph import value_name
from ..core.layouts import layout_to_spec, shard_count
from ..core.transfers import total_moved
from ..core.types import typed
from ..splitting.cost import instructions_transfers
from ..splitting.ir import Compute, transfers_of
from .listing import (format_bytes, format_listing, move_equation, moves_values, ops_summary, source_name,
                      stage_ops)
from .products import as_plan, resolve_value

PALETTE = ("#cfe2f3", "#d9ead3", "#fff2cc", "#f4cccc", "#d9d2e9", "#fce5cd", "#d0e0e3", "#ead1dc", "#e6b8af",
           "#c9daf8", "#b6d7a8", "#ffe599")


def device_coords(mesh) -> dict[int, dict[str, int]]:
    """``{device id: {mesh axis: position}}``, in mesh order."""
    names, sizes = tuple(mesh.axis_names), dict(mesh.shape)
    return {int(mesh.devices[coords].id): dict(zip(names, coords, strict=True))
            for coords in itertools.product(*(range(sizes[n]) for n in names))}


def device_blocks(mesh, layout) -> dict[int, tuple[int, ...]]:
    """``{device id: block index per tensor axis}``: which block of a tensor laid out as ``layout`` each
    device of ``mesh`` holds (mesh axes listed for one tensor axis count major first)."""
    sizes = dict(mesh.shape)
    out = {}
    for device, position in device_coords(mesh).items():
        index = []
        for mesh_axes in layout:
            i = 0
            for name in mesh_axes:
                i = i * sizes[name] + position[name]
            index.append(i)
        out[device] = tuple(index)
    return out


def _device_list(ids: list[int]) -> str:
    ids = sorted(ids)
    if len(ids) > 2 and ids == list(range(ids[0], ids[-1] + 1)):
        return f"{ids[0]}-{ids[-1]}"
    return ",".join(map(str, ids))


def blocks(prog: Any, value: Any, *, axes: tuple[int, int] | None = None, index: dict[int, int] | None = None
           ) -> Table:
    """A table of ``value``'s blocks: rows and columns are its blocks along two axes, each cell lists the
    devices that hold that block (devices: ids on the mesh). ``axes`` picks the two axes shown (default: the
    sharded ones first); ``index`` fixes the block shown along every other sharded axis (default 0)."""
    plan = as_plan(prog)
    v = resolve_value(plan, value)
    aval = plan.graph.avals[v]
    vtype = plan.type(v)
    shape, layout = aval.shape, vtype.layout  # a ranged axis's blocks are the rows each device holds
    rank = len(shape)
    if axes is None:
        order = sorted(range(rank), key=lambda k: (not layout[k], k))
        axes = tuple(sorted(order[:2]))
    axes = tuple(axes)
    if len(axes) > 2 or any(not 0 <= k < rank for k in axes) or len(set(axes)) != len(axes):
        raise OptionError(f"axes {axes} must be at most two distinct axes of {value_name(v)} (rank {rank})")
    index = dict(index or {})
    mesh_shape = plan.mesh_shape
    counts = [shard_count(mesh_shape, m) for m in layout]
    hidden = [k for k in range(rank) if k not in axes]
    for k in hidden:
        index.setdefault(k, 0)
        if not 0 <= index[k] < counts[k]:
            raise OptionError(f"block index {index[k]} out of range on axis {k} of {value_name(v)} "
                              f"({counts[k]} blocks)")
    held = device_blocks(plan.sharded.mesh, layout)
    row_axis = axes[0] if len(axes) == 2 else None
    col_axis = axes[-1] if axes else None
    n_rows = counts[row_axis] if row_axis is not None else 1
    n_cols = counts[col_axis] if col_axis is not None else 1

    def span(k, b):
        ranged = vtype.span_of(k)
        if ranged is not None:  # the rows this device holds (none, or fewer than a block, at the ends)
            first, stop = ranged.held(b, shape[k])
            return f"{first}:{stop}" if stop > first else "(none)"
        length = shape[k] // counts[k]
        return f"{b * length}:{(b + 1) * length}"

    caption = [f"axis {k}{'@' + '*'.join(layout[k]) if layout[k] else ''}: block {index[k]} of {counts[k]}"
               for k in hidden if counts[k] > 1]
    if vtype.partial:  # the devices sharing a block each hold one summand of it
        caption.append(f"a partial sum over {'*'.join(vtype.partial)}: the devices listed for a block each hold one "
                       "summand of it")
    title = f"{typed(v, aval, vtype)}  {layout_to_spec(layout)}"
    table = Table(title=title, caption="; ".join(caption) or None, box=box.SQUARE, show_lines=True,
                  show_header=col_axis is not None)
    corner = f"axis {row_axis} \\ axis {col_axis}" if row_axis is not None else (
        f"axis {col_axis}" if col_axis is not None else "")
    table.add_column(corner, justify="right", style="dim")
    for c in range(n_cols):
        table.add_column(span(col_axis, c) if col_axis is not None else "", justify="center")
    colours: dict[str, str] = {}
    for r in range(n_rows):
        cells = []
        for c in range(n_cols):
            want = dict(index)
            if row_axis is not None:
                want[row_axis] = r
            if col_axis is not None:
                want[col_axis] = c
            ids = [d for d, b in held.items() if all(b[k] == want[k] for k in want)]
            label = _device_list(ids)
            colour = colours.setdefault(label, PALETTE[len(colours) % len(PALETTE)])
            cells.append(Text(f"dev {label}", style=f"black on {colour}", justify="center"))
        table.add_row(span(row_axis, r) if row_axis is not None else "", *cells)
    return table


def stage_table(prog: Any) -> Table:
    """Per stage: its ops, inputs (spec, source stage), outputs, the moves and collectives it runs, and the bytes
    each device sends (estimated, ring model)."""
    plan = as_plan(prog)
    if not plan.is_split:
        raise OptionError("the stage table needs a split plan: pass a Program (fs.trace(...)) or sp.split(...)")
    graph = plan.graph
    table = Table(title=f"{len(plan.stages)} stage(s), strategy {plan.strategy}", box=box.SIMPLE_HEAVY,
                  show_lines=True)
    for name in ("stage", "ops", "inputs", "outputs", "collectives", "moved / device"):
        table.add_column(name, justify="right" if name in ("stage", "moved / device") else "left")
    total = 0.0
    for stage in plan.stages:
        ops = stage_ops(plan, stage)
        moved = 0.0
        inputs = [f"{value_name(i.value)} {layout_to_spec(i.layout)} ← {source_name(plan, i.source)}"
                  for i in stage.inputs]
        collectives = []
        for instruction in stage.instructions:
            if isinstance(instruction, Compute):
                inside = instructions_transfers([instruction])
                if inside:  # what a loop's or a cond's bodies move, every iteration
                    nbytes = total_moved(inside)
                    moved += nbytes
                    op = graph.nodes[instruction.node].op
                    collectives.append(f"inside `{op}` ({format_bytes(nbytes)} in all iterations)")
                continue
            sent = transfers_of(instruction)
            if sent:
                nbytes = total_moved(sent)
                moved += nbytes
                collectives.append(f"{move_equation(instruction)} ({format_bytes(nbytes)})")
        outputs = [f"{value_name(v)} {layout_to_spec(layout)}" for v, layout in
                   zip(stage.outputs, stage.out_layouts, strict=True)]
        total += moved
        table.add_row(str(stage.id), ops_summary(ops, counted=True, moves=moves_values(stage)),
                      "\n".join(inputs) or "-", "\n".join(outputs) or "-", "\n".join(collectives) or "-",
                      format_bytes(moved))
    table.caption = f"total ≈ {format_bytes(total)} moved per device"
    return table


def as_text(renderable, width: int = 120) -> str:
    """A rich renderable as plain text (for files, tests and logs)."""
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(renderable)
    return "\n".join(line.rstrip() for line in console.export_text().splitlines())


def _console() -> Console:
    """A console for printing: the terminal's width, or — writing to a file or a log, where rich would assume 80
    columns and cut op lists and specs mid-word — wide enough for the tables."""
    console = Console()
    return console if console.is_terminal else Console(width=160)


def show(prog: Any, *, console: Console | None = None) -> None:
    """Print the annotated listing (stage by stage) and the stage table."""
    plan = as_plan(prog)
    console = console or _console()
    console.print(format_listing(plan), markup=False, highlight=False, soft_wrap=True)
    if plan.is_split:
        console.print(stage_table(plan))


def show_blocks(prog: Any, value: Any, *, console: Console | None = None, **options) -> None:
    """Print ``blocks`` of ``value``."""
    (console or _console()).print(blocks(prog, value, **options))


