"""``shardprop inspect PATH.py:FUNC --mesh i=4,j=2 (--arg 'f32[16,8]@P(i,j)' ... | --args PATH.py:EXAMPLE ...
[--in-specs SPECS])``: inspect a function from the command line (text, JSON, DOT, SVG or Model Explorer's graph
JSON, ``--view`` to open it in Model Explorer), with optional ``--explain``, ``--lineage`` and ``--blocks``. Also
the flat ``--arg`` parsing that ``plan`` and ``debug`` share."""

from __future__ import annotations

import ast
import json
import math
import re
import sys
import tempfile
from pathlib import Path

from ..errors import OptionError
from ..splitting.strategy import Strategy
from .arguments import add_options, example_and_specs, load_function

DTYPES = {"f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64", "i8": "int8", "i16": "int16",
          "i32": "int32", "i64": "int64", "u8": "uint8", "u16": "uint16", "u32": "uint32", "u64": "uint64",
          "bool": "bool", "c64": "complex64", "c128": "complex128"}
_ARG = re.compile(r"^\s*(?P<dtype>[a-z0-9]+)\[(?P<shape>[0-9,\s]*)\]\s*(?:@\s*(?P<spec>P\s*\(.*\)|AUTO))?\s*$")


def parse_mesh(text: str) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """``"i=4,j=2"`` → ``((4, 2), ("i", "j"))``."""
    names, sizes = [], []
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, size = part.partition("=")
        if not name.strip().isidentifier() or not size.strip().isdigit() or int(size) < 1:
            raise OptionError(f"--mesh {text!r}: expected name=size pairs such as i=4,j=2")
        names.append(name.strip())
        sizes.append(int(size))
    if not names:
        raise OptionError(f"--mesh {text!r}: expected name=size pairs such as i=4,j=2")
    return tuple(sizes), tuple(names)


def parse_spec(text: str):
    """``"P(i,(j,k),None)"`` → ``PartitionSpec('i', ('j', 'k'), None)``."""
    from jax.sharding import PartitionSpec

    inner = text.strip()[1:].strip()[1:-1]  # drop "P(" and ")"
    inner = inner.replace('"', "").replace("'", "")  # P("i", 'j') as typed in Python: names either way
    quoted = re.sub(r"\b(?!None\b)([A-Za-z_]\w*)\b", r"'\1'", inner)
    try:
        entries = ast.literal_eval(f"({quoted},)") if quoted.strip() else ()
    except (SyntaxError, ValueError):
        raise OptionError(f"cannot read the spec {text!r}: expected P(i,j), P(None,j), P((i,j)) or P()") from None
    return PartitionSpec(*entries)


def parse_arg(text: str):
    """``"f32[16,8]@P(i,j)"`` → ``(ShapeDtypeStruct((16, 8), float32), PartitionSpec('i', 'j'))``; without
    ``@...`` the argument is unannotated (spec None); ``@AUTO``: the layout search chooses it (``sp.AUTO``)."""
    import jax
    import numpy as np

    m = _ARG.match(text)
    if m is None:
        raise OptionError(f"cannot read --arg {text!r}: expected DTYPE[SHAPE] or DTYPE[SHAPE]@P(...), such as "
                          "f32[16,8]@P(i,j), f32[16,8] or i32[]")
    dtype = DTYPES.get(m["dtype"], m["dtype"])
    try:
        dtype = jax.numpy.dtype(dtype)
    except TypeError:
        raise OptionError(f"--arg {text!r}: unknown dtype {m['dtype']!r} (known: {', '.join(DTYPES)})") from None
    shape = tuple(int(d) for d in m["shape"].replace(" ", "").split(",") if d)
    if m["spec"] == "AUTO":
        from ..search import AUTO

        spec = AUTO
    else:
        spec = parse_spec(m["spec"]) if m["spec"] else None
    return jax.ShapeDtypeStruct(shape, np.dtype(dtype) if dtype != jax.numpy.bfloat16 else dtype), spec


def parse_lineage(text: str) -> tuple[str, tuple[int, ...] | None]:
    """``"0:0,1"`` (output 0, block (0, 1)), ``"e:1"`` (value e, block (1,)) or ``"0:"`` (the whole output)."""
    target, sep, block = text.partition(":")
    if not sep or not target.strip():
        raise OptionError(f"--lineage {text!r}: expected OUT:BLOCK such as 0:0,1 (output 0, block (0, 1)) or e:1")
    try:
        blocks = tuple(int(b) for b in block.split(",") if b.strip()) if block.strip() else None
    except ValueError:
        raise OptionError(f"--lineage {text!r}: the block must be integers separated by commas") from None
    return target.strip(), blocks


