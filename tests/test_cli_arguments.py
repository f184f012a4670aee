"""The example arguments that ``plan``, ``inspect`` and ``debug`` share (shardprop/cli/arguments.py): ``--args`` from
a module's example function, an ``.npz`` or an ``.npy``, repeated in order; ``--in-specs``; the flat ``--arg`` kept;
one-line errors. In-process: the subprocess tests of each command are in tests/test_cli_*.py."""

from pathlib import Path
from types import SimpleNamespace

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from shardprop.cli.arguments import example_and_specs, filled, load_args, read_in_specs
from shardprop.cli.inspect import parse_arg
from shardprop.errors import OptionError
from shardprop.search import AUTO
from tests.cli_loss_example import make_args, make_batch, make_params

EXAMPLE = Path(__file__).parent / "cli_loss_example.py"


def options(args=(), arg=(), in_specs=None):
    """What argparse gives a command for ``--args``, ``--arg`` and ``--in-specs``."""
    return SimpleNamespace(args=list(args), arg=list(arg), in_specs=in_specs)


def same_tree(got, want):
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        np.testing.assert_array_equal(g, w)


def test_an_example_function_s_tuple_is_spliced_in():
    same_tree(load_args(f"{EXAMPLE}:make_args"), make_args())


def test_an_npz_is_one_dict_argument_keyed_by_the_array_names_and_an_npy_one_array(tmp_path):
    np.savez(tmp_path / "params.npz", **make_params())
    tokens, _ = make_batch()
    np.save(tmp_path / "tokens.npy", tokens)
    (params,) = load_args(str(tmp_path / "params.npz"))
    same_tree(params, make_params())
    (array,) = load_args(str(tmp_path / "tokens.npy"))
    np.testing.assert_array_equal(array, tokens)


def test_repeated_args_give_the_positional_arguments_in_order_with_the_in_specs(tmp_path):
    np.savez(tmp_path / "params.npz", **make_params())
    given = options(args=[str(tmp_path / "params.npz"), f"{EXAMPLE}:make_batch_only"],
                    in_specs="(None, P('i'), P('i'))")
    example, in_specs = example_and_specs(given, flat=parse_arg, default_in_specs=AUTO)
    same_tree(example, make_args())
    assert in_specs == (None, P("i"), P("i"))
    _, default = example_and_specs(options(args=[f"{EXAMPLE}:make_args"]), flat=parse_arg, default_in_specs=AUTO)
    assert default is AUTO


def test_flat_arg_flags_are_read_as_before():
    example, in_specs = example_and_specs(options(arg=["f32[16,8]@P(i,j)", "i32[4]", "f32[2]@AUTO"]),
                                          flat=parse_arg, default_in_specs=None)
    assert [(x.shape, str(x.dtype)) for x in example] == [((16, 8), "float32"), ((4,), "int32"), ((2,), "float32")]
    assert in_specs == (P("i", "j"), None, AUTO)


def test_debug_fills_only_the_shapes():
    shapes = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), make_args())
    values = filled((*shapes[:2], make_args()[2]), np.random.default_rng(0))
    assert jax.tree_util.tree_structure(values) == jax.tree_util.tree_structure(make_args())
    assert all(isinstance(x, np.ndarray) for x in jax.tree_util.tree_leaves(values))
    assert [(x.shape, x.dtype) for x in jax.tree_util.tree_leaves(values)] == \
        [(x.shape, x.dtype) for x in jax.tree_util.tree_leaves(make_args())]
    np.testing.assert_array_equal(values[2], make_args()[2])  # an array given stays as it is


def test_in_specs_read_p_auto_and_none_only():
    assert read_in_specs("(AUTO, P('data'), None)") == (AUTO, P("data"), None)
    with pytest.raises(OptionError, match="--in-specs .*NameError"):
        read_in_specs("__import__('os')")


@pytest.mark.parametrize("text, message", [
    ("/no/such/params.npz", "--args '/no/such/params.npz': cannot read it"),
    ("/no/such/model.py:make_args", "no such file /no/such/model.py"),
    (f"{EXAMPLE}:no_such_example", "cli_loss_example.py has no 'no_such_example'"),
    (f"{EXAMPLE}:make_dict", "make_dict() returned a dict, not a tuple of arguments (return (x,) for a single"),
    (f"{EXAMPLE}:make_fails", "calling make_fails() failed: RuntimeError: no data here"),
    ("weights.pkl", "expected PATH.py:EXAMPLE, FILE.npz or FILE.npy"),
])
def test_a_bad_args_is_an_option_error_naming_it(text, message):
    with pytest.raises(OptionError) as err:
        load_args(text)
    assert message in str(err.value) and str(err.value).startswith("--args ")


def test_an_npz_with_an_object_array_is_refused_not_unpickled(tmp_path):
    np.savez(tmp_path / "objects.npz", x=np.array([{"a": 1}], dtype=object))
    with pytest.raises(OptionError, match="cannot read it"):
        load_args(str(tmp_path / "objects.npz"))


@pytest.mark.parametrize("given, message", [
    (options(args=[f"{EXAMPLE}:make_args"], arg=["f32[8]"]), "give --arg (one array per flag) or --args"),
    (options(arg=["f32[8]"], in_specs="P('i')"), "--in-specs goes with --args"),
])
def test_mixed_flags_are_refused(given, message):
    with pytest.raises(OptionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        example_and_specs(given, flat=parse_arg, default_in_specs=None)
