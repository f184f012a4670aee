"""Derivatives through padding: a value ranged over more devices than it has rows (4 rows over 8: one row each, the
last four devices' blocks wholly padding) holds whatever its op computed there — ``x / sum(x * x)`` is ``0 / 0``.
An operand broadcast along that axis (a size-1 row, a replicated argument) must take no cotangent from those rows,
or the ``0 * NaN`` of a padding device reaches the real gradient through the sum over devices (found by the user
fuzzer: ``tests/test_fuzz_users.py``, seed 10597858, part 7 — every element of the gradient NaN).

Oracle: the unsharded function's gradient on the same inputs (``assert_differentiates_as_unsharded``).
"""

import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from tests.conftest import assert_differentiates_as_unsharded, covering

RNG = np.random.default_rng(0)
ROW = RNG.normal(size=(1, 8)).astype(np.float32)


def _unit_rows(x):
    return x / jnp.sum(x * x, axis=1, keepdims=True)


CASES = [
    ("times its own column sums", lambda x, r: _unit_rows(x) * jnp.sum(x, axis=0, keepdims=True)),
    ("times a replicated row", lambda x, r: _unit_rows(x) * r),
    ("a replicated row over the row norms", lambda x, r: r / jnp.sum(x * x, axis=1, keepdims=True)),
    ("a replicated scalar times", lambda x, r: _unit_rows(x) * r[0, 0]),
    ("where, else a replicated row", lambda x, r: jnp.where(x > 0, _unit_rows(x), r)),
]
ROWS = {"4 rows over 8": (4, "8", P("i")), "3 rows over 8": (3, "8", P("i")),
        "5 rows over i*j": (5, "4x2", P(("i", "j")))}


@pytest.mark.parametrize("name,f,rows", covering(CASES, list(ROWS)))
def test_a_broadcast_operand_takes_no_derivative_from_padding(name, f, rows, meshes):
    n, mesh, spec = ROWS[rows]
    x = RNG.normal(size=(n, 8)).astype(np.float32)
    assert_differentiates_as_unsharded(f, (x, ROW), mesh=meshes[mesh], in_specs=(spec, P()), rtol=1e-4, atol=1e-4)
