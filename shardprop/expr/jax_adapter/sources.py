"""The user's line: which frame of a traceback is the user's (past shardprop's own frames and installed
libraries)."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Sequence


from jax._src import source_info_util as _source_info_util


def exclude_from_sources(path: str) -> None:
    """Frames in ``path`` (a file or folder of shardprop's that calls the user's function, or adds ops to it)
    are not the user's line: an op they add is attributed to the user's frame that called in."""
    _source_info_util.register_exclusion(path)


# shardprop's own frames are never the user's line: an op a wrapper of ours adds (out_specs' constraints) is
# attributed to the user's call. Its examples are user code, written as a user writes it: their lines are kept.
_PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
for _entry in sorted(os.listdir(_PACKAGE)):
    if _entry != "examples":
        exclude_from_sources(os.path.join(_PACKAGE, _entry))


def _is_library(path: str) -> bool:
    return f"{os.sep}site-packages{os.sep}" in path or f"{os.sep}dist-packages{os.sep}" in path


@functools.lru_cache(maxsize=1024)
def sources_of_traceback(traceback) -> tuple[str | None, str | None]:
    """The ``file:line`` JAX names as the user's for an equation (None when it recorded none) and, when that line is
    inside an installed library (flax, optax, equinox: code the user did not write), the user's own line that
    called into it — what a warning should point at."""
    return _user_lines(traceback)


def user_call_site() -> str | None:
    """``file:line`` of the user's frame calling in now (past an installed library, to the user's own line), by the
    rule that names every equation's line: JAX's test of a user file, shardprop's own excluded. Python's own stack
    is walked (JAX's captured traceback stops at the tracing boundary when called while a function is traced).
    None when there is none."""
    frame = sys._getframe(1)
    source = None
    while frame is not None:
        name = frame.f_code.co_filename
        if _source_info_util.is_user_filename(name):
            if source is None:
                source = f"{name}:{frame.f_lineno}"
            if not _is_library(name):
                return f"{name}:{frame.f_lineno}"
        frame = frame.f_back
    return source


def _user_lines(traceback) -> tuple[str | None, str | None]:
    frames = _source_info_util.user_frames(traceback)
    first = next(frames, None)
    if first is None:
        return None, None
    source = f"{first.file_name}:{first.start_line}"
    if _is_library(first.file_name):
        for frame in frames:
            if not _is_library(frame.file_name):
                return source, f"{frame.file_name}:{frame.start_line}"
    return source, None




def argument_names(fun: Callable, args: Sequence, kwargs: dict, *, static_argnums: Sequence[int] = (),
                   static_argnames: Sequence[str] = ()) -> tuple[str, ...] | None:
    """The names ``jax.jit`` gives the dynamic argument leaves of ``fun(*args, **kwargs)`` in its messages — the
    parameter's name and the leaf's key path (``params['w'][0]``, ``rest[1]``, ``scale``) — in flat order (positional
    arguments, then keyword ones by name); None where JAX cannot say (a callable without a signature)."""
    from jax._src import api_util

    info = api_util.debug_info("autoshard", fun, args, kwargs, static_argnums=tuple(static_argnums),
                               static_argnames=tuple(static_argnames))
    names = info.arg_names
    return None if names is None or any(n is None or n == "" for n in names) else tuple(names)
