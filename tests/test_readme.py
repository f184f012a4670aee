"""README.md runs as written: its python blocks, run in page order in one namespace, print what the page shows.

A reader pastes the blocks, in order, into one Python session; so does this test. Every ```python block is run in
one shared namespace (``__name__ == "__main__"``), in a fresh temporary working directory (the blocks write
``graph.svg`` and ``repro/``). Each is compiled under the file name ``README.md`` with its lines numbered as the
page's own (the code is prefixed with as many newlines as lines come before it), so the source lines a listing
prints (``# README.md:39``) point at the page. A block is run as a script (``exec``); a ``>>>`` block is run as the
interpreter's prompt runs it, one statement at a time, echoing the value of an expression.

What a block shows is its standard output with, in it where they happen:

- each warning, as its message: shardprop's begin ``shardprop: ...`` (the page prints them so); any other is
  ``file:line: Category: message``. The warning filters are the interpreter's defaults, so every ``ReshardWarning``
  and ``FallbackWarning`` shows, and one the page does not show is a failure;
- an exception that ends the block, as the last line of its traceback (``shardprop.errors.ShardingConflictError:
  ...``); the next block runs (as at the prompt). The blocks check their sharded results against the unsharded
  function (``assert jnp.allclose(...)``, ``np.testing.assert_allclose``): a check that fails is an exception.

The output of a block is the plain ``` block that follows it, with only prose between (or, in a ``>>>`` block, the
lines after each statement). It must equal what the block shows line for line — trailing whitespace and trailing
blank lines aside, wall times normalised by :func:`normalise` (the only thing that differs from machine to machine)
— where a line ``...`` alone (any indentation) in the page's output stands for any run of lines, none included
(the page elides a long listing so). A block without an output block must show no warning and raise nothing.

``python tests/test_readme.py`` runs the page and rewrites its output blocks with what the blocks show now,
keeping the page's ``...`` elisions: each run of shown lines between them is found again in the new output by its
lines without their trailing ``# comment`` and spacing (a listing's source lines and column widths change). A line
that changed only in its wall times keeps the page's times (``--times`` writes the new ones too).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import io
import os
import pathlib
import re
import sys
import tempfile
import time
import traceback
import warnings

import pytest

PAGE = pathlib.Path(__file__).resolve().parents[1] / "README.md"
FILE_NAME = "README.md"
# a fenced block: its language ("" for an output block) and its body; the page's fences start at column 0
FENCE = re.compile(r"^```(?P<lang>[\w-]*)\n(?P<body>.*?)^```[ \t]*$", re.S | re.M)
ELISION = "..."  # an output line that is this alone (indentation aside) stands for any run of lines
# wall times: "1.23 ms", "compiled in 75.96 ms", "in 1.61 s", "0.97 s" (the search's time and its compile check)
WALL_TIME = re.compile(r"\b\d+(?:\.\d+)? ?(?:ms|µs|us|s)\b")


def normalise(line: str) -> str:
    """The line with what differs from machine to machine masked: wall times only (``1.23 ms`` -> ``<time>``)."""
    return WALL_TIME.sub("<time>", line)


@dataclasses.dataclass
class Run:
    """One piece of code the page runs: a whole ```python block, or one statement of a ``>>>`` block."""

    line: int  # the README line of the code's first line
    code: str
    mode: str  # "exec" (a block, as a script) or "single" (a statement at the prompt, its value echoed)
    expected: list[str] | None  # the page's output lines; None: the block has no output block
    span: tuple[int, int] | None  # where the expected lines are in the page (character offsets), for rewriting
    heading: str


@dataclasses.dataclass
class Shown:
    output: str
    warnings: list[str]
    raised: str | None
    seconds: float


def _line_of(page: str, offset: int) -> int:
    return page.count("\n", 0, offset) + 1


def _heading(page: str, offset: int) -> str:
    headings = re.findall(r"^#{2,3} (.+)$", page[:offset], re.M)
    return headings[-1] if headings else "top"


def runs(page: str) -> list[Run]:
    """Every piece of code on the page, in page order, with the output the page shows for it."""
    fences = list(FENCE.finditer(page))
    found, paired = [], set()
    for k, fence in enumerate(fences):
        if fence["lang"] != "python":
            continue
        body, start = fence["body"], fence.start("body")
        first_line, heading = _line_of(page, start), _heading(page, fence.start())
        if body.lstrip().startswith(">>>"):
            found += _prompt_runs(body, start, first_line, heading)
            continue
        after = fences[k + 1] if k + 1 < len(fences) else None
        if after is not None and after["lang"] == "" and "```" not in page[fence.end():after.start()]:
            paired.add(after.start())
            expected, span = after["body"].splitlines(), (after.start("body"), after.end("body"))
        else:
            expected, span = None, None
        found.append(Run(first_line, body, "exec", expected, span, heading))
    orphans = [_line_of(page, f.start()) for f in fences if f["lang"] == "" and f.start() not in paired]
    assert not orphans, f"README.md: output blocks that follow no python block, at lines {orphans}"
    return found


