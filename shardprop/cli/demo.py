"""``shardprop demo``: the Nx design note's example and a small MLP, sharded, inspected and checked."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from ..api import autoshard
from ..bench.models import nx_example
from ..mesh import make_mesh


def mlp(params, x):
    """A two-layer MLP returning its logits and the mean of squared logits."""
    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    logits = h @ params["w2"] + params["b2"]
    return logits, jnp.mean(logits**2)


def _check(name, fs, f, args, out=print) -> bool:
    sharded = fs(*args)
    expected = f(*args)
    ok = True
    for got, want in zip(jax.tree_util.tree_leaves(sharded), jax.tree_util.tree_leaves(expected), strict=True):
        diff = float(np.max(np.abs(np.asarray(got, np.float64) - np.asarray(want, np.float64))))
        close = np.allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
        ok &= close
        out(f"check {name}: sharded {got.shape} {'==' if close else '!='} unsharded (max abs diff {diff:.2e}), "
            f"output sharding {got.sharding.spec}")
    return ok


def run(out=print) -> bool:
    """Run both examples on an 8-device mesh; returns True when every sharded result matched."""
    rng = np.random.default_rng(0)
    mesh = make_mesh((4, 2), ("i", "j"))
    out(f"mesh: {dict(mesh.shape)} on {len(mesh.devices.flat)} {jax.default_backend()} devices\n")

    a = rng.normal(size=(16, 8)).astype(np.float32)
    b = rng.normal(size=(16, 8)).astype(np.float32)
    out("== Nx example: f(a, b) with in_specs=(P('i', 'j'), None), strategy='gather' (the Nx design) ==")
    fs = autoshard(nx_example, mesh=mesh, in_specs=(P("i", "j"), None), strategy="gather")
    prog = fs.trace(a, b)
    out(str(prog.graph))
    out("")
    out(str(prog.stages))
    ok = _check("nx_example", fs, nx_example, (a, b), out)

    out("\n== the same with strategy='auto' (the default): the sums finish with all-reduces ==")
    fs = autoshard(nx_example, mesh=mesh, in_specs=(P("i", "j"), None))
    out(str(fs.trace(a, b).stages))
    ok &= _check("nx_example (auto)", fs, nx_example, (a, b), out)

    params = {
        "w1": rng.normal(size=(32, 64)).astype(np.float32) / 6,
        "b1": rng.normal(size=(64,)).astype(np.float32),
        "w2": rng.normal(size=(64, 10)).astype(np.float32) / 8,
        "b2": rng.normal(size=(10,)).astype(np.float32),
    }
    x = rng.normal(size=(16, 32)).astype(np.float32)
    specs = ({"w1": P(None, "j"), "b1": None, "w2": P("j", None), "b2": P()}, P("i", None))
    out("\n== MLP: batch on 'i', hidden units on 'j' ==")
    ms = autoshard(mlp, mesh=mesh, in_specs=specs)
    prog = ms.trace(params, x)
    out(str(prog.graph))
    out("")
    out(str(prog.stages))
    ok &= _check("mlp", ms, mlp, (params, x), out)
    out("\nall sharded results equal the unsharded ones" if ok else "\nMISMATCH: a sharded result differs")
    return ok
