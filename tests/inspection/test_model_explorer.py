"""The shard graph in Model Explorer (``sp.to_model_explorer``, ``sp.model_explorer_overlays``): its groups are the
program's stages, every node's layout is the plan's, every move's bytes add up to what the compiled HLO moves, the
JSON loads back through Model Explorer's own loader, the overlays cover every node, a 10^4-node graph stays in small
groups, and the typed errors."""

import dataclasses
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

import shardprop as sp
from shardprop.inspect.model_explorer import GROUP_LIMIT, model_explorer_json
from tests.inspection.viewer_programs import NAMES, program

pytest.importorskip("model_explorer")

EXAMPLE = Path(__file__).parent / "nx_example.py"


@pytest.fixture(scope="module", params=NAMES)
def case(request):
    prog = program(request.param)
    return request.param, prog, sp.to_model_explorer(prog).graphs[0]


def attrs(node) -> dict:
    return {kv.key: kv.value for kv in node.attrs}


def pending(partial, reduction=None) -> str:
    """A to_json type's pending combine as a type spells it: ``+j``, ``max i``."""
    return f"{'+' if reduction is None else reduction + ' '}{'*'.join(partial)}"


def spec_text(layout, partial, reduction=None) -> str:
    """What a PartitionSpec prints for a to_json layout (one list of mesh axes per tensor axis), with ``{+j}`` or
    ``{max j}``."""
    entries = [None if not m else (m[0] if len(m) == 1 else tuple(m)) for m in layout]
    while entries and entries[-1] is None:
        entries.pop()
    spec = str(P(*entries))
    return spec if not partial else f"{spec}{{{pending(partial, reduction)}}}"


def test_the_top_level_groups_are_the_stages(case):
    _, prog, graph = case
    groups = {n.namespace.split("/")[0] for n in graph.nodes if n.namespace}
    assert groups == {f"stage {k}" for k in range(len(prog.stages))}


def test_every_value_node_has_the_layout_the_plan_computes_it_in(case):
    _, prog, graph = case
    doc = sp.to_json(prog)
    computed = {i["node"]: i["outputs"] for stage in doc["stages"] for i in stage["instructions"]
                if i["kind"] == "compute"}
    nodes = {n.id: n for n in graph.nodes}
    for node_id, outputs in computed.items():
        drawn = nodes[f"n{node_id}"]
        if len(outputs) == 1:
            out = outputs[0]
            assert attrs(drawn)["layout"] == spec_text(out["layout"], out["partial"], out.get("reduction")), drawn.label
            assert attrs(drawn)["partial"] == (pending(out["partial"], out.get("reduction")) if out["partial"] else "-")
        for k, out in enumerate(outputs):
            meta = {kv.key: kv.value for kv in drawn.outputsMetadata[k].attrs}
            assert meta["layout"] == spec_text(out["layout"], out["partial"], out.get("reduction"))
            assert meta["__tensor_tag"] == out["value"]
    for entry in doc["inputs"]:
        assert attrs(nodes[f"n{doc['values'][[v['name'] for v in doc['values']].index(entry['value'])]['producer']}"])[
            "layout"] == spec_text(entry["layout"], [])
    for entry in doc["outputs"]:
        assert attrs(nodes[f"out{entry['index']}"])["layout"] == spec_text(entry["layout"], [])


def test_moves_bytes_add_up_to_what_the_compiled_program_moves(case):
    name, prog, graph = case
    moves = [n for n in graph.nodes if "bytes per device" in attrs(n)]
    drawn = sum(float(attrs(n)["bytes per device per program run"]) for n in moves)
    assert drawn == pytest.approx(sum(t.total_moved_bytes for t in prog.communication()))
    kinds = {n.label for n in moves}
    if name == "nx":
        assert kinds == {"all_gather"} and sorted(float(attrs(n)["bytes per device"]) for n in moves) == [64, 192]
    if name == "partial":
        assert {"psum", "all_gather"} <= kinds
        assert any("{+j}" in attrs(n).get("type", "") for n in graph.nodes)  # the pending sum, before its psum
    for n in moves:  # each names the node it serves, and that node is drawn
        served = attrs(n).get("serves")
        assert served is None or set(served.nodeIds) <= {m.id for m in graph.nodes}


def test_loop_bodies_are_nested_groups(case):
    name, prog, graph = case
    bodies = {n.namespace for n in graph.nodes if n.namespace.endswith("/body") or "/body/" in n.namespace}
    if name == "scan":
        loops = [n for n in graph.nodes if n.label == "scan"]
        assert len(loops) == 2 and bodies
        for loop in loops:  # the body's outputs feed the loop node
            assert any(e.targetNodeInputId.startswith("body ") for e in loop.incomingEdges)
    else:
        assert not bodies


def test_the_json_round_trips_through_model_explorers_loader(case):
    from dacite import from_dict
    from model_explorer.graph_builder import Graph
    from model_explorer.utils import convert_adapter_response

    _, prog, graph = case
    collection = sp.to_model_explorer(prog)
    text = model_explorer_json(collection)
    data = json.loads(text)
    # what Model Explorer's own server sends for a collection, and its own loader (its node data runner's) reads back
    assert data == convert_adapter_response({"graphCollections": [collection]})["graphCollections"][0]
    assert from_dict(data_class=Graph, data=data["graphs"][0]) == graph


