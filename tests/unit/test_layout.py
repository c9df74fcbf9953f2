"""The shape of the code, checked: one import root, no import cycle between modules,
packages that import only downward, and modules of a readable size."""

from __future__ import annotations

import ast
import graphlib
import inspect
import subprocess
import sys
import tomllib
import typing
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: The parts keep their top-level folders (DESIGN.md, Layout) and are installed under
#: the one import root, ``servemon``, through the links in ``servemon/``.
PARTS = ("core", "loadgen", "monitor", "dashboards", "simulator")
CLI = "servemon"
CORE, WIRE = "servemon.core", "servemon.core.wire"
MONITOR, SIMULATOR, DASHBOARDS = (
    "servemon.monitor",
    "servemon.simulator",
    "servemon.dashboards",
)
LOADGEN = "servemon.loadgen"
SEND, WORKLOADS, RECORD = f"{LOADGEN}.send", f"{LOADGEN}.workloads", f"{LOADGEN}.record"
RUN, DRIVERS, REPORTS = f"{LOADGEN}.run", f"{LOADGEN}.drivers", f"{LOADGEN}.reports"
FLEET = f"{LOADGEN}.fleet"
#: The control family, a sub-wing of the drivers: it stands on what drivers share.
CONTROL = f"{DRIVERS}.control"
#: The floors, bottom up: what each package may import besides itself. Nothing is
#: left out and nothing is excepted; a module belongs to the deepest package that
#: holds it (``servemon.loadgen`` itself: ``runner``, the top of the load generator).
MAY_IMPORT: dict[str, set[str]] = {
    CORE: set(),
    WIRE: {CORE},
    SIMULATOR: {CORE},
    DASHBOARDS: {CORE},
    MONITOR: {CORE, WIRE},
    SEND: {CORE, WIRE},
    WORKLOADS: {CORE, WIRE},
    RECORD: {CORE, WIRE, SEND},
    RUN: {CORE, WIRE, MONITOR, SEND, WORKLOADS, RECORD},
    DRIVERS: {CORE, WIRE, MONITOR, SEND, WORKLOADS, RECORD, RUN},
    CONTROL: {CORE, WIRE, MONITOR, SEND, WORKLOADS, RECORD, RUN, DRIVERS},
    REPORTS: {CORE, WIRE, MONITOR, SEND, RECORD, RUN},
    FLEET: {CORE, WIRE, SEND, RECORD, RUN},
    LOADGEN: {
        *(CORE, WIRE, MONITOR, SEND, WORKLOADS, RECORD, RUN, DRIVERS, REPORTS),
        *(CONTROL, FLEET),
    },
}
MAY_IMPORT[CLI] = set(MAY_IMPORT)
#: Deepest first, so that a module finds its own package.
PACKAGES = sorted(MAY_IMPORT, key=lambda name: name.count("."), reverse=True)
#: Modules allowed past MAX_LINES: declarative tables, not logic.
TABLES = {"servemon.core.names"}
MAX_LINES = 450


def _package_of(module: str) -> str:
    return next(p for p in PACKAGES if module == p or module.startswith(p + "."))


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
            if other == package or other in MAY_IMPORT[package]:
                continue
            wrong.append(f"{name} imports {dep}")
    assert not wrong, wrong


def test_every_package_is_a_floor() -> None:
    """Each folder with modules is one of the floors above, and each floor a folder."""
    folders = {name for name, path in MODULES.items() if path.name == "__init__.py"}
    assert folders - {f"{CLI}.commands"} == set(MAY_IMPORT), folders ^ set(MAY_IMPORT)


