"""``dbg.save_stage(k, directory)``: one stage as a standalone reproducer a user can attach to a bug report.

The directory gets the stage as a serialized ``jax.export`` artifact, its inputs and the outputs it gave
(``.npz``), a manifest, and a short script that needs only JAX: it rebuilds a mesh of the same shape, places the
inputs as they were, runs the artifact and compares with the saved outputs (exit status 0 when equal).
"""

from __future__ import annotations

import json
from os import PathLike
from pathlib import Path

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from ..backends import stage_function
from ..errors import ArtifactError
from ..expr import jax_adapter as jx
from ..expr.graph import value_name

SCRIPT = '''"""Stage {k} of a shardprop program, saved by Debugger.save_stage: it needs only jax and numpy.

    python {script}        # runs the stage on a fresh {shape} mesh; exit status 0 when the outputs match
"""
import json
import pathlib
import sys

import jax

HERE = pathlib.Path(__file__).resolve().parent
MANIFEST = json.loads((HERE / "stage_{k}.json").read_text())
jax.config.update("jax_num_cpu_devices", MANIFEST["devices"])  # before any computation

import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec  # noqa: E402

mesh = jax.make_mesh(tuple(MANIFEST["mesh_shape"]), tuple(MANIFEST["mesh_axes"]),
                     axis_types=(AxisType.Auto,) * len(MANIFEST["mesh_axes"]))
data = np.load(HERE / "stage_{k}_data.npz")


def load(entry):
    x = data[entry["key"]]
    return x.view(jax.numpy.dtype(entry["dtype"])) if entry["stored_as"] != entry["dtype"] else x


def spec(entries):
    return PartitionSpec(*(tuple(e) if isinstance(e, list) else e for e in entries))


args = [jax.device_put(load(e), NamedSharding(mesh, spec(e["spec"]))) for e in MANIFEST["inputs"]]
exported = jax.export.deserialize(bytearray((HERE / "stage_{k}.jax_export").read_bytes()))
outputs = exported.call(*args)
ok = True
for entry, got in zip(MANIFEST["outputs"], outputs):
    want, got = load(entry), np.asarray(got)
    # bit for bit (NaN included; bfloat16 has no numpy arithmetic, its bytes compare all the same)
    same = got.shape == want.shape and got.dtype == want.dtype and got.tobytes() == want.tobytes()
    ok &= bool(same)
    verdict = "matches" if same else "DIFFERS from"
    print(f"{{entry['name']}}: {{got.dtype}}{{list(got.shape)}} {{verdict}} the saved output")
sys.exit(0 if ok else 1)
'''


def _stored(x) -> tuple[np.ndarray, str, str]:
    """``(numpy array to save, dtype name, dtype stored as)``: PRNG keys as their key data, dtypes numpy cannot
    save by name (bfloat16, float8) as unsigned integers of the same width."""
    if jx.is_extended_dtype(x.dtype):
        x = jax.random.key_data(x)
    a = np.asarray(x)
    name = str(a.dtype)
    if a.dtype.kind == "V" or name not in np.sctypeDict:
        return a.view(f"uint{8 * a.dtype.itemsize}"), name, f"uint{8 * a.dtype.itemsize}"
    return a, name, name


def _spec_json(spec: PartitionSpec) -> list:
    return [list(e) if isinstance(e, tuple) else e for e in spec]


def save_stage(session, k: int, directory) -> Path:
    """Write stage ``k`` (with the inputs the debugger holds for it) into ``directory``; returns the script."""
    plan, mesh = session.plan, session.mesh
    stage = session.stage_at(k)
    if not isinstance(directory, str | PathLike):
        raise ArtifactError(f"save_stage({k}, {directory!r}): the directory must be a path (a str or Path)")
    if session.stage is not None and session.stage <= k:
        session.run_to(k + 1)  # its inputs, and the outputs it gives
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".stage_{k}.probe"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise ArtifactError(f"cannot write stage {k} into {str(directory)!r}: {err.strerror or err}") from None
    inputs = session.stage_inputs(stage)
    outputs = session.stage_outputs(stage)
    keys = [jx.is_extended_dtype(x.dtype) for x in inputs]
    impls = [jax.random.key_impl(x) if key else None for x, key in zip(inputs, keys, strict=True)]
    fn = stage_function(plan, stage, mesh)

    def on_key_data(*xs):  # an exported function takes and returns plain arrays: PRNG keys travel as key data
        xs = [jax.random.wrap_key_data(x, impl=impl) if impl is not None else x
              for x, impl in zip(xs, impls, strict=True)]
        return [jax.random.key_data(o) if jx.is_extended_dtype(o.dtype) else o for o in fn(*xs)]

    specs = [x.sharding.spec if isinstance(x.sharding, NamedSharding) else PartitionSpec() for x in inputs]
    shaped = []
    for x, spec in zip(inputs, specs, strict=True):
        a = jax.random.key_data(x) if jx.is_extended_dtype(x.dtype) else x
        shaped.append(jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(mesh, spec)))
    try:
        with jx.program_mesh_context(mesh):
            exported = jax.export.export(jax.jit(on_key_data))(*shaped)
        blob = exported.serialize()
    except Exception as err:  # a host callback cannot be exported; flatbuffers missing; ...
        raise ArtifactError(f"stage {k} cannot be saved with jax.export: {type(err).__name__}: {err}") from err
    arrays, manifest_in, manifest_out = {}, [], []
    for j, (x, spec) in enumerate(zip(inputs, specs, strict=True)):
        a, name, stored = _stored(x)
        arrays[f"in_{j}"] = a
        manifest_in.append({"key": f"in_{j}", "name": f"{stage.inputs[j].source}", "dtype": name, "stored_as": stored,
                            "shape": list(a.shape), "spec": _spec_json(spec)})
    for j, (v, x) in enumerate(zip(stage.outputs, outputs, strict=True)):
        a, name, stored = _stored(x)
        arrays[f"out_{j}"] = a
        manifest_out.append({"key": f"out_{j}", "name": value_name(v), "dtype": name, "stored_as": stored,
                             "shape": list(a.shape)})
    manifest = {"stage": k, "devices": int(mesh.devices.size), "mesh_shape": [int(s) for s in mesh.devices.shape],
                "mesh_axes": list(mesh.axis_names), "jax": jax.__version__, "inputs": manifest_in,
                "outputs": manifest_out}
    script = directory / f"run_stage_{k}.py"
    try:
        (directory / f"stage_{k}.jax_export").write_bytes(bytes(blob))
        np.savez(directory / f"stage_{k}_data.npz", **arrays)
        (directory / f"stage_{k}.json").write_text(json.dumps(manifest, indent=2) + "\n")
        script.write_text(SCRIPT.format(k=k, script=script.name, shape=dict(mesh.shape)))
    except OSError as err:
        raise ArtifactError(f"cannot write stage {k} into {str(directory)!r}: {err.strerror or err}") from None
    return script
