"""Every relative link in README.md, docs/*.md and model/README.md names a file that exists, and its #anchor a heading
of that page; a page named in prose (`see tuner.md`) is one of the repository's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "model" / "README.md"]
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"#{1,6}\s+(.*)")
# A page named in prose, as docs name each other: "docs/tuner.md", "(store.md)".
PAGE_NAME = re.compile(r"(?<![\w/.-])((?:[\w-]+/)*[\w-]+\.md)\b")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but - and _ dropped, spaces as -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    counts: dict[str, int] = {}
    fenced = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        m = None if fenced else HEADING.match(line)
        if m:
            s = slug(m.group(1))
            found.add(s if s not in counts else f"{s}-{counts[s]}")
            counts[s] = counts.get(s, 0) + 1
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page):
    missing = []
    for target in LINK.findall(page.read_text()):
        path, _, fragment = target.partition("#")
        if re.match(r"[a-z]+:", path):
            continue
        linked = page.parent / path if path else page
        if path and not linked.exists():
            missing.append(target)
        elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
            missing.append(target)
    assert not missing, f"{page.relative_to(REPO)} links to missing files or anchors: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_pages_named_in_prose_exist(page):
    """A page named without a link is the repository's too: not a note kept outside it (paper.md, jetson-orin.md)."""
    missing = sorted({name for name in PAGE_NAME.findall(page.read_text())
                      if not any((base / name).exists() for base in (page.parent, REPO, REPO / "docs"))
                      and not any(not any(part.startswith(".") for part in found.relative_to(REPO).parts)
                                  for found in REPO.glob(f"**/{name}"))})
    assert not missing, f"{page.relative_to(REPO)} names pages the repository does not have: {missing}"
