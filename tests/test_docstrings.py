"""Every ``>>>`` example the API reference shows runs, and shows its real output (issue #30).

The reference (docs/reference/api.md, docs/reference/errors.md) renders the docstring of every name in
``shardprop.__all__`` and of the public methods and properties of its classes, and the ``shardprop.distributed``
module with its public functions. This file walks the same objects and runs their examples with the standard
library's ``doctest``, one test per object (its id is the object's qualified name), every example given the same
namespace: ``jax``, ``jnp``, ``np``, ``P`` (``jax.sharding.PartitionSpec``) and ``sp`` (``shardprop``).
"""

from __future__ import annotations

import doctest
import functools
import inspect
import re
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import shardprop as sp
import shardprop.distributed

NAMESPACE = {"jax": jax, "jnp": jnp, "np": np, "P": P, "sp": sp}
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
# The examples the walk finds today: fewer means the walk (or a docstring) lost some.
MIN_EXAMPLES = 60


def _unwrapped(raw):
    """The function holding a class member's docstring: a property's getter, a cached property's function, a
    static or class method's function; anything else as it is."""
    if isinstance(raw, property):
        return raw.fget
    if isinstance(raw, functools.cached_property):
        return raw.func
    if isinstance(raw, (staticmethod, classmethod)):
        return raw.__func__
    return raw


def _members(owner) -> list[tuple[str, object]]:
    """The public members the reference shows under a class (methods, properties, nested classes defined in
    shardprop, inherited ones included) or a module (its own functions and classes, not what it imports)."""
    out = []
    for name, _ in inspect.getmembers(owner):
        if name.startswith("_"):
            continue
        member = _unwrapped(inspect.getattr_static(owner, name))
        if not (inspect.isroutine(member) or inspect.isclass(member)):
            continue  # enum members, plain class attributes, slots
        module = getattr(member, "__module__", None) or ""
        if (module == owner.__name__) if inspect.ismodule(owner) else module.startswith("shardprop"):
            out.append((name, member))
    return out


def reference_objects() -> list[tuple[str, object]]:
    """``(qualified name, object)`` for every object whose docstring the reference shows, each object once."""
    found = [("shardprop", sp), ("shardprop.distributed", shardprop.distributed)]
    for name in sp.__all__:
        obj = getattr(sp, name)
        if not isinstance(obj, types.ModuleType):
            found.append((f"shardprop.{name}", obj))
        if inspect.isclass(obj) or isinstance(obj, types.ModuleType):
            found += [(f"shardprop.{name}.{member_name}", member) for member_name, member in _members(obj)]
    seen, unique = set(), []
    for qualified, obj in found:  # a method inherited by another class of the reference runs once, first owner's
        if id(obj) not in seen:
            seen.add(id(obj))
            unique.append((qualified, obj))
    return unique


def _doctests(qualified: str, obj) -> list[doctest.DocTest]:
    finder = doctest.DocTestFinder(recurse=False)  # this object's own docstring: its members are walked apart
    return finder.find(obj, qualified, module=False, globs=NAMESPACE)


WITH_EXAMPLES = [(qualified, obj) for qualified, obj in reference_objects()
                 if any(t.examples for t in _doctests(qualified, obj))]


@pytest.mark.parametrize("qualified, obj", WITH_EXAMPLES, ids=[q for q, _ in WITH_EXAMPLES])
def test_examples_run(qualified, obj):
    tests = _doctests(qualified, obj)
    skipped = [e.source.strip() for t in tests for e in t.examples if e.options.get(doctest.SKIP)]
    assert not skipped, f"{qualified}: an example the reference shows must run (no +SKIP): {skipped}"
    # griffe's google parser renders `>>>` lines as highlighted code only inside an `Examples:` section
    doc = inspect.getdoc(obj)
    section = re.search(r"^\s*Examples?:\s*$", doc, re.M)
    assert section and section.start() < doc.index(">>>"), f"{qualified}: put its examples under `Examples:`"
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    report, failed, attempted = [], 0, 0
    for test in tests:
        test.globs = dict(NAMESPACE)  # every docstring starts from the same namespace
        results = runner.run(test, out=report.append, clear_globs=True)
        failed, attempted = failed + results.failed, attempted + results.attempted
    if failed:
        pytest.fail(f"{failed} of {attempted} examples of {qualified} failed:\n" + "".join(report), pytrace=False)
    assert attempted == sum(len(t.examples) for t in tests) > 0


def test_the_walk_finds_the_examples():
    """The walk reaches the reference's examples: a change to it that finds none (or fewer) fails here."""
    counts = {q: sum(len(t.examples) for t in _doctests(q, obj)) for q, obj in WITH_EXAMPLES}
    assert sum(counts.values()) >= MIN_EXAMPLES, counts
    assert {"shardprop.autoshard", "shardprop.Debugger", "shardprop.distributed.fetch"} <= set(counts)
