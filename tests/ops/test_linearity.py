"""The ``linear`` piece of every record, against the definition: an op marked linear in an operand gives, applied
to two summands of that operand, results that sum to the op applied to their sum (the other operands fixed).
That is what lets a loop keep a partial sum through it (``splitting/partial_sums.py``)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from shardprop.ops import table
from shardprop.ops.opdef import Linearity

X = (4, 6)
# primitive -> (function of the operands, operand shapes); the linear operands are those the record names
PROGRAMS = {
    "neg": (lax.neg, [X]),
    "copy": (lambda x: lax.copy_p.bind(x), [X]),
    "real": (lambda x: lax.real(x.astype(jnp.complex64)), [X]),
    "imag": (lambda x: lax.imag(x.astype(jnp.complex64) * 1j), [X]),
    "conj": (lambda x: lax.conj(x.astype(jnp.complex64)).real, [X]),
    "add": (lax.add, [X, X]),
    "add_any": (lambda a, b: jax.lax.add(a, b), [X, X]),  # add_any is emitted by autodiff; same arithmetic
    "sub": (lax.sub, [X, X]),
    "mul": (lax.mul, [X, X]),
    "div": (lax.div, [X, X]),
    "reduce_sum": (lambda x: jnp.sum(x, axis=1), [X]),
    "reshape": (lambda x: x.reshape(6, 4), [X]),
    "broadcast_in_dim": (lambda x: jnp.broadcast_to(x, (3, *X)), [X]),
    "squeeze": (lambda x: lax.squeeze(x[None], (0,)), [X]),
    "transpose": (lambda x: x.T, [X]),
    "slice": (lambda x: x[1:3, ::2], [X]),
    "rev": (lambda x: lax.rev(x, (1,)), [X]),
    "dynamic_slice": (lambda x, i: lax.dynamic_slice(x, (i.astype(jnp.int32)[0, 0] % 2, 0), (2, 6)), [X, X]),
    "concatenate": (lambda a, b: jnp.concatenate([a, b], axis=0), [X, X]),
    "cumsum": (lambda x: jnp.cumsum(x, axis=1), [X]),
    "dot_general": (lambda a, b: a @ b.T, [X, X]),
    "conv_general_dilated": (lambda x, k: lax.conv_general_dilated(x, k, (1, 1), "SAME"),
                             [(2, 3, 6, 6), (4, 3, 3, 3)]),  # bilinear, as a contraction is (with zero padding)
}
LINEAR = {name: op.linear for name, op in sorted(table().items()) if op.linear is not Linearity.NONE}


def test_every_linear_record_has_a_program_here():
    assert set(LINEAR) == set(PROGRAMS)


def _split_cases(linearity: Linearity, n: int) -> list[tuple[int, ...]]:
    """Which operands are split into summands, per case: every operand together (joint), the first alone, or
    each alone in turn (bilinear)."""
    if linearity is Linearity.JOINT:
        return [tuple(range(n))]
    if linearity is Linearity.EITHER:
        return [(i,) for i in range(n)]
    return [(0,)]


@pytest.mark.parametrize("name", sorted(LINEAR))
def test_a_linear_record_is_linear(name):
    f, shapes = PROGRAMS[name]
    rng = np.random.default_rng(7)
    operands = [rng.normal(size=s).astype(np.float32) + 2.0 for s in shapes]  # away from 0 for the divisor
    for split in _split_cases(LINEAR[name], len(shapes)):
        first = list(operands)
        second = list(operands)
        for i in split:
            part = rng.normal(size=shapes[i]).astype(np.float32)
            first[i], second[i] = part, operands[i] - part
        whole = np.asarray(f(*map(jnp.asarray, operands)))
        summed = np.asarray(f(*map(jnp.asarray, first))) + np.asarray(f(*map(jnp.asarray, second)))
        np.testing.assert_allclose(summed, whole, rtol=2e-3, atol=2e-3, err_msg=f"{name}: split {split}")


def test_integer_division_is_not_linear_and_a_loop_does_not_defer_through_it(mesh):
    """Integer division rounds: a partial sum halved on each device is not the sum halved (found by a review:
    an integer carry accumulating row sums and halving them came out 55 instead of 56)."""
    import shardprop as sp
    from jax.sharding import PartitionSpec as P

    def f(xs, c0):
        return lax.scan(lambda c, x: (lax.div(c + jnp.sum(x), jnp.int32(2)), None), c0, xs)[0]

    xs = np.arange(3 * 16, dtype=np.int32).reshape(3, 16) % 7 + 1
    for strategy in ("auto", "collective"):
        got = sp.autoshard(f, mesh=mesh, in_specs=(P(None, "i"), P()), strategy=strategy)(xs, np.int32(1))
        assert int(got) == int(f(xs, np.int32(1))) == 56
    assert not Linearity.FIRST_IF_FLOAT.passes([True, False], np.dtype(np.int32))


def test_a_conversion_is_linear_only_to_a_float_type():
    assert Linearity.FIRST_IF_FLOAT.passes([True], jnp.bfloat16)
    assert not Linearity.FIRST_IF_FLOAT.passes([True], np.dtype(np.int32))


@pytest.mark.parametrize("name,f", [("exp", jnp.exp), ("max", lambda x: jnp.maximum(x, 0.5)),
                                    ("integer_pow", lambda x: x ** 2)])
def test_records_not_marked_linear_are_not(name, f):
    """The oracle tells a non-linear op apart (so the test above is not vacuous)."""
    assert table()[name].linear is Linearity.NONE
    x = np.linspace(-1, 1, 12, dtype=np.float32)
    assert not np.allclose(f(x / 2) + f(x / 2), f(x), atol=1e-3)
