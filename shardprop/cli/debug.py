"""``shardprop debug PATH.py:FUNC --mesh i=4,j=2 (--arg 'f32[16,8]@P(i,j)' ... | --args PATH.py:EXAMPLE ...)``: run a
function's sharded program stage by stage, each stage compared with the unsharded function, ending with the first
divergence (or "all N values agree") and the per-stage profile. ``--interactive`` stops between stages at a small
prompt.

A whole run exits 1 when it finds a problem — a divergence from the unsharded function, a broken promise or a
non-finite value — and 0 when clean, so that a script or CI job can gate on it (2: the command itself failed)."""

from __future__ import annotations

import cmd
import json
import math
import sys

from ..errors import OptionError, ShardingError
from ..splitting.strategy import Strategy
from .arguments import add_options, example_and_specs, filled, load_function, random_array
from .inspect import emit, parse_arg, parse_mesh, parse_spec

FOUND_PROBLEM = 1  # the exit status of a run that found a divergence, a broken promise or a non-finite value


def add_parser(sub) -> None:
    p = sub.add_parser(
        "debug", help="run a function's sharded program stage by stage against the unsharded function",
        description="Run FUNC from PATH.py sharded, stage by stage: each stage's summary and its comparison "
                    "with the unsharded function, then the first divergence and the per-stage profile. "
                    "Exit status: 0 when every value agrees with the unsharded function, every promise holds and "
                    "every value is finite; 1 when a divergence, a broken promise or a non-finite value (NaN, "
                    "inf, in the arguments too) is found; 2 when the command fails (bad options, the function "
                    "does not trace). --interactive exits 0.")
    p.add_argument("target", help="PATH.py:FUNC")
    p.add_argument("--mesh", required=True, help="mesh axes and sizes, e.g. i=4,j=2")
    p.add_argument("--arg", action="append", default=[], metavar="SPEC",
                   help="one per positional argument: DTYPE[SHAPE]@P(...) (filled from --seed) or @FILE.npy@P(...)")
    add_options(p, in_specs_default="None: every argument unannotated")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the random arguments: DTYPE[SHAPE] and ShapeDtypeStructs (default 0)")
    p.add_argument("--strategy", default="auto", choices=tuple(s.value for s in Strategy))
    p.add_argument("--keep", default="outputs", choices=("outputs", "all"),
                   help="keep every intermediate as stages run (all) or only stage outputs (default)")
    p.add_argument("--rtol", type=float, help="relative tolerance of the comparison (default: 100 ulps)")
    p.add_argument("--atol", type=float, help="absolute tolerance (default: rtol × the value's largest magnitude)")
    p.add_argument("--repeats", type=int, default=10, help="runs per stage for the profile (default 10)")
    p.add_argument("--save-stage", nargs=2, metavar=("K", "DIR"), help="also save stage K as a reproducer in DIR")
    p.add_argument("--interactive", action="store_true", help="a prompt between stages (type help)")
    p.add_argument("--format", default="text", choices=("text", "json"))
    p.add_argument("-o", "--output", help="write to this file instead of standard output")
    p.add_argument("--devices", type=int, help="number of virtual CPU devices (default: the mesh size, at least 8)")
    p.add_argument("--width", type=int, default=120, help="text width for tables (default 120)")


def parse_value_arg(text: str, rng):
    """``f32[16,8]@P(i,j)`` → a random array of that type (from ``rng``) and its spec; ``@x.npy@P(i,j)`` → the
    array in the file and its spec (no ``@P(...)``: unannotated)."""
    import numpy as np

    if text.strip().startswith("@"):  # one array per flag; a pytree from files is --args FILE.npz
        body = text.strip()[1:]
        at = body.rfind("@P")
        path, spec = (body[:at], parse_spec(body[at + 1:])) if at >= 0 else (body, None)
        try:
            loaded = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as err:
            raise OptionError(f"--arg {text!r}: cannot read {path!r}: {err}") from None
        if not isinstance(loaded, np.ndarray):
            raise OptionError(f"--arg {text!r}: {path!r} holds several arrays (an .npz); give one .npy per argument")
        return loaded, spec
    shaped, spec = parse_arg(text)
    return random_array(shaped.shape, shaped.dtype, rng), spec


