"""The documents hold together: every relative link lands; the headline page is short.

``benchmarks/RESULTS.md`` is a screen of headlines that links one page per topic under
``benchmarks/results/``; the runs themselves live there. A link is checked for its file
and, where it names one, for a heading with that anchor (GitHub's spelling of it).
docs/architecture.md names every module of the packages, and only modules that exist.
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


#: docs/architecture.md names modules under headings that name their folders; a
#: folder's modules are looked for in its section (``commands/`` in ``servemon/``'s).
_ARCH_HEADING = re.compile(r"^#{3,4} `([\w/]+)/`")
PACKAGE_FOLDERS = ("servemon", "core", "monitor", "loadgen", "dashboards", "simulator")
_PY = re.compile(r"`([\w./]+\.py)`")


def architecture_sections() -> dict[str, str]:
    """Each package folder's section of docs/architecture.md, by folder."""
    sections: dict[str, str] = {}
    folder = None
    for line in prose(ROOT / "docs" / "architecture.md"):
        if m := _ARCH_HEADING.match(line):
            folder = m.group(1)
            sections[folder] = ""
        elif line.startswith("#"):
            folder = None
        elif folder is not None:
            sections[folder] += line + "\n"
    return sections


def package_modules() -> list[Path]:
    found = []
    for name in PACKAGE_FOLDERS:
        top = ROOT / name
        pattern = "*.py" if name in ("servemon", "dashboards") else "**/*.py"
        found += [p for p in top.glob(pattern) if p.name != "__init__.py"]
    found += (ROOT / "servemon" / "commands").glob("*.py")
    return sorted(p for p in found if p.name != "__init__.py")


def test_architecture_names_every_module() -> None:
    """In its folder's section, or in another's by a path from there (``../x.py``)."""
    sections = architecture_sections()
    named = {
        (ROOT / folder / name).resolve()
        for folder, text in sections.items()
        for name in _PY.findall(text)
        if "/" in name
    }
    missing = []
    for path in package_modules():
        folder = path.parent.relative_to(ROOT).as_posix()
        home = "servemon" if folder == "servemon/commands" else folder
        names = {m.split("/")[-1] for m in _PY.findall(sections.get(home, ""))}
        if path.name not in names and path.resolve() not in named:
            missing.append(path.relative_to(ROOT).as_posix())
    assert not missing, "\n".join(missing)


def test_every_module_architecture_names_exists() -> None:
    missing = []
    for folder, text in architecture_sections().items():
        for name in _PY.findall(text):
            package = ROOT / folder.split("/")[0]
            places = [ROOT / folder / name, ROOT / name, package / name]
            if "/" not in name:  # a bare name: a module of that name in the package
                places += package.glob(f"**/{name}")
            if not any(p.resolve().is_file() for p in places):
                missing.append(f"{folder}/: {name}")
    assert not missing, "\n".join(missing)


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
