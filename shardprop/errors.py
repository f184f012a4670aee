"""Every error shardprop raises derives from ``ShardingError``.

User mistakes (a bad spec, a sharding conflict, calling a program with the wrong shapes) are reported with
the operation, the user's source line and the shardings involved, never as a raw JAX/XLA traceback.
"""

from __future__ import annotations

from enum import StrEnum


class ShardingError(Exception):
    """Base class of every error shardprop raises."""


class TraceError(ShardingError):
    """The function could not be traced (non-array argument, a JAX tracing error, ...)."""


class UnsupportedDtypeError(TraceError):
    """An argument's dtype cannot be held by a JAX array (strings, Python objects, ...)."""


class NoRuleError(ShardingError):
    """Under ``strict=True``: a primitive has no sharding rule (instead of the conservative fallback)."""


class OptionError(ShardingError, ValueError):
    """An option has a value shardprop does not know (an unknown strategy)."""


class UnknownValueError(OptionError):
    """A node or value name that the graph does not have (close names are suggested)."""


class StageIndexError(OptionError, IndexError):
    """A stage number outside the program's stages."""


class NotComputedError(ShardingError):
    """The debugger was asked for a value whose stage has not run yet."""


class ReferenceEvaluationError(ShardingError):
    """The debugger's unsharded evaluation of a node failed (the node's own primitive on whole arrays: a host
    callback of the user's that raises, say)."""


class ArtifactError(ShardingError):
    """A debugging artifact (a saved stage) could not be written or made."""


class MeshError(ShardingError):
    """The mesh is malformed (wrong device count, duplicate axis names, ...)."""


class SpecError(ShardingError):
    """An input PartitionSpec is not valid for its argument."""


class UnknownMeshAxisError(SpecError):
    """A spec names an axis the mesh does not have."""


class IndivisibleAxisError(SpecError):
    """An ``out_specs`` entry lays an output's axis out over mesh axes whose size does not divide it: a JAX array is
    held in equal blocks (``jax.jit``'s ``out_shardings`` refuse it too). An argument or a sharding constraint laid out
    so runs on uneven blocks instead."""


class SpecRankError(SpecError):
    """A spec has more entries than its argument has axes."""


class DuplicateMeshAxisError(SpecError):
    """One mesh axis shards two axes of the same tensor."""


class SpecTreeError(SpecError):
    """``in_specs`` is not a pytree prefix of the arguments."""


class SearchError(ShardingError):
    """The layout search (``sp.AUTO``) cannot decide: ``strict=True`` with nothing fixed to decide from, or refusing
    every layout weighed."""


class MemoryLimitError(SearchError):
    """No plan found fits ``memory_limit``: the message gives the smallest footprint of the plans tried (how many)
    and its layout."""


class ConflictKind(StrEnum):
    """Why two shardings cannot be reconciled."""

    MISMATCH = "mismatch"  # operands laid out over different mesh axes along one axis, neither refining the other
    REUSE = "reuse"        # one mesh axis would shard two axes of the result


class ShardingConflictError(ShardingError):
    """Two operands of one operation are sharded incompatibly.

    ``op`` and ``source`` name the operation and the user's line, ``axis`` the output axis that cannot be given
    one sharding, and ``layouts`` the per-axis layouts (tuples of mesh axes) that clash: operands sharded over
    different mesh axes along one axis (``ConflictKind.MISMATCH``), or one mesh axis that would shard two axes of
    the result (``ConflictKind.REUSE``)."""

    def __init__(self, message: str, *, op: str | None = None, source: str | None = None, axis: int | None = None,
                 layouts: tuple[tuple[str, ...], ...] = (), kind: ConflictKind = ConflictKind.MISMATCH):
        super().__init__(message)
        self.op, self.source, self.axis, self.layouts, self.kind = op, source, axis, layouts, kind


class InputMismatchError(ShardingError):
    """A compiled program was called with arguments other than those it was traced with."""


class PlanMismatchError(ShardingError):
    """The processes of a multi-process run made different plans: their collectives would not match (a deadlock).
    ``stage`` is the first stage that differs."""

    def __init__(self, message: str, *, stage: int | None = None):
        super().__init__(message)
        self.stage = stage


class OutOfStepError(ShardingError):
    """On a multi-process run, the processes did not make the same debugger call (one that runs collectives) at the
    same point: another call, or none within the call timeout. Run without it, they would wait for each other
    forever. ``process`` is the other process named."""

    def __init__(self, message: str, *, process: int | None = None):
        super().__init__(message)
        self.process = process


class FallbackWarning(UserWarning):
    """A primitive had no sharding rule; the conservative rule (gather everything, replicate) was used."""


class StrategyWarning(UserWarning):
    """The strategy asked for could not plan this program as it says; the message names why and what planned it
    instead (``strategy="optimal"`` with an argument laid out in uneven blocks: propagation's plan)."""


class ReshardWarning(UserWarning):
    """Two operands were sharded incompatibly; the one cheaper to move was gathered before the op (the message
    carries the conflict, as ``ShardingConflictError`` would have said it)."""


class UnsupportedJaxError(ShardingError, ImportError):
    """The installed JAX is outside the releases shardprop supports (raised when shardprop is imported)."""


class ExtraNotInstalledError(ShardingError, ImportError):
    """A feature needs a package of one of shardprop's extras that is not installed (the message names the extra:
    ``python -m pip install "shardprop[viewer]"``)."""


class LoweringError(ShardingError):
    """An operation could not be evaluated on its per-device blocks (a shardprop bug: please report it)."""


class InvariantError(LoweringError):
    """A pass produced an inconsistent product (see ``shardprop/checks.py``): a shardprop bug."""


class RenderError(ShardingError):
    """A picture could not be drawn (the graphviz ``dot`` program is missing, or failed)."""


def abridged(text: object, limit: int = 300) -> str:
    """``str(text)``, its middle cut out past ``limit`` characters: a module's pytree structure or a spec tree of
    a hundred leaves stays readable in a one-line message.

        >>> abridged("x" * 1000, 20)
        'xxxxxxxxxx … (980 more characters) … xxxxxxxxxx'
    """
    text = str(text)
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]} … ({len(text) - 2 * half} more characters) … {text[-half:]}"
