"""What differs between the JAX releases shardprop supports (0.10.2 through 0.12.x), decided once, here.

The rest of shardprop reads equations in one vocabulary, 0.10.2's: a ``scan`` equation's params are
``jaxpr, num_consts, num_carry, length, reverse, unroll`` whatever the installed JAX calls them. Equations read
from a jaxpr are put into that vocabulary (``read_params``) and put back into the installed JAX's before they
are bound (``bind_params``). Every difference is detected from the installed JAX's features, not its version
number, except where a name set has to be listed (``PRIMITIVES_OF_SOME_RELEASES``).
"""

from __future__ import annotations

import inspect
import itertools
from typing import Any

import jax

from ...errors import UnsupportedJaxError

# the releases supported, as pyproject.toml declares them (tests/test_versions.py holds the two to each other)
OLDEST, NEWER_THAN_ALL = (0, 10, 2), (0, 13)


def release(version: str) -> tuple[int, ...]:
    """A version string's numeric release, for comparing: ``"0.12.0.1"`` → ``(0, 12, 0, 1)``; a suffix such as
    ``.dev20261101`` or ``rc1`` ends it."""
    out = []
    for part in version.split("."):
        digits = "".join(itertools.takewhile(str.isdigit, part))
        if not digits:
            break
        out.append(int(digits))
        if digits != part:
            break
    return tuple(out)


def check_supported(version: str) -> None:
    """Raise ``shardprop.UnsupportedJaxError`` naming ``version`` and the supported range unless
    ``OLDEST <= version < NEWER_THAN_ALL`` (shardprop reads JAX's internals, which change between releases)."""
    if not OLDEST <= release(version) < NEWER_THAN_ALL:
        supported = f"jax>={'.'.join(map(str, OLDEST))},<{'.'.join(map(str, NEWER_THAN_ALL))}"
        raise UnsupportedJaxError(
            f"shardprop supports {supported}, and jax {version} is installed: shardprop reads JAX's internal "
            f"representation, which changes between releases; install a supported JAX (pip install "
            f"'{supported}') or a shardprop release made for jax {version}")


check_supported(jax.__version__)  # before anything below reads an internal this JAX may not have

# (imported after the check: these internals are where releases differ)
from jax._src.lax import eval_jaxpr as _eval_jaxpr  # noqa: E402
from jax._src.lax.control_flow import loops as _loops  # noqa: E402

JAX_VERSION: tuple[int, ...] = release(jax.__version__)

# jax 0.12 describes a scan's operands and results as flat trees (``ft_in`` packs consts, carry and xs;
# ``ft_out`` carry and ys) where 0.10.2 gave their counts (``num_consts``, ``num_carry``).
SCAN_FLAT_TREES = "ft_in" in inspect.signature(_loops._scan_impl).parameters
if SCAN_FLAT_TREES:
    from jax._src import flattree as _ft

# ``eval_jaxpr`` (a call of a closed jaxpr) holds its body as ``jaxpr`` in 0.10.2, ``call_jaxpr`` in 0.12, where it is
# also what ``core.call``/``closed_call`` bind.
EVAL_JAXPR_BODY = "call_jaxpr" if "call_jaxpr" in inspect.signature(
    _eval_jaxpr.eval_jaxpr_p.impl).parameters else "jaxpr"

# Primitive names some supported release defines and another does not: the completeness check allows a record,
# an inlined call or a reason for each of these whether or not the installed JAX defines it.
PRIMITIVES_OF_SOME_RELEASES = frozenset({
    # 0.10.2 only
    "box_get", "box_set", "new_box", "log_extend", "log_read", "new_log", "call", "closed_call", "shard_alike",
    "pbroadcast_start", "pbroadcast_done", "psum_start", "unreduced_psum_start", "unreduced_reduce_scatter_start",
    "reduced_vary_cast_p", "vary_unreduced_cast_p",  # renamed (without the _p) in 0.12
    # newer releases only (log2 and one_minus_square from 0.11, the rest from 0.12)
    "log2", "one_minus_square", "polynomial", "unreduced_pmax", "unreduced_pmin", "reduced_vary_cast",
    "vary_unreduced_cast", "pbroadcast_dynamic", "relayout", "program_order", "with_memory_space_constraint",
    "xla_metadata_call",
    # 0.12.1 and later
    "acospi", "asinpi", "atanpi", "cospi", "sinpi", "tanpi", "exp2m1", "log2p1", "atan2pi", "fma", "fmuladd",
    "random_gamma_grad", "random_poisson", "raw_bits", "pmax_scatter", "pmin_scatter", "pxor",
})


def read_params(name: str, params) -> Any:
    """An equation's params in shardprop's vocabulary (the same object when nothing differs)."""
    if name == "scan" and "ft_in" in params:
        num_consts, num_carry, _ = (len(t) for t in params["ft_in"].unpack())
        out = {k: v for k, v in params.items() if k not in ("ft_in", "ft_out")}
        out.update(num_consts=num_consts, num_carry=num_carry)
        return out
    return params


def bind_params(name: str, params) -> Any:
    """Params in shardprop's vocabulary (or already the installed JAX's) as the installed JAX binds them."""
    if name == "scan" and SCAN_FLAT_TREES and "num_consts" in params:
        out = {k: v for k, v in params.items() if k not in ("num_consts", "num_carry", "linear", "_split_transpose")}
        num_consts, num_carry = params["num_consts"], params["num_carry"]
        jaxpr = params["jaxpr"]
        num_xs = len(jaxpr.in_avals) - num_consts - num_carry
        num_ys = len(jaxpr.out_avals) - num_carry
        out["ft_in"] = _ft.pack((_ft.nones(num_consts), _ft.nones(num_carry), _ft.nones(num_xs)))
        out["ft_out"] = _ft.pack((_ft.nones(num_carry), _ft.nones(num_ys)))
        return out
    return params
