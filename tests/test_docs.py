"""The documentation stays honest: README.md and docs/*.md link only to files (and headings)
that exist, every file under docs/ is reachable from README.md, the pages speak of the software
(no issue numbers, no account of who ran what, no paths of one machine), README.md stays a first
page and docs/ stays short.

Pure file reading: no Ray, no model. Each rule is a function that returns its violations, and
`test_each_check_catches_a_planted_violation` shows every one of them failing on a bad page.
"""

from __future__ import annotations

import re
from collections import deque
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_MAX_LINES = 300
DOCS_MAX_CHARS = 120_000  # docs/*.md together: current facts only, superseded ones go away

# [text](target) and ![alt](target), with an optional "title"; the target has no spaces
_LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)  # http:, https:, mailto:, ...
_HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", re.M)

FORBIDDEN = {
    # "#20", "(#21)", "issue 43", "issues": the pages describe the software, not its tracker.
    # `#### 42` (GSM8K's answer line) and headings are a run of '#' then a space: not matched.
    "issue number": re.compile(r"(?<![\w&/#])#\d+\b"),
    "the word 'issue'": re.compile(r"\bissues?\b", re.I),
    # an account of how the work went, rather than what the software does
    "development history": re.compile(
        r"this session|these sessions|earlier sessions?|session's host|was not lent|"
        r"no gpu was lent|been lent|development machine|the device tool|i have not|"
        r"\bwe tried\b|before this change|since this work|what this work|working checkout|"
        r"my test runs|on this machine|this session's|not lent to", re.I),
    # paths of one particular machine
    "machine path": re.compile(r"/work/|/root/|/home/|\.\./shared/"),
}


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def targets(text: str) -> list[str]:
    """Relative link and image targets of a markdown page, outside code, with their #anchors."""
    text = _INLINE_CODE.sub("", _FENCE.sub("", text))
    return [t for t in _LINK.findall(text) if not _EXTERNAL.match(t)]


def links(text: str) -> list[str]:
    """Relative link and image targets of a markdown page, outside code, without #anchors."""
    return [t.split("#", 1)[0] for t in targets(text) if not t.startswith("#")]


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of a markdown page's headings (outside code fences)."""
    return {slug(h) for h in _HEADING.findall(_FENCE.sub("", text))}


def broken_anchors(page: Path) -> list[str]:
    """Link targets of `page` with a #anchor that names no heading of the markdown page."""
    out = []
    for target in targets(page.read_text()):
        path, _, anchor = target.partition("#")
        dest = page.parent / path if path else page
        if anchor and dest.suffix == ".md" and dest.is_file() \
                and anchor not in anchors(dest.read_text()):
            out.append(target)
    return out


def broken_links(page: Path) -> list[str]:
    """Link targets of `page` that name no existing file or directory."""
    return [t for t in links(page.read_text()) if not (page.parent / t).exists()]


def reachable(start: Path) -> set[Path]:
    """Every file reached from `start` by following relative links from markdown pages."""
    seen, todo = {start.resolve()}, deque([start.resolve()])
    while todo:
        page = todo.popleft()
        for target in links(page.read_text()):
            path = (page.parent / target).resolve()
            if path.is_file() and path not in seen:
                seen.add(path)
                if path.suffix == ".md":
                    todo.append(path)
    return seen


def unreachable(start: Path, docs: Path) -> list[str]:
    """Files under `docs` that no chain of links from `start` reaches."""
    found = reachable(start)
    return sorted(str(p.relative_to(docs)) for p in docs.rglob("*")
                  if p.is_file() and p.resolve() not in found)


def too_long(page: Path, limit: int = README_MAX_LINES) -> str | None:
    """Why `page` is too long for a first page, or None."""
    n = len(page.read_text().splitlines())
    return f"{page.name} has {n} lines (at most {limit})" if n > limit else None


def forbidden(text: str) -> list[str]:
    """'rule: the text that breaks it' for every forbidden pattern in `text`."""
    return [f"{rule}: {m.group(0)!r}" for rule, pattern in FORBIDDEN.items()
            for m in pattern.finditer(text)]


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_links_name_existing_files(page):
    assert not broken_links(page), f"{page.relative_to(ROOT)}: broken {broken_links(page)}"


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_anchors_name_existing_headings(page):
    assert not broken_anchors(page), f"{page.relative_to(ROOT)}: {broken_anchors(page)}"


def test_every_docs_file_is_reachable_from_readme():
    missing = unreachable(README, DOCS)
    assert not missing, f"not linked from README.md or a page it reaches: {missing}"


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_pages_speak_of_the_software(page):
    found = forbidden(page.read_text())
    assert not found, f"{page.relative_to(ROOT)}: {found}"


def test_readme_is_a_first_page():
    assert too_long(README) is None, too_long(README)


def test_the_docs_stay_short():
    total = sum(len(p.read_text()) for p in DOCS.glob("*.md"))
    assert total <= DOCS_MAX_CHARS, f"docs/*.md hold {total} characters (at most {DOCS_MAX_CHARS})"


def test_each_check_catches_a_planted_violation(tmp_path):
    """Every rule above fails on a page that breaks it, and passes the forms it must allow."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("![plot](plot.png) [back](../README.md#top) [b](b.md)\n")
    (docs / "plot.png").write_bytes(b"")
    (docs / "b.md").write_text("[gone](gone.md) [web](https://example.com/x.md) [up](#a)\n"
                               "`[code](not-a-link.md)`\n```\n[fenced](nor-this.md)\n```\n")
    (docs / "orphan.png").write_bytes(b"")
    (docs / "island.md").write_text("[a](a.md)\n")  # links out, but nothing links to it
    readme = tmp_path / "README.md"
    readme.write_text("[docs](docs/a.md#section)\n")

    assert broken_links(readme) == []
    assert broken_links(docs / "a.md") == []
    assert broken_links(docs / "b.md") == ["gone.md"]
    assert unreachable(readme, docs) == ["island.md", "orphan.png"]
    (docs / "c.md").write_text("# Top\n## `cpu-14core`: per core, 0.5B\n```\n# not a heading\n```\n"
                               "[ok](#top) [ok](c.md#cpu-14core-per-core-05b) [ok](a.md)\n"
                               "[bad](#not-a-heading) [bad](a.md#nothing)\n")
    assert broken_anchors(docs / "c.md") == ["#not-a-heading", "a.md#nothing"]

    for bad in ("fixed in #20", "the ratio (#21)", "see issue 43", "the issues asked",
                "this session had no GPU", "No GPU was lent", "on the development machine",
                "which I have not explained", "we tried G=16", "before this change it leaked",
                "cd /work/old", "/root/.cache/x", "/home/me/data", "../shared/data/x.jsonl"):
        assert forbidden(bad), bad
    for good in ("#### 42", "## Results", "### Memory", "a = 8\n#### 8",
                 "[memory](docs/performance.md#memory)", "&#35;", "~/.cache/homerl",
                 "/tmp/ray/session_latest/logs", "path/to/gsm8k/train.jsonl", "commit 855505e"):
        assert not forbidden(good), good

    readme.write_text("line\n" * README_MAX_LINES)
    assert too_long(readme) is None
    readme.write_text("line\n" * (README_MAX_LINES + 1))
    assert too_long(readme)
