"""A documentation page runs as written: its python blocks, run in page order in one namespace, print what it shows.

The one runner for the pages whose code is their own (README.md: tests/test_readme.py; the other pages under
docs/: tests/test_pages.py). A reader pastes a page's blocks, in order, into one Python session; so does this
runner. Every ```python block is run in one shared namespace (``__name__ == "__main__"``), in a fresh temporary
working directory (README's blocks write ``graph.svg`` and ``repro/``). Each is compiled under the page's path from
the repository's root (``README.md``, ``docs/workloads.md``) with its lines numbered as the page's own (the code is
prefixed with as many newlines as lines come before it), so the source lines a listing prints (``# README.md:39``,
``at workloads.md:15``: shardprop prints a path's last part) point at the page. A block is run as a script
(``exec``); a ``>>>`` block is run as the interpreter's prompt runs it, one statement at a time, echoing the value
of an expression.

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
(the page elides a long listing so). A block without an output block must show no warning and raise nothing. On a
JAX release other than the documented one, the parts of a page listed in ``tests/releases.py`` (by heading) are run
but not compared.

``python tests/pages.py docs/workloads.md`` (any page; ``python tests/test_readme.py`` for README.md) runs the page
and rewrites its output blocks with what the blocks show now, keeping the page's ``...`` elisions: each run of
shown lines between them is found again in the new output by its lines without their trailing ``# comment`` and
spacing (a listing's source lines and column widths change). A line that changed only in its wall times keeps the
page's times (``--times`` writes the new ones too). A new output block is written by the rewrite into an empty
plain ``` block placed after the python block.
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

ROOT = pathlib.Path(__file__).resolve().parents[1]
# a fenced block: its language ("" for an output block) and its body; the page's fences start at column 0
FENCE = re.compile(r"^```(?P<lang>[\w-]*)\n(?P<body>.*?)^```[ \t]*$", re.S | re.M)
ELISION = "..."  # an output line that is this alone (indentation aside) stands for any run of lines
# wall times: "1.23 ms", "compiled in 75.96 ms", "in 1.61 s", "0.97 s" (the search's time and its compile check)
WALL_TIME = re.compile(r"\b\d+(?:\.\d+)? ?(?:ms|µs|us|s)\b")


def name_of(path: pathlib.Path) -> str:
    """The page's name: its path from the repository's root (``docs/workloads.md``), as tests/releases.py keys it."""
    return path.resolve().relative_to(ROOT).as_posix()


def normalise(line: str) -> str:
    """The line with what differs from machine to machine masked: wall times only (``1.23 ms`` -> ``<time>``)."""
    return WALL_TIME.sub("<time>", line)


@dataclasses.dataclass
class Run:
    """One piece of code the page runs: a whole ```python block, or one statement of a ``>>>`` block."""

    page: str  # the page's name (see name_of): the file name its code is compiled under
    line: int  # the page's line of the code's first line
    code: str
    mode: str  # "exec" (a block, as a script) or "single" (a statement at the prompt, its value echoed)
    expected: list[str] | None  # the page's output lines; None: the block has no output block
    span: tuple[int, int] | None  # where the expected lines are in the page (character offsets), for rewriting
    heading: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line} ({self.heading})"


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


def runs(page: str, name: str) -> list[Run]:
    """Every piece of code on the page (its text; ``name`` as name_of gives it), in page order, with the output the
    page shows for it."""
    fences = list(FENCE.finditer(page))
    found, paired = [], set()
    for k, fence in enumerate(fences):
        if fence["lang"] != "python":
            continue
        body, start = fence["body"], fence.start("body")
        first_line, heading = _line_of(page, start), _heading(page, fence.start())
        if body.lstrip().startswith(">>>"):
            found += _prompt_runs(name, body, start, first_line, heading)
            continue
        after = fences[k + 1] if k + 1 < len(fences) else None
        if after is not None and after["lang"] == "" and "```" not in page[fence.end():after.start()]:
            paired.add(after.start())
            expected, span = after["body"].splitlines(), (after.start("body"), after.end("body"))
        else:
            expected, span = None, None
        found.append(Run(name, first_line, body, "exec", expected, span, heading))
    orphans = [_line_of(page, f.start()) for f in fences if f["lang"] == "" and f.start() not in paired]
    assert not orphans, f"{name}: output blocks that follow no python block, at lines {orphans}"
    return found


def _prompt_runs(name: str, body: str, start: int, first_line: int, heading: str) -> list[Run]:
    """A ``>>>`` block: each statement (``>>>`` and its ``...`` continuation lines) and the output lines after it."""
    found, offset = [], start
    for number, text in enumerate(body.splitlines(keepends=True), first_line):
        line = text.rstrip("\n")
        if line.startswith(">>>"):
            found.append(Run(name, number, line[4:] + "\n", "single", [], (offset + len(text), offset + len(text)),
                             heading))
        elif line.startswith("...") and found and not found[-1].expected:
            found[-1].code += line[4:] + "\n"
            found[-1].span = (offset + len(text), offset + len(text))
        else:
            assert found, f"{name}:{number}: a >>> block starts with a statement"
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
            exec(compile(source, code.page, code.mode), namespace)
        except Exception as error:  # shown as the session shows it: the last line of the traceback
            raised = "".join(traceback.format_exception_only(type(error), error)).rstrip("\n")
            print(raised)
    return Shown(out.getvalue(), _show_warning.shown, raised, time.perf_counter() - began)