def add_parser(sub) -> None:
    p = sub.add_parser("inspect", help="trace, shard and split a function, and show what happened",
                       description="Inspect how shardprop shards FUNC from PATH.py: the annotated listing and stage "
                                   "table (text), the JSON form (json), a graphviz picture (dot, svg), the graph "
                                   "for Google's Model Explorer (model-explorer; --view opens it there).")
    p.add_argument("target", nargs="?", help="PATH.py:FUNC")
    p.add_argument("--mesh", help="mesh axes and sizes, e.g. i=4,j=2")
    p.add_argument("--arg", action="append", default=[], metavar="SPEC",
                   help="one per positional argument: DTYPE[SHAPE], DTYPE[SHAPE]@P(...) or DTYPE[SHAPE]@AUTO (the "
                        "layout search chooses), e.g. 'f32[16,8]@P(i,j)'")
    add_options(p, in_specs_default="None: every argument unannotated")
    p.add_argument("--strategy", default="auto", choices=tuple(s.value for s in Strategy))
    p.add_argument("--format", choices=FORMATS,
                   help="default: from the suffix of -o (.txt .json .dot .gv .svg .png .pdf), else text")
    p.add_argument("--explain", action="append", default=[], metavar="NODE",
                   help="explain a value, e.g. e, params['w'], out[1] (or one inside a loop's body: e/body/c), or "
                        "every value made on a source line: model.py:50")
    p.add_argument("--lineage", action="append", default=[], metavar="OUT:BLOCK",
                   help="input boxes a block depends on, e.g. 0:0,1 (output 0, block (0, 1)) or e:1")
    p.add_argument("--blocks", action="append", default=[], metavar="VALUE",
                   help="(text) picture of which device holds which block of VALUE")
    p.add_argument("--brief", action="store_true",
                   help="(text) leave out the listing and stage table: only what --explain/--lineage/--blocks ask for")
    p.add_argument("-o", "--output", help="write to this file instead of standard output")
    p.add_argument("--devices", type=int, help="number of virtual CPU devices (default: the mesh size, at least 8)")
    p.add_argument("--width", type=int, default=120, help="text width for tables (default 120)")
    p.add_argument("--schema", action="store_true", help="print the JSON schema of --format json and exit")
    p.add_argument("--view", action="store_true",
                   help="open the shard graph in Model Explorer (needs shardprop[viewer]; Ctrl+C stops its server)")
    p.add_argument("--port", type=int, help="(--view) the port of Model Explorer's server (default: a free one)")


FORMATS = ("text", "json", "dot", "svg", "png", "pdf", "model-explorer")
SUFFIXES = {".txt": "text", ".text": "text", ".json": "json", ".dot": "dot", ".gv": "dot", ".svg": "svg",
            ".png": "png", ".pdf": "pdf"}


def output_format(fmt: str | None, output: str | None) -> str:
    """The format asked for: ``--format``, else the suffix of ``-o``, else text; a ``--format`` that the suffix of
    ``-o`` contradicts (``--format svg -o graph.png``) is an ``OptionError``, not a mislabelled file."""
    by_suffix = SUFFIXES.get(Path(output).suffix.lower()) if output else None
    if fmt is None:
        return by_suffix or "text"
    if by_suffix is not None and by_suffix != fmt and not (fmt == "model-explorer" and by_suffix == "json"):
        raise OptionError(f"--format {fmt} but -o {output} says {by_suffix}: drop one, or make them agree")
    if fmt in ("png", "pdf") and not output:
        raise OptionError(f"--format {fmt} is binary: give -o FILE.{fmt}")
    return fmt


