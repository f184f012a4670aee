"""Custom derivative rules survive sharding.

The traced graph inlines calls that carry custom derivative rules — ``jax.nn.relu`` is a ``custom_jvp``, a user
may clip gradients with a ``custom_vjp`` or make a norm safe at zero, ``jnp.linalg.solve`` has its own
transpose — so it holds their forward computation only. Differentiating the program's own ops would
differentiate that forward, not the rule (relu's derivative at 0 would come out 1/2, a clipped gradient
unclipped). A Program whose graph inlined such a call is therefore differentiated the way ``jax.jit``
differentiates the user's function: its derivative is another sharded program, traced from ``jax.jvp`` of the
function (``jax.vjp`` when a ``custom_vjp`` is inside, which has no forward mode, as under ``jax.jit``), where
JAX applies every rule. Programs without such calls are differentiated directly, op by op.

>>> fs = autoshard(lambda x: jax.nn.relu(x).sum(), mesh=mesh, in_specs=(P("i"),))     # doctest: +SKIP
>>> jax.grad(fs)(jnp.zeros(8))                       # relu's rule: 0 at 0, as jax.grad(jax.jit(f)) gives
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import numpy as np

from .errors import FallbackWarning
from .expr import jax_adapter as jx
from .expr.graph import warn_at


def _differentiable(x) -> bool:
    """A leaf with a tangent of its own dtype (floats, complex); others' tangents are ``float0``."""
    return jax.numpy.issubdtype(jx.as_dtype(x.dtype), jax.numpy.inexact)


def _float0_zeros(x):
    return np.zeros(np.shape(x), jax.dtypes.float0)


class Derivatives:
    """How a Program is differentiated: ``function`` maps the program's flat argument leaves to its flat output
    leaves; ``compile(fn, in_specs=...)`` shards a derivative function as the program was sharded (an autoshard
    function on its mesh, with its options: the same pipeline, handed in rather than imported), and its derivative
    programs are sharded with the Program's resolved input specs."""

    def __init__(self, function: Callable, in_specs: tuple, *, compile: Callable, reverse: bool):
        self.function, self.in_specs, self.compile, self.reverse = function, tuple(in_specs), compile, reverse
        self._pushforward = self._pullback = None
        self._warned = False

    def wrap(self, run: Callable) -> Callable:
        """``run`` (flat argument leaves -> list of output leaves) with the user's function's derivative."""
        return self._with_vjp(run) if self.reverse else self._with_jvp(run)

    # -- forward mode: jax.jvp of the function, itself sharded ------------------------------------------
    def _with_jvp(self, run: Callable) -> Callable:
        @jax.custom_jvp
        def call(*leaves):
            return run(*leaves)

        @call.defjvp
        def rule(primals, tangents):
            if self._unsharded_higher_order(primals):
                return jax.jvp(self.function, list(primals), list(tangents))
            live = tuple(t for p, t in zip(primals, tangents, strict=True) if _differentiable(p))
            outs, live_out = self.pushforward(primals)(tuple(primals), live)
            more = iter(live_out)
            return list(outs), [next(more) if _differentiable(o) else _float0_zeros(o) for o in outs]

        return call

    def _unsharded_higher_order(self, primals) -> bool:
        """A derivative of the derivative, when the derivative program itself inlined custom rules (solve's
        JVP solves for the tangent, a rule calls another custom_jvp): JAX's linearization would inline that
        program's own wrapper (its inputs are partly unknown there) and the outer derivative would miss those
        rules. Then the derivative is JAX's own, traced from the function without shardprop's stages (XLA
        shards it from its inputs' shardings under jax.jit), with a FallbackWarning — correct, not sharded."""
        if not any(jx.is_differentiated(p) for p in primals):
            return False
        program = self.pushforward(primals).trace(tuple(primals), tuple(
            p for p in primals if _differentiable(p)))
        if not program.plan.graph.custom_derivatives:
            return False
        if not self._warned:
            self._warned = True
            warn_at(jx.user_call_site(),
                    "shardprop: a higher-order derivative through custom derivative rules inside a custom rule ("
                    f"{', '.join(sorted(program.plan.graph.custom_derivatives))} in the derivative): computed by JAX "
                    "from the function, without shardprop's stages, so that every rule applies", FallbackWarning)
        return True

    def pushforward(self, primals) -> Callable:
        """The sharded ``(primals, tangents of the float leaves) -> (outputs, tangents of the float outputs)``."""
        if self._pushforward is None:
            mask = [_differentiable(p) for p in primals]
            function = self.function

            def pushforward(primals, live):
                more = iter(live)
                tangents = [next(more) if m else _float0_zeros(p) for p, m in zip(primals, mask, strict=True)]
                outs, out_tangents = jax.jvp(function, list(primals), tangents)
                return outs, [t for o, t in zip(outs, out_tangents, strict=True) if _differentiable(o)]

            specs = (self.in_specs, tuple(s for s, m in zip(self.in_specs, mask, strict=True) if m))
            self._pushforward = self.compile(pushforward, in_specs=specs)
        return self._pushforward

    # -- reverse mode (a custom_vjp inside): jax.vjp of the function, sharded -----------------------------
    def _with_vjp(self, run: Callable) -> Callable:
        @jax.custom_vjp
        def call(*leaves):
            return run(*leaves)

        def forward(*leaves):
            return run(*leaves), leaves  # the pullback recomputes from the arguments, as jax.checkpoint does

        def backward(leaves, cotangents):
            live = tuple(c for c in cotangents if _differentiable(c))
            grads = iter(self.pullback(leaves, cotangents)(tuple(leaves), live))
            return tuple(next(grads) if _differentiable(x) else _float0_zeros(x) for x in leaves)

        call.defvjp(forward, backward)
        return call

    def pullback(self, primals, cotangents) -> Callable:
        """The sharded ``(primals, cotangents of the float outputs) -> cotangents of the float arguments``."""
        if self._pullback is None:
            in_mask = [_differentiable(p) for p in primals]
            out_mask = [_differentiable(c) for c in cotangents]
            function = self.function

            def pullback(primals, live):
                outs, vjp = jax.vjp(function, *primals)
                more = iter(live)
                cts = [next(more) if m else _float0_zeros(o) for o, m in zip(outs, out_mask, strict=True)]
                return [g for g, m in zip(vjp(cts), in_mask, strict=True) if m]

            specs = (self.in_specs, None)
            self._pullback = self.compile(pullback, in_specs=specs)
        return self._pullback


def derivatives_for(graph, f: Callable, in_specs, *, compile: Callable) -> Derivatives | None:
    """The ``Derivatives`` of a program traced from ``f`` (on ``graph.in_tree``'s arguments), its derivative
    programs sharded by ``compile`` (see ``Derivatives``), or None when its graph inlined no call with custom
    derivative rules (the program's own ops then differentiate)."""
    if not graph.custom_derivatives:
        return None
    in_tree = graph.in_tree

    def flat(*leaves):
        return jax.tree_util.tree_leaves(f(*jax.tree_util.tree_unflatten(in_tree, leaves)))

    reverse = bool(graph.custom_derivatives & jx.CUSTOM_VJP_CALLS)
    return Derivatives(flat, in_specs, compile=compile, reverse=reverse)
