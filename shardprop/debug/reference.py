"""The unsharded reference and how far a sharded value may stray from it.

The oracle is the traced graph evaluated unsharded on one device, each node's own JAX primitive bound eagerly
on whole arrays — what ``jax.core.eval_jaxpr`` does with the traced program. No shardprop rule, plan or per-block
piece takes part, so a bug in any of them shows up as a difference.

How far a value may stray is its own: a hundred rounding units of each element's magnitude, at least of the median
element's — no constant upstream sets it, nor a far larger element beside it, so a causal mask's ``-1e9`` leaves the
scores beside it and the attention weights theirs, and a missing collective is caught at the first value it touches. Rounding carried through (a gradient's, amplified where an optimizer divides by it) is told
apart by the node-local yardstick: a value whose operands agree and whose node, computed unsharded from its sharded
operands, gives the sharded value within a rounding unit of the terms each element is made of (``terms``) agrees.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import OptionError, ReferenceEvaluationError
from ..distributed import whole
from ..expr import jax_adapter as jx
from ..expr.graph import CONSTANT, Node, where
from ..ops import has_record, lookup
from ..ops.opdef import Family, Linearity, Trait
from ..splitting import Plan, Stage


@dataclass(frozen=True)
class Tolerance:
    """``rtol``/``atol`` as given; ``None`` picks per dtype: ``rtol`` 100 ulps (1.2e-5 for f32), ``atol``
    ``rtol`` times the value's *scale*, per element: its own magnitude there, at least its elements' median
    (``own_scale``; or, judging a node by its sharded operands, the magnitude of the terms each element is made of:
    ``terms``)."""

    rtol: float | None = None
    atol: float | None = None

    def __post_init__(self):
        for name in ("rtol", "atol"):
            given = getattr(self, name)
            if given is None:
                continue
            if isinstance(given, bool) or not isinstance(given, numbers.Real) or not math.isfinite(given) \
                    or given < 0:
                raise OptionError(f"{name}={given!r}: expected a finite number >= 0 (or None for the default)")
            object.__setattr__(self, name, float(given))

    def for_value(self, ref: np.ndarray, scale=None, dtype=None) -> tuple[float, Any]:
        """``(rtol, atol)`` for a value whose reference is ``ref``; ``scale`` (default: ``magnitude(ref)``; an array
        of ``ref``'s shape: per element) sets the default ``atol``; ``dtype`` (default ``ref.dtype``) the default
        ``rtol`` (a bfloat16 value compared as float32 keeps bfloat16's precision)."""
        if ref.dtype.kind not in "fc":
            return 0.0, 0.0
        rtol = self.rtol if self.rtol is not None else 100 * float(jnp.finfo(ref.dtype if dtype is None else dtype).eps)
        if self.atol is not None:
            return rtol, self.atol
        return rtol, rtol * (magnitude(ref) if scale is None else scale)

    def __str__(self) -> str:
        rtol = "100 ulps" if self.rtol is None else f"{self.rtol:g}"
        atol = "rtol × each element's magnitude, at least the median's" if self.atol is None else f"{self.atol:g}"
        return f"rtol {rtol}, atol {atol}"


def magnitude(x) -> float:
    """The largest finite magnitude in ``x`` (0 for non-float values and when no element is finite)."""
    x = np.asarray(x)
    if x.dtype.kind not in "fc" or x.size == 0:
        return 0.0
    a = np.abs(x)
    biggest = float(a.max())
    if math.isfinite(biggest):
        return biggest
    return float(a[np.isfinite(a)].max(initial=0.0))


def errors(got: np.ndarray, ref: np.ndarray, tolerance: Tolerance, scale=None, dtype=None
           ) -> tuple[float, float, bool]:
    """``(max abs, max relative, agrees)`` of ``got`` against ``ref`` (as ``.findings.as_numpy`` gives
    them). NaN agrees with NaN and an infinity with the same infinity; a NaN or infinity on one side only is an
    infinite error. The relative error of an element whose reference is 0 is infinite unless it is 0 too.
    ``scale`` and ``dtype`` as ``Tolerance.for_value`` takes them."""
    if got.shape != ref.shape:
        return math.inf, math.inf, False
    if np.array_equal(got, ref):  # the common case, in one pass
        return 0.0, 0.0, True
    if ref.dtype.kind not in "fc":
        if ref.dtype.kind == "b":
            return 1.0, math.inf, False
        diff = np.abs(got.astype(np.float64) - ref.astype(np.float64))
        return float(diff.max()), _relative(diff, np.abs(ref.astype(np.float64))), False
    rtol, atol = tolerance.for_value(ref, scale, dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(got - ref)
    size = np.abs(ref)
    finite = np.isfinite(diff)
    if not finite.all():  # NaN or infinity somewhere: same on both sides is fine, one side only is not
        same = (np.isnan(got) & np.isnan(ref)) | (got == ref)
        if not (finite | same).all():
            return math.inf, math.inf, False
        diff, size = diff[finite], size[finite]
        atol = np.broadcast_to(atol, finite.shape)[finite] if np.ndim(atol) else atol
    agrees = bool((diff <= atol + rtol * size).all())
    return float(diff.max(initial=0.0)), _relative(diff, size), agrees


def _relative(diff: np.ndarray, size: np.ndarray) -> float:
    nonzero = size > 0
    if (diff[~nonzero] > 0).any():
        return math.inf
    if not nonzero.any():
        return 0.0
    return float((diff[nonzero] / size[nonzero]).max())


def bind_whole(node: Node, operands: list, reference: bool = False) -> list:
    """``node`` evaluated unsharded on ``operands`` (whole arrays): its own primitive, bound eagerly. Its
    failure (a host callback of the user's raising, say) is a ``ReferenceEvaluationError`` naming it."""
    if node.op == CONSTANT:
        return [np.asarray(node.params["value"])]
    if has_record(node.op) and lookup(node.op).family is Family.PLACEMENT:
        return list(operands)  # where a value lives is not what it is: the unsharded reference keeps one device
    try:
        return jx.bind(node.primitive, operands, dict(node.params))
    except Exception as err:
        what = "the unsharded reference" if reference else "re-computing it from its sharded operands"
        raise ReferenceEvaluationError(
            f"evaluating `{node.op}` at {where(node)} for {what} failed: "
            f"{type(err).__name__}: {err}") from err


# families whose linear ops make each element a sum of products of operand elements (a contraction, a sum, a
# cumulative sum, a convolution): bound on the operands' magnitudes, they give the magnitude of the terms each element
# adds — the order of which sharding changes
_SUMMING = frozenset({Family.REDUCTION, Family.CONTRACTION, Family.WINDOW, Family.SCAN})


def terms(node: Node, operands: list, outputs: list) -> list[np.ndarray]:
    """Per output of ``node`` (computed from ``operands``), per element: the magnitude of the terms it is made of,
    the scale its rounding is relative to — a sum's, its terms' (bound on the operands' magnitudes); an addition's,
    its own and its operands' at that element (a multiply-add fused rounds once, not twice); any other op's, its own
    (a select's, the element it picked: never a masked branch's ``-1e9``). Infinities and NaN count 0: where a value
    is one, the comparison asks it to be the same."""
    own = [_magnitudes(x) for x in outputs]
    record = lookup(node.op) if has_record(node.op) else None
    if record is not None and record.family in _SUMMING and record.linear is not Linearity.NONE:
        magnitudes = [jnp.abs(x) if jx.dtype_kind(x.dtype) in ("f", "c") else x for x in operands]
        return [np.maximum(a, _magnitudes(b)) for a, b in zip(own, bind_whole(node, magnitudes), strict=True)]
    if record is not None and record.family is Family.ELEMENTWISE and Trait.SUM in record.traits:
        return [a + sum((_magnitudes(x) for x in operands), start=np.zeros(())) for a in own]
    return own


def own_scale(ref: np.ndarray) -> np.ndarray:
    """Per element of a value whose reference is ``ref``, the scale its rounding is judged against: the element's own
    magnitude, and at least the median of its elements' (an element summed from cancelling terms rounds relative to
    its neighbours) — never a far larger element's: a causal mask's ``-1e9`` beside the scores it masks leaves their
    tolerance theirs. Infinities and NaN count 0."""
    magnitudes = _magnitudes(ref)
    return np.maximum(magnitudes, float(np.median(magnitudes))) if magnitudes.size else magnitudes


def _magnitudes(x) -> np.ndarray:
    """``|x|`` as float64, 0 where it is not finite (and for a value not a float: compared exactly)."""
    if jx.is_extended_dtype(x.dtype):  # PRNG keys
        return np.zeros(x.shape)
    a = np.asarray(x)
    if a.dtype.kind == "V":  # bfloat16, float8: numpy has no arithmetic for them
        a = a.astype(np.float32)
    if a.dtype.kind not in "fc":
        return np.zeros(a.shape)
    magnitude = np.abs(a).astype(np.float64)
    return np.where(np.isfinite(magnitude), magnitude, 0.0)


class Reference:
    """The unsharded values of the program's nodes, evaluated node by node in program order on one device (one
    small dispatch per node: no compile of a whole stage with thousands of outputs); a value is dropped once
    the last stage that reads it has been evaluated."""

    def __init__(self, plan: Plan, args: list):
        self.plan = plan
        self.device = jax.local_devices()[0]  # each process evaluates its own reference, on a device of its own
        with jx.no_mesh_context():  # onto one device, whatever mesh the user has set
            self.env = {v: self.place(x) for v, x in zip(plan.graph.inputs, args, strict=True)}
        graph = plan.graph
        self._last_read: dict[int, int] = {}
        for stage in plan.stages:
            for n in stage.nodes:
                for u in graph.nodes[n].operands:
                    self._last_read[u] = stage.id

    def place(self, x) -> Any:
        """``x`` whole on the reference's device (a value spanning other processes gathered from them first)."""
        return jax.device_put(whole(x), self.device)

    def evaluate(self, stage: Stage) -> dict[int, Any]:
        """Every value ``stage`` computes, unsharded."""
        graph, env = self.plan.graph, self.env
        results: dict[int, Any] = {}
        for n in stage.nodes:
            node = graph.nodes[n]
            outs = bind_whole(node, [env[u] for u in node.operands], reference=True)
            env.update(zip(node.outputs, outs, strict=True))
            results.update(zip(node.outputs, outs, strict=True))
        for v in [v for v in env if self._last_read.get(v, -1) <= stage.id]:
            del env[v]
        return results
