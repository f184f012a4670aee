"""The ``shardprop`` command line: ``shardprop demo``, ``shardprop inspect``, ``shardprop plan``, ``shardprop debug``,
``shardprop bench`` and ``shardprop launch`` (or ``python -m shardprop``).

Applications built on the library, kept out of its top level: ``demo.py`` (the Nx example and a small MLP,
sharded and checked), ``inspect.py`` (the ``inspect`` front end), ``plan.py`` (the layout search's front end),
``debug.py`` (the ``debug`` front end), ``bench.py`` (the benchmark against ``jax.jit``) and ``launch.py`` (a local
multi-process cluster).
"""

from __future__ import annotations

import argparse
import sys

from ..errors import ShardingError
from . import bench as bench_cli
from . import debug as debug_cli
from . import docs as docs_cli
from . import inspect as inspect_cli
from . import launch as launch_cli
from . import plan as plan_cli


def _configure_devices(count: int) -> None:
    # Must run before JAX initialises its backend: virtual CPU devices so meshes of 8 work anywhere. Started by
    # `shardprop launch`, the process joins its cluster instead: the mesh spans every process's devices.
    import os

    from .. import distributed

    if os.environ.get(distributed.COORDINATOR):
        distributed.initialize()
        return
    import jax

    jax.config.update("jax_num_cpu_devices", count)


# the subcommands, in the order the help lists them (the documentation site's command-line page shows each one's help)
COMMANDS = ("demo", "inspect", "plan", "debug", "bench", "launch", "docs")


def parser() -> argparse.ArgumentParser:
    """The ``shardprop`` command's argument parser, every subcommand of ``COMMANDS`` on it."""
    from .. import __version__

    command = argparse.ArgumentParser(
        prog="shardprop", description="shardprop: symbolic sharding propagation for JAX functions.")
    command.add_argument("--version", action="version", version=f"shardprop {__version__}")
    sub = command.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="shard the Nx example and a small MLP on 8 CPU devices and check them")
    demo.add_argument("--devices", type=int, default=8, help="number of virtual CPU devices (default 8)")
    for front_end in (inspect_cli, plan_cli, debug_cli, bench_cli, launch_cli, docs_cli):
        front_end.add_parser(sub)
    assert tuple(sub.choices) == COMMANDS, tuple(sub.choices)
    return command


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "demo":
        _configure_devices(args.devices)
        from .demo import run

        return 0 if run() else 1
    if args.command == "launch":
        return launch_cli.run(args)
    runs = {"inspect": inspect_cli.run, "plan": plan_cli.run, "debug": debug_cli.run, "bench": bench_cli.run,
            "docs": docs_cli.run}
    if args.command in runs:
        try:
            return runs[args.command](args, _configure_devices)
        except ShardingError as err:
            print(f"shardprop {args.command}: {type(err).__name__}: {err}", file=sys.stderr)
            return 2
    return 2


if __name__ == "__main__":
    sys.exit(main())
