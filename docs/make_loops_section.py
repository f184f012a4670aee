"""Write the loop workloads' table into docs/workloads.md and the RNN gradient's into docs/performance.md:
`python docs/make_loops_section.py` (compiles every loop workload with shardprop and with jax.jit)."""

import pathlib
import re

import jax

jax.config.update("jax_num_cpu_devices", 8)

import shardprop as sp  # noqa: E402
from tests.test_loops import H0, RNN, WORKLOADS, XS, rnn_grad  # noqa: E402

DOCS = pathlib.Path(__file__).parent


def _rows(mesh) -> list[str]:
    rows = ["| workload | in_specs | shardprop (auto): collectives, bytes/device | jax.jit: collectives, "
            "bytes/device |", "|---|---|---|---|"]
    for name, f, args, specs in WORKLOADS:
        c = sp.compare_with_jit(f, mesh, specs, *args)
        shown = ", ".join(str(s) for s in jax.tree_util.tree_leaves(specs, is_leaf=lambda x: x is None)
                          if s is not None)
        rows.append(f"| `{name}` | {shown} | {_count(c.shardprop)}, {c.shardprop_bytes:.0f} | "
                    f"{_count(c.jit)}, {c.jit_bytes:.0f} |")
    return rows


def _count(transfers) -> str:
    return str(sum(t.repeats for t in transfers))


def _replace(path: pathlib.Path, marker: str, text: str) -> None:
    doc = path.read_text()
    begin, end = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
    new = f"{begin}\n{text}\n{end}"
    doc = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: new, doc, flags=re.S) if begin in doc \
        else doc.rstrip() + "\n\n" + new + "\n"
    path.write_text(doc)


if __name__ == "__main__":
    mesh = sp.make_mesh((4, 2), ("i", "j"))
    _replace(DOCS / "workloads.md", "loops", "\n".join(_rows(mesh)))
    c = sp.compare_with_jit(rnn_grad, mesh, (None, jax.sharding.PartitionSpec(None, "i"),
                                             jax.sharding.PartitionSpec("i")), RNN, XS, H0)
    _replace(DOCS / "performance.md", "rnn", "```\n" + str(c) + "\n```")
