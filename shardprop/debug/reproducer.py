"""``dbg.save_stage(k, directory)``: one stage as a standalone reproducer a user can attach to a bug report.

The directory gets the stage as a serialized ``jax.export`` artifact, its inputs and the outputs it gave
(``.npz``), a manifest, and a short script that needs only JAX: it rebuilds a mesh of the same shape, places the
inputs as they were, runs the artifact and compares with the saved outputs (exit status 0 when equal).

On a mesh spanning several processes every process calls it (the inputs and outputs are gathered whole); process 0
writes the files, and every process raises the same ``shardprop.ArtifactError`` if that fails.
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
from ..distributed import any_process, whole
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


def rounding_only(got, want, dtype):
    """Saved on several processes, a sum across them was added in another order than here: equal to rounding
    (100 ulps of the dtype, relative to the largest magnitude) is a match; anything else is not."""
    if MANIFEST.get("processes", 1) == 1 or got.shape != want.shape or not np.issubdtype(want.dtype, np.inexact):
        return None
    got, want = got.astype(np.float64), want.astype(np.float64)
    if not (np.isnan(got) == np.isnan(want)).all():
        return None
    rtol = 100 * float(jax.numpy.finfo(jax.numpy.dtype(dtype)).eps)
    difference = float(np.nanmax(np.abs(got - want), initial=0.0))
    return difference if difference <= rtol * float(np.nanmax(np.abs(want), initial=0.0)) else None


ok = True
for entry, got in zip(MANIFEST["outputs"], outputs):
    want, got = load(entry), np.asarray(got)
    # bit for bit (NaN included; bfloat16 has no numpy arithmetic, its bytes compare all the same)
    same = got.shape == want.shape and got.dtype == want.dtype and got.tobytes() == want.tobytes()
    close = None if same else rounding_only(got, want, entry["dtype"])
    ok &= bool(same) or close is not None
    verdict = "matches the saved output" if same else "DIFFERS from the saved output" if close is None else \
        f"matches the saved output to rounding (max abs difference {{close:.3g}}: saved on " \
        f"{{MANIFEST['processes']}} processes, whose collectives add in another order)"
    print(f"{{entry['name']}}: {{got.dtype}}{{list(got.shape)}} {{verdict}}")
sys.exit(0 if ok else 1)
'''


def _stored(x) -> tuple[np.ndarray, str, str]:
    """``(numpy array to save, dtype name, dtype stored as)``: PRNG keys as their key data, dtypes numpy cannot
    save by name (bfloat16, float8) as unsigned integers of the same width."""
    if jx.is_extended_dtype(x.dtype):
        x = jax.random.key_data(x)
    a = np.asarray(whole(x))
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
    manifest = {"stage": k, "devices": int(mesh.devices.size), "processes": jax.process_count(),
                "mesh_shape": [int(s) for s in mesh.devices.shape],
                "mesh_axes": list(mesh.axis_names), "jax": jax.__version__, "inputs": manifest_in,
                "outputs": manifest_out}
    script = directory / f"run_stage_{k}.py"
    files = {directory / f"stage_{k}.jax_export": bytes(blob),
             directory / f"stage_{k}.json": (json.dumps(manifest, indent=2) + "\n").encode(),
             script: SCRIPT.format(k=k, script=script.name, shape=dict(mesh.shape)).encode()}
    failure = _write(files, directory / f"stage_{k}_data.npz", arrays) if jax.process_index() == 0 else None
    # Process 0 writes; every process hears whether it could, so all raise or none does (no process left waiting).
    if any_process([failure is not None])[0]:
        reason = failure or "process 0 could not write it (its error is reported there)"
        raise ArtifactError(f"cannot write stage {k} into {str(directory)!r}: {reason}")
    return script


def _write(files: dict[Path, bytes], data: Path, arrays: dict[str, np.ndarray]) -> str | None:
    """Write the reproducer's files; the reason it could not, or None."""
    try:
        data.parent.mkdir(parents=True, exist_ok=True)
        for path, content in files.items():
            path.write_bytes(content)
        np.savez(data, **arrays)
    except OSError as err:
        return str(err.strerror or err)
    return None
