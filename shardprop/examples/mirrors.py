"""Outputs laid out like the arguments they mirror: the gradients of ``sum(x @ y)`` (constant cotangents, which no
sharded operand reaches) come out in their arguments' layouts, as jax.jit's explicit mode types a cotangent like its
primal (docs/design.md, "Outputs mirror arguments").

    python -m shardprop.examples.mirrors
"""

import jax

jax.config.update("jax_num_cpu_devices", 8)
import numpy as np  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import shardprop as sp  # noqa: E402

gradients = jax.grad(lambda x, y: (x @ y).sum(), argnums=(0, 1))
SPECS = (P("x"), P(None, "y"))


def arguments():
    rng = np.random.default_rng(0)
    return rng.normal(size=(8, 8)).astype(np.float32), rng.normal(size=(8, 8)).astype(np.float32)


if __name__ == "__main__":
    mesh = sp.make_mesh((2, 2), ("x", "y"))
    prog = sp.autoshard(gradients, mesh=mesh, in_specs=SPECS).trace(*arguments())
    print(prog.out_specs)
    print(sp.explain(prog, prog.plan.graph.outputs[0]))