def run(args, configure_devices) -> int:
    from ..inspect.export import SCHEMA

    args.format = output_format(args.format, args.output)
    if args.schema:
        return emit(json.dumps(SCHEMA, indent=2), args.output)
    if not args.target or not args.mesh:
        raise OptionError("inspect needs PATH.py:FUNC and --mesh (e.g. --mesh i=4,j=2)")
    asked = {"--explain": args.explain, "--lineage": args.lineage, "--blocks": args.blocks, "--brief": args.brief}
    shown_in = {"--explain": ("text", "json"), "--lineage": ("text", "json"), "--blocks": ("text",),
                "--brief": ("text",)}
    if args.view and args.format not in ("text", "model-explorer"):
        raise OptionError(f"--view opens the graph in Model Explorer: drop --format {args.format}")
    if args.port is not None and not args.view:
        raise OptionError("--port is the port of --view's Model Explorer server: add --view, or drop --port")
    if args.view and args.format == "text":
        # --view shows the graph instead of the text: what only the text would show is refused, not dropped
        dropped = [flag for flag, value in {"-o": args.output, "--explain": args.explain, "--lineage": args.lineage,
                                            "--blocks": args.blocks, "--brief": args.brief}.items() if value]
        if dropped:
            raise OptionError(f"--view opens the graph in Model Explorer and prints no text: drop "
                              f"{', '.join(dropped)} (or --format model-explorer -o graph.json --view to keep the "
                              f"graph's file too)")
    for flag, value in asked.items():
        if value and args.format not in shown_in[flag]:
            raise OptionError(f"{flag} is shown only with --format {' or '.join(shown_in[flag])}, not "
                              f"--format {args.format}")
    sizes, names = parse_mesh(args.mesh)
    configure_devices(args.devices or max(8, math.prod(sizes)))

    from .. import api, inspect as sp_inspect
    from ..inspect.explain import explain
    from ..mesh import make_mesh

    mesh = make_mesh(sizes, names)
    example, in_specs = example_and_specs(args, flat=parse_arg, default_in_specs=None)
    lineages = [parse_lineage(text) for text in args.lineage]
    f = load_function(args.target)
    prog = api.compile_program(f, example, mesh=mesh, in_specs=in_specs, strategy=args.strategy)
    explained = {name: explain(prog, name) for name in args.explain}
    traced = {text: _lineage(prog, target, block) for text, (target, block) in zip(
        args.lineage, lineages, strict=True)}
    if args.format == "json":
        doc = sp_inspect.to_json(prog)
        if explained:
            doc["explain"] = {name: e.to_dict() for name, e in explained.items()}
        if traced:
            doc["lineage"] = {text: _lineage_json(result) for text, result in traced.items()}
        return emit(json.dumps(doc, indent=2), args.output)
    if args.format == "model-explorer" and (args.output or not args.view):
        from ..inspect.model_explorer import model_explorer_json, to_model_explorer

        emit(model_explorer_json(to_model_explorer(prog)), args.output)
    if args.view:
        from ..inspect.viewer import visualize

        visualize(prog, port=args.port)  # serves until Ctrl+C
    if args.view or args.format == "model-explorer":
        return 0
    if args.format == "dot":
        return emit(sp_inspect.to_dot(prog), args.output)
    if args.format in ("svg", "png", "pdf"):
        if args.output:
            sp_inspect.render(prog, args.output, format=args.format)
            return 0
        with tempfile.TemporaryDirectory() as tmp:
            path = sp_inspect.render(prog, Path(tmp) / "graph.svg", format="svg")
            return emit(path.read_text(), None)
    parts = [] if args.brief else [str(prog.graph),
                                   sp_inspect.as_text(sp_inspect.stage_table(prog), width=args.width).rstrip()]
    parts += [str(e) for e in explained.values()]
    parts += [_lineage_text(prog, text, result) for text, result in traced.items()]
    parts += [sp_inspect.as_text(sp_inspect.blocks(prog, v), width=args.width).rstrip() for v in args.blocks]
    return emit("\n\n".join(parts), args.output)


def _lineage(prog, target: str, block):
    from ..inspect.lineage import lineage

    if target.isdigit():
        return lineage(prog, output=int(target), block=block)
    return lineage(prog, value=target, block=block)


def _lineage_json(result) -> dict:
    from ..expr.graph import value_name

    return {"value": value_name(result.value), "box": [list(b) for b in result.box], "exact": result.exact,
            "inputs": {str(k): [[list(r) for r in box] for box in boxes] for k, boxes in result.items()}}


def _lineage_text(prog, text: str, result) -> str:
    from ..expr.graph import argument_label, value_name

    graph = prog.sharded.graph
    box = ", ".join(f"{s}:{e}" for s, e in result.box)
    lines = [f"lineage {text}: {value_name(result.value)}[{box}] depends on"
             + ("" if result.exact else " (a superset: some rule on the way is not exact)")]
    for k, boxes in result.items():
        name = argument_label(graph, k)
        if not boxes:
            lines.append(f"  {name}: nothing")
        for b in boxes:
            lines.append(f"  {name}[{', '.join(f'{s}:{e}' for s, e in b)}]")
    return "\n".join(lines)


def emit(text: str, output: str | None) -> int:
    """Write ``text`` to the file ``output``, or to standard output. On several processes (``shardprop launch``),
    process 0 writes it: every process computed the same report."""
    import jax

    if jax.process_index() != 0:
        return 0
    if output:
        Path(output).write_text(text + "\n")
    else:
        sys.stdout.write(text + "\n")
    return 0
