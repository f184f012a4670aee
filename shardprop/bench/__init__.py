"""``shardprop bench``: shardprop against ``jax.jit`` on the same meshes and input shardings, side by side.

Start at ``shardprop.bench.run.run_benchmark`` (measure every row into one document) and
``shardprop.bench.run.write`` (the JSON, the plots and ``benchmarks.md``). The rows are
``shardprop.bench.workloads`` (the project's own models and loops, in ``shardprop.bench.models``) and
``shardprop.bench.libraries`` (flax, equinox, haiku, optax); ``shardprop.bench.measure`` measures one,
``shardprop.bench.timing`` holds the clocks, ``shardprop.bench.goals`` the goals a run is held to, and
``shardprop.bench.report`` and ``shardprop.bench.plots`` write the results.
"""
