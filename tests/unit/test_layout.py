"""The shape of the code, checked: no import cycle between modules, packages that
import only downward, and modules of a readable size."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("servemon", "loadgen", "monitor", "dashboards", "simulator")
#: What each package may import besides itself (DESIGN.md, "Layout").
MAY_IMPORT = {
    "servemon": set(PACKAGES),
    "loadgen": {"monitor"},
    "dashboards": {"monitor"},
    "monitor": set(),
    "simulator": set(),
}
#: The foundation every package may use: they import nothing of servemon's own
#: (``servemon`` itself: its ``__init__`` holds only the version).
FOUNDATION = {"servemon", "servemon.errors", "servemon.fields"}
#: Modules allowed past MAX_LINES: declarative tables, not logic.
TABLES = {"monitor.names"}
MAX_LINES = 450


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Every project module ``name`` imports, anywhere in it (a lazy import inside a
    function or under TYPE_CHECKING still ties the two together)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        out |= {t for t in targets if t in MODULES and t != name}
    return out


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def test_no_import_cycle() -> None:
    # A package's __init__ re-exporting its modules is not a cycle of theirs.
    graph = {
        name: {d for d in deps if not name.startswith(d + ".")}
        for name, deps in GRAPH.items()
    }
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        pytest.fail(f"import cycle: {' -> '.join(exc.args[1])}")


def test_packages_import_only_downward() -> None:
    wrong = []
    for name, deps in GRAPH.items():
        package = name.split(".")[0]
        for dep in deps:
            other = dep.split(".")[0]
            if other == package or other in MAY_IMPORT[package] or dep in FOUNDATION:
                continue
            wrong.append(f"{name} imports {dep}")
    assert not wrong, wrong


def test_foundation_imports_nothing_of_its_own() -> None:
    for name in FOUNDATION:
        assert GRAPH[name] <= FOUNDATION, (name, GRAPH[name])


def test_modules_stay_readable() -> None:
    long = {
        name: n
        for name, path in MODULES.items()
        if name not in TABLES
        and (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines: {long}"