def run_page(page: str, name: str, *, report=None) -> list[tuple[Run, Shown]]:
    """Every piece of the page run in order, in one namespace, in a fresh temporary directory."""
    import jax

    jax.config.update("jax_num_cpu_devices", 8)  # as tests/conftest.py does (a page's first block does it too)
    namespace = {"__name__": "__main__"}
    results = []
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as directory:
        os.chdir(directory)
        try:
            for code in runs(page, name):
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
    if code.expected is None:
        if shown.raised is not None:
            return f"{code.where} raised {shown.raised}"
        if shown.warnings:
            return f"{code.where} warned, and the page shows no output for it: {shown.warnings}"
        return None
    expected = [normalise(line) for line in lines("\n".join(code.expected))]
    actual = [normalise(line) for line in lines(shown.output)]
    from tests.releases import compared  # (imports shardprop: not before the device count is set)

    if not compared(code.page, code.heading):  # a JAX release that traces it otherwise: it runs, as the page does
        ran_as_shown = shown.raised is None or shown.raised in code.expected
        return None if ran_as_shown else f"{code.where} raised {shown.raised}"
    if matches(expected, actual):
        return None
    diff = "\n".join(difflib.unified_diff(expected, actual, code.page, "run", lineterm=""))
    return f"{code.where} shows other output than the page's:\n{diff}"


def failures(path: pathlib.Path) -> list[str]:
    """What is wrong with the page at ``path``, run: one text per failing piece, each saying how to fix the page."""
    name = name_of(path)
    found = [text for code, shown in run_page(path.read_text(), name) if (text := failure(code, shown))]
    command = "python tests/test_readme.py" if name == "README.md" else f"python tests/pages.py {name}"
    return (found + [f"run `{command}` and review the diff of {name}"]) if found else []


def keep_times(old: list[str], new: list[str]) -> list[str]:
    """``new``, where a line differs from the page's only in its wall times the page's line (see ``rewrite``)."""
    matcher = difflib.SequenceMatcher(a=[normalise(s) for s in old], b=[normalise(s) for s in new], autojunk=False)
    out = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        out += old[i1:i2] if tag == "equal" else new[j1:j2]
    return out


def rewrite(path: pathlib.Path, *, times: bool = False) -> None:
    """Run the page at ``path`` and write what each block shows into its output block (the ``...`` elisions kept).

    A line that differs from the page's only in its wall times is left as it is, unless ``times`` (``--times``):
    the times on the page are from a quiet machine, not from whatever load the rewrite runs under.
    """
    name = name_of(path)
    while True:  # again while the blocks moved: their listings name their own lines
        page = path.read_text()
        _rewrite_once(path, name, page, times)
        if [code.line for code in runs(path.read_text(), name)] == [code.line for code in runs(page, name)]:
            return
        print("the blocks moved: once more", file=sys.stderr)


def _rewrite_once(path: pathlib.Path, name: str, page: str, times: bool) -> None:
    def report(code, shown):
        note = f" raised {shown.raised.splitlines()[0]}" if shown.raised and code.expected is None else ""
        note += f" warned {len(shown.warnings)}x" if shown.warnings and code.expected is None else ""
        print(f"{code.where}: {shown.seconds:.2f} s{note}", file=sys.stderr)

    parts, end = [], 0
    for code, shown in run_page(page, name, report=report):
        if code.span is None:
            continue
        old = lines("\n".join(code.expected))
        new = fill(old, lines(shown.output), f"{name}:{code.line}")
        new = new if times else keep_times(old, new)
        text = "\n".join(new) + "\n" if new else ""
        parts += [page[end:code.span[0]], text]
        end = code.span[1]
    path.write_text("".join(parts) + page[end:])


def main(arguments: list[str]) -> None:
    """``python tests/pages.py PAGE [--times]``: rewrite PAGE's output blocks (see the module docstring)."""
    pages = [argument for argument in arguments if argument != "--times"]
    if len(pages) != 1:
        sys.exit("usage: python tests/pages.py PAGE [--times]   (PAGE: README.md, docs/workloads.md, ...)")
    path = pathlib.Path(pages[0])
    path = (path if path.exists() else ROOT / path).resolve()  # from here, or from the repository's root
    if not path.is_file() or ROOT not in path.parents:
        sys.exit(f"{pages[0]}: not a page of this repository ({ROOT})")
    import jax

    jax.config.update("jax_num_cpu_devices", 8)  # as tests/conftest.py does, before shardprop is imported
    os.environ.setdefault("SHARDPROP_CHECKS", "1")  # as tests/conftest.py does: the same run as the test's
    sys.path.insert(0, str(ROOT))
    from tests.releases import refuse_unless_documented

    refuse_unless_documented(name_of(path))
    rewrite(path, times="--times" in arguments)


if __name__ == "__main__":
    main(sys.argv[1:])
