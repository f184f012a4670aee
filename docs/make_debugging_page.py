"""Write docs/debugging.md, pasting the real output of every snippet and command it shows:
`python docs/make_debugging_page.py` (tests/test_docs.py checks that the page is current, timings aside)."""

from __future__ import annotations

import contextlib
import io
import pathlib
import re
import shlex
import subprocess
import sys
import tempfile
import textwrap

import jax

jax.config.update("jax_num_cpu_devices", 8)

ROOT = pathlib.Path(__file__).resolve().parents[1]
CLI = ["shardprop", "debug", "shardprop/examples/inspect_example.py:nx", "--mesh", "i=4,j=2", "--arg", "f32[16,8]@P(i,j)",
       "--arg", "f32[16,8]", "--strategy", "gather", "--repeats", "3"]
SPEED = ROOT / "docs" / "debugging_speed.txt"
PROMPT_INPUT = "break e\ncontinue\nprint e\nnext\nwhere\nquit\n"

SETUP = """
import numpy as np
from jax.sharding import PartitionSpec as P
import shardprop as sp
from shardprop.examples.debug_example import log_returns
from shardprop.examples.inspect_example import nx

mesh = sp.make_mesh((4, 2), ("i", "j"))
a = np.arange(128, dtype=np.float32).reshape(16, 8)
b = np.linspace(-1, 1, 128, dtype=np.float32).reshape(16, 8)
"""


class Session:
    """Runs snippets in one namespace; each returns its code and what it printed."""

    def __init__(self):
        sys.path.insert(0, str(ROOT))
        self.namespace: dict = {}
        self.run(SETUP)

    def run(self, code: str) -> str:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(textwrap.dedent(code), self.namespace)  # noqa: S102  (our own snippets)
        return out.getvalue().rstrip().replace(str(ROOT) + "/", "")

    def block(self, code: str) -> str:
        code = textwrap.dedent(code).strip()
        output = self.run(code)
        return f"```python\n{code}\n```\n\n```text\n{output}\n```\n"


def run_cli(argv: list[str], stdin: str | None = None) -> str:
    """The output of ``shardprop argv[1:]`` reading ``stdin``, run in this process (the page's snippets and commands
    share one JAX start; tests/test_cli.py runs each command in a process of its own)."""
    sys.path.insert(0, str(ROOT))
    from tests.cli import shardprop

    with contextlib.chdir(ROOT):
        done = shardprop(*argv[1:], stdin=stdin)
    if done.returncode != 0:
        raise RuntimeError(f"shardprop {' '.join(argv[1:])} failed ({done.returncode}): {done.stderr}")
    return done.stdout.rstrip().replace(str(ROOT) + "/", "")


def cli_block(argv: list[str], stdin: str | None = None) -> str:
    shown = " ".join(shlex.quote(a) if a != argv[0] else a for a in argv)
    if stdin is not None:
        typed = stdin.strip().replace("\n", "\\n")
        shown = f"printf '{typed}\\n' | {shown}"
    return f"```bash\n{shown}\n```\n\n```text\n{run_cli(argv, stdin)}\n```\n"


def saved_stage(s: Session) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        s.namespace["repro_dir"] = tmp
        code = """
            prog = sp.autoshard(nx, mesh=mesh, in_specs=(P("i", "j"), None), strategy="gather").trace(a, b)
            script = sp.Debugger(prog, a, b).save_stage(1, repro_dir)
            print(sorted(p.name for p in script.parent.iterdir()))
        """
        text = s.block(code).replace(tmp, "repro")
        run = subprocess.run([sys.executable, "-I", str(pathlib.Path(tmp) / "run_stage_1.py")], capture_output=True,
                             text=True, check=True, timeout=300)
    return text + f"\n```bash\npython repro/run_stage_1.py   # a fresh process: jax and numpy only\n```\n\n" \
                  f"```text\n{run.stdout.rstrip()}\n```\n"


def speed() -> str:
    return f"```text\n{SPEED.read_text().rstrip()}\n```\n\nSo stepping and comparing every one of 10^4 " \
           "values costs about ten compiles of the whole program (most of it compiling the read-outs); " \
           "`keep=\"all\"` moves the read-out into stepping. `docs/debugging_speed.txt` holds the figures " \
           "(`python benchmarks/debugger_speed.py` prints them with a breakdown of where the time goes)."