def _prompt_runs(body: str, start: int, first_line: int, heading: str) -> list[Run]:
    """A ``>>>`` block: each statement (``>>>`` and its ``...`` continuation lines) and the output lines after it."""
    found, offset = [], start
    for number, text in enumerate(body.splitlines(keepends=True), first_line):
        line = text.rstrip("\n")
        if line.startswith(">>>"):
            found.append(Run(number, line[4:] + "\n", "single", [], (offset + len(text), offset + len(text)),
                             heading))
        elif line.startswith("...") and found and not found[-1].expected:
            found[-1].code += line[4:] + "\n"
            found[-1].span = (offset + len(text), offset + len(text))
        else:
            assert found, f"README.md:{number}: a >>> block starts with a statement"
            found[-1].expected.append(line)
            found[-1].span = (found[-1].span[0], offset + len(text))
        offset += len(text)
    return found


def _show_warning(message, category, filename, lineno, file=None, line=None):
    text = str(message)
    if not text.startswith("shardprop: "):
        text = f"{filename}:{lineno}: {category.__name__}: {text}"
    print(text)  # to the block's captured standard output, where it happens
    _show_warning.shown.append(text)


def run(code: Run, namespace: dict) -> Shown:
    """Run one piece of the page in ``namespace``: what it printed, the warnings it showed, what it raised."""
    source = "\n" * (code.line - 1) + code.code
    out, _show_warning.shown = io.StringIO(), []
    raised = None
    began = time.perf_counter()
    with warnings.catch_warnings(), contextlib.redirect_stdout(out):
        warnings.resetwarnings()  # the interpreter's default filters, as in a fresh session
        for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
            warnings.filterwarnings("ignore", category=category)
        warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")
        warnings.showwarning = _show_warning
        try:
            exec(compile(source, FILE_NAME, code.mode), namespace)
        except Exception as error:  # shown as the session shows it: the last line of the traceback
            raised = "".join(traceback.format_exception_only(type(error), error)).rstrip("\n")
            print(raised)
    return Shown(out.getvalue(), _show_warning.shown, raised, time.perf_counter() - began)


def run_page(page: str, *, report=None) -> list[tuple[Run, Shown]]:
    """Every piece of the page run in order, in one namespace, in a fresh temporary directory."""
    import jax

    jax.config.update("jax_num_cpu_devices", 8)  # as tests/conftest.py does (the page's first block does it too)
    namespace = {"__name__": "__main__"}
    results = []
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as directory:
        os.chdir(directory)
        try:
            for code in runs(page):
                shown = run(code, namespace)
                results.append((code, shown))
                if report:
                    report(code, shown)
        finally:
            os.chdir(cwd)
    return results


def lines(text: str) -> list[str]:
    """Lines without trailing whitespace, trailing blank lines dropped."""
    return [line.rstrip() for line in text.rstrip().splitlines()]


