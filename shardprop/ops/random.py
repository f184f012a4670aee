"""Random bit generation: conservative on purpose (keys and bits replicated) so that every device draws
exactly the numbers the unsharded program draws. ``threefry2x32`` itself is elementwise.

(``random_gamma`` too: each element's draw depends on its position in the whole array, which a block does not
know.)

Lineage: every element of the keys (sound; not claimed exact). On blocks: as it is, on the replicated keys.
"""

from __future__ import annotations

from ..backends.blocks import bind_as_is
from ..propagation.context import RuleContext, RuleOutput
from ..propagation.sharding import TensorSharding
from .fallback import conservative as _conservative
from .fallback import whole_operands
from .opdef import Family, Linearity, defs


def conservative(ctx: RuleContext, *operands: TensorSharding, **params) -> RuleOutput:
    """Keys and bits replicated, on purpose (see the module docstring)."""
    return _conservative(ctx, *operands)

OPS = defs(("random_bits", "random_seed", "random_wrap", "random_unwrap", "random_split", "random_fold_in",
            "random_clone", "random_gamma", "rng_bit_generator", "rng_uniform"), Family.RANDOM, linear=Linearity.NONE,
           propagate=conservative, lineage=whole_operands, lineage_exact=False, per_block=bind_as_is, finish=None,
           pull=None)
