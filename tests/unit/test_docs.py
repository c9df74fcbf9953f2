"""The documents hold together: every relative link lands; the headline page is short.

``benchmarks/RESULTS.md`` is a screen of headlines that links one page per topic under
``benchmarks/results/``; the runs themselves live there. A link is checked for its file
and, where it names one, for a heading with that anchor (GitHub's spelling of it).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: The headline page's bound: one screen and a little room.
RESULTS_MAX_LINES = 80

_FENCE = re.compile(r"^\s*(```|~~~)")
_CODE = re.compile(r"`+[^`]*`+")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def documents() -> list[Path]:
    return sorted(
        [
            ROOT / "README.md",
            ROOT / "benchmarks" / "RESULTS.md",
            *(ROOT / "docs").glob("*.md"),
            *(ROOT / "benchmarks" / "results").glob("*.md"),
        ]
    )


def prose(path: Path) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation gone, spaces to dashes."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: Counter[str] = Counter()
    found = set()
    for line in prose(path):
        if m := _HEADING.match(line):
            base = slug(m.group(1))
            found.add(f"{base}-{seen[base]}" if seen[base] else base)
            seen[base] += 1
    return found


def links(path: Path) -> list[str]:
    return [
        target
        for line in prose(path)
        for target in _LINK.findall(_CODE.sub("", line))
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target)  # http:, mailto:, ...
    ]


def test_slug_spells_anchors_as_github_does() -> None:
    heading = "Simulator calibration: `qwen3-0.6b-eager` against the course"
    assert slug(heading) == "simulator-calibration-qwen3-06b-eager-against-the-course"
    assert slug("Fleet: one process, 4 workers") == "fleet-one-process-4-workers"


def test_the_headline_page_stays_one_screen() -> None:
    lines = (ROOT / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8")
    assert len(lines.splitlines()) <= RESULTS_MAX_LINES


@pytest.mark.parametrize("path", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_lands(path: Path) -> None:
    broken = []
    for target in links(path):
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no such heading")
    assert broken == []
