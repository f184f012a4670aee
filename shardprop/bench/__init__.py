"""``shardprop bench``: shardprop against ``jax.jit`` on the same meshes and input shardings, side by side.

Start at :func:`~shardprop.bench.run.run_benchmark` (measure every row into one document) and
:func:`~shardprop.bench.run.write` (the JSON, the plots and ``benchmarks.md``). The rows are
:mod:`~shardprop.bench.workloads` (the project's own models and loops, in :mod:`~shardprop.bench.models`) and
:mod:`~shardprop.bench.libraries` (flax, equinox, haiku, optax); :mod:`~shardprop.bench.measure` measures one,
:mod:`~shardprop.bench.timing` holds the clocks, :mod:`~shardprop.bench.goals` the goals a run is held to, and
:mod:`~shardprop.bench.report` and :mod:`~shardprop.bench.plots` write the results.
"""
