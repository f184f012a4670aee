"""How fast is the stage-by-stage debugger (``sp.Debugger``) on a ~10^4-node program, next to compiling the whole
program once?

The program is a deep stack of elementwise ops on an array sharded over both mesh axes, broken every few hundred
ops by reductions over sharded axes (a mean over ``j``, a max over ``i``, a contraction over ``j``), so the plan
has several stages and, under ``strategy="auto"``, both gathers at stage boundaries and collectives inside
stages. Per strategy it measures, in seconds and as a multiple of one whole-program compile:

  trace      ``fs.trace(*args)``: trace, propagate, split, lower
  compile    ``prog.lower(*args).compile()``: the whole program, once (the yardstick)
  step       ``sp.Debugger(prog, *args).run()``: every stage jitted, compiled and run on its own
  compare    ``dbg.compare()``: every value against the unsharded reference (``table.agree`` must be True)
  first div  ``dbg.first_divergence()`` right after ``compare()`` (the debugger keeps the comparison made by
             ``compare()``, so this is the cost of a second question, not of a fresh comparison)
  step/cmp   the same two with ``keep="all"`` (every intermediate kept while stepping)

The headline figure is (step + compare) / compile. Each debugger phase is also broken down (``Session.
compiled_stage``, ``Session._run``, ``Session.readout``, ``Reference.evaluate``, the device-to-host copies and
the numpy error computation, and XLA's backend compile time from ``jax.monitoring``) to show where the time goes.

    python benchmarks/debugger_speed.py [--blocks 8] [--steps 180] [--strategies auto gather]
"""

from __future__ import annotations

import jax

jax.config.update("jax_num_cpu_devices", 8)

import argparse  # noqa: E402
import collections  # noqa: E402
import functools  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from contextlib import contextmanager  # noqa: E402

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import shardprop as sp  # noqa: E402
from shardprop.backends import parse_hlo  # noqa: E402
from shardprop.debug import comparison as comparison_module  # noqa: E402
from shardprop.debug import reference as reference_module  # noqa: E402
from shardprop.debug.session import Session  # noqa: E402


def program(x, w, blocks: int, steps: int):
    """``blocks`` blocks of ``steps`` elementwise updates (about 7 graph nodes each, no communication), each
    block finished by reductions over sharded axes. Mixing the input back in keeps the values from collapsing
    onto one fixed point (which would make ``x - mean(x)`` pure cancellation, unfair to any comparison)."""
    x0 = x
    for b in range(blocks):
        for _ in range(steps):
            x = jnp.tanh(x * 0.9 + x0) - 0.05 * x
        x = x - jnp.mean(x, axis=1, keepdims=True)  # a reduction over j
        x = x / (jnp.max(jnp.abs(x), axis=0) + 1.0)  # a reduction over i
        if b % 2 == 0:
            x = jnp.tanh(x @ w)  # a contraction over j
    return x.sum()


# -- where the time goes ------------------------------------------------------------------------------------
class Breakdown:
    """Seconds spent inside a few debugger functions, and in XLA's backend compile attributed to the innermost of
    them running (wrappers installed once, on the classes; ``measure`` starts a fresh count)."""

    WRAPPED = ((Session, "compiled_stage", "stage compile"), (Session, "_run", "stage run"),
               (Session, "readout", "stage read-out"),
               (reference_module.Reference, "evaluate", "reference evaluate"),
               (comparison_module, "as_numpy", "device-to-host"), (comparison_module, "errors", "numpy errors"))

    def __init__(self):
        self.seconds: collections.Counter[str] = collections.Counter()
        self.calls: collections.Counter[str] = collections.Counter()
        self._where: list[str] = []
        for owner, attr, label in self.WRAPPED:
            if hasattr(owner, attr):  # the debugger is young: tolerate a renamed helper
                setattr(owner, attr, self._timed(getattr(owner, attr), label))
        jax.monitoring.register_event_duration_secs_listener(self._jax_event)

    def _timed(self, fn: Callable, label: str) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            self._where.append(label)
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[label] += time.perf_counter() - start
                self.calls[label] += 1
                self._where.pop()

        return wrapper

    def _jax_event(self, event: str, duration: float, **_) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            where = self._where[-1] if self._where else "elsewhere"
            self.seconds[f"XLA compile in {where}"] += duration
            self.calls[f"XLA compile in {where}"] += 1

    @contextmanager
    def measure(self, into: dict[str, float], name: str):
        """Time the block into ``into[name]``; the breakdown starts from zero for it."""
        self.seconds.clear()
        self.calls.clear()
        start = time.perf_counter()
        yield
        into[name] = time.perf_counter() - start

    def lines(self, total: float) -> list[str]:
        s = self.seconds
        compile_ = s["stage compile"]
        parts = [("stage compiles (Session.compiled_stage)", compile_, self.calls["stage compile"]),
                 ("stage runs (Session._run minus compiles)", s["stage run"] - compile_, self.calls["stage run"]),
                 ("intermediates read out (Session.readout)", s["stage read-out"], self.calls["stage read-out"]),
                 ("reference (Reference.evaluate)", s["reference evaluate"], self.calls["reference evaluate"]),
                 ("device-to-host copies (as_numpy)", s["device-to-host"], self.calls["device-to-host"]),
                 ("numpy error computation (errors)", s["numpy errors"], self.calls["numpy errors"])]
        rest = total - sum(p[1] for p in parts)
        out = [f"    {name:44} {sec:7.2f}s {sec / total:5.0%}  ({calls} calls)" for name, sec, calls in parts if calls]
        out.append(f"    {'everything else':44} {rest:7.2f}s {rest / total:5.0%}")
        for key in sorted(k for k in s if k.startswith("XLA compile")):
            out.append(f"      of which {key:35} {s[key]:7.2f}s {s[key] / total:5.0%}  ({self.calls[key]} compiles)")
        return out


