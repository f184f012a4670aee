"""The ``shardprop`` command line (``shardprop demo``, or ``python -m shardprop demo``)."""

from __future__ import annotations

import argparse
import sys


def _configure_devices(count: int) -> None:
    # Must run before JAX initialises its backend: virtual CPU devices so meshes of 8 work anywhere.
    import jax

    jax.config.update("jax_num_cpu_devices", count)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="shardprop", description="shardprop: symbolic sharding propagation for JAX functions.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="shard the Nx example and a small MLP on 8 CPU devices and check them")
    demo.add_argument("--devices", type=int, default=8, help="number of virtual CPU devices (default 8)")
    args = parser.parse_args(argv)
    if args.command == "demo":
        _configure_devices(args.devices)
        from .demo import run

        return 0 if run() else 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
