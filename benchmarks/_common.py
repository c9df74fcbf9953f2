"""Shared by the benchmark scripts: run ``servemon sim`` as a subprocess."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVEMON = Path(sys.executable).parent / "servemon"


def _refuse_bare_parts() -> None:
    """Refuse ``import loadgen`` and its kind in a benchmark, as in the tests: in a
    checkout it would load a second copy of each module (tests/support/oneroot.py,
    loaded by its path: the benchmarks do not put the root on ``sys.path``)."""
    path = ROOT / "tests" / "support" / "oneroot.py"
    spec = importlib.util.spec_from_file_location("_servemon_oneroot", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.install()


_refuse_bare_parts()


@contextlib.contextmanager
def sim_process(*args: str, cpu: int | None = None) -> Iterator[str]:
    """Start ``servemon sim --port 0 ARGS`` and yield its base URL."""
    command = [str(SERVEMON), "sim", "--port", "0", *args]
    if cpu is not None:
        command = ["taskset", "-c", str(cpu), *command]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 30
        line = ""
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if "serving" in line or not line:
                break
        match = re.search(r"http://[\d.]+:\d+", line)
        if not match:
            raise RuntimeError(f"servemon sim did not start: {line!r}")
        yield match.group(0)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def pin_self(cpu: int) -> None:
    """Run this process on one CPU, where the machine has more than one."""
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > cpu:
        os.sched_setaffinity(0, {cpu})