def page() -> str:
    s = Session()
    return f"""# Debugging a sharded program, stage by stage

A `Program` runs as stages — each one `jax.shard_map` — under one `jax.jit`. When its result is wrong, NaN or
slow, `sp.Debugger(prog, *args)` walks the same program the way it runs: one stage at a time, each
stage the same `shard_map` the program is made of but jitted on its own, so you can stop between stages, read
every device's block of any value, check that the devices hold what the plan says, compare every value with the
unsharded function and find the first node that goes wrong.

| question | Python | command line |
|---|---|---|
| run one stage and see what it did | `dbg.step()`, `dbg.run_to(k)`, `dbg.run()`, `dbg.reset()` | `shardprop debug F.py:f ...` |
| stop before the stage computing `e` | `dbg.break_at("e")` | `--interactive`: `break e`, `continue` |
| the value of `e`, and each device's block | `dbg.value("e")`, `dbg.blocks("e")` | `print e`, `blocks e` |
| does every device hold what the plan says? | `dbg.check()` | (in the text output) |
| where does the first NaN appear? | `dbg.first_nonfinite()` | (in the text output) |
| which node goes wrong first? | `dbg.compare()`, `dbg.first_divergence()` | (after every stage, and at the end) |
| which stage is slow or chatty? | `dbg.profile()` | (at the end) |
| a stage for a bug report | `dbg.save_stage(k, "repro/")` | `--save-stage K DIR` |

Values are named as in the listing (`"e"`), by value id, or by the `Node`. `keep="outputs"` (the default) keeps
stage outputs and recomputes an intermediate when asked for it (its stage run once more with it as an extra
output); `keep="all"` keeps every value as stages run. The debugger never changes the program: `prog(*args)`
returns what it returned before. Every output below was pasted by `docs/make_debugging_page.py` from running
it, on [`shardprop/examples/inspect_example.py`](../shardprop/examples/inspect_example.py) and
[`shardprop/examples/debug_example.py`](../shardprop/examples/debug_example.py) with

```python
{SETUP.strip()}
```

## Stepping

`dbg.step()` runs the next stage and returns its summary: its ops, what it reads (and the gathers that bring it
in) and returns, the wall time of the run (compiling excluded) and the bytes its compiled HLO moves per device.

{s.block('''
prog = sp.autoshard(nx, mesh=mesh, in_specs=(P("i", "j"), None), strategy="gather").trace(a, b)
print(prog.graph)
dbg = sp.Debugger(prog, a, b)
print(dbg.step())
''')}
`dbg.value(name)` is the global value as the program holds it on the mesh (a `jax.Array` with its sharding);
`dbg.blocks(name)` lists, in mesh order, each device's id, its mesh coordinates, the global index ranges its
block covers (from the value's shards) and the block. They reassemble to the value.

{s.block('''
print(dbg.value("c").sharding.spec)
for block in dbg.blocks("c")[:3]:
    print(block.where(), "holds", block.data.shape)
print(dbg.blocks("c")[1].data)
''')}
`dbg.break_at("i")` makes `dbg.run()` stop before the stage that computes `i` (as in pdb, `run()` always runs
the stage it stands before); `dbg.run()` with no breakpoint ahead runs to the end, and `dbg.outputs` is then
exactly what `prog(a, b)` returns.

{s.block('''
dbg = sp.Debugger(prog, a, b)                  # a fresh debugger
print(dbg.break_at("i"))                # the stage that computes i
dbg.run()
print(dbg.stage, dbg.done)
dbg.run()
print(dbg.done, np.array_equal(dbg.outputs, prog(a, b)), dbg.outputs.sharding.spec)
''')}
## Comparing with the unsharded function

`dbg.compare()` evaluates the traced graph unsharded, on one device, node by node on the same inputs — each
node's own JAX primitive on whole arrays; no shardprop rule, plan or lowering takes part — and reports each
value's error. The default tolerance is the value's own: 100 ulps relative, and as much absolute relative to each
element's own magnitude, at least the median of its elements' — nothing upstream sets it, and no far larger element
beside it: a causal mask's `-1e9` or a rotary embedding's `10000.0` loosens no element but its own. A value further off than that is judged by the node-local yardstick
below: if its node, computed unsharded from its *sharded* operands, gives the sharded value (within a rounding unit
of the terms each element is made of: a sum's terms, an addition's operands) and those operands agree, the
difference is theirs carried through — an optimizer dividing by a gradient near 0 amplifies rounding a
thousandfold — and the value agrees. `rtol=` and `atol=` override the defaults.

{s.block('''
print(dbg.compare())
print(dbg.first_divergence(), dbg.check(), dbg.first_nonfinite())
''')}
## Finding a planted bug

Here is what a lowering bug looks like. We plant one — the step that finishes a partial sum with a `psum`
forgets to — and debug the `collective` strategy's program, where both sums are finished that way.
`first_divergence()` names the first node at fault: its value differs from the unsharded function's, and
computed unsharded from its own *sharded* operands it gives another value — so what it was given is right and
what it made of it is not: the fault is that node's rule or its lowering. (A value that differs only because
its operands do — rounding carried through — is not blamed: the table marks every value whose own node is at
fault `FAULT`, and those that only inherit a difference `differs`.) `check()` sees the same bug from the other side: the plan says `e` is
replicated over `j`, but the two devices of each `j` pair hold different partial sums.

{s.block('''
from shardprop.backends import evaluate
real_step = evaluate.apply_step   # the planted bug: every psum skipped
evaluate.apply_step = lambda x, step, mesh_shape: x if step.kind == "psum" else real_step(x, step, mesh_shape)

buggy = sp.autoshard(nx, mesh=mesh, in_specs=(P("i", "j"), None), strategy="collective").trace(a, b)
dbg = sp.Debugger(buggy, a, b)
print(dbg.compare())
print(dbg.first_divergence())
for finding in dbg.check()[:2]:
    print(finding)
evaluate.apply_step = real_step
''')}
## A causal language model

The same plant on the Llama-style training step of `shardprop/examples/llama.py` (RMSNorm, rotary embeddings,
grouped-query attention under a causal mask of `-1e9`, SwiGLU, a hand-written AdamW) under Megatron, this time
only the psums over `data` skipped — the gradient sums over the batch. The correct program agrees everywhere; the
planted one is caught at the first value the missing psum touches, the loss's mean, with its line:

{s.block('''
import jax
from shardprop.examples import llama

lm_mesh = sp.make_mesh((4, 2), ("data", "model"))
params = llama.init_llama(layers=1)
zeros = jax.tree_util.tree_map(np.zeros_like, params)
tokens, targets = (np.random.default_rng(k).integers(0, 128, size=(8, 16)).astype(np.int32) for k in (1, 2))
column, row = P(None, "model"), P("model", None)
layer = {"attn_norm": P(), "wq": column, "wk": column, "wv": column, "wo": row, "mlp_norm": P(),
         "w_gate": column, "w_up": column, "w_down": row}
specs = {"embed": P(), "layers": [layer], "final_norm": P(), "lm_head": P()}
lm = sp.autoshard(llama.llama_train_step, mesh=lm_mesh, in_specs=(specs, specs, specs, P("data"), P("data")))
lm_prog = lm.trace(params, zeros, zeros, tokens, targets)
print(sp.Debugger(lm_prog, params, zeros, zeros, tokens, targets).compare().agree)

evaluate.apply_step = (lambda x, step, mesh_shape: x if step.kind == "psum" and "data" in step.mesh_axes
                       else real_step(x, step, mesh_shape))
dbg = sp.Debugger(lm_prog, params, zeros, zeros, tokens, targets)
found = dbg.first_divergence()
print(f"the first at fault: `{found.where.op}` at {found.where.source.rsplit('/', 1)[-1]}, stage {found.where.stage}")
print(*(line.split(" inside")[0].rsplit(" ", 1)[0] for line in found.decision if line.startswith("finished")))
evaluate.apply_step = real_step
''')}
`tests/debug/test_llama_faults.py` removes each collective kind in turn — a psum, an all-gather, an all-to-all —
and checks that `first_divergence()`, at default settings, names the op the missing collective feeds and its line.

## The first NaN

`dbg.first_nonfinite()` finds the first NaN or infinity in program order — arguments first, then stage by
stage, node by node — and names the node, its source line, the device and the element.

{s.block('''
prices = np.linspace(1, 2, 128, dtype=np.float32).reshape(16, 8)
prices[5, 3] = -1.0                                   # a bad tick
prog = sp.autoshard(log_returns, mesh=mesh, in_specs=(P("i"),)).trace(prices)
print(sp.Debugger(prog, prices).first_nonfinite())
''')}
## Profiling

`dbg.profile(repeats=10)` runs every stage on its own `repeats` times: the median wall time, the collectives in
its compiled HLO and the bytes they move per device, next to the cost model's estimate.

{s.block('''
dbg = sp.Debugger(prog, prices)
print(dbg.profile(repeats=5))
''')}
## A stage as a standalone reproducer

`dbg.save_stage(k, directory)` writes stage `k` as a serialized `jax.export` artifact, its inputs and the
outputs it gave (`.npz`, with a JSON manifest of specs and dtypes) and a short script that needs only JAX: it
builds a mesh of the same shape, places the inputs as they were held, runs the stage and compares. Something to
attach to a bug report, without the model code.

{saved_stage(s)}
## From the command line

`shardprop debug` takes the `inspect` arguments (arrays are filled from `--seed`, or read with
`--arg @x.npy@P(i,j)`; a function of pytrees takes `--args PATH.py:EXAMPLE`, `--args FILE.npz` or `--args FILE.npy`,
repeated in positional order, with `--in-specs`), steps every stage printing its summary and its comparison with the
unsharded function, and ends with the first divergence (or "all N values agree"), the promises checked, the first
non-finite value if any, and the profile. `--format json` gives the same for tools; `--save-stage K DIR` saves a stage.

The exit status says what the run found, so that a script or a CI job can gate on it: 0 when every value agrees
with the unsharded function, every promise holds and no value is NaN or infinite; 1 when it finds a divergence, a
broken promise or a non-finite value (in the arguments too; standard error then says which); 2 when the command
itself fails (a bad option, a function that does not trace). `--interactive` exits 0.

{cli_block(CLI)}
`--interactive` stops at a prompt between stages: `next`, `print NAME`, `blocks NAME`, `break NAME`,
`continue`, `compare`, `where`, `quit`.

{cli_block([*CLI, "--interactive"], stdin=PROMPT_INPUT)}
## On several processes

On a mesh that spans several processes (`sp.distributed`), every process steps the same program.
`dbg.blocks(name)` shows this process's blocks, and `dbg.blocks(name, all_processes=True)` gathers the rest.
`check`, `compare`, `first_divergence` and `first_nonfinite` gather every device's block and give the same answer
on every process. Every process must make the same debugger calls in the same order, as it calls the program. A
call made out of step is an `sp.OutOfStepError` naming it, not a deadlock. `shardprop launch -n 2 -- shardprop
debug ...` runs the command above on a local cluster, and process 0 prints the report. See
[distributed.md](distributed.md#the-debugger-on-every-process), with real output.

## Speed

Stepping compiles every stage on its own — XLA cannot fuse across stages, so stepping a whole program costs
1.5–2.5 times one compile of it. Reading a stage's intermediates out (for `compare()`, `check()`, or a value
asked for under `keep="outputs"`) runs the stage again as segments of at most 512 nodes that return every value
they compute: XLA spends about a millisecond per returned value compiling them (once per stage; a value asked for
later re-runs compiled segments). The unsharded reference is cheap (one eager dispatch per node, under half a
second for 10^4 nodes). `benchmarks/debugger_speed.py` measures it on a program of about 10^4 nodes (8 blocks
of 180 elementwise updates, each block ended by reductions over sharded axes), 2-core machine, one run:

{speed()}
"""


def normalized(text: str) -> str:
    """The page with what changes from run to run masked: timings, shares and table widths."""
    text = re.sub(r"\d+(\.\d+)? ms", "T ms", text)
    text = re.sub(r"\d+%", "P%", text)
    text = re.sub(r"━+", "━", text)
    return re.sub(r"[ \t]+", " ", text)


if __name__ == "__main__":
    (ROOT / "docs" / "debugging.md").write_text(page())