def test_overlays_cover_every_node(case):
    _, prog, graph = case
    overlays = sp.model_explorer_overlays(prog)
    ids = {n.id for n in graph.nodes}
    assert sorted(overlays) == ["bytes moved", "layout"]
    for data in overlays.values():
        assert set(data.graphsData["shardprop"].results) == ids
        json.loads(data.to_json_string())
    moved = overlays["bytes moved"].graphsData["shardprop"].results
    assert sum(r.value for r in moved.values()) == pytest.approx(sum(t.total_moved_bytes for t in prog.communication()))
    layouts = overlays["layout"].graphsData["shardprop"].results
    colour_of = {}
    for node in graph.nodes:  # one colour per distinct layout
        result = layouts[node.id]
        assert colour_of.setdefault(attrs(node).get("layout") or attrs(node).get(
            next(k for k in attrs(node) if k.endswith(" layout"))), result.bgColor) == result.bgColor


def children(graph) -> dict[str, int]:
    """How many direct children (nodes and groups) each group has ("" is the top level)."""
    counts: dict[str, set] = {}
    for node in graph.nodes:
        parts = node.namespace.split("/") if node.namespace else []
        counts.setdefault(node.namespace, set()).add(("node", node.id))
        for k in range(len(parts)):
            counts.setdefault("/".join(parts[:k]), set()).add(("group", parts[k]))
    return {group: len(members) for group, members in counts.items()}


@pytest.mark.slow  # a scale check (9 s cold): the default run draws the bench programs' graphs above
def test_a_ten_thousand_node_graph_exports_in_small_groups():
    from shardprop.bench.timing import deep

    mesh = sp.make_mesh((4, 2), ("i", "j"))
    x, w = jax.ShapeDtypeStruct((64, 32), jnp.float32), jax.ShapeDtypeStruct((32, 32), jnp.float32)
    plan = sp.split(sp.propagate(sp.trace(lambda x, w: deep(x, w, 715), x, w), (P("i", "j"), None), mesh=mesh))
    assert len(plan.graph.nodes) >= 10_000
    start = time.perf_counter()
    graph = sp.to_model_explorer(plan).graphs[0]
    print(f"\n{len(graph.nodes)} Model Explorer nodes in {time.perf_counter() - start:.1f} s")
    assert len(graph.nodes) >= 10_000
    assert max(children(graph).values()) <= GROUP_LIMIT + 10


def test_without_model_explorer_the_error_names_the_extra(monkeypatch):
    prog = program("nx")
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "model_explorer" else find_spec(name, *a))
    for export in (sp.to_model_explorer, sp.model_explorer_overlays, sp.visualize):
        with pytest.raises(sp.ExtraNotInstalledError, match=r'pip install "shardprop\[viewer\]"') as raised:
            export(prog)
        assert isinstance(raised.value, ImportError)


def test_importing_shardprop_does_not_import_model_explorer():
    code = "import sys, shardprop; assert 'model_explorer' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_a_plan_that_fails_its_invariants_is_not_drawn():
    plan = program("nx").plan
    first, second = plan.stages
    broken = dataclasses.replace(plan, stages=(first, dataclasses.replace(
        second, instructions=second.instructions[1:])))  # the gather the first reduction reads is gone
    with pytest.raises(sp.InvariantError):
        sp.to_model_explorer(broken)


def test_the_cli_writes_graph_json_that_loads(tmp_path):
    from dacite import from_dict
    from model_explorer.graph_builder import Graph

    out = tmp_path / "graph.json"
    cmd = [sys.executable, "-m", "shardprop", "inspect", f"{EXAMPLE}:f", "--mesh", "i=4,j=2", "--arg",
           "f32[16,8]@P(i,j)", "--arg", "f32[16,8]", "--strategy", "gather", "--format", "model-explorer",
           "-o", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    graph = from_dict(data_class=Graph, data=data["graphs"][0])
    assert {n.namespace.split("/")[0] for n in graph.nodes if n.namespace} == {"stage 0", "stage 1"}
    assert sorted(n.label for n in graph.nodes if n.label == "all_gather") == ["all_gather", "all_gather"]


def test_a_value_held_in_equal_blocks_shows_each_device_its_block():
    """After a realign the value is held in equal blocks whatever propagation's shards said of it before: an axis of
    32 over j (2 devices) shows rows [0:16] and [16:32] (the review found propagation's stale ranges there)."""
    graph = sp.to_model_explorer(program("ranged")).graphs[0]
    realigns = [n for n in graph.nodes if n.label == "realign"]
    assert realigns
    for node in realigns:
        a = attrs(node)
        if "[" not in a["type"].split(",")[1]:          # the move's result is not ranged on axis 1
            assert a["axis 1"] == "32 @j: [0:16] [16:32]"
    output = next(n for n in graph.nodes if n.label == "output 0")
    assert attrs(output)["axis 1"] == "32 @j: [0:16] [16:32]"


@pytest.mark.parametrize("extra, message", [
    (["--view", "--explain", "e"], "drop --explain"),
    (["--view", "-o", "out.txt"], "drop -o"),
    (["--port", "8080"], "add --view"),
])
def test_the_command_line_refuses_what_view_would_drop(extra, message, capsys):
    from shardprop.cli import main

    target = "shardprop/examples/inspect_example.py:nx"
    argv = ["inspect", target, "--mesh", "i=4,j=2", "--arg", "f32[16,8]@P(i,j)", "--arg", "f32[16,8]", *extra]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("keywords, message", [
    ({"port": 70000}, "expected a TCP port"), ({"port": -1}, "expected a TCP port"),
    ({"host": "no-such-host.invalid"}, "not an IPv4 name"),
])
def test_visualize_refuses_a_bad_port_or_host_with_a_typed_error(keywords, message):
    with pytest.raises(sp.OptionError, match=message):
        sp.visualize(program("nx"), open_browser=False, block=False, **keywords)
