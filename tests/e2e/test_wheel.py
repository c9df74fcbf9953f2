"""The built wheel, installed as a user installs it, beside another project that owns
the name ``simulator``: servemon installs one import root and touches nothing else.

The environment is a fresh virtual environment that holds only the two wheels. The
third-party libraries servemon needs are lent to it read-only by a path entry to this
interpreter's site-packages (installing them afresh would cost a minute of the suite,
and they are not what is tested); that entry is a plain path, so the editable install
of the checkout that lives there is not processed and the checkout stays out of reach.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
#: What the other project's package says about itself, checked after servemon lands.
OTHER = '"""Another project\'s simulator: not servemon\'s."""\n\nOWNER = "other"\n'


def _run(*argv: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, (argv, done.stdout[-2000:], done.stderr[-2000:])
    return done.stdout


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
    pip = (sys.executable, "-m", "pip", "--disable-pip-version-check")
    _run(*pip, "wheel", "--quiet", "--no-deps", "-w", wheels, ROOT, cwd=tmp_path)
    other = _other_project(tmp_path / "other")
    _run(*pip, "wheel", "--quiet", "--no-deps", "-w", wheels, other, cwd=tmp_path)
    (servemon_wheel,) = wheels.glob("servemon-*.whl")
    (other_wheel,) = wheels.glob("simulator-*.whl")

    env_dir = tmp_path / "env"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    site = Path(
        _run(
            python,
            "-c",
            "import sysconfig; print(sysconfig.get_path('purelib'))",
            cwd=tmp_path,
        ).strip()
    )
    lent = Path(sysconfig.get_path("purelib"))
    (site / "zz_lent_dependencies.pth").write_text(f"{lent}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
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
