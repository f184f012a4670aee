"""What ``shardprop plan``, ``inspect`` and ``debug`` load from the user: the function (``PATH.py:FUNC``) and its
example arguments as pytrees (``--args``, ``--in-specs``).

``--arg`` (one flat array per flag, read in ``inspect.py``; ``debug`` also fills it with values) suits a function
of a few arrays; a real model takes pytrees — a dict of parameters, a batch. ``--args`` gives them, repeated for
several positional arguments, each one of:

* ``PATH.py:EXAMPLE`` — a function of no arguments returning a tuple of arguments (arrays, ShapeDtypeStructs, or
  pytrees of them), spliced in at its place: ``return params, tokens, targets``, or ``return (params,)`` for one.
* ``FILE.npz`` — one argument: a dict of the file's arrays keyed by their names (``np.savez(f, w=..., b=...)``
  gives ``{"b": ..., "w": ...}``).
* ``FILE.npy`` — one argument: the array in the file.

``--in-specs`` is the ``in_specs`` prefix over all of them, written in Python with ``P`` and ``AUTO`` in scope.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from ..errors import OptionError

ARGS_HELP = ("pytree arguments, repeated in positional order: PATH.py:EXAMPLE (a function returning a tuple of "
             "arguments, spliced in), FILE.npz (one dict argument keyed by the array names) or FILE.npy (one "
             "array); instead of --arg")
IN_SPECS_HELP = ("with --args: the in_specs prefix over all the arguments, as Python with P and AUTO, e.g. "
                 "\"(None, P('data'), P('data'))\"")


def load_function(target: str):
    """``"path/to/file.py:name"`` (or ``file.py:obj.attr``) → the function."""
    path, sep, name = target.rpartition(":")
    if not sep or not path.endswith(".py"):
        raise OptionError(f"{target!r}: expected PATH.py:FUNCTION")
    file = Path(path)
    if not file.is_file():
        raise OptionError(f"{target!r}: no such file {path}")
    sys.path.insert(0, str(file.resolve().parent))
    spec = importlib.util.spec_from_file_location(f"_shardprop_inspect_{file.stem}", file)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # the user's module does not import: say so in one line, no traceback
        where = f" (line {err.lineno})" if isinstance(err, SyntaxError) and err.lineno else ""
        raise OptionError(f"{target!r}: importing {file.name} failed{where}: {type(err).__name__}: {err}") from err
    obj = module
    for part in name.split("."):
        if not hasattr(obj, part):
            raise OptionError(f"{target!r}: {file.name} has no {name!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise OptionError(f"{target!r}: {name!r} is not a function")
    return obj


def add_options(parser, *, in_specs_default: str) -> None:
    """``--args`` and ``--in-specs`` on a subcommand's parser; ``in_specs_default`` says what no ``--in-specs``
    means for that command."""
    parser.add_argument("--args", action="append", default=[], metavar="PATH.py:EXAMPLE|FILE.npz|FILE.npy",
                        help=ARGS_HELP)
    parser.add_argument("--in-specs", metavar="SPECS", help=f"{IN_SPECS_HELP} (default {in_specs_default})")


def example_and_specs(args, *, flat, default_in_specs) -> tuple[tuple, object]:
    """``(arguments, in_specs)`` from ``--args``/``--in-specs``, or from ``--arg``, each read by ``flat`` into
    ``(argument, spec)``. Neither given: no arguments (the command says whether it needs some)."""
    if args.arg and args.args:
        raise OptionError("give --arg (one array per flag) or --args (pytrees), not both")
    if args.in_specs and not args.args:
        raise OptionError("--in-specs goes with --args (with --arg, write each spec after @)")
    if args.args:
        example = tuple(x for text in args.args for x in load_args(text))
        return example, read_in_specs(args.in_specs) if args.in_specs else default_in_specs
    parsed = [flat(text) for text in args.arg]
    return tuple(x for x, _ in parsed), tuple(s for _, s in parsed)


def load_args(text: str) -> tuple:
    """One ``--args`` as the tuple of positional arguments it stands for (see the module's docstring)."""
    suffix = Path(text).suffix.lower()
    if suffix in (".npz", ".npy"):
        return (_load_arrays(text),)
    if ":" not in text:
        raise OptionError(f"--args {text!r}: expected PATH.py:EXAMPLE, FILE.npz or FILE.npy")
    try:
        make = load_function(text)
    except OptionError as err:
        raise OptionError(f"--args {err}") from None
    name = text.rpartition(":")[2]
    try:
        example = make()
    except Exception as err:  # the user's example fails: one line naming it, no traceback
        raise OptionError(f"--args {text!r}: calling {name}() failed: {type(err).__name__}: {err}") from err
    if not isinstance(example, tuple):
        # A lone dict or list could be one argument or several: a tuple says which, as jax's *args does.
        raise OptionError(f"--args {text!r}: {name}() returned a {type(example).__name__}, not a tuple of "
                          f"arguments (return (x,) for a single argument)")
    return example


def _load_arrays(text: str):
    """An ``.npz`` as the dict of its arrays (read now: the file closes), an ``.npy`` as its array."""
    import numpy as np

    try:
        loaded = np.load(text, allow_pickle=False)  # no pickles: a data file must not run code
    except (OSError, ValueError) as err:
        raise OptionError(f"--args {text!r}: cannot read it: {err}") from None
    if isinstance(loaded, np.ndarray):
        if text.lower().endswith(".npz"):
            raise OptionError(f"--args {text!r}: holds one bare array, not named arrays (np.savez(f, name=x))")
        return loaded
    with loaded:
        if not text.lower().endswith(".npz"):
            raise OptionError(f"--args {text!r}: holds several named arrays: name the file .npz")
        try:
            arrays = {name: loaded[name] for name in loaded.files}
        except ValueError as err:  # an object array, which would need pickle
            raise OptionError(f"--args {text!r}: cannot read it: {err}") from None
    if not arrays:
        raise OptionError(f"--args {text!r}: holds no arrays")
    return arrays


def read_in_specs(text: str):
    """The ``--in-specs`` expression, read with only ``P``, ``PartitionSpec``, ``AUTO`` and ``None`` in scope."""
    from jax.sharding import PartitionSpec

    from ..search import AUTO

    try:
        return eval(text, {"__builtins__": {}}, {"P": PartitionSpec, "PartitionSpec": PartitionSpec,  # noqa: S307
                                                  "AUTO": AUTO, "None": None})
    except Exception as err:
        raise OptionError(f"--in-specs {text!r}: {type(err).__name__}: {err} (write e.g. \"(AUTO, P('data'))\")") \
            from None


def random_array(shape, dtype, rng):
    """A random array of ``shape`` and ``dtype`` from ``rng``: what ``debug`` runs where only a shape is given."""
    import numpy as np

    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) > 0.5
    if dtype.kind in "iu":
        return rng.integers(0, 10, size=shape).astype(dtype)
    if dtype.kind == "c":
        return (rng.normal(size=shape) + 1j * rng.normal(size=shape)).astype(dtype)
    return rng.normal(size=shape).astype(dtype)


def filled(example: tuple, rng) -> tuple:
    """``example`` with every ShapeDtypeStruct leaf replaced by a random array (``debug`` needs values)."""
    import jax

    def fill(leaf):
        return random_array(leaf.shape, leaf.dtype, rng) if isinstance(leaf, jax.ShapeDtypeStruct) else leaf

    return jax.tree_util.tree_map(fill, example)
