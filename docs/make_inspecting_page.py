"""Write docs/inspecting.md, pasting the real output of every command it shows:
`python docs/make_inspecting_page.py` (tests/test_docs.py checks that the page is current)."""

from __future__ import annotations

import contextlib
import json
import pathlib
import shlex
import subprocess
import sys

import jax

jax.config.update("jax_num_cpu_devices", 8)

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
NX = ["shardprop", "inspect", "shardprop/examples/inspect_example.py:nx", "--mesh", "i=4,j=2",
      "--arg", "f32[16,8]@P(i,j)", "--arg", "f32[16,8]", "--strategy", "gather"]
RNN_GRAD = ["shardprop", "inspect", "shardprop/examples/inspect_example.py:rnn_grad", "--mesh", "i=4,j=2",
            "--arg", "f32[16,16]", "--arg", "f32[6,8,16]@P(None,i)", "--arg", "f32[8,16]@P(i)"]
MATMUL = ["shardprop", "inspect", "shardprop/examples/inspect_example.py:scanned_matmul", "--mesh", "i=4,j=2",
          "--arg", "f32[16,8]@P(i,j)", "--arg", "f32[8,8]@P(j)"]


def run(argv: list[str]) -> str:
    """The output of ``shardprop argv[1:]``, run in this process (one JAX start for the page's dozen commands;
    tests/test_cli.py runs each command in a process of its own)."""
    from tests.cli import shardprop

    with contextlib.chdir(ROOT):
        done = shardprop(*argv[1:])
    if done.returncode != 0:
        raise RuntimeError(f"{shown(argv)} failed ({done.returncode}): {done.stderr}")
    return done.stdout.rstrip().replace(str(ROOT) + "/", "")


def shown(argv: list[str]) -> str:
    return " ".join(shlex.quote(a) if a != argv[0] else a for a in argv)


def block(argv: list[str], lang: str = "text", output: str | None = None) -> str:
    return f"```bash\n{shown(argv)}\n```\n\n```{lang}\n{run(argv) if output is None else output}\n```\n"


def json_excerpt() -> str:
    doc = json.loads(run([*NX, "--format", "json", "--lineage", "0:0,1"]))
    excerpt = {
        "schema": doc["schema"], "mesh": doc["mesh"], "strategy": doc["strategy"], "inputs": doc["inputs"],
        "outputs": doc["outputs"], "values": doc["values"][2:3], "nodes": doc["nodes"][4:5],
        "stages": doc["stages"][1:2], "lineage": doc["lineage"],
    }
    return json.dumps(excerpt, indent=1)


