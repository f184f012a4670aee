"""Splitting around a slice laid out unevenly over a compound mesh axis (issue #48, found by a battery of
row-mixing ops between a ranged operand and a quotient whose padding is NaN). Oracle: the unsharded function and
both gradients on the same inputs.

* Placing a gather where it moves fewest bytes (``strategies.pull_gathers_back``) priced the move to a layout
  whose mesh axes do not divide the axis as equal blocks: a raw ``ValueError`` from the move planner.
* A stage that received a ranged value in two layouts, moving from one of them, still listed the other as an
  input it never read: an ``InvariantError``.
"""

import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from tests.conftest import assert_differentiates_as_unsharded, assert_same_as_unsharded, covering

X = np.random.default_rng(1).normal(size=(16, 4)).astype(np.float32)


def _gram_of_a_slice(x):  # 11 rows over ('k', 'i'): 4 blocks that do not divide them
    return x[2:13].T @ x[2:13]


def _quotient(x):
    return x / jnp.sum(x * x, axis=1, keepdims=True)


def _gram_row_plus_a_slice(x):
    y = (x[2:13].T @ x[2:13])[0:1] + x[2:13]
    return y * _quotient(y)


CASES = [("the Gram matrix of an uneven slice", _gram_of_a_slice),
         ("a Gram row added to the slice, times its quotient", _gram_row_plus_a_slice)]


@pytest.mark.parametrize("name,f,strategy", covering(CASES, ["auto", "gather", "collective"]))
def test_an_uneven_slice_over_a_compound_axis_runs_as_unsharded(name, f, strategy, meshes):
    in_specs = (P(("k", "i"), "j"),)
    assert_same_as_unsharded(f, (X,), mesh=meshes["2x2x2"], in_specs=in_specs, strategy=strategy, rtol=1e-4,
                             atol=1e-4)
    assert_differentiates_as_unsharded(f, (X,), mesh=meshes["2x2x2"], in_specs=in_specs, strategy=strategy,
                                       rtol=1e-4, atol=1e-4)
