"""How a call reaches its compiled program: straight into that program's ``jax.jit``, or through Python first.

Every ``shardprop.Program`` holds one ``jax.jit`` of itself on its flat argument leaves, whose
trace checks the call's ``shardprop.signature.Signature``: a call that hits the jit's C++ cache costs what a
``jax.jit`` call costs. An autoshard function finds the program of a call as ``jax.jit``'s cache finds an
executable, by the call's signature: a dict keyed by ``shardprop.signature.call_key``, read in about a
microsecond per leaf. So calls alternating between signatures (train and eval batches, a last short batch) each go
straight into their own program's jit.

NumPy values and fresh, uncommitted arrays are put where the program reads them first, in one batched call
(``loose_if_straight``): ``jax.jit`` keys its executables by whether an argument was placed already, so otherwise a
training step called on fresh parameters and then on its own outputs would compile twice (as under ``jax.jit``
with ``in_shardings``); this way it runs one executable. An array on the mesh laid out otherwise than the program
reads it is moved inside the program (one executable per input layout, as under ``jax.jit``).

A few calls need Python before the jit; ``loose_if_straight`` and ``donated_in_place`` find them by cheap
predicates, up front, never by a failed attempt:

- a tracer of an outer transformation (``jax.grad``, ``jax.vmap``, ``jax.jit`` of the function): the call is
  traced in Python, where the custom derivative rules are put around the jit (``derivatives.py``);
- an array committed to other devices than the mesh's, which ``jax.jit`` refuses: copied onto the mesh first;
- a host value on a mesh spanning several processes: checked to be the same on every process first;
- a donated leaf that is not a live committed array passed once: copied into place and invalidated afterwards,
  or refused (a buffer donated and also read, or donated after it was deleted, would crash the process in XLA).

Keyword and static arguments (through ``AutoSharded.trace``) and a plan not yet agreed on by the processes go
through Python too, then into the program's jit. A failed jit call is reported once — the user's mistake when
the arguments are at fault (``as_lowering_errors``'s ``check_arguments``), a ``shardprop.LoweringError``
otherwise — and never run again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from .expr import jax_adapter as jx


def loose_if_straight(leaves: Sequence, devices: Any, several_processes: bool) -> list[int] | None:
    """None where the call needs Python first (a leaf ``jax.jit`` would not take as it is: ``_straight``); else the
    indices of the leaves to place first (``_loose``). One pass: a committed array of JAX's own type on the mesh
    (the common leaf, a step's own outputs fed back) costs a type test and two attribute reads
    (``jax_adapter.committed_array_devices``): 27 leaves about 4 us, where two passes of the general checks took 21."""
    loose = []
    for k, x in enumerate(leaves):
        held = jx.committed_array_devices(x)
        if held is None:  # another kind of leaf: the general checks
            if not _straight(x, devices, several_processes):
                return None
            if _loose(x):
                loose.append(k)
        elif held is False:
            loose.append(k)
        elif held != devices:
            return None
    return loose


def _straight(x, devices: Any, several_processes: bool) -> bool:
    """Whether ``jax.jit`` of a computation on the mesh of ``devices`` (``jax_adapter.device_list``) takes the leaf
    ``x`` as it is (placed first where ``_loose``): no tracer, no array committed to other devices, and — on a mesh
    spanning several processes — no host value."""
    if isinstance(x, jax.Array):  # tracers too
        return not (jx.is_traced(x) or (x.committed and jx.device_list(x.sharding) != devices))
    return not several_processes


def _loose(x) -> bool:
    """A leaf ``jax.jit`` would place itself: a NumPy value or an uncommitted array (Python scalars are left as
    they are: weakly typed, the same on every call). ``jax.jit`` keys its executables by whether an argument was
    placed already, so a call on fresh arrays and a call on the program's own outputs would compile twice; put
    where the program reads them first (``jax_adapter.put_all``), they share one executable."""
    return isinstance(x, np.ndarray | np.generic) or (isinstance(x, jax.Array) and not x.committed)


def donated_in_place(donated: Sequence, leaves: Sequence) -> bool:
    """Every ``donated`` leaf is a live committed array passed once among ``leaves``: ``jax.jit`` donates its
    buffer as it is. (An uncommitted one is copied onto the mesh and the copy donated: the checked path
    invalidates the original. A buffer donated and also read, or donated when already deleted, crashes the
    process in XLA: the checked path refuses them.)"""
    if any(not isinstance(x, jax.Array) or jx.is_traced(x) or not x.committed or x.is_deleted() for x in donated):
        return False
    passed = Counter(map(id, leaves))
    return all(passed[id(x)] == 1 for x in donated)
