"""Prints the stage fingerprints of a few programs (one process, 8 CPU devices): tests/test_distributed.py runs it
under two hash seeds, which must not change any plan (every process of a cluster must make the same one)."""

import jax

jax.config.update("jax_num_cpu_devices", 8)

import numpy as np  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import shardprop as sp  # noqa: E402
from examples import mlp, recurrent  # noqa: E402
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
for name, (f, args, specs) in programs.items():
    for strategy in ("gather", "collective", "auto"):
        prog = sp.autoshard(f, mesh=mesh, in_specs=specs, strategy=strategy).trace(*args)
        print(name, strategy, sp.distributed.stage_fingerprints(prog.plan))