def page() -> str:
    return f"""# Inspecting shard graphs

shardprop's passes produce plain data — a sharded graph, a plan of stages — and everything on this page
reads those products; nothing here changes them. Each view is a Python function (`import shardprop as sp`)
and a `shardprop inspect` option:

| question | Python | command line |
|---|---|---|
| what does every tensor look like, stage by stage? | `print(prog.graph)`, `sp.show(prog)` | `shardprop inspect F.py:f ...` |
| what does each stage receive, compute and send? | `sp.stage_table(prog)` | (in the text output) |
| why does this axis have this sharding? | `sp.explain(prog, "e")` | `--explain e` |
| which input elements does this output block need? | `sp.lineage(prog, output=0, block=(0, 1))` | `--lineage 0:0,1` |
| which device holds which block? | `sp.show_blocks(prog, "c")` | `--blocks c` |
| a picture | `sp.to_dot(prog)`, `sp.render(prog, "graph.svg")` | `--format dot`, `--format svg` |
| everything, for a tool | `sp.to_json(prog)` | `--format json` (schema: `--schema`) |

`prog` is what `sp.autoshard(f, ...).trace(*args)` returns (a `Program`); a `Plan` from `sp.split` or a
`ShardedGraph` from `sp.propagate` work too (without stages, the views that need them say so). `--brief` leaves the listing and the stage table out
of the text output, keeping only what `--explain`, `--lineage` and `--blocks` ask for. Every output
below was pasted by `docs/make_inspecting_page.py` from running the command shown, on
[`shardprop/examples/inspect_example.py`](../shardprop/examples/inspect_example.py).

## The annotated listing and the stage table

The listing is the program's sharded IR, stage by stage. Every value prints with its type: `16@i` is an axis of
16 elements laid out over mesh axis `i` (`@(i,j)` over both, major first; no `@` means replicated), and `{{+j}}`
after the type says the value is still a partial sum over `j` (each device holds one summand of its block).
A *ranged* axis names the rows device `k` holds: `1001@i[126k:126k+126]` (a slice, pad or concatenation along a
sharded axis keeps its rows where they are; `sp.explain` and `sp.show_blocks` list each device's real range).
Every move is an equation of the stage that runs it — `all_gather`, `all_to_all`, `ppermute`, a local `slice`,
`take_once` — and so is every collective that finishes a node (`psum`, `psum_scatter`, `pmax`, ...), each with the
bytes one device sends (ring model) or `local`. A stage takes its inputs as their source made them and moves them
itself. The stage table sums it up per stage: its inputs and where they come from, the collectives inside it
(what each does, its bytes, the node it serves) and its outputs.

{block([*NX])}
With the default strategy (`auto`) the cost model finishes both sums with collectives instead, and the whole
function is one stage:

{block([*NX[:-2], "--strategy", "auto"])}
## Why: `sp.explain` / `--explain`

For each axis of a value: if sharded, the chain of ops (with the rule that carried the sharding and the
source line) back to the input spec that started it — followed through the shard parents; if replicated,
the op that dropped the sharding and why (the first sentence of that rule's documentation), or the input
spec that never had one. A value held as a partial sum says why (`partial:`) and which collective sums it. Then
how the node consumes its operands: which sharded axes it takes whole, and the moves or the collective that pay
for it.

{block([*NX, "--brief", "--explain", "e"])}
A matmul whose result is scanned: each device scans its block of rows and `prefix[i]` adds the totals of the
blocks before it (one row per device moves, the rows stay sharded); the columns were never sharded.

{block([*MATMUL, "--brief", "--explain", "e", "--explain", "c"])}
A value is named as the listing prints it (`e`), by an argument's name or key path (`params['w']`, `[0]['w']`) or
a key of it no other argument shares (`w`: a key several share, such as a Llama's `wq` in every layer and in both
AdamW moments, is refused with their paths — a name the listing generates never shadows one of yours), by an
output's path (`out[1]`, `out[0]['w']`), or by a source line as the listing prints it: every value made there,
each explained.

{block([*NX, "--brief", "--explain", "inspect_example.py:12"])}
## Inside loops and branches

A `scan`, a `while` loop (a `fori_loop` with a traced bound) or a `cond` stays one node of its stage, and the
listing prints each of its bodies' IR indented under it — the body's values in the types each device holds its
blocks in, what it moves and the collectives that finish its nodes (on every iteration), and the carries kept
partial sums (typed `{{+i}}` inside, summed by one collective after the loop). A body's values are named by a path: `s/body/l` is
value `l` of the body of the op computing `s` (`e/cond/c` for a while loop's condition, `e/branch1/c` for a
branch of a `cond`; nested loops continue the path). `sp.explain` and `--explain` take those paths. The
gradient of a small RNN (batch sharded over `i`): the backward scan's weight gradient is a sum over the batch;
each device keeps its partial sum through the loop and one all-reduce finishes it after the last step. (The
outputs on this page are jax 0.10.2's. jax 0.11 and later write tanh's derivative as one primitive,
`one_minus_square`, so under them this program has a few values fewer and the ones after them have other names.)

{block([*RNN_GRAD, "--explain", "s/body/l"])}
`sp.lineage` follows a block through loops too: a `scan` block reads the same iterations of `xs` (and every
earlier one, through the carry), a `while` loop's block what its body and its condition read on every
iteration (see below).

## Lineage: `sp.lineage` / `--lineage`

The Nx idea of following an output section back to the inputs. `sp.lineage(prog, output=0, block=(0, 1))`
takes block `(0, 1)` of output 0 — blocks indexed along each axis as laid out on the mesh — and returns, for
every flat input, a list of boxes (one `(start, stop)` per axis) whose union is the set of input elements
that block depends on. `value="e"` asks about an intermediate value instead; `block=None` about all of it.

```python
>>> sp.lineage(prog, output=0, block=(0, 1))
{sp_lineage_repr()}
```

so output block `(0, 1)` (rows 0:4, columns 4:8) needs `a[0:4, :]` and `a[:, 4:8]` — its rows' sums of `x`
and its columns' sums of `y` — and the same of `b`.

{block([*NX, "--brief", "--lineage", "0:0,1", "--lineage", "e:1"])}
Lineage walks the graph backwards once, mapping boxes through one rule per primitive
(`shardprop/inspect/lineage/`, grouped by family like the sharding rules). It is **sound** — it never misses
a dependency — and **exact** wherever the dependency is block-shaped: elementwise ops, broadcasts,
reductions, `dot_general`, transposes, reshapes, slices (strided too), pads, concatenation, reversal,
cumulative ops, sorts and (undilated, single-operand) window reductions. (Exact in the data-flow sense:
every element in the boxes can change the block. The Jacobian at one point can be sparser — for `max`, `select` or a sort only the winning
elements have a non-zero derivative — so the test checks exactness on smooth functions and soundness on all.)
`scan` is followed into its body: a block of `ys` reads the same iterations of `xs` and, if the body passes
anything through the carry, every earlier iteration too (later ones for `reverse=True`) — the carry regions
are grown to a fixed point, so the answer is sound; a scan that needs nothing of its carry (a `lax.map`) is
exact. Where an op reads data-dependent positions (`gather`, `dynamic_slice`, scatters) its rule returns
the whole of every axis the index values move — a block of an embedding lookup reads its own ids and every
row of the table, but only the block's columns — and the result says `exact=False` (the CLI: "a
superset"). A `while` loop is followed into its body the same way and into its condition: the condition
decides how many iterations run, so what it reads of the carry is read by every block (never exact: the trip
count is known only at run time); a `cond` reads its index and what any branch reads (exact with one branch).
Ops without a lineage rule return whole operands, also flagged; a result
that would need more than 64 boxes is widened to its bounding box, also flagged. `tests/inspection/test_lineage.py` checks both claims against the non-zero pattern of the Jacobian
at a random point, block by block and on random boxes, and for scans also that a block never reads
iterations the scan has not reached.

## Which device holds what: `sp.show_blocks` / `--blocks`

Like `jax.debug.visualize_array_sharding`, for any value of the graph and any rank: rows and columns are
the value's blocks along two axes (by default its sharded ones), each cell lists the devices that hold that
block. Replicated axes are one block held by several devices; for a rank > 2 tensor the other axes are
fixed at one block (the caption says which; `index={{2: 3}}` picks another).

{block([*NX, "--brief", "--blocks", "c", "--blocks", "e"])}
## Pictures: `sp.to_dot`, `sp.render`, `--format dot|svg`

Graphviz DOT text: one cluster per stage, nodes coloured by stage, edges labelled with the type the value
travels in; an edge on which the IR moves the value is red and names the steps (`gather j@1`, `all-to-all
i@1->0`) and the bytes per device; a node finished by a collective names it. `sp.render(prog, "graph.svg")` (or `.png`, `.pdf`) runs graphviz's `dot`; without it,
it raises `sp.RenderError` saying how to install graphviz or to render the DOT text elsewhere.

```bash
{shown([*NX, "--format", "svg", "-o", "docs/img/nx_gather.svg"])}
```

![the Nx example's graph, two stages](img/nx_gather.svg)

{block([*NX, "--format", "dot"], lang="dot")}
## JSON for tools: `sp.to_json` / `--format json`

A stable document, schema id `shardprop.inspect/3`; `shardprop inspect --schema` prints its JSON Schema
(`shardprop.inspect.SCHEMA`), and the tests validate the output against it.

| field | contents |
|---|---|
| `schema` | `"shardprop.inspect/3"` |
| `mesh` | `axis_names` and `shape` |
| `strategy` | `"gather"`, `"collective"` or `"auto"` (null for a sharded graph without a plan) |
| `inputs`, `outputs` | per flat input/output: `index`, `value` (its name in the listing), `layout`; inputs also their `name` (as `jax.jit` names the argument leaf: `params['w']`) and `spec_source` (`in_specs`: written, or unannotated; `sp.AUTO`: chosen by the search; `array`: the layout of the array it was called with), outputs their `source` |
| `values` | per value: `id`, `name`, `dtype`, `shape`, its type as the plan holds it — `layout` and `partial` (the mesh axes over which it is still a partial sum, `[]` when whole) — `producer` (node id) and `axes`: per axis the `mesh_axes` and its `shards` as propagation made them, each `{{id, start, stop, parents}}` — `parents` are shard ids, so lineage graphs can be rebuilt. The two differ only where a reduce-scatter holds a value finer than its shards (`layout` over `j`, the shards replicated) |
| `nodes` | per node: `id`, `op`, `operands`/`outputs` (value names), `params` (printable ones), `source` (`file:line`), `rule` (the sharding rule, or `conservative fallback`), `fallback`, `stage`, `needs` (the type each operand is consumed in: `layout`, `partial`), `collective` (`{{kind, mesh_axes}}` or null: the collective that finishes the node; which outputs, into which types, the IR says); a loop or a cond has `bodies`: per body its `name` (`body`, `cond`, `branch0`...), `path` (`s/body`, as `--explain` takes it), `repeats` (null for a while loop), `inputs` (`index`, `value`, type, `operand`: the op's operand it comes from), `outputs` (`index`, `value`, the type the op takes it in), `partial_carries` (`output`, `mesh_axes`), its `instructions`, and its own `values` and `nodes` |
| `stages` | per stage: `id`, `nodes`, `inputs` (`value`, `layout` it is taken in, `source`: `{{"argument": k}}` or `{{"stage": s, "output": k}}`), `outputs` (`value`, `layout`), `instructions` (its IR, in order: `{{"kind": "compute", "node", "inputs", "outputs"}}`, each input and output a `{{value, layout, partial}}`; or a `"move"` or `"finish"` with `op` (`all_gather`, `all_to_all`, `ppermute`, `psum`, `psum_scatter`, `slice`, `take_once`, `pmax`, ...), `mesh_axes`, `axis`/`to_axis`, `from` and `to` (typed values), `moved_bytes` per device, `transfers` (the collectives XLA runs for it) and `node`, the node it serves); `"outside_shard_map": true` for a stage that runs a primitive without a record on whole arrays under the program's `jax.jit` |
| `explain`, `lineage` | present when asked for with `--explain` / `--lineage`: `Explanation.to_dict()`, and `{{value, box, exact, inputs: {{index: boxes}}}}` |

A *layout* is one list per tensor axis of the mesh axes it is laid out over (`[]`: replicated). An excerpt
(one value, one node, one stage) of `{shown([*NX, "--format", "json", "--lineage", "0:0,1"])}`:

```json
{json_excerpt()}
```
"""


def sp_lineage_repr() -> str:
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    import shardprop as sp
    from shardprop.examples.inspect_example import nx

    prog = sp.autoshard(nx, mesh=sp.make_mesh((4, 2), ("i", "j")), in_specs=(P("i", "j"), None),
                        strategy="gather").trace(jnp.ones((16, 8)), jnp.ones((16, 8)))
    return str(sp.lineage(prog, output=0, block=(0, 1))).strip()


if __name__ == "__main__":
    from tests.releases import refuse_unless_documented

    refuse_unless_documented("docs/inspecting.md")
    (ROOT / "docs" / "img").mkdir(exist_ok=True)
    subprocess.run([sys.executable, "-m", "shardprop", *NX[1:], "--format", "svg", "-o", "docs/img/nx_gather.svg"],
                   cwd=ROOT, check=True)
    (ROOT / "docs" / "inspecting.md").write_text(page())