def matches(expected: list[str], actual: list[str]) -> bool:
    """``expected`` equals ``actual`` line for line, where an ``...`` line stands for any run of lines."""
    # can[j]: expected[:i] matches actual[:j], for the i reached so far
    can = [True] + [False] * len(actual)
    for want in expected:
        if want.strip() == ELISION:
            can = [any(can[:j + 1]) for j in range(len(actual) + 1)]
        else:
            can = [False] + [can[j] and want == actual[j] for j in range(len(actual))]
    return can[-1]


def _key(line: str) -> str:
    """A line as the rewrite finds it again: without its trailing ``# comment`` and its spacing."""
    return " ".join(re.sub(r"\s+#\s.*$", "", line).split())


def fill(expected: list[str], actual: list[str], where: str) -> list[str]:
    """The new output for an output block: ``actual``, elided where the page elides (see the module docstring)."""
    if not any(line.strip() == ELISION for line in expected):
        return actual
    out, position, segment = [], 0, []
    for line in expected + [None]:
        if line is not None and line.strip() != ELISION:
            segment.append(line)
            continue
        keys = [_key(s) for s in segment]
        for start in range(position, len(actual) - len(segment) + 1):
            if [_key(a) for a in actual[start:start + len(segment)]] == keys:
                break
        else:
            raise ValueError(f"{where}: the lines shown around an elision are no longer in the output: "
                             f"{segment[:1]}; edit the page's output by hand")
        out += actual[start:start + len(segment)]
        position = start + len(segment)
        segment = []
        if line is not None:
            out.append(line)
    if not matches(out, actual):
        raise ValueError(f"{where}: the elided output does not match the new output; edit it by hand")
    return out


def failure(code: Run, shown: Shown) -> str | None:
    """What is wrong with one piece of the page, run: None when it shows what the page shows."""
    where = f"README.md:{code.line} ({code.heading})"
    if code.expected is None:
        if shown.raised is not None:
            return f"{where} raised {shown.raised}"
        if shown.warnings:
            return f"{where} warned, and the page shows no output for it: {shown.warnings}"
        return None
    expected = [normalise(line) for line in lines("\n".join(code.expected))]
    actual = [normalise(line) for line in lines(shown.output)]
    from tests.releases import compared  # (imports shardprop: not before the device count is set)

    if not compared("README.md", code.heading):  # a JAX release that traces it otherwise: it runs, as the page does
        ran_as_shown = shown.raised is None or shown.raised in code.expected
        return None if ran_as_shown else f"{where} raised {shown.raised}"
    if matches(expected, actual):
        return None
    diff = "\n".join(difflib.unified_diff(expected, actual, "README.md", "run", lineterm=""))
    return f"{where} shows other output than the page's:\n{diff}"


def test_every_python_block_runs_and_shows_what_the_page_shows():
    """One test, not one per block: the blocks share a namespace, and the page runs once (in one xdist worker)."""
    failures = [text for code, shown in run_page(PAGE.read_text()) if (text := failure(code, shown))]
    assert not failures, ("\n\n".join(failures) + "\n\nrun `python tests/test_readme.py` and review the diff "
                          "of README.md")


def test_the_page_has_code_and_outputs():
    found = runs(PAGE.read_text())
    assert len([c for c in found if c.mode == "exec"]) >= 20
    assert len([c for c in found if c.expected]) >= 15
    assert found[0].code.startswith('import jax\njax.config.update("jax_num_cpu_devices", 8)')


SAMPLE = '''# a page

## Warned

```python
import sys, warnings
warnings.warn("shardprop: moved it\\n  in detail", UserWarning)
print(f"{sys._getframe().f_code.co_filename}:{sys._getframe().f_lineno}")
```

prints:

```
shardprop: moved it
  in detail
README.md:8
```

## Silent

```python
warnings.warn("unseen")
```

```python
>>> 1 + 1
2
>>> x = 3
>>> x
3
```

```python
raise ValueError("bad")
```
```
ValueError: bad
```
'''


