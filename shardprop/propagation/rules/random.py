"""Random bit generation: conservative on purpose (keys and bits replicated) so that every device draws
exactly the numbers the unsharded program draws. ``threefry2x32`` itself is elementwise."""

from __future__ import annotations

from .fallback import conservative
from .registry import register

register("random_bits", "random_seed", "random_wrap", "random_unwrap", "random_split", "random_fold_in",
         "rng_bit_generator", "rng_uniform")(conservative)