def run(args, configure_devices) -> int:
    sizes, names = parse_mesh(args.mesh)
    configure_devices(args.devices or max(8, math.prod(sizes)))
    import jax
    import numpy as np

    from .. import api
    from ..debug import Debugger
    from ..mesh import make_mesh

    if args.repeats < 1:
        raise OptionError(f"--repeats {args.repeats}: expected at least 1")
    if args.interactive and args.format != "text":
        raise OptionError("--interactive is a text prompt; --format json is for a whole run without it")
    if args.interactive and jax.process_count() > 1:
        raise OptionError(f"--interactive reads one terminal, but this runs as {jax.process_count()} processes: "
                          "run without it (every process steps the same stages; process 0 prints the report)")
    rng = np.random.default_rng(args.seed)
    example, in_specs = example_and_specs(args, flat=lambda text: parse_value_arg(text, rng), default_in_specs=None)
    values = filled(example, rng)
    f = load_function(args.target)
    mesh = make_mesh(sizes, names)
    prog = api.compile_program(f, values, mesh=mesh, in_specs=in_specs, strategy=args.strategy)
    dbg = Debugger(prog, *values, keep=args.keep)
    if args.interactive:
        return Prompt(dbg, args).run()
    report = walk(dbg, args)
    if args.save_stage:
        k, directory = args.save_stage
        if not k.isdigit():
            raise OptionError(f"--save-stage {k!r}: expected a stage number")
        report["saved"] = str(dbg.save_stage(int(k), directory))
    if args.format == "json":
        emit(json.dumps(_finite(report["json"]), indent=2, allow_nan=False), args.output)
    else:
        emit(report["text"] + (f"\nstage {args.save_stage[0]} saved: python {report['saved']}" if args.save_stage
                               else ""), args.output)
    return exit_status(report["json"])


def exit_status(doc: dict) -> int:
    """``FOUND_PROBLEM`` when the run found a divergence, a broken promise or a non-finite value, else 0; the
    reasons go to standard error (once: every process found the same), since the report may have gone to a file."""
    import jax

    problems = [what for what, found in (("a divergence from the unsharded function", doc["divergence"]),
                                         (f"{len(doc['findings'])} broken promise(s)", doc["findings"]),
                                         ("a non-finite value", doc["nonfinite"])) if found]
    if not problems:
        return 0
    if jax.process_index() == 0:
        print(f"shardprop debug: found {', '.join(problems)} (exit status {FOUND_PROBLEM})", file=sys.stderr)
    return FOUND_PROBLEM


def _finite(doc):
    """``doc`` with every non-finite float spelled as a string ("inf", "nan"): strict JSON has no such numbers,
    and an infinite relative error (a reference of 0) is exactly when the JSON is wanted."""
    if isinstance(doc, float) and not math.isfinite(doc):
        return str(doc)
    if isinstance(doc, dict):
        return {k: _finite(v) for k, v in doc.items()}
    if isinstance(doc, list | tuple):
        return [_finite(v) for v in doc]
    return doc


def walk(dbg, args) -> dict:
    """Every stage stepped and compared; the closing verdict and profile. ``{"text": ..., "json": ...}``."""
    import jax
    from rich.console import Console
    from rich.progress import Progress

    from ..inspect.pictures import as_text

    prog, graph = dbg.program, dbg.plan.graph
    processes = jax.process_count()
    head = (f"shardprop debug {args.target} on mesh {dict(prog.mesh.shape)}"
            f"{f' over {processes} processes' if processes > 1 else ''}: {len(prog.stages)} stage(s), "
            f"{len(graph.nodes)} nodes, strategy {prog.plan.strategy}")
    parts, stages_json = [head], []
    console = Console(stderr=True)
    with Progress(console=console, transient=True, disable=not console.is_terminal) as progress:
        task = progress.add_task("stepping", total=len(prog.stages))
        while not dbg.done:
            step = dbg.step()
            compared = dbg.compare(rtol=args.rtol, atol=args.atol).for_stage(step.stage)
            parts.append(f"{step}\n  vs unsharded: {compared.summary()}")
            parts += [f"    DIFFERS {r.where}: max abs error {r.max_abs:.3g}" for r in compared.disagreeing]
            stages_json.append({**step.to_dict(), "comparison": compared.to_dict()})
            progress.advance(task)
    table = dbg.compare(rtol=args.rtol, atol=args.atol)
    divergence = dbg.first_divergence(rtol=args.rtol, atol=args.atol)
    findings = dbg.check()
    nonfinite = dbg.first_nonfinite()
    profile = dbg.profile(args.repeats)
    verdict = str(divergence) if divergence else f"all {len(table.rows)} values agree with the unsharded function"
    parts.append(verdict)
    if findings:
        parts.append(f"{len(findings)} broken promise(s):\n" + "\n".join(str(x) for x in findings))
    else:
        parts.append("every device holds what the plan says it holds (replicas equal, blocks where shards say)")
    if nonfinite:
        parts.append(f"first non-finite: {nonfinite}")
    parts.append(as_text(profile, width=args.width).rstrip())
    doc = {"program": {"target": args.target, "mesh": dict(prog.mesh.shape), "processes": processes,
                       "stages": len(prog.stages),
                       "nodes": len(graph.nodes), "strategy": str(prog.plan.strategy)},
           "stages": stages_json, "agree": table.agree,
           "divergence": divergence.to_dict() if divergence else None,
           "findings": [x.to_dict() for x in findings], "nonfinite": nonfinite.to_dict() if nonfinite else None,
           "profile": profile.to_dict()}
    return {"text": "\n\n".join(parts), "json": doc}


