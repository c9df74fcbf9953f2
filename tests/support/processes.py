"""Child processes of an end-to-end stack: started in their own session with output
to a file, polled for their ready line with a deadline, and stopped (a signal, a
wait, then a kill of the whole process group)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

__all__ = [
    "READY_EXPORTER",
    "READY_SIM",
    "SERVEMON",
    "Child",
    "ahead_of_the_suite",
    "logs",
    "read_text",
    "ready_url",
    "servemon_argv",
    "spawn",
    "stop",
    "until",
]

SERVEMON = (sys.executable, "-m", "servemon")
#: The lines ``servemon sim`` and ``servemon exporter`` print once they serve.
READY_SIM = re.compile(r"servemon sim: serving .* on (http://127\.0\.0\.1:\d+)")
READY_EXPORTER = re.compile(r"servemon exporter: serving (http://127\.0\.0\.1:\d+)/")


#: The nice value :func:`ahead_of_the_suite` gives a measuring thread: ten steps
#: ahead of a nice-0 neighbour is about ten times its share of a busy core.
AHEAD_NICE = -10


@contextlib.contextmanager
def ahead_of_the_suite() -> Iterator[None]:
    """The calling thread ahead of the other pytest workers' own threads while it
    runs something timed in this process. Not ahead of what tests start in
    sessions of their own: Linux shares a core between sessions first (autogroups),
    so a test that needs the machine is marked ``alone`` instead. Without root a
    priority cannot be raised: then nothing changes."""
    before = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, AHEAD_NICE)
    except PermissionError:
        yield
        return
    try:
        yield
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, before)


def read_text(path: Path) -> str:
    """A log file's text, whatever bytes it holds."""
    return path.read_text(encoding="utf-8", errors="replace")


@dataclass
class Child:
    """One child process; stdout and stderr go to ``log``."""

    name: str
    proc: asyncio.subprocess.Process
    log: Path

    def tail(self, chars: int = 3000) -> str:
        text = read_text(self.log)
        return f"--- {self.name} (exit {self.proc.returncode}) ---\n{text[-chars:]}"

    def alive(self) -> None:
        """Fail the test if the process has exited."""
        if self.proc.returncode is not None:
            pytest.fail(f"{self.name} exited early\n{self.tail()}")


def logs(children: Sequence[Child]) -> str:
    """The end of every child's output."""
    return "\n".join(child.tail(1500) for child in children)


def servemon_argv(command: str, *args: str) -> list[str]:
    """``python -m servemon COMMAND ARGS``, ending with the parent (pytest)."""
    return [*SERVEMON, command, *args, "--exit-with-parent"]


async def spawn(name: str, argv: Sequence[str], folder: Path) -> Child:
    """Start ``argv`` in its own session, output to ``folder/NAME.log``."""
    log = folder / f"{name}.log"
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
    return Child(name, proc, log)


async def stop(child: Child, sig: int = signal.SIGTERM, timeout_s: float = 10) -> None:
    """Send ``sig``, wait up to ``timeout_s``, then kill its process group (its own
    session: what it started, such as nginx's workers, goes with it)."""
    proc = child.proc
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        try:
            await asyncio.wait_for(proc.wait(), timeout=timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()


async def until(
    check: Callable[[], Awaitable[Any]],
    timeout_s: float,
    what: str,
    *,
    interval_s: float = 0.25,
    explain: Callable[[], Awaitable[str]] | None = None,
) -> Any:
    """Poll ``check`` until it returns something truthy; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = await check()
        except (aiohttp.ClientError, OSError) as exc:
            last = exc
        if last and not isinstance(last, BaseException):
            return last
        await asyncio.sleep(interval_s)
    detail = await explain() if explain is not None else ""
    pytest.fail(f"{what}: not within {timeout_s} s (last: {last!r})\n{detail}")


async def ready_url(child: Child, pattern: re.Pattern[str], timeout_s: float) -> str:
    """The URL ``child`` prints once it serves (``pattern``'s first group)."""

    async def printed() -> str | None:
        child.alive()
        match = pattern.search(read_text(child.log))
        return match.group(1) if match else None

    url: str = await until(printed, timeout_s, f"{child.name} ready line")
    return url
