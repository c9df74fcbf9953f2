"""The built wheel, installed as a user installs it, beside another project that owns
the name ``simulator``: servemon installs one import root and touches nothing else.
And the base install (``pip install servemon``, no extra) is the exporter's: no
matplotlib or scipy, ``servemon exporter`` runs, a load command names its extra.

The environment is a fresh virtual environment that holds only the wheels. The
third-party libraries servemon needs are lent to it read-only by a path entry to this
interpreter's site-packages (installing them afresh would cost a minute of the suite,
and they are not what is tested); that entry is a plain path, so the editable install
of the checkout that lives there is not processed and the checkout stays out of reach.
The base install is lent only the distributions its own requirements reach (links in
a folder of their own), and pip installs the wheel against them with its dependencies
checked, from no index: a base requirement that the exporter lacks fails here.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from servemon.cli import EXTRAS

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
#: What the other project's package says about itself, checked after servemon lands.
OTHER = '"""Another project\'s simulator: not servemon\'s."""\n\nOWNER = "other"\n'


def _run(*argv: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = _try(*argv, cwd=cwd, env=env)
    assert done.returncode == 0, (argv, done.stdout[-2000:], done.stderr[-2000:])
    return done.stdout


def _try(
    *argv: str | Path, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


PIP = (sys.executable, "-m", "pip", "--disable-pip-version-check")
#: The environment of the fresh venv's commands: none of this interpreter's PYTHON*.
ENV = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}


def _wheel(where: Path) -> Path:
    _run(*PIP, "wheel", "--quiet", "--no-deps", "-w", where, ROOT, cwd=where.parent)
    (wheel,) = where.glob("servemon-*.whl")
    return wheel


def _venv(env_dir: Path, lent: Path) -> tuple[Path, Path]:
    """A fresh venv whose site-packages has a path entry to ``lent``: its python
    and its site-packages."""
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    site = Path(
        _run(
            python,
            "-c",
            "import sysconfig; print(sysconfig.get_path('purelib'))",
            cwd=env_dir.parent,
        ).strip()
    )
    (site / "zz_lent_dependencies.pth").write_text(f"{lent}\n")
    return python, site


def _other_project(where: Path) -> Path:
    """A project of its own whose distribution installs a top-level ``simulator``."""
    (where / "simulator").mkdir(parents=True)
    (where / "simulator" / "__init__.py").write_text(OTHER)
    (where / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n'
        '[project]\nname = "simulator"\nversion = "9.9"\n'
        '[tool.hatch.build.targets.wheel]\npackages = ["simulator"]\n'
    )
    return where


def test_the_wheel_installs_one_root_beside_another_simulator(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    servemon_wheel = _wheel(wheels)
    other = _other_project(tmp_path / "other")
    _run(*PIP, "wheel", "--quiet", "--no-deps", "-w", wheels, other, cwd=tmp_path)
    (other_wheel,) = wheels.glob("simulator-*.whl")

    env_dir = tmp_path / "env"
    python, site = _venv(env_dir, Path(sysconfig.get_path("purelib")))
    env = ENV
    install = (python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index")
    _run(*install, other_wheel, cwd=tmp_path, env=env)
    _run(*install, servemon_wheel, cwd=tmp_path, env=env)

    installed = {p.name for p in site.iterdir() if not p.name.endswith(".pth")}
    version = servemon_wheel.name.split("-")[1]
    ours = {name for name in installed if name.startswith("servemon")}
    assert ours == {"servemon", f"servemon-{version}.dist-info"}, installed
    for name in ("monitor", "loadgen", "dashboards"):
        assert name not in installed, installed
    assert (site / "simulator" / "__init__.py").read_text() == OTHER

    where = _run(
        python,
        "-c",
        "import json, simulator, servemon, servemon.simulator.server as s;"
        "print(json.dumps([simulator.OWNER, servemon.__file__, s.__file__]))",
        cwd=tmp_path,
        env=env,
    )
    owner, ours_file, server_file = json.loads(where)
    assert owner == "other"
    assert Path(ours_file).is_relative_to(site), ours_file
    assert Path(server_file).is_relative_to(site / "servemon" / "simulator")

    # The console script runs the main job's parts from the wheel: the built-in
    # simulator as a child process, the load generator, the report.
    out = tmp_path / "runs"
    _run(
        env_dir / "bin" / "servemon",
        "ramp",
        "--sim-profile",
        "tiny",
        "--stages",
        "8:2",
        "--workload",
        "random:prompt=16,output=4",
        "--metrics-port",
        "0",
        "--out",
        out,
        cwd=tmp_path,
        env=env,
    )
    (run_dir,) = [p for p in out.iterdir() if not p.name.startswith(".")]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["overall"]["outcomes"].get("ok", 0) > 0, summary["overall"]


def _base_closure(wheel: Path) -> set[str]:
    """The distributions the wheel's base requirements reach (no extra), by their
    normalized names, as this interpreter's environment resolves them."""
    pending = [
        Requirement(line)
        for line in _run(
            sys.executable,
            "-c",
            "import sys, zipfile, email;"
            "z = zipfile.ZipFile(sys.argv[1]);"
            "(m,) = [n for n in z.namelist() if n.endswith('.dist-info/METADATA')];"
            "print(*email.message_from_bytes(z.read(m)).get_all('Requires-Dist'),"
            " sep='\\n')",
            wheel,
            cwd=wheel.parent,
        ).splitlines()
    ]
    found: set[str] = set()
    while pending:
        requirement = pending.pop()
        if requirement.marker is not None and not requirement.marker.evaluate(
            {"extra": ""}
        ):
            continue
        name = requirement.name.lower().replace("_", "-")
        if name in found:
            continue
        found.add(name)
        pending += map(Requirement, importlib.metadata.requires(name) or [])
    return found


def _lend(names: set[str], into: Path) -> Path:
    """A folder of links to the top-level files of the distributions ``names``."""
    into.mkdir()
    for name in names:
        dist = importlib.metadata.distribution(name)
        for top in {f.parts[0] for f in dist.files or () if f.parts[0] != ".."}:
            source = Path(str(dist.locate_file(top)))
            if source.exists() and not (into / top).exists():
                (into / top).symlink_to(source)
    return into


def test_the_base_install_runs_the_exporter_without_the_extras(
    tmp_path: Path,
) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel = _wheel(wheels)
    base = _base_closure(wheel)
    extras = {"matplotlib", "scipy", "grafanalib", "ddsketch", "numpy", "rich"}
    assert set().union(*map(set, EXTRAS.values())) == extras
    assert not base & extras, base & extras
    python, _ = _venv(tmp_path / "env", _lend(base, tmp_path / "lent"))
    # Dependencies checked (no --no-deps) against the lent ones only: no index.
    install = (python, "-m", "pip", "install", "--quiet", "--no-index", wheel)
    _run(*install, cwd=tmp_path, env=ENV)

    absent = _run(
        python,
        "-c",
        "import importlib.metadata as m, importlib.util as u, sys\n"
        "for name in sys.argv[1:]:\n"
        "    try:\n"
        "        m.distribution(name)\n"
        "    except m.PackageNotFoundError:\n"
        "        if u.find_spec(name) is None:\n"
        "            print(name)\n",
        *sorted(extras),
        cwd=tmp_path,
        env=ENV,
    )
    assert set(absent.split()) == extras

    # Every module of the exporter's parts imports without the extras.
    _run(
        python,
        "-c",
        "import importlib, pkgutil, servemon\n"
        "for part in ('core', 'monitor', 'simulator'):\n"
        "    name = f'servemon.{part}'\n"
        "    path = importlib.import_module(name).__path__\n"
        "    for info in pkgutil.walk_packages(path, f'{name}.'):\n"
        "        importlib.import_module(info.name)\n",
        cwd=tmp_path,
        env=ENV,
    )
    servemon = tmp_path / "env" / "bin" / "servemon"
    for args in (["--help"], ["exporter", "--help"], ["sim", "--help"]):
        assert "Usage: servemon" in _run(servemon, *args, cwd=tmp_path, env=ENV)
    for args in (["ramp", "--help"], ["ramp", "--stages", "8:2"]):
        done = _try(servemon, *args, cwd=tmp_path, env=ENV)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        (line,) = done.stderr.splitlines()
        assert line.startswith("servemon: error: servemon ramp needs the loadgen extra")
        assert line.endswith("pip install 'servemon[loadgen]'")
