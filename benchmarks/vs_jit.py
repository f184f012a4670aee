"""Side-by-side benchmark: shardprop (each strategy) against jax.jit (GSPMD/Shardy) on the same mesh and input
shardings. Reports per workload the collective bytes per device from both compiled HLOs and the median
runtime ratio over interleaved runs (these 2-core machines are noisy: read ratios, not absolute times).

    python benchmarks/vs_jit.py [--repeats 30]

Then the per-call overhead at a small size: a cached call of a Program and of an autoshard function against the
same function under ``jax.jit`` with the same in_shardings, for arguments already placed and for NumPy arrays.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository's examples/, from anywhere

import jax

jax.config.update("jax_num_cpu_devices", 8)

import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import shardprop as sp  # noqa: E402
from examples import attention, layernorm, mlp  # noqa: E402
from shardprop.cli.demo import nx_example  # noqa: E402


def workloads():
    rng = np.random.default_rng(0)

    def arr(*shape):
        return rng.normal(size=shape).astype(np.float32)

    col, row = P(None, "j"), P("j", None)
    block = attention.init_block(d_model=128, n_heads=4, d_ff=256)
    block_specs = ({"wq": col, "wk": col, "wv": col, "wo": row, "w1": col, "b1": P("j"), "w2": row, "b2": None,
                    "ln1_g": None, "ln1_b": None, "ln2_g": None, "ln2_b": None}, P("i"))
    params = mlp.init_params((256, 512, 128))
    mlp_specs = ([{"w": P(None, "j"), "b": P("j")}, {"w": P("j", None), "b": P()}], P("i"), P("i"))
    labels = rng.integers(0, 128, size=256).astype(np.int32)
    return [
        ("nx_example 1024x1024", nx_example, (P("i", "j"), P("i", "j")), (arr(1024, 1024), arr(1024, 1024))),
        ("matmul_basic", lambda a, b: a @ b, (P("i", "j"), P("j", None)), (arr(512, 1024), arr(1024, 512))),
        ("matmul_reduce_scatter", lambda a, b, c: (a @ b) * c, (P("i", "j"), P("j", None), P("i", "j")),
         (arr(512, 1024), arr(1024, 512), arr(512, 512))),
        ("mlp_train_step", mlp.train_step, mlp_specs, (params, arr(256, 256), labels)),
        ("layer_norm 2d", layernorm.layer_norm, (P("i", "j"), None, None), (arr(1024, 512), arr(512), arr(512))),
        ("transformer_block tp", attention.transformer_block, block_specs, (block, arr(16, 64, 128))),
    ]


def timed(fn, args) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    mesh = sp.make_mesh((4, 2), ("i", "j"))
    print(f"mesh {dict(mesh.shape)}, {args.repeats} interleaved repeats, median times; ratio = shardprop / jit\n")
    print(f"{'workload':24} {'strategy':10} {'bytes shardprop':>15} {'bytes jit':>10} {'time ratio':>10}")
    for name, f, specs, inputs in workloads():
        for strategy in ("gather", "auto"):
            comparison = sp.compare_with_jit(f, mesh, specs, *inputs, strategy=strategy)
            program = comparison.program
            flat, tree = jax.tree_util.tree_flatten(inputs)
            shardings = [NamedSharding(mesh, s) for s in program.graph.in_specs]
            placed = jax.tree_util.tree_unflatten(
                tree, [jax.device_put(x, s) for x, s in zip(flat, shardings, strict=True)])
            jitted = jax.jit(f)
            timed(program, placed), timed(jitted, placed)  # compile and warm up both
            ours, theirs = [], []
            for _ in range(args.repeats):  # interleaved, so both see the same machine noise
                ours.append(timed(program, placed))
                theirs.append(timed(jitted, placed))
            ratio = statistics.median(ours) / statistics.median(theirs)
            print(f"{name:24} {strategy:10} {comparison.shardprop_bytes:>15.0f} {comparison.jit_bytes:>10.0f} "
                  f"{ratio:>10.2f}")


    call_overhead(mesh, args.repeats)


def call_overhead(mesh, repeats: int, calls: int = 100) -> None:
    """Median microseconds per call (blocking on each) at a small size, interleaved rounds of ``calls`` calls."""
    print(f"\nper-call overhead, nx_example 16x8, {repeats} interleaved rounds of {calls} calls, median us per call")
    print(f"{'arguments':10} {'jax.jit':>8} {'Program':>8} {'ratio':>6} {'autoshard':>10} {'ratio':>6}")
    a = np.linspace(-1, 1, 128, dtype=np.float32).reshape(16, 8)
    sharding = NamedSharding(mesh, P("i", "j"))
    fs = sp.autoshard(nx_example, mesh=mesh, in_specs=(P("i", "j"), P("i", "j")))
    placed = (jax.device_put(a, sharding), jax.device_put(a + 1, sharding))
    functions = {"jit": jax.jit(nx_example, in_shardings=(sharding, sharding)), "program": fs.trace(*placed),
                 "autoshard": fs}
    for kind, args in (("jax.Array", placed), ("NumPy", (a, a + 1))):
        per_call = {name: [] for name in functions}
        for f in functions.values():
            for _ in range(20):
                jax.block_until_ready(f(*args))
        for _ in range(repeats):
            for name, f in functions.items():
                start = time.perf_counter()
                for _ in range(calls):
                    jax.block_until_ready(f(*args))
                per_call[name].append((time.perf_counter() - start) / calls * 1e6)
        jit, prog, auto = (statistics.median(per_call[n]) for n in ("jit", "program", "autoshard"))
        print(f"{kind:10} {jit:>8.0f} {prog:>8.0f} {prog / jit:>6.2f} {auto:>10.0f} {auto / jit:>6.2f}")


if __name__ == "__main__":
    main()