# -- one strategy -------------------------------------------------------------------------------------------
def bench(strategy: str, mesh, args: tuple, blocks: int, steps: int, breakdown: Breakdown) -> dict[str, float]:
    t: dict[str, float] = {}
    fs = sp.autoshard(lambda x, w: program(x, w, blocks, steps), mesh=mesh, in_specs=(P("i", "j"), None),
                      strategy=strategy)
    with breakdown.measure(t, "trace"):
        prog = fs.trace(*args)
    with breakdown.measure(t, "compile"):
        compiled = prog.lower(*args).compile()
    kinds = collections.Counter(str(tr.kind) for tr in parse_hlo(compiled.as_text(), mesh))
    collectives = ", ".join(f"{k} x{n}" for k, n in sorted(kinds.items())) or "none"
    print(f"\n== strategy={strategy!r}: {len(prog.sharded.graph.nodes)} nodes, {len(prog.stages)} stages; "
          f"collectives in the whole program's HLO: {collectives}")
    print(f"  trace+propagate+split+lower {t['trace']:.2f}s, whole-program compile {t['compile']:.2f}s")

    for keep, suffix in (("outputs", ""), ("all", " keep=all")):
        dbg = sp.Debugger(prog, *args, keep=keep)
        with breakdown.measure(t, "step" + suffix):
            dbg.run()
        print(f"  [keep={keep!r}] step (dbg.run()) {t['step' + suffix]:.2f}s")
        print("\n".join(breakdown.lines(t["step" + suffix])))
        with breakdown.measure(t, "compare" + suffix):
            table = dbg.compare()
        print(f"  [keep={keep!r}] dbg.compare() {t['compare' + suffix]:.2f}s; agree={table.agree}: {table.summary()}")
        print("\n".join(breakdown.lines(t["compare" + suffix])))
        if not table.agree:
            print(f"  WARNING: the sharded program disagrees with the reference (strategy={strategy!r})")
        if keep == "outputs":
            with breakdown.measure(t, "first divergence"):
                divergence = dbg.first_divergence()
            print(f"  [keep={keep!r}] dbg.first_divergence() {t['first divergence']:.2f}s -> "
                  f"{'None' if divergence is None else divergence.where}")
        del dbg
    return t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=8, help="blocks of elementwise ops, each ended by reductions")
    parser.add_argument("--steps", type=int, default=180, help="elementwise updates per block (~7 nodes each)")
    parser.add_argument("--strategies", nargs="+", default=["auto", "gather"])
    parser.add_argument("--shape", type=int, nargs=2, default=(256, 128), help="the sharded argument's shape")
    opts = parser.parse_args()

    mesh = sp.make_mesh((4, 2), ("i", "j"))
    rng = np.random.default_rng(0)
    rows, cols = opts.shape
    x = rng.normal(size=(rows, cols)).astype(np.float32)
    w = (rng.normal(size=(cols, cols)) / np.sqrt(cols)).astype(np.float32)
    print(f"jax {jax.__version__}, mesh {dict(mesh.shape)}, x f32{[rows, cols]} sharded P('i', 'j'), "
          f"{opts.blocks} blocks x {opts.steps} elementwise steps")
    breakdown = Breakdown()
    start = time.perf_counter()
    results = {s: bench(s, mesh, (x, w), opts.blocks, opts.steps, breakdown) for s in opts.strategies}

    rows_ = [("trace+propagate+split+lower", "trace"), ("whole-program compile", "compile"),
             ("step: dbg.run()", "step"), ("dbg.compare()", "compare"),
             ("dbg.first_divergence() after compare", "first divergence"),
             ("step, keep='all'", "step keep=all"), ("dbg.compare(), keep='all'", "compare keep=all")]
    header = f"{'phase':38}" + "".join(f" {s + ' (s)':>13} {'x compile':>9}" for s in opts.strategies)
    print(f"\n{header}\n{'-' * len(header)}")
    for label, key in rows_:
        print(f"{label:38}" + "".join(f" {results[s][key]:13.2f} {results[s][key] / results[s]['compile']:9.1f}"
                                      for s in opts.strategies))
    for label, suffix in (("step + compare", ""), ("step + compare, keep='all'", " keep=all")):
        print(f"{label:38}" + "".join(
            f" {results[s]['step' + suffix] + results[s]['compare' + suffix]:13.2f}"
            f" {(results[s]['step' + suffix] + results[s]['compare' + suffix]) / results[s]['compile']:9.1f}"
            for s in opts.strategies))
    print("\nheadline (step + compare) / whole-program compile: "
          + ", ".join(f"{s} {(results[s]['step'] + results[s]['compare']) / results[s]['compile']:.1f}x"
                      for s in opts.strategies)
          + f"   (script total {time.perf_counter() - start:.0f}s)")


if __name__ == "__main__":
    main()