def test_modules_stay_readable() -> None:
    long = {
        name: n
        for name, path in MODULES.items()
        if name not in TABLES
        and (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines: {long}"


#: Where a run is put together, a function a reader can follow in one screen.
RUNNER = (RUN, f"{LOADGEN}.runner")
MAX_FUNCTION_LINES = 80


def test_the_runs_functions_stay_readable() -> None:
    """No function of ``loadgen/run/`` or ``loadgen/runner.py`` is over
    :data:`MAX_FUNCTION_LINES` lines, its signature and docstring included."""
    long = {
        f"{name}.{node.name}": n
        for name, path in MODULES.items()
        if name.startswith(RUNNER)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and (n := (node.end_lineno or node.lineno) - node.lineno + 1)
        > MAX_FUNCTION_LINES
    }
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def _repository_code() -> list[Path]:
    """Every Python file the repository runs: the package (each part through its
    own folder), the tests, the benchmarks and the scripts (``scripts/gen-k8s`` is
    Python without the suffix: told by its first line)."""
    found = list(MODULES.values())
    for folder in ("tests", "benchmarks"):
        found += sorted((ROOT / folder).rglob("*.py"))
    for path in sorted((ROOT / "scripts").iterdir()):
        if not path.is_file():  # __pycache__, where a script was imported
            continue
        with path.open("rb") as file:
            first = file.readline()
        if path.suffix == ".py" or (first.startswith(b"#!") and b"python" in first):
            found.append(path)
    return found


def test_one_import_root() -> None:
    """The wheel installs ``servemon`` only; each part is reached through it, in
    every file of the repository, not only in the package."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert project["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"] == [CLI]
    for part in PARTS:
        link = ROOT / CLI / part
        assert link.is_symlink(), link
        assert link.readlink() == Path("..", part), link
    bare = []
    for path in _repository_code():
        name = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets = [node.module]
            else:
                continue
            bare += [f"{name}: {t}" for t in targets if t.split(".")[0] in PARTS]
    assert not bare, f"import a part through servemon: {bare}"


def test_benchmarks_refuse_a_bare_part() -> None:
    """A benchmark refuses ``import loadgen`` as the tests do (benchmarks/_common.py
    installs tests/support/oneroot.py), though the root is on its path."""
    refused = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; sys.path[:0] = ['benchmarks', '.']; import _common; "
            f"import {PARTS[1]}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert refused.returncode == 1
    assert f"import servemon.{PARTS[1]}, not {PARTS[1]}" in refused.stderr


def test_drivers_get_the_parts_of_a_run_not_the_run() -> None:
    """A driver is handed a ``Drive`` (the settings, the sender and its hooks, the
    server's signals and their ``SignalSource``, the board of its stages) and puts
    what it finds in its ``Driven``; the runner's ``RunContext`` (the run
    directory, the live metrics, the tally, the guard rail) is not for a driver to
    reach into."""
    from servemon.loadgen.runner import DRIVERS as drivers

    wrong = []
    for name, path in MODULES.items():
        if not name.startswith(DRIVERS + "."):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == f"{RUN}.context":
                wrong += [
                    f"{name} imports {alias.name}"
                    for alias in node.names
                    if alias.name not in {"Drive", "Driven", "SignalSource"}
                ]
    assert not wrong, wrong
    for kind, driver in drivers.items():
        hints = typing.get_type_hints(driver.drive)
        assert list(inspect.signature(driver.drive).parameters) == ["run", "found"]
        assert typing.get_origin(hints["run"]).__name__ == "Drive", kind
        # It reads its own settings, not the run's LoadConfig.
        assert typing.get_args(hints["run"]) == (driver.settings,), kind


def test_no_driver_imports_another_driver() -> None:
    """A driver (a module of drivers/ that defines a ``drive_*``) stands on the run's
    machinery and the drivers' shared parts (``openloop``, ``conversation``), never
    on another driver: what two drivers share moves out of both."""
    drivers = {
        name
        for name, path in MODULES.items()
        if name.startswith(DRIVERS + ".")
        and any(
            isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.name.startswith("drive_")
            for node in ast.parse(path.read_text(encoding="utf-8")).body
        )
    }
    assert len(drivers) == 5, drivers
    wrong = [
        f"{name} imports {dep}" for name in drivers for dep in GRAPH[name] & drivers
    ]
    assert not wrong, wrong
