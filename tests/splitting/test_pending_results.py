"""A result not yet combined — a partial sum waiting for its ``psum`` further down a linear chain
(``defer_sums_past_linear_consumers``), or a loop's carry kept partial (``partial_sums``) — read by an op that reads
ranged rows or its neighbours' rows (a slice realigned to equal blocks, a pad, a concatenation, a roll): the sum is
finished first, where it is made. Found by an outside fuzzer (issue #48): ``jnp.sum(x, axis=1)[2:6]`` on a 2×4 mesh
was off by up to 5.3, its realignment dropped from the slice the chain reached. Oracle: the unsharded function and
gradient on the same inputs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from tests.conftest import assert_differentiates_as_unsharded, assert_same_as_unsharded, covering, random_args

X, W = random_args([((8, 4), np.float32), ((4, 8), np.float32)])
Y = random_args([((16, 8), np.float32)], seed=1)[0]

CASES = [  # (name, f, args, in_specs)
    ("a slice of a sum (issue #48)", lambda x: jnp.sum(x, axis=1)[2:6], (X,), (P("i", "j"),)),
    ("a slice of a mean, shifted by one", lambda x: jnp.mean(x, axis=1)[1:7], (X,), (P("i", "j"),)),
    ("a strided slice of a sum", lambda x: jnp.sum(x, axis=1)[1::2], (X,), (P("i", "j"),)),
    ("a pad of a sum", lambda x: jnp.pad(jnp.sum(x, axis=1), (3, 1)) * 2.0, (X,), (P("i", "j"),)),
    ("a sum joined to a slice of itself", lambda x: jnp.concatenate([jnp.sum(x, 1), jnp.sum(x, 1)[:4]]), (X,),
     (P("i", "j"),)),
    ("a roll of a sum", lambda x: jnp.roll(jnp.sum(x, axis=1), 3), (X,), (P("i", "j"),)),
    ("a slice of a contraction", lambda x, w: (x @ w)[2:6] * 0.5, (X, W), (P("i", "j"), P("j", None))),
    ("a compound slice of a sum", lambda y: jnp.sum(y, axis=1)[4:12], (Y,), (P(("j", "i"), None),)),
    ("a scaled sum, then sliced", lambda x: (2.0 * jnp.sum(x, axis=1))[2:6], (X,), (P("i", "j"),)),
    ("a loop's carry, sliced from a sum", lambda x: jax.lax.fori_loop(
        0, 3, lambda _, c: c + jnp.pad(jnp.sum(x, axis=1)[2:6], (2, 2)), jnp.zeros(8)), (X,), (P("i", "j"),)),
]


@pytest.mark.parametrize("name,f,args,in_specs,strategy,mesh_name", covering(CASES, ["collective", "auto"],
                                                                             ["2x4", "4x2", "8"]))
def test_a_result_not_yet_combined_is_combined_before_its_rows_move(name, f, args, in_specs, strategy, mesh_name,
                                                                   meshes):
    mesh = meshes[mesh_name]
    if mesh_name == "8":  # one mesh axis: the sum's axis and the kept axis cannot both be sharded
        in_specs = tuple(P(*(e if e == "i" else None for e in spec)) for spec in in_specs)
    assert_same_as_unsharded(f, args, mesh=mesh, in_specs=in_specs, strategy=strategy, rtol=1e-5, atol=1e-5)
    assert_differentiates_as_unsharded(f, args, mesh=mesh, in_specs=in_specs, strategy=strategy, rtol=1e-5,
                                       atol=1e-5)
