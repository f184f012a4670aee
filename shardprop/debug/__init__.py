"""Stage-by-stage debugging of a compiled ``shardprop.Program``.

    dbg = sp.Debugger(prog, a, b)
    dbg.step()                             # stage 0 on its own: ops, specs, wall time, bytes moved
    dbg.value("e"); dbg.blocks("e")        # the global value; every device's block with its index ranges
    dbg.run()                              # to the end (or the next breakpoint: dbg.break_at("e"))
    dbg.check()                            # replicated data equal on every device, blocks where shards say
    dbg.compare(); dbg.first_divergence()  # against the unsharded graph, node by node
    dbg.first_nonfinite(); dbg.profile(); dbg.save_stage(1, "repro/")

Module by module: ``session`` (stepping, values, blocks), ``findings`` (the program's promises checked),
``reference`` (the unsharded oracle, the tolerance), ``comparison`` (per-value errors, blame, the first
divergence), ``profile``, ``reproducer`` (a stage as a ``jax.export`` artifact).
"""

from __future__ import annotations

import numbers
from pathlib import Path

from ..errors import OptionError

from . import findings as _findings
from . import profile as _profile
from . import comparison as _comparison
from . import reproducer as _reproducer
from .findings import Finding, FindingKind, NonFinite, Where
from .profile import Profile, StageProfile
from .comparison import Divergence, ErrorTable, NodeError
from .reference import Tolerance
from .reports import DeviceBlock, Port, StageReport
from .session import Session, collective


class Debugger(Session):
    """Run a program stage by stage, read every device's blocks, check the plan's promises, compare with
    the unsharded function and find the first node that goes wrong. Nodes are named as in the listing
    (``"e"``), by value id, or by ``shardprop.Node``. ``keep="all"`` keeps every intermediate as
    stages run; ``"outputs"`` (the default) keeps stage outputs and recomputes an intermediate when asked.

    The program itself is never changed: ``prog(*args)`` returns what it returned before.

    On a mesh spanning several processes every process makes the same debugger calls in the same order, as every
    process calls the program: ``blocks(name)`` shows this process's blocks, and the analyses gather the others'
    and give the same answer everywhere. A call that runs collectives made by one process only is an
    ``shardprop.OutOfStepError`` (after ``SHARDPROP_CALL_TIMEOUT`` seconds, default 300), not a deadlock.

    Examples:
        >>> mesh = sp.make_mesh((4, 2), ("i", "j"))
        >>> def f(a, b):                                   # the Nx design note's example
        ...     x, y = a + b, a - b
        ...     return jnp.sum(x, axis=1)[:, None] + jnp.sum(y, axis=0)[None, :]
        >>> a, b = jnp.arange(128.0).reshape(16, 8), jnp.ones((16, 8))
        >>> prog = sp.autoshard(f, mesh=mesh, in_specs=(P("i", "j"), None), strategy="gather").trace(a, b)
        >>> dbg = sp.Debugger(prog, a, b)
        >>> reports = dbg.run()                              # every stage: one report each
        >>> len(reports)
        2
        >>> print(dbg.first_divergence())                    # no node differs from the unsharded function
        None
    """

    def _ensure_run(self) -> None:
        if not self.stages_run:  # nothing run yet: an analysis covers the whole program
            self.run_to(len(self.plan.stages))

    @collective
    def check(self) -> list[Finding]:
        """Every promise the program breaks among the values computed so far: a replicated axis whose devices
        hold different data, a block that is not the slice its shard ranges name. Empty when all hold."""
        return _findings.check(self)

    @collective
    def first_nonfinite(self, arguments: bool = True) -> NonFinite | None:
        """The first NaN or infinity in program order (the arguments first, unless ``arguments=False``: then
        the first a node produces), or None. Runs the whole program first when no stage has run yet; otherwise
        covers the stages run so far."""
        self._ensure_run()
        return _findings.first_nonfinite(self, arguments=arguments)

    @collective
    def compare(self, rtol: float | None = None, atol: float | None = None) -> ErrorTable:
        """Per value computed so far, max abs / relative error against the unsharded graph evaluated node by
        node on the same inputs (see ``Tolerance`` for the defaults). Runs the whole program first when no
        stage has run yet."""
        self._ensure_run()
        return self._comparer(Tolerance(rtol, atol)).table()

    @collective
    def first_divergence(self, rtol: float | None = None, atol: float | None = None) -> Divergence | None:
        """The first node in program order at fault: its value differs from the unsharded function's, and
        re-computed unsharded from its own sharded operands it gives another value (so its rule or its lowering
        is wrong, not what it was given). None when no node is at fault."""
        self._ensure_run()
        return self._comparer(Tolerance(rtol, atol)).first_divergence()

    def _comparer(self, tolerance: Tolerance) -> _comparison.Comparer:
        # One per tolerance, advanced as stages run; reset() forgets them with the results.
        if self._comparers.get(tolerance) is None:
            self._comparers[tolerance] = _comparison.Comparer(self, tolerance)
        return self._comparers[tolerance]

    @collective
    def profile(self, repeats: int = 10) -> Profile:
        """Per stage: median wall time over ``repeats`` runs, bytes moved per its compiled HLO and the cost
        model's estimate. Runs the program to the end first."""
        if isinstance(repeats, bool) or not isinstance(repeats, numbers.Integral) or repeats < 1:
            raise OptionError(f"repeats={repeats!r}: expected a whole number of runs, at least 1")
        return _profile.profile(self, int(repeats))

    @collective
    def save_stage(self, k: int, directory: str | Path) -> Path:
        """Write stage ``k`` as a standalone reproducer (a ``jax.export`` artifact, its inputs and outputs, and
        a script needing only JAX); returns the script's path. Runs the stages up to ``k`` if needed."""
        return _reproducer.save_stage(self, k, directory)

    def __repr__(self) -> str:
        count = len(self.plan.stages)
        where = "finished" if self.done else f"next stage {self._next}"
        return f"<Debugger {count} stage{'' if count == 1 else 's'}, {where}, keep={self.keep!r}>"


__all__ = ["Debugger", "DeviceBlock", "Divergence", "ErrorTable", "Finding", "FindingKind", "NodeError", "NonFinite",
           "Port", "Profile", "StageProfile", "StageReport", "Tolerance", "Where"]
