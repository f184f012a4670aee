"""A causal language model cannot fool the debugger: on the Llama-style training step (``examples/llama.py``: a
causal mask of ``-1e9``, rotary embeddings of base ``10000``, AdamW dividing by gradients near 0), the correct
program agrees with the unsharded function everywhere, and with each collective kind removed in turn — a psum, an
all-gather, an all-to-all — ``first_divergence()`` at default settings names the op the missing collective feeds,
its source line and the collective in the plan; ``compare()``, ``check()``, ``first_divergence()`` and the
``shardprop debug`` command agree."""

import inspect
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import shardprop as sp
from shardprop.backends import evaluate
from shardprop.core.steps import StepKind
from shardprop.debug import FindingKind
from shardprop.examples import llama
from tests.cli import shardprop

PARAMS = llama.init_llama(layers=1)
ZEROS = jax.tree_util.tree_map(np.zeros_like, PARAMS)
_RNG = np.random.default_rng(11)
TOKENS, TARGETS = (_RNG.integers(0, 128, size=(8, 16)).astype(np.int32) for _ in range(2))
ARGS = (PARAMS, ZEROS, ZEROS, TOKENS, TARGETS)


def _megatron(params, tokens, embed=P()):
    """Attention heads and MLP hidden units over ``model`` (q/k/v and gate/up by columns, o and down by rows), the
    batch over ``data``; ``tokens``: the token arrays' spec, ``embed`` the embedding table's."""
    layer = {"attn_norm": P(), "wq": P(None, "model"), "wk": P(None, "model"), "wv": P(None, "model"),
             "wo": P("model", None), "mlp_norm": P(), "w_gate": P(None, "model"), "w_up": P(None, "model"),
             "w_down": P("model", None)}
    specs = {"embed": embed, "layers": [layer for _ in params["layers"]], "final_norm": P(), "lm_head": P()}
    return (specs, specs, specs, tokens, tokens)


LAYOUTS = {"Megatron": _megatron(PARAMS, P("data")),
           # the sequence over model, the embedding's features too: its gradient's rows change axes (an all-to-all)
           "Megatron + sequence": _megatron(PARAMS, P("data", "model"), embed=P(None, "model"))}


def _line(text: str) -> str:
    lines = inspect.getsource(llama).splitlines()
    return f"/examples/llama.py:{next(k for k, line in enumerate(lines, 1) if text in line)}"


def _without(monkeypatch, kind: StepKind, axis: str) -> list:
    """Every lowering step of ``kind`` over ``axis`` skipped: a psum leaves each device its partial sum, an
    all-gather leaves each device its own block where the others' belong, an all-to-all leaves each device its own
    pieces, rearranged locally. Returns the list the skipped steps are appended to."""
    real, skipped = evaluate.apply_step, []

    def planted(x, step, mesh_shape):
        y = real(x, step, mesh_shape)
        if step.kind is not kind or axis not in step.mesh_axes:
            return y
        skipped.append(step)
        if kind is StepKind.PSUM:
            return x
        grown = next(a for a in range(x.ndim) if y.shape[a] > x.shape[a])
        if kind is StepKind.ALL_GATHER:
            return jnp.concatenate([x] * (y.shape[grown] // x.shape[grown]), axis=grown)
        split = next(a for a in range(x.ndim) if y.shape[a] < x.shape[a])
        return jnp.concatenate(jnp.split(x, x.shape[split] // y.shape[split], axis=split), axis=grown)

    monkeypatch.setattr(evaluate, "apply_step", planted)
    return skipped


@pytest.fixture(scope="module")
def programs():
    mesh = sp.make_mesh((4, 2), ("data", "model"))
    return {name: sp.autoshard(llama.llama_train_step, mesh=mesh, in_specs=specs).trace(*ARGS)
            for name, specs in LAYOUTS.items()}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_correct_program_agrees_everywhere(programs, layout):
    dbg = sp.Debugger(programs[layout], *ARGS)
    table = dbg.compare()
    assert table.agree, table.summary()
    assert dbg.first_divergence() is None
    assert dbg.check() == []


# (the layout, the collective removed, over which mesh axis, the op the debugger must name, the text of its line,
#  what the plan says of the collective)
CASES = [
    ("Megatron", StepKind.PSUM, "data", "reduce_sum", "return -jnp.mean(", "psum[data"),
    ("Megatron", StepKind.ALL_GATHER, "model", "dot_general", 'v = (x @ p["wv"])', "all-gather over model"),
    ("Megatron + sequence", StepKind.ALL_TO_ALL, "model", "scatter-add", 'h = params["embed"][tokens]',
     "all-to-all over model"),
]


@pytest.mark.parametrize("layout,kind,axis,op,line,collective", CASES, ids=[str(c[1]) for c in CASES])
def test_a_missing_collective_is_named_at_the_first_value_it_touches(monkeypatch, programs, layout, kind, axis, op,
                                                                     line, collective):
    skipped = _without(monkeypatch, kind, axis)
    dbg = sp.Debugger(programs[layout], *ARGS)
    table = dbg.compare()
    assert skipped, f"the plan has no {kind} over {axis}"
    found = dbg.first_divergence()
    assert found is not None, table.summary()
    assert found.where.op == op and found.where.source.endswith(_line(line)), str(found)
    assert any(collective in step for step in found.decision), found.decision
    assert not table.agree and table.fault.where == found.where
    assert table.summary().endswith(f"the first at fault: {found.where.name} (`{op}`)")
    if kind is StepKind.PSUM:  # each device keeps its own partial sum where the plan says it is replicated
        assert any(f.kind is FindingKind.REPLICAS_DIFFER for f in dbg.check())


def _spelled(spec) -> str:
    """``spec`` (a pytree of PartitionSpecs) as ``--in-specs`` reads it: Python with ``P``."""
    if isinstance(spec, P):
        return "P(" + ", ".join(repr(a) for a in spec) + ")"
    if isinstance(spec, dict):
        return "{" + ", ".join(f"{k!r}: {_spelled(v)}" for k, v in spec.items()) + "}"
    return ("[" if isinstance(spec, list) else "(") + "".join(f"{_spelled(v)}, " for v in spec) + (
        "]" if isinstance(spec, list) else ")")


def test_the_command_line_names_the_same_fault(monkeypatch):
    """``shardprop debug`` on the Llama step with the gradient's psum over ``data`` planted missing: the same first
    divergence as ``first_divergence()`` (the op and its line), the same broken promises as ``check()``, exit 1."""
    layout, kind, axis, op, line, _ = CASES[0]
    _without(monkeypatch, kind, axis)
    example = Path(__file__).parent / "llama_cli_example.py"
    result = shardprop("debug", f"{inspect.getsourcefile(llama)}:llama_train_step", "--mesh", "data=4,model=2",
                       "--args", f"{example}:arguments", "--in-specs", _spelled(LAYOUTS[layout]), "--repeats", "1",
                       "--format", "json")
    assert result.returncode == 1, result.stderr
    doc = json.loads(result.stdout)
    found = doc["divergence"]
    assert doc["agree"] is False and found is not None
    assert found["op"] == op and found["source"].endswith(_line(line)), found
    assert any(step for step in found["decision"] if "psum[data" in step), found["decision"]
    assert any(f["kind"] == FindingKind.REPLICAS_DIFFER.value for f in doc["findings"]), doc["findings"][:3]
