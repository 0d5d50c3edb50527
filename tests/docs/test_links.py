"""The README and docs/ stay short and connected: every relative link opens, every file they name exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
README_LIMIT = 10_000

_FENCE = re.compile(r"^(```|~~~)")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^()\s]+)\)")
_CODE_SPAN = re.compile(r"`([^`]+)`")
# A repo path written in a code span: these must exist (examples such as `our-log.toml` have no folder).
_REPO_PATH = re.compile(r"^(?:tests|bench|specdec_core|data|pages|docs)/[\w./-]*\.(?:py|md|toml|json|gz|png)$")
_PACKAGES = {p.name for p in (REPO / "specdec_core").iterdir() if p.is_dir() and (p / "__init__.py").exists()}


def prose_lines(path: Path) -> list[str]:
    """The lines outside fenced code blocks (a `# comment` in a shell block is no heading)."""
    lines, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens, repeats numbered."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose_lines(path):
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def relative_links(path: Path) -> list[str]:
    targets = []
    for line in prose_lines(path):
        for target in _LINK.findall(line):
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: are not ours to check
                targets.append(target)
    return targets


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_opens_a_file_and_its_heading(page: Path) -> None:
    broken = []
    for target in relative_links(page):
        file_part, _, anchor = target.partition("#")
        linked = (page.parent / file_part).resolve() if file_part else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and anchor not in anchors(linked):
            broken.append(f"{target}: no heading with that anchor in {linked.name}")
    assert broken == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_repo_path_named_in_code_exists(page: Path) -> None:
    missing = []
    for line in prose_lines(page):
        for span in _CODE_SPAN.findall(line):
            first = span.split("/", 1)[0]
            candidate = f"specdec_core/{span}" if first in _PACKAGES else span
            if _REPO_PATH.match(candidate) and not (REPO / candidate).exists():
                missing.append(span)
    assert missing == []


def test_the_readme_stays_short() -> None:
    assert (REPO / "README.md").stat().st_size <= README_LIMIT


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {(REPO / t.partition("#")[0]).resolve() for t in relative_links(REPO / "README.md")}
    unlinked = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert unlinked == []


def test_the_anchor_rule_matches_githubs() -> None:
    page = REPO / "docs" / "store.md"
    assert "one-store-for-several-machines-ducklake" in anchors(page)
    assert "on-the-ingest-host-beside-the-services-logs" not in anchors(page)  # a comment in a code block
    assert "bench_keyspy" in anchors(REPO / "docs" / "benchmarks.md")
