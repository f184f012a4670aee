"""mkdocs hooks for the documentation site (mkdocs.yml's ``hooks:``).

README.md is the guide's one source — its ``python`` blocks run in one session under tests/test_readme.py — and
the site places its sections into pages rather than keeping a second copy: a page line

    <!-- readme: Steering -->

is replaced by README's section of that heading (its heading line through the line before the next heading of
the same or a higher level; ``<!-- readme: intro -->`` is the text between the title and the first section).
Links in a placed section are rewritten for the site: ``docs/x.md`` → ``x.md``, ``#anchor`` → the page that
places the section holding it, and a link to a repository file outside ``docs/`` → that path in code.

A page line ``<!-- cli-help -->`` is replaced by the installed ``shardprop`` command's help and every
subcommand's (argparse's own output, so it cannot go stale).
"""

from __future__ import annotations

import contextlib
import io
import os
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SECTION_MARKER = re.compile(r"^<!-- readme: (?P<title>.+?) -->[ \t]*$", re.M)
CLI_MARKER = "<!-- cli-help -->"
HEADING = re.compile(r"^(?P<hashes>#{1,6}) (?P<title>.+?)\s*$")
# CommonMark's code fences: three or more backticks or tildes, closed by the same character at least as many times
FENCE = re.compile(r"^ {0,3}(?P<fence>`{3,}|~{3,})")


def fenced(lines: list[str]) -> list[bool]:
    """For each line, whether it belongs to a fenced code block (its fences included): no heading or link there."""
    out, opening = [], None
    for line in lines:
        m = FENCE.match(line)
        if opening is None:
            opening = m["fence"] if m else None
            out.append(m is not None)
        else:
            out.append(True)
            if m and m["fence"][0] == opening[0] and len(m["fence"]) >= len(opening) and not line[m.end():].strip():
                opening = None
    return out

# README anchor -> the page (path relative to docs/) placing the section that holds it; filled by on_files
_anchor_pages: dict[str, str] = {}


def slug(title: str) -> str:
    """The anchor the site gives a heading: Python-Markdown's toc's own (GitHub's too, for the titles README uses)."""
    from markdown.extensions.toc import slugify

    return slugify(title, "-")


def readme_sections() -> dict[str, list[str]]:
    """README's sections by title (each with its subsections), and ``intro``; fenced code is not a heading."""
    lines = README.read_text().splitlines()
    headings = []  # (line index, level, title)
    for index, (line, code) in enumerate(zip(lines, fenced(lines), strict=True)):
        m = None if code else HEADING.match(line)
        if m:
            headings.append((index, len(m["hashes"]), m["title"]))
    sections = {"intro": lines[1:headings[1][0]] if len(headings) > 1 else lines[1:]}
    for position, (start, level, title) in enumerate(headings[1:], start=1):
        end = next((i for i, lvl, _ in headings[position + 1:] if lvl <= level), len(lines))
        sections[title] = lines[start:end]
    return sections


def _anchors_in(section: list[str]) -> list[str]:
    return [slug(m["title"]) for line, code in zip(section, fenced(section), strict=True)
            if not code and (m := HEADING.match(line))]


def on_files(files, config):
    sections = readme_sections()
    _anchor_pages.clear()
    for file in files.documentation_pages():
        text = pathlib.Path(file.abs_src_path).read_text()
        for m in SECTION_MARKER.finditer(text):
            for anchor in _anchors_in(sections.get(m["title"], [])):
                _anchor_pages.setdefault(anchor, file.src_uri)
    return files


def site_link(target: str, source: pathlib.PurePosixPath, page_uri: str) -> str | None:
    """``target`` as a link on the site, written in the repository file ``source`` (README.md or a docs page) and
    shown on the page ``page_uri``; None for a repository file outside ``docs/`` (no page to link to)."""
    if re.match(r"[a-z]+:", target):
        return target
    path, _, anchor = target.partition("#")
    up = "../" * page_uri.count("/")
    resolved = os.path.normpath(source.parent / path) if path else str(source)
    if resolved == "README.md":
        owner = _anchor_pages.get(anchor)
        if owner is None:
            return target  # left as is: mkdocs' link validation reports it
        return f"#{anchor}" if owner == page_uri else f"{up}{owner}#{anchor}"
    if resolved.startswith("docs/"):
        return up + resolved[len("docs/"):] + (f"#{anchor}" if anchor else "")
    return None


MARKDOWN_LINK = re.compile(r"(?<!!)\[(?P<text>[^\]]+)\]\((?P<target>[^)\s]+)\)")


def rewrite_links(lines: list[str], source: pathlib.PurePosixPath, page_uri: str) -> list[str]:
    """Links outside fenced code rewritten for the site (see the module docstring)."""

    def rewrite(m: re.Match) -> str:
        target = site_link(m["target"], source, page_uri)
        if target is not None:
            return f"[{m['text']}]({target})"
        # a repository file: its path in code, once (the text is often the path already)
        path = os.path.normpath(source.parent / m["target"])
        return m["text"] if path in m["text"] else f"{m['text']} (`{path}`)"

    # a link's text may span lines: the text between fences is rewritten as a whole
    out, prose = [], []
    for line, code in zip(lines + [""], fenced(lines) + [True], strict=True):
        if code:
            out += MARKDOWN_LINK.sub(rewrite, "\n".join(prose)).split("\n") if prose else []
            prose = []
            out.append(line)
        else:
            prose.append(line)
    return out[:-1]


def place_section(title: str, page_uri: str) -> str:
    sections = readme_sections()
    if title not in sections:
        raise KeyError(f"{page_uri}: README.md has no section {title!r} (headings: {sorted(sections)})")
    return "\n".join(rewrite_links(sections[title], pathlib.PurePosixPath("README.md"), page_uri))


def cli_help() -> str:
    from shardprop.cli import COMMANDS, main

    def help_of(argv: list[str]) -> str:
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer), contextlib.suppress(SystemExit):
            main(argv + ["--help"])
        return buffer.getvalue().rstrip()

    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "88"  # argparse wraps to the terminal: the same width wherever the site is built
    try:
        parts = [f"## `shardprop`\n\n```text\n{help_of([])}\n```"]
        for command in COMMANDS:
            parts.append(f"## `shardprop {command}`\n\n```text\n{help_of([command])}\n```")
    finally:
        if previous is None:
            os.environ.pop("COLUMNS")
        else:
            os.environ["COLUMNS"] = previous
    return "\n\n".join(parts)


def on_page_markdown(markdown, page, config, files):
    uri = page.file.src_uri
    markdown = "\n".join(rewrite_links(markdown.splitlines(), pathlib.PurePosixPath("docs") / uri, uri))
    markdown = SECTION_MARKER.sub(lambda m: place_section(m["title"], uri), markdown)
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_help())
    return markdown
