"""Block pictures (checked against JAX's own device→index map), the stage table (checked against the
communication estimate) and the JSON export (validated against its schema)."""

import json

import jax
import jax.numpy as jnp
import jsonschema
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardprop as sp
from shardprop.inspect import SCHEMA, as_text
from shardprop.inspect.pictures import device_blocks
from shardprop.core.layouts import layout_from_spec, shard_count

from .nx_example import f as nx_example

SPECS = [P("i", "j"), P(None, "j"), P("j", "i"), P(("i", "j")), P(), P(("j", "i"), None)]


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_device_blocks_agree_with_jax(spec, mesh):
    """Independent oracle: JAX's ``devices_indices_map`` says which slice each device holds."""
    shape = (16, 8)
    layout = layout_from_spec(spec, shape, dict(mesh.shape), "x")
    ours = device_blocks(mesh, layout)
    theirs = NamedSharding(mesh, spec).devices_indices_map(shape)
    for device, index in theirs.items():
        block = ours[device.id]
        for k, (s, n) in enumerate(zip(index, shape, strict=True)):
            length = n // shard_count(dict(mesh.shape), layout[k])
            start = 0 if s.start is None else s.start
            assert (start, start + length) == (block[k] * length, (block[k] + 1) * length), (device, k)


def test_block_picture_of_a_2d_tensor(mesh):
    a = jnp.ones((16, 8))
    prog = sp.autoshard(nx_example, mesh=mesh, in_specs=(P("i", "j"), None), strategy="gather").trace(a, a)
    text = as_text(sp.blocks(prog, "c"))
    theirs = NamedSharding(mesh, P("i", "j")).devices_indices_map((16, 8))
    for device, (rows, cols) in theirs.items():  # every device appears in the cell of its block
        row = next(line for line in text.splitlines() if line.strip().startswith("│") and
                   f" {rows.start}:{rows.stop} │" in line)
        cells = [c.strip() for c in row.split("│")[2:-1]]
        assert f"dev {device.id}" == cells[cols.start // 4]
    # a reduced value is replicated over j: each block is held by a pair of devices
    e = as_text(sp.blocks(prog, "e"))
    assert e.count("dev ") == 4 and all(f"dev {2 * k},{2 * k + 1}" in e or f"dev {2 * k}-{2 * k + 1}" in e
                                        for k in range(4))


def test_block_picture_of_a_3d_tensor_projects_and_says_so(meshes):
    mesh = meshes["2x2x2"]
    prog = sp.autoshard(jnp.sin, mesh=mesh, in_specs=(P("i", None, ("j", "k")),)).trace(jnp.ones((4, 4, 4)))
    default = as_text(sp.blocks(prog, "a"))
    assert "axis 0 \\ axis 2" in default  # the two sharded axes are shown
    projected = as_text(sp.blocks(prog, "a", axes=(0, 1), index={2: 3}))
    assert "axis 2@j*k: block 3 of 4" in projected
    theirs = NamedSharding(mesh, P("i", None, ("j", "k"))).devices_indices_map((4, 4, 4))
    holders = sorted(d.id for d, idx in theirs.items() if idx[2].start == 3)
    assert [f"dev {d}" in projected for d in holders] == [True, True]


def test_block_picture_of_scalars_and_bad_axes(mesh):
    prog = sp.autoshard(lambda x: jnp.sum(x), mesh=mesh, in_specs=(P("i"),)).trace(jnp.ones(16))
    out = prog.sharded.graph.outputs[0]
    assert "dev 0-7" in as_text(sp.blocks(prog, out))
    with pytest.raises(sp.OptionError, match="at most two distinct axes"):
        sp.blocks(prog, "a", axes=(0, 3))


@pytest.mark.parametrize("strategy", ["gather", "collective", "auto"])
def test_stage_table_bytes_agree_with_the_communication_estimate(strategy, mesh):
    def f(x, w):
        h = jnp.tanh(x @ w)
        return jnp.cumsum(h, axis=0), jnp.max(h, axis=1)

    prog = sp.autoshard(f, mesh=mesh, in_specs=(P("i", "j"), P("j")), strategy=strategy).trace(
        jnp.ones((16, 8)), jnp.ones((8, 8)))
    text = as_text(sp.stage_table(prog), width=200)
    total = sum(t.moved_bytes for t in prog.estimated_communication())
    assert f"total ≈ {total:.0f} B moved per device" in text
    assert f"{len(prog.stages)} stage(s), strategy {strategy}" in text


def test_json_follows_its_schema_and_shard_parents_resolve(mesh):
    a = jnp.ones((16, 8))
    prog = sp.autoshard(nx_example, mesh=mesh, in_specs=(P("i", "j"), None), strategy="gather").trace(a, a)
    doc = json.loads(json.dumps(sp.to_json(prog)))
    jsonschema.validate(doc, SCHEMA)
    shard_ids = {s["id"] for v in doc["values"] for axis in v["axes"] for s in axis["shards"]}
    assert all(p in shard_ids for v in doc["values"] for axis in v["axes"] for s in axis["shards"]
               for p in s["parents"])
    # the stage inputs say where they come from, in the layout they arrive in; the stage's IR gathers them
    stage1 = doc["stages"][1]
    assert stage1["inputs"][0] == {"value": "c", "layout": [["i"], ["j"]], "source": {"stage": 0, "output": 0}}
    gather = stage1["instructions"][0]
    assert (gather["kind"], gather["op"], gather["mesh_axes"], gather["axis"], gather["moved_bytes"]) == (
        "move", "all_gather", ["j"], 1, 64.0)
    assert gather["from"] == {"value": "c", "layout": [["i"], ["j"]], "partial": []}
    assert gather["to"] == {"value": "c", "layout": [["i"], []], "partial": []}
    assert doc["outputs"] == [{"index": 0, "value": "i", "layout": [["i"], ["j"]],
                               "source": {"stage": 1, "output": 0}}]
    assert [n["stage"] for n in doc["nodes"]] == [None, None, 0, 0, 1, 1, 1, 1, 1]


@pytest.mark.parametrize("f,kind", [(lambda x: jnp.roll(x, 3) * 2, "rotated"), (lambda x: x[::-1] + 1, "mirrored"),
                                    (lambda x: jnp.concatenate([x, x * 2]) * 3, "routed")],
                         ids=["rotated", "mirrored", "routed"])
def test_json_says_where_an_op_left_its_rows_and_the_step_that_places_them(f, kind):
    """A value an op left out of its places is typed so (its ``placement``), and the move that puts its rows there
    is a step of its own, as every other move: the document serializes and validates."""
    mesh = sp.make_mesh((8,), ("i",))
    doc = json.loads(json.dumps(sp.to_json(sp.autoshard(f, mesh=mesh, in_specs=(P("i"),)).trace(jnp.ones(64)))))
    jsonschema.validate(doc, SCHEMA)
    ir = [i for stage in doc["stages"] for i in stage["instructions"]]
    placed = [o for i in ir if i["kind"] == "compute" for o in i["outputs"] if "placement" in o]
    axis, shift = {"rotated": (0, 61), "mirrored": (None, 0), "routed": (0, 0)}[kind]  # roll by 3: rows 61 further
    assert [p["placement"] for p in placed] == [{"kind": kind, "mesh_axes": ["i"], "axis": axis, "shift": shift}]
    (move,) = [i for i in ir if i["kind"] == "move" and "placement" in i["from"]]
    assert move["op"] == {"rotated": "rotate", "mirrored": "mirror", "routed": "route"}[kind] and move["finishes"]
    assert "placement" not in move["to"] and move["moved_bytes"] > 0


def test_json_of_a_workload_with_collectives_and_scans_validates(mesh):
    from shardprop.examples.mlp import init_params, train_step

    params = init_params((32, 64, 10))
    x, labels = jnp.ones((16, 32)), jnp.zeros((16,), jnp.int32)
    prog = sp.autoshard(train_step, mesh=mesh, in_specs=(P(), P("i"), P("i"))).trace(params, x, labels)
    doc = sp.to_json(prog)
    jsonschema.validate(json.loads(json.dumps(doc)), SCHEMA)
    assert any(n["collective"] for n in doc["nodes"])
    assert len(doc["values"]) == len(prog.sharded.graph.avals)


def test_json_marks_a_stage_outside_shard_map_and_still_validates(mesh):
    import warnings


    def f(a):
        return jax.pure_callback(lambda v: v * 2.0, jax.ShapeDtypeStruct(a.shape, a.dtype), jnp.exp(a)) + 1.0

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sp.FallbackWarning)
        prog = sp.autoshard(f, mesh=mesh, in_specs=(P("i", "j"),)).trace(jnp.ones((16, 8)))
    doc = sp.to_json(prog)
    jsonschema.validate(json.loads(json.dumps(doc)), SCHEMA)
    assert [s.get("outside_shard_map", False) for s in doc["stages"]] == [False, True, False]
    assert "── stage 1 (outside shard_map) ──" in str(prog.graph)


