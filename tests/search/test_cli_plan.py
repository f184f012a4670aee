"""``shardprop plan`` (in this process, tests/cli.py; the first test as a user runs it, a subprocess): the chosen
layout table, its JSON, bad options."""

import json
from pathlib import Path

import jsonschema
import pytest

from shardprop.cli.plan import parse_size
from shardprop.errors import OptionError
from shardprop.inspect.searched import SEARCH_SCHEMA
from tests.cli import shardprop, shardprop_subprocess

EXAMPLE = Path(__file__).parent / "plan_example.py"


def plan(*args, check=True, subprocess=False):
    result = (shardprop_subprocess if subprocess else shardprop)("plan", *args)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def test_plan_prints_the_chosen_table_and_explains_a_choice():
    out = plan(f"{EXAMPLE}:step", "--mesh", "data=4,model=2", "--args", f"{EXAMPLE}:example",
               "--in-specs", "(AUTO, P('data'), P('data'))", "--memory-limit", "1MB",
               "--explain", "params[0]['w']", subprocess=True).stdout
    assert out.startswith("sp.AUTO chose 4 layouts in ")
    assert "as compiled, limit 976.6 KiB" in out
    for path in ("params[0]['b']", "params[0]['w']", "params[1]['b']", "params[1]['w']"):
        assert f"  {path}  " in out
    assert "chosen by the sp.AUTO solve (optimal) among 9 layouts" in out and "(chosen)" in out  # (limit not binding)


def test_plan_json_with_flat_arguments():
    out = plan(f"{EXAMPLE}:matmul", "--mesh", "i=8", "--arg", "f32[64,256]@P(i)", "--arg", "f32[256,512]@AUTO",
               "--format", "json").stdout
    doc = json.loads(out)["search"]
    jsonschema.validate(doc, SEARCH_SCHEMA)
    assert [row["argument"] for row in doc["chosen"]] == ["b"]
    assert doc["chosen"][0]["shape"] == [256, 512] and isinstance(doc["chosen"][0]["spec"], list)
    assert doc["moved_bytes"] >= 0 and doc["memory"]["total"] > 0 and doc["certificate"] == "optimal"


@pytest.mark.parametrize("args, message", [
    ((), "one --arg per argument, or --args"),
    (("--arg", "f32[8,8]@P(i)", "--arg", "f32[8,8]"), "nothing to plan: no argument is sp.AUTO"),
    (("--arg", "f32[8]@AUTO", "--memory-limit", "lots"), "--memory-limit 'lots': expected bytes"),
    (("--arg", "f32[8]@AUTO", "--in-specs", "AUTO"), "--in-specs goes with --args"),
])
def test_plan_refuses_bad_options_in_one_line(args, message):
    result = plan(f"{EXAMPLE}:matmul", "--mesh", "i=8", *args, check=False)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("text, size", [("4096", 4096), ("12MB", 12_000_000), ("1.5GiB", 1610612736),
                                        ("64 kib", 65536)])
def test_parse_size(text, size):
    assert parse_size(text) == size


def test_parse_size_refuses_nonsense():
    with pytest.raises(OptionError):
        parse_size("12 parsecs")


def test_inspect_json_of_a_searched_program_says_what_was_chosen():
    from shardprop.inspect import SCHEMA

    result = shardprop("inspect", f"{EXAMPLE}:matmul", "--mesh", "i=8", "--arg", "f32[64,256]@P(i)",
                       "--arg", "f32[256,512]@AUTO", "--format", "json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    jsonschema.validate(doc, SCHEMA)
    assert [row["argument"] for row in doc["search"]["chosen"]] == ["b"]
