"""Golden outputs of the annotated listing, the shard listing and the DOT text for the Nx example.

The goldens were checked by hand against the Nx design note: stage 0 computes ``a + b`` and ``a - b`` with
the input sharding; stage 1 receives ``x`` gathered along axis 1 (over ``j``) and ``y`` gathered along
axis 0 (over ``i``). Byte counts: ``x`` block after the gather is 4x8 f32 = 128 B, half of it arrives from
the other device of the ``j`` group = 64 B; ``y``'s is 16x4 f32 = 256 B, three quarters arrive = 192 B.
The tests only compare; after a deliberate change regenerate with ``python -m tests.inspection.goldens`` and
read the diff.
"""

import os

import pytest

import shardprop as sp
from shardprop.splitting.ir import Move

from .goldens import GOLDENS, golden_path, nx_program


@pytest.mark.parametrize("name", sorted(GOLDENS))
def test_golden(name, mesh):
    assert GOLDENS[name](mesh) + "\n" == golden_path(name).read_text(), \
        f"{name} changed: if on purpose, run `python -m tests.inspection.goldens` and read the diff"


def test_listing_marks_what_crosses_the_stage_boundary(mesh):
    text = str(nx_program(mesh, "gather").graph)
    assert "── stage 0 ──" in text and "── stage 1 ──" in text
    lines = [" ".join(line.split()) for line in text.splitlines()]  # the moves: equations of the stage making them
    assert "c:f32[16@i,8] = all_gather[j axis=1] c # 64 B per device" in lines
    assert "d:f32[16,8@j] = all_gather[i axis=0] d # 192 B per device" in lines
    # the auto strategy finishes both sums with collectives instead: one stage, no gathers
    auto = [" ".join(line.split()) for line in str(nx_program(mesh, "auto").graph).splitlines()]
    assert "── stage 1 ──" not in auto and not any("all_gather" in line for line in auto)
    assert "e:f32[16@i] = psum[j] e # 16 B per device" in auto and "f:f32[8@j] = psum[i] f # 24 B per device" in auto


def test_dot_is_accepted_by_graphviz_or_render_says_how_to_get_it(mesh, tmp_path):
    prog = nx_program(mesh, "gather")
    import shutil

    if shutil.which("dot"):
        path = sp.render(prog, tmp_path / "nx.svg")
        svg = path.read_text()
        assert "<svg" in svg and "stage 1" in svg and "gather j@1" in svg
    else:
        with pytest.raises(sp.RenderError, match="graphviz"):
            sp.render(prog, tmp_path / "nx.svg")


def test_render_without_dot_raises_a_clear_error(mesh, tmp_path, monkeypatch):
    import shardprop.inspect.dot as dot

    monkeypatch.setattr(dot.shutil, "which", lambda name: None)
    with pytest.raises(sp.RenderError, match="apt install graphviz.*sp.to_dot"):
        sp.render(nx_program(mesh, "gather"), tmp_path / "nx.svg")


def test_show_prints_listing_and_stage_table(mesh):
    from rich.console import Console

    console = Console(record=True, width=140, file=open(os.devnull, "w"))
    sp.show(nx_program(mesh, "gather"), console=console)
    text = console.export_text()
    assert "c:f32[16@i,8@j] = add a b" in text and "2 stage(s), strategy gather" in text


@pytest.mark.parametrize("workload", ["mlp_train_step_2d", "transformer_2d"])
@pytest.mark.parametrize("strategy", ["gather", "auto"])
def test_dot_structure_agrees_with_the_graph_and_the_plan(workload, strategy, meshes):
    """Beyond the golden: on real workloads every data edge of the graph is drawn once, each stage cluster
    holds exactly that stage's ops, and the red edges are exactly where a stage receives a value gathered."""
    import re

    from tests.test_workloads import WORKLOADS

    _, fn, args, mesh_name, specs = next(w for w in WORKLOADS if w[0] == workload)
    prog = sp.autoshard(fn, mesh=meshes[mesh_name], in_specs=specs, strategy=strategy).trace(*args)
    graph, plan = prog.sharded.graph, prog.plan
    dot = sp.to_dot(prog)

    clusters = {int(k): {int(n) for n in re.findall(r"^\s+n(\d+) \[", body, re.M)}
                for k, body in re.findall(r"subgraph cluster_stage_(\d+) \{\n(.*?)\n  \}", dot, re.S)}
    drawn: set[int] = set()
    for stage in plan.stages:  # a node sits in the first stage that runs it; constants are drawn outside
        ops = {n for n in stage.nodes if graph.nodes[n].op not in ("constant",)} - drawn
        assert clusters[stage.id] == ops
        drawn |= ops

    edges = re.findall(r"^  n(\d+) -> n(\d+) \[label=\"[^\"]*\"(, color=\"#cc0000\")?", dot, re.M)
    want = {(graph.producer[v], node.id) for node in graph.nodes if node.op not in ("parameter", "constant")
            for v in node.operands}
    assert {(int(a), int(b)) for a, b, _ in edges} == want and len(edges) == len(want)

    gathered = {(m.source.value, stage.id) for stage in plan.stages for m in stage.instructions
                if isinstance(m, Move) and m.transfer is not None and m.node is not None
                and m.source.value not in graph.nodes[m.node].outputs}  # operands moved, not sums finished
    red = {(int(a), int(b)) for a, b, red in edges if red}
    red_into = {(v, plan.stage_of(b)) for a, b in red
                for v in set(graph.nodes[a].outputs) & set(graph.nodes[b].operands)}
    assert red_into == gathered
    if strategy == "gather":
        assert gathered  # these workloads reduce over sharded axes: the gather strategy must cut somewhere
