"""Prints the stage fingerprints of a few programs (one process, 8 CPU devices): tests/test_distributed.py runs it
under two hash seeds, which must not change any plan (every process of a cluster must make the same one)."""

import warnings

import jax

jax.config.update("jax_num_cpu_devices", 8)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import shardprop as sp  # noqa: E402
from shardprop.examples import mlp, recurrent  # noqa: E402
from tests.functions import nx_example  # noqa: E402

mesh = sp.make_mesh((4, 2), ("i", "j"))
a = np.ones((16, 8), np.float32)
gates_on_j = {"wx": P(None, "j"), "wh": P(None, "j"), "b": P("j")}
programs = {
    "nx": (nx_example, (a, a), (P("i", "j"), None)),
    "mlp": (mlp.train_step, (mlp.init_params((16, 32, 4)), np.ones((16, 16), np.float32), np.zeros(16, np.int32)),
            (P(), P("i"), P("i"))),
    "gru_grad": (jax.grad(recurrent.gru_loss), (recurrent.init_gru(), np.ones((6, 8, 16), np.float32),
                                                np.ones((8, 16), np.float32)), (gates_on_j, P(None, "i"), P("i"))),
}
# Mesh axes named by several strings, whose sets iterate in hash-seed order: a conflict between two orders of the
# same axes, a loop's deferred sum over two axes, reductions finished over several axes (from the audit of #16).
xyz = sp.make_mesh((2, 2, 2), ("x", "y", "z"))
warnings.simplefilter("ignore", sp.ReshardWarning)  # the conflict is resolved on purpose
sixteen = np.ones((16, 16), np.float32)


def conflict(a, b):
    return (a + b) @ (a - b).T, jnp.max(a * b, axis=0), jnp.argmax(a - b, axis=1)


programs_xyz = {
    "conflict_xyz": (conflict, (sixteen, sixteen), (P(("x", "y"), "z"), P("z", ("y", "x")))),
    "rnn_grad_xyz": (jax.grad(recurrent.rnn_loss), (recurrent.init_rnn(), np.ones((6, 8, 16), np.float32),
                                                    np.ones((8, 16), np.float32)),
                     ({"w": P(None, "z"), "u": P(None, "z"), "b": P("z")}, P(None, ("x", "y")), P(("x", "y")))),
    "reductions_xyz": (lambda x: (jnp.argmin(x, axis=1), jnp.max(x), jnp.min(x, axis=0)), (sixteen,),
                       (P(("z", "x"), "y"),)),
}
for name, (f, args, specs) in [*programs.items(), *programs_xyz.items()]:
    for strategy in ("gather", "collective", "auto"):
        on = xyz if name in programs_xyz else mesh
        prog = sp.autoshard(f, mesh=on, in_specs=specs, strategy=strategy).trace(*args)
        print(name, strategy, sp.distributed.stage_fingerprints(prog.plan))