def test_json_lists_loop_bodies_with_their_paths_partial_sums_and_collectives(mesh):
    """An RNN gradient: each scan node carries its body (values, nodes, where each input comes from); the
    backward body's weight-gradient contraction is marked partial over i and the loop says which outputs one
    psum finishes; a while loop's body and condition have an unknown repeat count."""
    from shardprop.examples import recurrent

    xs, h0 = jnp.ones((6, 8, 16)), jnp.ones((8, 16))
    grad = sp.autoshard(jax.grad(recurrent.rnn_loss), mesh=mesh, in_specs=(None, P(None, "i"), P("i")))
    doc = json.loads(json.dumps(sp.to_json(grad.trace(recurrent.init_rnn(), xs, h0))))
    jsonschema.validate(doc, SCHEMA)
    forward, backward = [n for n in doc["nodes"] if n["op"] == "scan"]
    # each body's path is its loop's (first) output's name, as the listing prints it
    assert [b["path"] for b in forward["bodies"] + backward["bodies"]] == [
        f"{loop['outputs'][0]}/body" for loop in (forward, backward)]
    assert backward["collective"] == {"kind": "psum", "mesh_axes": ["i"]}
    (stage,) = doc["stages"]  # after the loop, one psum of each carry it kept partial
    finished = [i for i in stage["instructions"] if i["kind"] == "move" and i["from"]["value"] in backward["outputs"]]
    assert [(i["op"], i["from"]["partial"], i["to"]["partial"]) for i in finished] == [("psum", ["i"], [])] * 3
    (body,) = backward["bodies"]
    assert body["repeats"] == 6 and [c["output"] for c in body["partial_carries"]] == [0, 1, 2]
    assert [i["operand"] for i in body["inputs"]] == list(range(len(backward["operands"])))
    values = {v["name"]: v for v in body["values"]}
    partial = [n for n in body["nodes"] if n["op"] != "parameter" and values[n["outputs"][0]]["partial"]]
    assert {"reduce_sum", "dot_general"} <= {n["op"] for n in partial} and all(
        values[n["outputs"][0]]["partial"] == ["i"] and n["collective"] is None for n in partial)

    loop = sp.autoshard(recurrent.grow_until, mesh=mesh, in_specs=(P("i", "j"),)).trace(jnp.ones((8, 16)))
    doc = json.loads(json.dumps(sp.to_json(loop)))
    jsonschema.validate(doc, SCHEMA)
    (node,) = [n for n in doc["nodes"] if n["op"] == "while"]
    assert [(b["name"], b["repeats"]) for b in node["bodies"]] == [("cond", None), ("body", None)]
    assert [n["collective"]["kind"] for n in node["bodies"][0]["nodes"] if n["collective"]] == ["psum"]
