"""Lowering: each stage becomes a ``jax.shard_map`` (``stage_function``), the program the stages in order
(``program_function``); ``shardprop.Program`` puts them under one ``jax.jit``. ``hlo.py`` reads a
compiled program's collectives back."""

from .hlo import parse_hlo
from .shard_map import jit_stage, program_function, stage_function

__all__ = ["parse_hlo", "jit_stage", "program_function", "stage_function"]

