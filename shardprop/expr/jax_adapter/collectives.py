"""An all-reduce JAX has no public collective for: the product of every device's value over mesh axes, lowered to
XLA's all-reduce with a multiply — what ``jax.jit`` compiles a product over a sharded axis to. Built from JAX's own
all-reduce pieces (the ones ``psum``/``pmax`` are made of), so it lowers, evaluates and batches as they do."""

from __future__ import annotations

from functools import partial

from jax import lax
from jax._src import core
from jax._src.interpreters import batching, mlir
from jax._src.lax import parallel

# jax 0.10.2 calls the all-reduce lowering ``_allreduce_lowering``; 0.12 renamed it ``_all_reduce_lowering``.
_allreduce_lowering = getattr(parallel, "_allreduce_lowering", None) or parallel._all_reduce_lowering

_pprod_p = core.Primitive("shardprop_pprod")
_pprod_p.def_impl(partial(parallel._allreduce_impl, _pprod_p, lax.reduce_prod))
_pprod_p.def_effectful_abstract_eval(partial(parallel._pmin_pmax_abstract_eval, "pprod"))
mlir.register_lowering(_pprod_p, partial(_allreduce_lowering, lax.mul_p, lax.reduce_prod))
batching.fancy_primitive_batchers[_pprod_p] = partial(parallel._batched_reduction_collective, _pprod_p,
                                                      lambda v, axis_size: lax.integer_pow(v, axis_size))


def pprod(x, axis_names: tuple[str, ...]):
    """The product of ``x`` over the devices along ``axis_names`` (inside ``shard_map``): one all-reduce. Not
    differentiable by itself: the caller gives it a derivative (a product's rule needs every other device's factor)."""
    return _pprod_p.bind(x, axes=tuple(axis_names), axis_index_groups=None)