class Prompt(cmd.Cmd):
    """``(shardprop) `` between stages: next, print NAME, blocks NAME, break NAME, continue, quit."""

    intro = "shardprop debugger: next (n), print NAME (p), blocks NAME, break NAME (b), continue (c), " \
            "compare, where, quit (q)"
    prompt = "(shardprop) "

    def __init__(self, dbg, args, stdin=None, stdout=None):
        super().__init__(stdin=stdin, stdout=stdout)
        if stdin is not None:
            self.use_rawinput = False
        self.dbg, self.args = dbg, args

    def run(self) -> int:
        self.cmdloop()
        return 0

    def _say(self, text: str) -> None:
        self.stdout.write(f"{text}\n")

    def onecmd(self, line):
        try:
            return super().onecmd(line)
        except ShardingError as err:  # a typo is a message, not the end of the session
            self._say(f"{type(err).__name__}: {err}")
            return False

    def emptyline(self):
        return False

    def _show(self, step) -> None:
        compared = self.dbg.compare(rtol=self.args.rtol, atol=self.args.atol).for_stage(step.stage)
        self._say(f"{step}\n  vs unsharded: {compared.summary()}")

    def do_next(self, _):
        """next: run the next stage and show it, with its comparison."""
        if self.dbg.done:
            self._say("the program has finished (quit, or compare)")
            return False
        self._show(self.dbg.step())
        return False

    def do_continue(self, _):
        """continue: run to the end or the next breakpoint, showing each stage with its comparison."""
        for step in self.dbg.run():
            self._show(step)
        self.do_where("")

    def _name(self, arg: str, command: str):
        name = arg.strip()
        if not name:
            raise OptionError(f"usage: {command} NAME (a value as the listing names it, such as e, or its id)")
        return int(name) if name.isdigit() else name

    def do_print(self, arg):
        """print NAME: the global value of NAME (a listing name such as e, or a value id)."""
        self._say(f"{arg.strip()} =\n{self.dbg.value(self._name(arg, 'print'))}")

    def do_blocks(self, arg):
        """blocks NAME: every device's block of NAME with its index ranges."""
        for block in self.dbg.blocks(self._name(arg, "blocks")):
            self._say(str(block))

    def do_break(self, arg):
        """break NAME: stop before the stage that computes NAME; break alone lists the breakpoints."""
        if not arg.strip():
            points = self.dbg.breakpoints
            self._say("\n".join(f"before stage {k}: {', '.join(names)}" for k, names in sorted(points.items()))
                      or "no breakpoints")
            return
        self._say(f"breakpoint before stage {self.dbg.break_at(self._name(arg, 'break'))}")

    def do_compare(self, _):
        """compare: every value computed so far against the unsharded function."""
        self._say(str(self.dbg.compare(rtol=self.args.rtol, atol=self.args.atol)))

    def do_where(self, _):
        """where: the next stage to run."""
        self._say("finished" if self.dbg.done else f"next: stage {self.dbg.stage} of {len(self.dbg.plan.stages)}")

    def do_quit(self, _):
        """quit: leave the debugger."""
        return True

    do_n, do_p, do_b, do_c, do_q, do_EOF = do_next, do_print, do_break, do_continue, do_quit, do_quit
