"""One program (or more) per primitive record, run on sharded inputs by ``test_completeness.py``.

Each :class:`Example` names the primitives it must emit, a function written with the public JAX API, the
argument types, a mesh and in_specs that shard the arguments. Programs share primitives where that is natural
(one program of every float unary op), so the table stays short and the suite fast.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.ad_checkpoint import checkpoint_name
from jax.extend.core import primitives as prims
from jax.sharding import PartitionSpec as P

from shardprop.expr import jax_adapter as jx

F32, I32, U32, BOOL = np.float32, np.int32, np.uint32, np.bool_
M = (16, 8)
B = (4, 6, 6)  # a batch of four 6x6 matrices, for the linear algebra


@dataclass(frozen=True)
class Example:
    name: str
    primitives: frozenset[str]
    fn: object
    args: tuple  # (shape, dtype) per argument
    specs: tuple
    mesh: str = "4x2"
    positive: bool = False  # draw positive inputs (logs, roots, gamma functions)


def ex(name, primitives, fn, args, specs, **kw) -> Example:
    return Example(name, frozenset(primitives.split()), fn, tuple(args), tuple(specs), **kw)


UNARY = {
    "neg": lax.neg, "sign": lax.sign, "floor": lax.floor, "ceil": lax.ceil, "round": lax.round,
    "is_finite": lax.is_finite, "exp": lax.exp, "exp2": lax.exp2, "log": lax.log, "log1p": lax.log1p,
    "expm1": lax.expm1, "tanh": lax.tanh, "logistic": lax.logistic, "sin": lax.sin, "cos": lax.cos,
    "tan": lambda x: lax.tan(x / 4), "asin": lambda x: lax.asin(x / 8), "acos": lambda x: lax.acos(x / 8),
    "atan": lax.atan, "sinh": lax.sinh, "cosh": lax.cosh, "asinh": lax.asinh, "acosh": lambda x: lax.acosh(x + 1),
    "atanh": lambda x: lax.atanh(x / 8), "sqrt": lax.sqrt, "rsqrt": lax.rsqrt, "cbrt": lax.cbrt, "abs": lax.abs,
    "erf": lax.erf, "erfc": lax.erfc, "erf_inv": lambda x: lax.erf_inv(x / 8), "lgamma": lax.lgamma,
    "digamma": lax.digamma, "integer_pow": lambda x: x**3, "convert_element_type": lambda x: x.astype(I32),
    "reduce_precision": lambda x: lax.reduce_precision(x, 5, 10), "copy": lambda x: x.copy(),
    "square": lax.square, "bessel_i0e": lax.bessel_i0e, "bessel_i1e": lax.bessel_i1e,
    "stop_gradient": lax.stop_gradient,
}
BINARY = {
    "add": lax.add, "sub": lax.sub, "mul": lax.mul, "div": lax.div, "rem": lax.rem, "pow": lax.pow,
    "max": lax.max, "min": lax.min, "atan2": lax.atan2, "nextafter": lax.nextafter, "igamma": lax.igamma,
    "igammac": lax.igammac, "polygamma": lambda a, b: lax.polygamma(jnp.ones_like(a), b), "zeta": lax.zeta,
    "regularized_incomplete_beta": lambda a, b: lax.betainc(a, b, a / (a + b)),
    "eq": lax.eq, "ne": lax.ne, "lt": lax.lt, "le": lax.le, "gt": lax.gt, "ge": lax.ge,
    "eq_to": prims.eq_to_p.bind, "le_to": prims.le_to_p.bind, "lt_to": prims.lt_to_p.bind,
    "select_n": lambda a, b: lax.select_n(a > b, a, b), "clamp": lambda a, b: lax.clamp(-b, a, b),
    "complex": lambda a, b: lax.complex(a, b),
}
COMPLEX = {"real": lax.real, "imag": lax.imag, "conj": lambda z: lax.real(lax.conj(z))}
INTEGER = {
    "and": lax.bitwise_and, "or": lax.bitwise_or, "xor": lax.bitwise_xor, "not": lambda a, b: lax.bitwise_not(a),
    "shift_left": lambda a, b: lax.shift_left(a, b % 8),
    "shift_right_arithmetic": lambda a, b: lax.shift_right_arithmetic(a, b % 8),
    "population_count": lambda a, b: lax.population_count(a), "clz": lambda a, b: lax.clz(a), "mulhi": lax.mulhi,
}
UNSIGNED = {"shift_right_logical": lambda a, b: lax.shift_right_logical(a, b % 8), "mulhi": lax.mulhi}


def _each(table, *args):
    return tuple(fn(*args) for fn in table.values())


def _max_pool(x):
    return lax.reduce_window(x, -jnp.inf, lax.max, (1, 2), (1, 2), "VALID")


def _scatter(op):
    def f(a, r):
        index = jnp.array([1, 5])
        return getattr(a.at[:, index], op)(r[:, :2])
    return f


def _batched_spd(a):
    return a @ jnp.swapaxes(a, -1, -2) + 6 * jnp.eye(a.shape[-1])


# Elementwise primitives newer releases added (jax 0.10.2 computes these from others; 0.11 has the first two, 0.12
# the third, 0.12.1 the rest): an example of each the installed JAX defines.
_NEWER = [ex(f"newer_{name}", name, function, [(M, F32), (M, F32)], [P("i", "j"), P("i")], positive=True)
          for name, function in (("log2", lambda a, b: lax.log2(a) + b),
                                 ("one_minus_square", lambda a, b: lax.one_minus_square(a / 8) * b),
                                 ("polynomial", lambda a, b: lax.polynomial(a, [1.0, b, 0.25])),
                                 *((name, lambda a, b, name=name: getattr(lax, name)(a / 8) * b)
                                   for name in ("acospi", "asinpi", "atanpi", "cospi", "sinpi", "tanpi", "exp2m1",
                                                "log2p1")),
                                 ("atan2pi", lambda a, b: lax.atan2pi(a, b)),
                                 ("fma", lambda a, b: lax.fma(a, b, a)),
                                 ("fmuladd", lambda a, b: lax.fmuladd(a, b, b)))
          if name in jx.defined_primitives()]
# jax >= 0.12.1 draws Poisson samples with a primitive of its own (a conservative record, as random_gamma's)
_NEWER += [ex("newer_random_poisson", "random_poisson", lambda a: a * jax.random.poisson(jax.random.key(4), 3.0, M),
              [(M, F32)], [P("i", "j")])] if "random_poisson" in jx.defined_primitives() else []


EXAMPLES = [
    *_NEWER,
    ex("unary_float", " ".join(UNARY), lambda a: _each(UNARY, a), [(M, F32)], [P("i", "j")], positive=True),
    ex("binary_float", " ".join(BINARY), lambda a, b: _each(BINARY, a, b), [(M, F32), (M, F32)],
       [P("i", "j"), P("i")], positive=True),
    ex("complex_parts", " ".join(COMPLEX), lambda a, b: _each(COMPLEX, lax.complex(a, b)), [(M, F32), (M, F32)],
       [P("i", "j"), None]),
    ex("integer", " ".join(INTEGER), lambda a, b: _each(INTEGER, a, b), [(M, I32), (M, I32)], [P(("i", "j")), None]),
    ex("unsigned", " ".join(UNSIGNED), lambda a, b: _each(UNSIGNED, a, b), [(M, U32), (M, U32)], [P("i"), P("i")]),
    ex("add_any", "add_any", jax.grad(lambda a: jnp.sum(jnp.sin(a) * jnp.cos(a))), [(M, F32)], [P("i", "j")]),
    ex("igamma_grad_a", "igamma_grad_a", jax.grad(lambda a: jnp.sum(jax.scipy.special.gammainc(a, 1.0))),
       [(M, F32)], [P("i", "j")], positive=True),
    ex("threefry2x32", "threefry2x32", lambda c: prims.threefry2x32_p.bind(U32(7), U32(9), c, c + U32(1)),
       [(M, U32)], [P("i", "j")]),
    ex("bitcast", "bitcast_convert_type", lambda a: lax.bitcast_convert_type(a, I32), [(M, F32)], [P("i", "j")]),
    ex("pass_through", "optimization_barrier name dce_sink device_put",
       lambda a: (lax.dce_sink(a), jax.device_put(checkpoint_name(lax.optimization_barrier(a * 2), "h")))[1],
       [(M, F32)], [P("i", "j")]),
    ex("reductions", "reduce_sum reduce_max reduce_min reduce_prod argmax argmin",
       lambda a: (a.sum(0), a.max(1), a.min(), (a / 4).prod(1), a.argmax(0), a.argmin(1)), [(M, F32)], [P("i", "j")]),
    ex("bool_reductions", "reduce_and reduce_or", lambda a: (a.all(0), a.any(1)), [(M, BOOL)], [P("i", "j")]),
    ex("reduce_xor", "reduce_xor", lambda a: lax.reduce_xor(a, (0,)), [(M, I32)], [P("i", "j")]),
    ex("generic_reduce", "reduce", lambda a, b: lax.reduce((a, b), (0.0, 1.0), lambda x, y: (x[0] + y[0], x[1] * y[1]),
                                                          (1,)), [(M, F32), (M, F32)], [P("i", "j"), P("i")]),
    ex("cumulative", "cumsum cumprod cummax cummin cumlogsumexp",
       lambda a: (jnp.cumsum(a, 0), jnp.cumprod(a / 4, 1), lax.cummax(a, 0), lax.cummin(a, 1),
                  lax.cumlogsumexp(a, 0)), [(M, F32)], [P("i", "j")]),
    ex("sorting", "sort top_k approx_top_k", lambda a: (jnp.sort(a, 0), lax.top_k(a, 3), lax.approx_max_k(a, 2)),
       [(M, F32)], [P("i", "j")]),
    ex("shapes", "broadcast_in_dim squeeze transpose reshape iota",
       lambda a: (a[:, None, :], jnp.squeeze(a[:, :1], 1), a.T, a.reshape(4, 4, 8), a + lax.iota(F32, 8)),
       [(M, F32)], [P("i", "j")]),
    ex("empty", "empty", lambda a: a + lax.empty(M, F32), [(M, F32)], [P("i", "j")]),
    # the gradient of a cond whose branches keep different residuals: the other branch's are empty2 placeholders
    ex("empty2", "empty2 cond", jax.grad(lambda a: jnp.sum(lax.cond(jnp.sum(a) > 0, lambda h: h * 2.0, jax.nn.relu,
                                                                   a) ** 2)), [(M, F32)], [P("i", "j")]),
    ex("stack", "stack unstack", lambda a, b: (jnp.stack([a, b], 1), jnp.unstack(a, axis=1)[3]),
       [(M, F32), (M, F32)], [P("i", "j"), P("i")]),
    ex("tile", "tile", lambda a, w: (jnp.tile(a, (1, 2)), jnp.tile(a[:, :1], (1, 8)) * w), [(M, F32), (M, F32)],
       [P("i", "j"), P(None, "j")]),
    ex("slicing", "slice pad rev concatenate split dynamic_slice dynamic_update_slice",
       lambda a, i: (a[2:10, :], jnp.pad(a, ((1, 1), (0, 0))), a[::-1], jnp.concatenate([a, a], 0),
                     jnp.split(a, 2, axis=1)[1], lax.dynamic_slice(a, (i, 0), (4, 8)),
                     lax.dynamic_update_slice(a, a[:4] * 2, (i, 0))),
       [(M, F32), ((), I32)], [P("i", "j"), None]),
    ex("gather", "gather", lambda a: a[:, jnp.array([0, 3, 3, 7])], [(M, F32)], [P("i", "j")]),
    ex("scatter", "scatter scatter-add scatter-sub scatter-mul scatter-min scatter-max",
       lambda a, r: tuple(_scatter(op)(a, r) for op in ("set", "add", "subtract", "multiply", "min", "max")),
       [(M, F32), (M, F32)], [P("i", "j"), P("i")]),
    ex("dot_general", "dot_general", lambda a, b: a @ b.T, [(M, F32), (M, F32)], [P("i", "j"), P(None, "j")]),
    ex("ragged_dot_general", "ragged_dot_general",
       lambda a, w: lax.ragged_dot(a, w, jnp.array([8, 8], I32)), [(M, F32), ((2, 8, 16), F32)],
       [P("i"), P(None, None, "j")]),
    ex("convolution", "conv_general_dilated",
       lambda x, k: lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW")),
       [((8, 3, 8, 8), F32), ((4, 3, 3, 3), F32)], [P("i"), P("j")]),
    ex("windows", "reduce_window_sum reduce_window_max reduce_window_min reduce_window",
       lambda x: (lax.reduce_window(x, 0.0, lax.add, (1, 2), (1, 2), "VALID"), _max_pool(x),
                  lax.reduce_window(x, jnp.inf, lax.min, (1, 2), (1, 1), "SAME"),
                  lax.reduce_window(x, 0.0, lambda u, v: u + 2 * v, (1, 2), (1, 2), "VALID")),
       [(M, F32)], [P("i", "j")]),
    ex("max_pool_derivatives", "select_and_scatter_add select_and_gather_add",
       lambda x: (jax.grad(lambda y: _max_pool(y).sum())(x), jax.jvp(_max_pool, (x,), (jnp.cos(x),))[1]),
       [(M, F32)], [P("i", "j")]),
    ex("factorisations", "cholesky eigh lu qr svd triangular_solve lu_pivots_to_permutation",
       lambda a: (jnp.linalg.cholesky(_batched_spd(a)), jnp.linalg.eigh(_batched_spd(a))[0],
                  jax.lax.linalg.lu(a)[0], jax.lax.linalg.lu_pivots_to_permutation(jax.lax.linalg.lu(a)[1], 6),
                  jnp.linalg.qr(a)[1], jnp.linalg.svd(a, compute_uv=False),
                  jax.lax.linalg.triangular_solve(_batched_spd(a), a, left_side=True, lower=True)),
       [(B, F32)], [P("i")]),
    ex("more_linalg", "eig hessenberg householder_product ormqr schur symmetric_product tridiagonal tridiagonal_solve",
       lambda a: (jnp.abs(jnp.linalg.eigvals(_batched_spd(a))), jax.lax.linalg.hessenberg(a)[1],
                  jax.lax.linalg.householder_product(a, a[:, 0, :4]), jax.lax.linalg.ormqr(a, a[:, 0], a),
                  jnp.abs(jnp.linalg.eigvals(jax.lax.linalg.schur(_batched_spd(a))[0])),
                  jax.lax.linalg.symmetric_product(a, _batched_spd(a)), jax.lax.linalg.tridiagonal(_batched_spd(a))[1],
                  jax.lax.linalg.tridiagonal_solve(a[:, 0] * 0, a[:, 1] + 8, a[:, 2] * 0, a)),
       [(B, F32)], [P("i")]),
    ex("cholesky_update", "cholesky_update",
       lambda a, w: jax.lax.linalg.cholesky_update(jnp.triu(a) + 8 * jnp.eye(8), w),
       [((8, 8), F32), ((8,), F32)], [P("i"), None], mesh="8"),
    ex("fft", "fft", lambda a: (jnp.fft.rfft(a), jnp.fft.ifft(jnp.fft.fft(a)).real), [(M, F32)], [P("i", "j")]),
    ex("scan", "scan", lambda a: lax.scan(lambda c, x: (c + x, c * x), a[0], a)[1], [(M, F32)], [P(None, "i")]),
    ex("while", "while", lambda a: lax.while_loop(
        lambda c: jnp.max(jnp.abs(c[1])) < 50.0, lambda c: (c[0] + 1, c[1] * 1.5 + jnp.mean(c[1], axis=0)), (0, a))[1],
       [(M, F32)], [P("i", "j")]),
    ex("cond", "cond", lambda a: lax.cond(a[0, 0] > 0, lambda x: jnp.tanh(x) * 2, lambda x: x - 1, a) + lax.switch(
        jnp.argmax(a[0]).astype(jnp.int32) % 3, [jnp.sin, jnp.cos, lambda x: -x], a), [(M, F32)], [P("i", "j")]),
    ex("random", "random_bits random_seed random_wrap random_unwrap random_split random_fold_in random_clone "
       "random_gamma rng_bit_generator rng_uniform",
       lambda a: (a + jax.random.normal(jax.random.fold_in(jax.random.clone(jax.random.key(0)), 3), a.shape),
                  a * jax.random.gamma(jax.random.key(1), jnp.ones(M)),
                  a + jax.random.uniform(jax.random.split(jax.random.PRNGKey(2))[1], a.shape),
                  jax.random.key_data(jax.random.key(3)),
                  a + lax.rng_bit_generator(jnp.zeros(4, U32), M)[1].astype(F32) * 0,
                  a + lax.rng_uniform(0.0, 0.0, M)),
       [(M, F32)], [P("i", "j")]),
]

# Examples whose functions take the mesh (a sharding constraint names it).
MESH_EXAMPLES = [
    ex("sharding_constraint", "sharding_constraint",
       lambda mesh: lambda a: lax.with_sharding_constraint(a * 2, jax.sharding.NamedSharding(mesh, P("i", "j"))),
       [(M, F32)], [P("i")]),
    # jax.grad binds reshard on the cotangent of a constrained value (Auto axes: no placement)
    ex("reshard", "reshard",
       lambda mesh: jax.grad(lambda a: jnp.sum(lax.with_sharding_constraint(
           jnp.tanh(a), jax.sharding.NamedSharding(mesh, P("i", "j"))) ** 2)),
       [(M, F32)], [P("i")]),
]
