"""Fixtures for the console script run as a user runs it: ``python -m servemon ...``
in its own session, output to files, and everything it started cleaned up.

Processes are found through ``/proc`` (Linux): a child is remembered with its start
time, so that cleanup never signals a process that merely reused its id.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

SERVEMON = [sys.executable, "-m", "servemon"]
#: The commands that end a run with ``report.html``: the fixture asks them for none
#: (``--no-report``) unless the test is marked ``report`` (the plots cost a short
#: run about 1.5 s of CPU, some 100 s of the suite's on 2 cores; docs/testing.md).
LOAD_COMMANDS = frozenset({"ramp", "sweep", "replay", "capacity", "control"})

#: (pid, start time in clock ticks since boot): one process, whatever reuses its id.
ProcId = tuple[int, int]


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name, or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def is_running(proc: ProcId) -> bool:
    """Whether that process still exists and is not a zombie."""
    fields = _stat(proc[0])
    return fields is not None and fields[0] != "Z" and int(fields[19]) == proc[1]


def children_of(pid: int) -> list[ProcId]:
    """The running processes whose parent is ``pid``."""
    found: list[ProcId] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat(int(entry.name))
        if fields is not None and fields[0] != "Z" and int(fields[1]) == pid:
            found.append((int(entry.name), int(fields[19])))
    return found


class ServemonProcess:
    """One ``python -m servemon ARGS`` process; stdout and stderr go to files."""

    def __init__(
        self,
        args: tuple[str, ...],
        workdir: Path,
        env: Mapping[str, str],
        *,
        own_session: bool = True,
    ) -> None:
        n = len(list(workdir.glob("servemon-*.stdout")))
        self.stdout_path = workdir / f"servemon-{n}.stdout"
        self.stderr_path = workdir / f"servemon-{n}.stderr"
        with (
            self.stdout_path.open("wb") as out,
            self.stderr_path.open("wb") as err,
        ):
            self.proc = subprocess.Popen(
                [*SERVEMON, *args],
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                cwd=workdir,
                env=dict(env),
                # Its own process group, as a shell job, and its own session unless
                # told (see ``servemon``).
                start_new_session=own_session,
                process_group=None if own_session else 0,
            )
        self.pid = self.proc.pid
        self._seen: set[ProcId] = set()

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text(encoding="utf-8", errors="replace")

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")

    def children(self) -> list[ProcId]:
        """Its running children now (remembered for cleanup)."""
        found = children_of(self.pid) if self.proc.poll() is None else []
        self._seen.update(found)
        return found

    def wait(self, timeout: float) -> int:
        """Its exit code; fails the test if it runs past ``timeout`` seconds."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"servemon still running after {timeout} s; stderr: {self.stderr}"
            )

    def close(self) -> None:
        """Kill it and everything it started that is still there."""
        self.children()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait(timeout=10)
        for proc in self._seen:
            if is_running(proc):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc[0], signal.SIGKILL)


@pytest.fixture
def servemon(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., ServemonProcess]]:
    """``servemon("ramp", "--stages", "1:1", env={...})`` starts the console script
    in ``tmp_path``; ``env`` is added to this process's environment. Every process
    started, and every child of it seen, is killed when the test ends. A load
    command writes ``report.html`` only in a test marked ``report``.

    Each runs in a session of its own, except in the real vLLM's tests
    (``-m vllm``), where it stays in pytest's session, as that vLLM does
    (``tests/e2e/engines/conftest.py``): Linux shares the CPU between sessions
    first (autogroups) and between the processes of a session second, and on two cores
    the vLLM CPU build then starved: with the engine and servemon in two sessions,
    ``control --hold waiting=96`` saw vLLM's queue pass 300 at 2 req/s and the
    client's loop stall for 4-21 s (8 runs of 8); in one session, 93-100 % of ticks
    within +-15 % (3 of 3; docs/testing.md)."""
    if not Path("/proc/self/stat").exists():
        pytest.skip("needs /proc (Linux)")
    started: list[ServemonProcess] = []
    own_session = request.node.get_closest_marker("vllm") is None
    reports = request.node.get_closest_marker("report") is not None

    def start(*args: str, env: Mapping[str, str] | None = None) -> ServemonProcess:
        if args and args[0] in LOAD_COMMANDS and not reports:
            args = (args[0], "--no-report", *args[1:])
        proc = ServemonProcess(
            args, tmp_path, {**os.environ, **(env or {})}, own_session=own_session
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.close()


@pytest.fixture
def process_running() -> Callable[[ProcId], bool]:
    """``process_running((pid, start_time))``: alive and not a zombie."""
    return is_running
