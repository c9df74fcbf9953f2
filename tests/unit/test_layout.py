"""The shape of the code, checked: one import root, no import cycle between modules,
packages that import only downward, and modules of a readable size."""

from __future__ import annotations

import ast
import graphlib
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: The parts keep their top-level folders (DESIGN.md, Layout) and are installed under
#: the one import root, ``servemon``, through the links in ``servemon/``.
PARTS = ("loadgen", "monitor", "dashboards", "simulator")
CLI = "servemon"
PACKAGES = (CLI, *(f"{CLI}.{part}" for part in PARTS))
#: What each package may import besides itself (DESIGN.md, "Layout").
MAY_IMPORT = {
    CLI: set(PACKAGES),
    "servemon.loadgen": {"servemon.monitor"},
    "servemon.dashboards": {"servemon.monitor"},
    "servemon.monitor": set(),
    "servemon.simulator": set(),
}
#: The foundation every package may use: they import nothing of servemon's own
#: (``servemon`` itself: its ``__init__`` holds only the version).
FOUNDATION = {"servemon", "servemon.errors", "servemon.fields"}
#: Modules allowed past MAX_LINES: declarative tables, not logic.
TABLES = {"servemon.monitor.names"}
MAX_LINES = 450


def _package_of(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 and parts[1] in PARTS else CLI


def _modules() -> dict[str, Path]:
    found = {}
    for folder in (CLI, *PARTS):
        prefix = () if folder == CLI else (CLI,)
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if folder == CLI and len(parts) > 1 and parts[1] in PARTS:
                continue  # the links: walked from the part's own folder
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(prefix + parts)] = path
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
        package = _package_of(name)
        for dep in deps:
            other = _package_of(dep)
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


def test_one_import_root() -> None:
    """The wheel installs ``servemon`` only; each part is reached through it."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert project["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"] == [CLI]
    for part in PARTS:
        link = ROOT / CLI / part
        assert link.is_symlink(), link
        assert link.readlink() == Path("..", part), link
    bare = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets = [node.module]
            else:
                continue
            bare += [f"{name}: {t}" for t in targets if t.split(".")[0] in PARTS]
    assert not bare, f"import a part through servemon: {bare}"
