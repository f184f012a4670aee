"""``shardprop plan PATH.py:FUNC --mesh data=4,model=2 (--arg 'f32[64,512]@P(data)' ... | --args PATH.py:EXAMPLE ...)
[--in-specs '(AUTO, P(data))'] [--memory-limit 12MB] [--format json]``: let the layout search choose the ``sp.AUTO``
arguments' layouts and print the chosen layout table (text or JSON), with ``--explain ARG`` for why."""

from __future__ import annotations

import json
import math
import re

from ..errors import OptionError
from ..splitting.strategy import Strategy
from .arguments import add_options, example_and_specs, load_function
from .inspect import emit, parse_arg, parse_mesh

_SIZE = re.compile(r"^\s*(?P<n>[0-9]*\.?[0-9]+)\s*(?P<unit>[kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6, "mib": 2**20,
          "g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12, "tib": 2**40}


_NOTHING = "nothing to plan: no argument is sp.AUTO (write DTYPE[SHAPE]@AUTO, or AUTO in --in-specs)"


def add_parser(sub) -> None:
    p = sub.add_parser("plan", help="let the layout search choose the sp.AUTO arguments' layouts and show them",
                       description="Trace FUNC from PATH.py, search the layouts of its sp.AUTO arguments (an "
                                   "argument written DTYPE[SHAPE]@AUTO, or every argument of --args unless "
                                   "--in-specs says otherwise) and print the chosen layout table.")
    p.add_argument("target", help="PATH.py:FUNC")
    p.add_argument("--mesh", required=True, help="mesh axes and sizes, e.g. data=4,model=2")
    p.add_argument("--arg", action="append", default=[], metavar="SPEC",
                   help="one per positional array argument: DTYPE[SHAPE], DTYPE[SHAPE]@P(...) or DTYPE[SHAPE]@AUTO")
    add_options(p, in_specs_default="AUTO: every argument searched")
    p.add_argument("--memory-limit", help="bytes per device the chosen plan must fit, e.g. 12MB, 1.5GiB")
    p.add_argument("--strategy", default="auto", choices=tuple(s.value for s in Strategy))
    p.add_argument("--explain", action="append", default=[], metavar="ARG",
                   help="why an argument got its layout, by key path as the table prints it, e.g. \"[0]['w']\"")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument("-o", "--output", help="write to this file instead of standard output")
    p.add_argument("--devices", type=int, help="number of virtual CPU devices (default: the mesh size, at least 8)")


def parse_size(text: str) -> int:
    """``"12MB"`` → 12000000, ``"1.5GiB"`` → 1610612736, ``"4096"`` → 4096."""
    m = _SIZE.match(text)
    if m is None or (m["unit"] or "").lower() not in _UNITS:
        raise OptionError(f"--memory-limit {text!r}: expected bytes such as 4096, 12MB or 1.5GiB")
    return int(float(m["n"]) * _UNITS[(m["unit"] or "").lower()])


def run(args, configure_devices) -> int:
    if not args.arg and not args.args:
        raise OptionError("plan needs its example arguments: one --arg per argument, or --args PATH.py:EXAMPLE")
    sizes, names = parse_mesh(args.mesh)
    configure_devices(args.devices or max(8, math.prod(sizes)))
    from .. import api
    from ..inspect.explain import explain
    from ..inspect.searched import search_to_dict
    from ..mesh import make_mesh
    from ..search import AUTO

    mesh = make_mesh(sizes, names)
    f = load_function(args.target)
    example, in_specs = example_and_specs(args, flat=parse_arg, default_in_specs=AUTO)
    if args.arg and AUTO not in in_specs:
        raise OptionError(_NOTHING)
    limit = parse_size(args.memory_limit) if args.memory_limit else None
    prog = api.compile_program(f, example, mesh=mesh, in_specs=in_specs, strategy=args.strategy, memory_limit=limit)
    if prog.search is None:
        raise OptionError(_NOTHING)
    explained = {name: explain(prog, name) for name in args.explain}
    if args.format == "json":
        doc = {"search": search_to_dict(prog.search)}
        if explained:
            doc["explain"] = {name: e.to_dict() for name, e in explained.items()}
        return emit(json.dumps(doc, indent=2), args.output)
    return emit("\n\n".join([str(prog.search), *map(str, explained.values())]), args.output)

