"""The Llama step's arguments for ``shardprop debug --args tests/debug/llama_cli_example.py:arguments`` (the
faults test runs the command on them with a collective planted missing)."""

from tests.debug.test_llama_faults import ARGS


def arguments():
    return ARGS