def test_the_runner_shows_what_a_session_shows():
    """Warnings where they happen (shardprop's as their message), the page's own line numbers, the prompt's echo,
    an exception's last traceback line; a warning on a block without output is a failure."""
    found = runs(SAMPLE)
    assert [(c.line, c.mode) for c in found] == [(6, "exec"), (22, "exec"), (26, "single"), (28, "single"),
                                                  (29, "single"), (34, "exec")]
    results = run_page(SAMPLE)
    assert results[0][1].output == "shardprop: moved it\n  in detail\nREADME.md:8\n"
    assert [failure(c, s) is None for c, s in results] == [True, False, True, True, True, True]
    assert "warned" in failure(*results[1]) and "unseen" in failure(*results[1])


@pytest.mark.parametrize("expected, actual, ok", [
    (["a", "...", "d"], ["a", "b", "c", "d"], True),
    (["a", "...", "d"], ["a", "d"], True),
    (["a", "  ...", "c", "..."], ["a", "b", "c", "d", "e"], True),
    (["a", "...", "d"], ["a", "b", "c"], False),
    (["a", "c"], ["a", "b", "c"], False),
    (["...", "b"], ["a", "b", "c"], False),
])
def test_elision_stands_for_any_run_of_lines(expected, actual, ok):
    assert matches(expected, actual) is ok


def test_only_wall_times_are_normalised():
    assert normalise("ran in 1.23 ms (compiled in 75.96 ms), 256 B moved") == \
        "ran in <time> (compiled in <time>), 256 B moved"
    assert normalise("chose 6 layouts in 1.61 s (48 plans priced; 1 compiled, 0.97 s): 5.1 MiB moved") == \
        "chose 6 layouts in <time> (48 plans priced; 1 compiled, <time>): 5.1 MiB moved"
    assert normalise("8 stages, 2 programs, 4096 B, 39%") == "8 stages, 2 programs, 4096 B, 39%"


def keep_times(old: list[str], new: list[str]) -> list[str]:
    """``new``, where a line differs from the page's only in its wall times the page's line (see ``rewrite``)."""
    matcher = difflib.SequenceMatcher(a=[normalise(s) for s in old], b=[normalise(s) for s in new], autojunk=False)
    out = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        out += old[i1:i2] if tag == "equal" else new[j1:j2]
    return out


def rewrite(*, times: bool = False) -> None:
    """Run the page and write what each block shows into its output block (the ``...`` elisions kept).

    A line that differs from the page's only in its wall times is left as it is, unless ``times`` (``python
    tests/test_readme.py --times``): the times on the page are from a quiet machine, not from whatever load the
    rewrite runs under.
    """
    while True:  # again while the blocks moved: their listings name their own lines
        page = PAGE.read_text()
        _rewrite_once(page, times)
        if [code.line for code in runs(PAGE.read_text())] == [code.line for code in runs(page)]:
            return
        print("the blocks moved: once more", file=sys.stderr)


def _rewrite_once(page: str, times: bool) -> None:
    def report(code, shown):
        note = f" raised {shown.raised.splitlines()[0]}" if shown.raised and code.expected is None else ""
        note += f" warned {len(shown.warnings)}x" if shown.warnings and code.expected is None else ""
        print(f"README.md:{code.line} ({code.heading}): {shown.seconds:.2f} s{note}", file=sys.stderr)

    parts, end = [], 0
    for code, shown in run_page(page, report=report):
        if code.span is None:
            continue
        where = f"README.md:{code.line}"
        old = lines("\n".join(code.expected))
        new = fill(old, lines(shown.output), where)
        new = new if times else keep_times(old, new)
        text = "\n".join(new) + "\n" if new else ""
        parts += [page[end:code.span[0]], text]
        end = code.span[1]
    PAGE.write_text("".join(parts) + page[end:])


if __name__ == "__main__":
    import jax

    jax.config.update("jax_num_cpu_devices", 8)  # as tests/conftest.py does, before shardprop is imported
    os.environ.setdefault("SHARDPROP_CHECKS", "1")  # as tests/conftest.py does: the same run as the test's
    sys.path.insert(0, str(PAGE.parent))
    from tests.releases import refuse_unless_documented

    refuse_unless_documented("README.md")
    rewrite(times="--times" in sys.argv[1:])
