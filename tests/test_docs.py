"""The README stays a two-minute read and every relative link of the README and docs/ resolves (file and anchor)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation other than ``-`` and ``_`` dropped, spaces to ``-``."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def prose(text: str) -> str:
    """``text`` without its fenced code blocks and inline code spans (links there are not links)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def anchors(path: Path) -> set[str]:
    """Every heading anchor of ``path``, duplicates numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    out = set()
    for line in re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M).split("\n"):
        m = re.match(r"#{1,6} (.*)", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def test_slug_matches_githubs():
    assert slug("Precision (`--ds.mixed_precision auto|bf16|off`)") == "precision---dsmixed_precision-autobf16off"
    assert slug("The held-out check: draw 9001 (issue 32, item 4)") == "the-held-out-check-draw-9001-issue-32-item-4"


def test_every_relative_link_resolves_to_a_file_and_anchor():
    broken = []
    for page in PAGES:
        for target in LINK.findall(prose(page.read_text())):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            if not dest.exists():
                broken.append(f"{page.relative_to(REPO)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_readme_is_a_two_minute_read():
    lines = (REPO / "README.md").read_text().split("\n")
    assert len(lines) <= 120, len(lines)
    for section in ("## The main job", "## The tests", "## Advantage estimators", "## Current results", "## Docs"):
        assert section in lines, section
