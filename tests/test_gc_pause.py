"""``gc_paused`` pauses the collector for the outermost call only and always restores it."""

import gc

import pytest

from shardprop.gc_pause import gc_paused


def test_collector_is_paused_inside_and_restored_after_return_and_raise():
    seen = []

    @gc_paused
    def inner():
        seen.append(gc.isenabled())

    @gc_paused
    def outer(fail):
        inner()
        seen.append(gc.isenabled())
        if fail:
            raise ValueError("boom")
        return 7

    assert gc.isenabled()
    assert outer(False) == 7 and gc.isenabled()
    with pytest.raises(ValueError):
        outer(True)
    assert gc.isenabled() and seen == [False] * 4


def test_collector_left_off_when_the_caller_turned_it_off():
    gc.disable()
    try:
        gc_paused(lambda: None)()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_tracing_leaves_the_collector_on_while_the_users_function_runs():
    """Only our own graph building is paused: the user's function may make cyclic garbage."""
    import jax.numpy as jnp

    import shardprop as sp

    seen = []

    def f(x):
        seen.append(gc.isenabled())
        return x + 1

    sp.trace(f, jnp.ones(4))
    assert seen == [True] and gc.isenabled()
