"""Side-by-side benchmark: shardprop (each strategy) against jax.jit (GSPMD/Shardy) on the same mesh and input
shardings. Reports per workload the collective bytes per device from both compiled HLOs and the median
runtime ratio over interleaved runs (these 2-core machines are noisy: read ratios, not absolute times).

    python benchmarks/vs_jit.py [--repeats 30]

Then the per-call overhead at a small size: a cached call of a Program and of an autoshard function against the
same function under ``jax.jit`` with the same in_shardings, for arguments already placed and for NumPy arrays, called
with the same shapes every time and alternating between two shapes (train and eval batches).

``shardprop bench`` is the full benchmark (more workloads, loops, flax/equinox/haiku/optax models, memory, compile
times, pass scaling, docs/benchmarks.md); this script keeps the
shardprop/examples/ rows of docs/performance.md, timed with the same clocks (``shardprop.bench.timing``).
"""

from __future__ import annotations

import argparse

import jax

jax.config.update("jax_num_cpu_devices", 8)

import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import shardprop as sp  # noqa: E402
from shardprop.examples import attention, layernorm, mlp  # noqa: E402
from shardprop.bench.report import overhead_lines  # noqa: E402
from shardprop.bench.timing import interleaved, small_call_overhead  # noqa: E402
from shardprop.bench.models import nx_example  # noqa: E402


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    mesh = sp.make_mesh((4, 2), ("i", "j"))
    print(f"mesh {dict(mesh.shape)}, {args.repeats} interleaved rounds, median of per-round ratios shardprop / jit\n")
    print(f"{'workload':24} {'strategy':10} {'bytes shardprop':>15} {'bytes jit':>10} {'time ratio':>10}")
    for name, f, specs, inputs in workloads():
        for strategy in ("gather", "auto"):
            comparison = sp.compare_with_jit(f, mesh, specs, *inputs, strategy=strategy)
            program = comparison.program
            flat, tree = jax.tree_util.tree_flatten(inputs)
            shardings = [NamedSharding(mesh, s) for s in program.in_specs]
            placed = jax.tree_util.tree_unflatten(
                tree, [jax.device_put(x, s) for x, s in zip(flat, shardings, strict=True)])
            runtime = interleaved(program, jax.jit(f), placed, args.repeats)
            print(f"{name:24} {strategy:10} {comparison.shardprop_bytes:>15.0f} {comparison.jit_bytes:>10.0f} "
                  f"{runtime.ratio:>10.2f}")
    print(f"\nper-call overhead, nx_example 16x8 (alternating: with 8x8), {args.repeats} interleaved rounds of 100 "
          "calls, median per call")
    print("\n".join(overhead_lines(small_call_overhead(mesh, args.repeats))))


if __name__ == "__main__":
    main()
