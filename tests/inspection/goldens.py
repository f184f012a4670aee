"""The golden texts of the Nx example (and an RNN gradient's loops): what produces each file in ``golden/``.

The tests only compare (``test_listing_and_dot.py``). After a deliberate change, regenerate the files with
``python -m tests.inspection.goldens`` and read the diff before committing it. A JAX release that traces a
golden's program otherwise than the documented one (``tests/releases.py``) has its own copy under
``golden/jax-<major>.<minor>/``: run the generator under that release too.
"""

from pathlib import Path

import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import shardprop as sp

from shardprop.expr.jax_adapter import JAX_VERSION
from shardprop.expr.jax_adapter.versions import release

from ..releases import ON_DOCUMENTED, RELEASE
from .nx_example import f

GOLDEN = Path(__file__).parent / "golden"


def golden_path(name: str) -> Path:
    """The golden of ``name`` for the installed JAX: the copy under ``golden/jax-<major>.<minor>/`` of the newest
    release up to the installed one that traced it otherwise (a difference lasts until a later copy says other)."""
    if ON_DOCUMENTED:
        return GOLDEN / name
    def of(folder: Path) -> tuple[int, ...]:  # "jax-0.11" -> (0, 11)
        return release(folder.name.removeprefix("jax-"))

    own = [d / name for d in GOLDEN.glob("jax-*") if of(d) <= JAX_VERSION[:2] and (d / name).exists()]
    return max(own, key=lambda p: of(p.parent), default=GOLDEN / name)


def nx_program(mesh, strategy):
    a = jnp.ones((16, 8))
    return sp.autoshard(f, mesh=mesh, in_specs=(P("i", "j"), None), strategy=strategy).trace(a, a)


def _shards(mesh) -> str:
    sharded = nx_program(mesh, "gather").sharded
    return "\n".join(sharded.describe(v) for v in range(len(sharded.graph.avals)))


def _rnn_grad_listing(mesh) -> str:
    """The listing of an RNN's gradient: both scans with their bodies indented under them, the backward body's
    weight-gradient sums left partial (one psum after the loop)."""
    import jax

    from shardprop.examples import recurrent

    xs, h0 = jnp.ones((6, 8, 16)), jnp.ones((8, 16))
    grad = sp.autoshard(jax.grad(recurrent.rnn_loss), mesh=mesh, in_specs=(None, P(None, "i"), P("i")))
    return str(grad.trace(recurrent.init_rnn(), xs, h0).graph)


# file name -> the text it holds, from the (4, 2) mesh
GOLDENS = {
    "rnn_grad_listing_auto.txt": _rnn_grad_listing,
    "nx_listing_gather.txt": lambda mesh: str(nx_program(mesh, "gather").graph),
    "nx_listing_auto.txt": lambda mesh: str(nx_program(mesh, "auto").graph),
    "nx_shards.txt": _shards,
    "nx_gather.dot": lambda mesh: sp.to_dot(nx_program(mesh, "gather")),
}


def main() -> None:
    import jax

    jax.config.update("jax_num_cpu_devices", 8)
    mesh = sp.make_mesh((4, 2), ("i", "j"))
    for name, produce in GOLDENS.items():
        text, own = produce(mesh) + "\n", GOLDEN / RELEASE / name
        if ON_DOCUMENTED:
            (GOLDEN / name).write_text(text)
            print(f"wrote {GOLDEN / name}")
        elif text != golden_path(name).read_text():  # this release traces it otherwise than the one before: its copy
            own.parent.mkdir(exist_ok=True)
            own.write_text(text)
            print(f"wrote {own}")


if __name__ == "__main__":
    main()
