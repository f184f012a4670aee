"""The primitives of the installed JAX that have no record here, and why.

Every primitive JAX defines is either one with a record (``shardprop.ops.table``), a call the tracer
inlines (``jax_adapter.INLINED_CALLS``) or folds (``jax_adapter.FOLDED_AT_TRACE``), or listed here with the
reason it has no record. Those listed get the conservative record if they ever appear (every operand
gathered, outputs replicated, a ``FallbackWarning``) and run in a stage of their own outside ``shard_map``, on
whole arrays under the program's ``jax.jit``. ``tests/ops/test_completeness.py`` checks that these
lists cover what the installed JAX defines and that none of them names a primitive it does not.
"""

from __future__ import annotations

COLLECTIVE = ("a named-axis collective: it appears only inside shard_map or pmap, whose bodies chose their "
              "layouts already (a shard_map of the user's runs outside shardprop's, on whole arrays)")
STATE = "a mutable reference or state primitive (jax.experimental mutable arrays, hijax): not sharded yet"
TOKEN = "an ordering token: carries no data"
AD = "an automatic-differentiation internal: it never appears in a traced program"
SHAPE_POLY = "shape polymorphism of jax.export: the traced program has concrete shapes"
GPU = "a GPU-only kernel (cuDNN)"
OPAQUE = ("a host callback or foreign function: opaque to sharding, it runs outside shard_map on the whole "
          "(gathered) arrays, as under jax.jit")
PRNG = "a PRNG implementation internal: it runs inside random_bits, never in a traced program"
MEMORY = "memory spaces, layouts and compiler metadata: nothing to shard"
INTERNAL = "a JAX internal that jax.numpy, jax.nn and jax.lax do not emit"
NOT_IN_TRACES = "lax.stage lifts a value into a trace: it binds nothing inside one"
NO_FUNCTION = ("no public function emits it: the max-pool's derivative binds select_and_scatter_add, which has a "
               "record")

WITHOUT_RECORD: dict[str, str] = {
    **dict.fromkeys((
        "all_gather", "all_gather_done", "all_gather_invariant", "all_gather_reduced", "all_gather_reduced_start",
        "all_gather_start", "all_to_all", "all_to_all_done", "all_to_all_start", "axis_index", "pbroadcast",
        "pbroadcast_done", "pbroadcast_start", "pmax", "pmin", "ppermute", "ppermute_done", "ppermute_start",
        "precv", "preduced", "psend", "psum", "psum_done", "psum_invariant", "psum_invariant_start", "psum_start",
        "ragged_all_to_all", "reduce_scatter", "reduce_scatter_done", "reduce_scatter_start", "unreduced_psum",
        "unreduced_psum_start", "unreduced_reduce_scatter", "unreduced_reduce_scatter_start", "pvary",
        "reduced_vary_cast_p", "vary_unreduced_cast_p", "shard_map",
        # jax 0.12
        "unreduced_pmax", "unreduced_pmin", "reduced_vary_cast", "vary_unreduced_cast", "pbroadcast_dynamic",
        "pmax_scatter", "pmin_scatter", "pxor"),  # (the last three: jax >= 0.12.1)
        COLLECTIVE),
    **dict.fromkeys((
        "accum_grad_in_ref", "addupdate", "get", "swap", "new_ref", "empty_ref", "free_ref", "freeze", "pin",
        "unpin", "run_state", "create_linear", "broadcast_to", "box_get", "box_set", "new_box", "log_extend",
        "log_read", "new_log", "call_hi_primitive_linearized"), STATE),
    **dict.fromkeys(("after_all", "create_token"), TOKEN),
    **dict.fromkeys(("custom_lin", "zeros_like", "unreachable", "remat_opt"), AD),
    **dict.fromkeys(("dim_as_value", "dimension_size", "shape_assertion", "call_exported"), SHAPE_POLY),
    **dict.fromkeys((
        "cudnn_fusion", "dot_product_attention_bwd", "dot_product_attention_bwd_wrapper",
        "dot_product_attention_fp8_bwd", "dot_product_attention_fp8_bwd_wrapper", "dot_product_attention_fp8_fwd",
        "dot_product_attention_fp8_fwd_wrapper", "dot_product_attention_fwd", "dot_product_attention_fwd_wrapper",
        "scaled_matmul", "scaled_matmul_wrapper"), GPU),
    **dict.fromkeys(("debug_callback", "debug_print", "pure_callback", "io_callback", "ffi_call", "buffer_callback",
                     "inspect_sharding", "check"), OPAQUE),
    **dict.fromkeys(("iota_2x32_shape", "philox2x32", "philox4x32", "threefry4x32",
                     "raw_bits"),  # (jax >= 0.12.1: a philox or threefry4x32 key's bits, inside random_bits)
                    PRNG),
    **dict.fromkeys(("tie", "layout_constraint", "compute_on", "xla_metadata_value",
                     "relayout", "with_memory_space_constraint"), MEMORY),
    **dict.fromkeys(("from_edtype", "to_edtype", "scaled_dot", "custom_partitioning", "shard_alike",
                     "geqrf", "geqp3",
                     "random_gamma_grad"),  # (jax >= 0.12.1: lax.random_gamma_grad computes it inline)
                    INTERNAL),
    "select_and_scatter": NO_FUNCTION,
    "stage": NOT_IN_TRACES,
}
