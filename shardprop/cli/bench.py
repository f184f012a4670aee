"""``shardprop bench [--quick] [--repeats N] [--out DIR] [--json PATH] [--no-plots] [--only PATTERN]``: the benchmark
against ``jax.jit`` (see ``shardprop.bench``), written as a table, JSON, PNG plots and ``DIR/benchmarks.md``.

``DIR`` is ``./shardprop-bench`` unless ``--out`` says otherwise: a folder of its own, never the ``docs/`` of whatever
project it runs in. The project's own pages are regenerated with ``--out docs`` (which also rewrites the summary
section of ``docs/performance.md``).

It exits 0 when every row ran and equals the unsharded function, whatever the goals say (it is a measurement), and
1 when a row is wrong or fails to run."""

from __future__ import annotations

import shlex
from pathlib import Path

from ..errors import OptionError

QUICK_ROUNDS, FULL_ROUNDS = 5, 30
DEFAULT_OUT = "shardprop-bench"


def add_parser(sub) -> None:
    p = sub.add_parser(
        "bench", help="benchmark shardprop against jax.jit (bytes, memory, compile and run times) and write the report",
        description="Run the benchmark workloads through shardprop (each strategy) and jax.jit on 8 CPU devices and "
                    "write a table, JSON, PNG plots and DIR/benchmarks.md. Needs the bench extra for the library "
                    "rows and the plots: pip install \"shardprop[bench]\".")
    p.add_argument("--quick", action="store_true", help="a few rows, few rounds, scaling up to 10^4 nodes (< 2 min)")
    p.add_argument("--repeats", type=int, help=f"interleaved timing rounds per row (default {FULL_ROUNDS}, "
                                               f"{QUICK_ROUNDS} with --quick; 0 skips the runtime ratios)")
    p.add_argument("--out", default=DEFAULT_OUT,
                   help=f"directory of benchmarks.md and img/bench_*.png, or of search.md with --search (default "
                        f"./{DEFAULT_OUT}; the project's own pages: --out docs)")
    p.add_argument("--json", help="where to write the JSON (default OUT/benchmarks.json)")
    p.add_argument("--no-plots", action="store_true", help="write no PNG plots")
    p.add_argument("--search", action="store_true",
                   help="instead: the layout search (sp.AUTO) against expert layouts, written to OUT/search.md and "
                        "OUT/search.json (a few minutes)")
    p.add_argument("--iopddl", metavar="FILE", nargs="+",
                   help="instead: solve auto-sharding problems in the ASPLOS 2025 IOPDDL contest's form (.json or "
                        ".json.gz, such as google/iopddl's benchmarks/) exactly, printing each cost, the bound proved "
                        "and the time")
    p.add_argument("--time-limit", type=float, metavar="SECONDS",
                   help="with --iopddl: stop each solve after SECONDS, stating the best cost found and the bound")
    p.add_argument("--only", metavar="PATTERN",
                   help="only rows whose name, kind or parallelism contains PATTERN (such as flax, loop, 2-D or "
                        "mlp_train_step/data); leaves out the overhead and scaling sections")


def command_line(args) -> str:
    """The command as a user would type it again (only the options given)."""
    words = ["shardprop", "bench"]
    if args.quick:
        words.append("--quick")
    if args.repeats is not None:
        words += ["--repeats", str(args.repeats)]
    if args.out != DEFAULT_OUT:
        words += ["--out", args.out]
    if args.json:
        words += ["--json", args.json]
    if args.no_plots:
        words.append("--no-plots")
    if args.only:
        words += ["--only", args.only]
    if args.search:
        words.append("--search")
    if args.iopddl:
        words += ["--iopddl", *args.iopddl]
    if args.time_limit is not None:
        words += ["--time-limit", str(args.time_limit)]
    return shlex.join(words)


def run(args, configure_devices) -> int:
    rounds = args.repeats if args.repeats is not None else (QUICK_ROUNDS if args.quick else FULL_ROUNDS)
    if rounds < 0:
        raise OptionError(f"--repeats {rounds}: expected 0 or more")
    if args.iopddl:
        return run_iopddl(args)
    if args.time_limit is not None:
        raise OptionError("--time-limit applies to --iopddl's solves")
    configure_devices(8)
    if args.search:
        return run_search(args)
    from ..bench import report
    from ..bench.run import run_benchmark, stderr, write

    doc = run_benchmark(quick=args.quick, rounds=rounds, only=args.only, command=command_line(args), say=stderr)
    if not doc["rows"]:
        raise OptionError(f"--only {args.only!r}: no workload matches" if args.only else "no workload to run")
    out = Path(args.out)
    written = write(doc, out=out, json_path=Path(args.json) if args.json else out / "benchmarks.json",
                    with_plots=not args.no_plots, say=stderr)
    report.print_table(doc)
    print("\nwrote " + ", ".join(str(p) for p in written))
    bad = [f"{r['name']}/{r['parallel']}" for r in doc["rows"] if not r["correct"]]
    if bad:
        print(f"\nFAILED: {len(bad)} row(s) wrong or not run: {', '.join(bad)}")
        return 1
    return 0


def run_search(args) -> int:
    """``--search``: every model's expert layouts and the searched one, written as OUT/search.md and its JSON."""
    import json
    from dataclasses import asdict

    from ..bench import search
    from ..bench.run import stderr

    results = search.run(say=stderr)
    scaled = search.scaling(say=stderr)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "search.md").write_text(search.markdown(results, command_line(args), scaled) + "\n")
    json_path = Path(args.json) if args.json else out / "search.json"
    json_path.write_text(json.dumps({"models": [asdict(r) for r in results], "scaling": [asdict(r) for r in scaled]},
                                    indent=1, default=str) + "\n")
    print(f"wrote {out / 'search.md'}, {json_path}")
    wrong = [r.model for r in results if not all(e.equal for e in r.experts) or (r.searched and not r.searched.equal)]
    wrong += [f"stack of {r.blocks} blocks" for r in scaled if not r.equal]
    if wrong:
        print(f"FAILED: results differ from the unsharded function's: {', '.join(wrong)}")
        return 1
    return 0


def run_iopddl(args) -> int:
    """``--iopddl FILE...``: each contest problem solved by the integer program, one line each (and the JSON with
    ``--json``); exits 1 when a problem has no feasible assignment."""
    import json

    from ..search.ilp import solve
    from ..search.problem import read_problem

    rows = []
    for path in args.iopddl:
        problem = read_problem(path)
        solution = solve(problem, time_limit=args.time_limit)
        rows.append({"file": path, "name": problem.name, "nodes": problem.node_count,
                     "strategies": problem.strategy_count, "edges": len(problem.edges),
                     "usage_limit": problem.usage_limit, "cost": solution.cost, "bound": solution.bound,
                     "gap": solution.gap, "status": solution.status, "seconds": round(solution.seconds, 2),
                     "strategies_chosen": list(solution.strategies)})
        print(f"{problem.name}: {problem.node_count:,} nodes, {problem.strategy_count:,} strategies, "
              f"{len(problem.edges):,} edges — {solution.summary()}")
    if args.json:
        Path(args.json).write_text(json.dumps({"command": command_line(args), "problems": rows}, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 1 if any(r["cost"] is None for r in rows) else 0
