"""Golden outputs of the annotated listing, the shard listing and the DOT text for the Nx example.

The goldens were checked by hand against the Nx design note: stage 0 computes ``a + b`` and ``a - b`` with
the input sharding; stage 1 receives ``x`` gathered along axis 1 (over ``j``) and ``y`` gathered along
axis 0 (over ``i``). Byte counts: ``x`` block after the gather is 4x8 f32 = 128 B, half of it arrives from
the other device of the ``j`` group = 64 B; ``y``'s is 16x4 f32 = 256 B, three quarters arrive = 192 B.
Regenerate with ``SHARDPROP_REGENERATE_GOLDEN=1`` after a deliberate change, and read the diff.
"""

import os
from pathlib import Path

import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

import shardprop as sp

from .nx_example import f

GOLDEN = Path(__file__).parent / "golden"


def nx_program(mesh, strategy):
    a = jnp.ones((16, 8))
    return sp.autoshard(f, mesh=mesh, in_specs=(P("i", "j"), None), strategy=strategy).trace(a, a)


def check_golden(name: str, text: str):
    path = GOLDEN / name
    if os.environ.get("SHARDPROP_REGENERATE_GOLDEN"):
        path.write_text(text + "\n")
    assert text + "\n" == path.read_text(), f"{name} changed; see the diff above"


@pytest.mark.parametrize("strategy", ["gather", "auto"])
def test_listing_golden(strategy, mesh):
    check_golden(f"nx_listing_{strategy}.txt", str(nx_program(mesh, strategy).graph))


def test_listing_marks_what_crosses_the_stage_boundary(mesh):
    text = str(nx_program(mesh, "gather").graph)
    assert "── stage 0 ──" in text and "── stage 1 ── receives:" in text
    assert "c from stage 0, gathered over j: [16@i,8@j] -> [16@i,8], 64 B per device" in text
    assert "d from stage 0, gathered over i: [16@i,8@j] -> [16,8@j], 192 B per device" in text
    # the auto strategy finishes both sums with collectives instead: one stage, no gathers
    auto = str(nx_program(mesh, "auto").graph)
    assert "stage 1" not in auto and "finished by psum over j" in auto and "finished by psum over i" in auto


def test_shard_ids_golden(mesh):
    sharded = nx_program(mesh, "gather").graph
    text = "\n".join(sharded.describe(v) for v in range(len(sharded.graph.avals)))
    check_golden("nx_shards.txt", text)


def test_dot_golden(mesh):
    check_golden("nx_gather.dot", sp.to_dot(nx_program(mesh, "gather")))


def test_dot_is_accepted_by_graphviz_or_render_says_how_to_get_it(mesh, tmp_path):
    prog = nx_program(mesh, "gather")
    import shutil

    if shutil.which("dot"):
        path = sp.render(prog, tmp_path / "nx.svg")
        svg = path.read_text()
        assert "<svg" in svg and "stage 1" in svg and "gather j" in svg
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
