"""servemon's own servers as child processes: the simulator, the exporter, Prometheus.

Each runs as its own process so that it does not share the load generator's event
loop or core, in its own session (a Ctrl-C in the terminal reaches only the load
generator, which stops gracefully while the servers keep serving the requests in
flight). servemon's children get ``--exit-with-parent`` so that they end should the
parent be killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import socket
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from servemon.core.errors import TargetError

__all__ = [
    "child_process",
    "embedded_exporter",
    "embedded_prometheus",
    "embedded_simulator",
    "free_port",
]

_URL = re.compile(rb"http://127\.0\.0\.1:\d+")


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (for programs that cannot take port 0)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.asynccontextmanager
async def child_process(
    what: str,
    argv: Sequence[str],
    *,
    ready: re.Pattern[bytes] | None = _URL,
    stream: str = "stdout",
    timeout_s: float = 30.0,
) -> AsyncIterator[str]:
    """Start ``argv``; wait for a line matching ``ready`` on ``stream``; yield the
    match (or "" without ``ready``); terminate it on the way out."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    drains: list[asyncio.Task[None]] = []
    try:
        found = ""
        if ready is not None:
            pipe = proc.stdout if stream == "stdout" else proc.stderr
            assert pipe is not None
            found = await _wait_ready(what, proc, pipe, ready, timeout_s)
        # Keep reading what it prints, so that a full pipe never blocks it.
        drains = [
            asyncio.create_task(_drain(p))
            for p in (proc.stdout, proc.stderr)
            if p is not None
        ]
        yield found
    finally:
        for task in drains:
            task.cancel()
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), timeout=10)
            except TimeoutError:
                proc.kill()
                await proc.wait()


async def _drain(pipe: asyncio.StreamReader) -> None:
    while await pipe.read(65536):
        pass


async def _wait_ready(
    what: str,
    proc: asyncio.subprocess.Process,
    pipe: asyncio.StreamReader,
    ready: re.Pattern[bytes],
    timeout_s: float,
) -> str:
    last = b""
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                line = await pipe.readline()
                if not line:
                    break
                last = line
                match = ready.search(line)
                if match is not None:
                    return match.group(0).decode()
    except TimeoutError:
        pass
    detail = last.decode(errors="replace").strip()
    if proc.returncode is not None and proc.stderr is not None and pipe is proc.stdout:
        err = (await proc.stderr.read()).decode(errors="replace").strip().splitlines()
        detail = err[-1] if err else detail
    raise TargetError(f"{what} did not start" + (f": {detail}" if detail else ""))


def _servemon(*args: str) -> list[str]:
    return [sys.executable, "-m", "servemon", *args, "--exit-with-parent"]


@contextlib.asynccontextmanager
async def embedded_simulator(
    profile: str, extra_args: Sequence[str] = ()
) -> AsyncIterator[str]:
    """Start ``servemon sim`` on a free loopback port; yield its base URL."""
    argv = _servemon(
        "sim", "--host", "127.0.0.1", "--port", "0", "--profile", profile, *extra_args
    )
    async with child_process("the built-in simulator", argv) as url:
        yield url


@contextlib.asynccontextmanager
async def embedded_exporter(
    targets: Sequence[str], extra_args: Sequence[str] = ()
) -> AsyncIterator[str]:
    """Start ``servemon exporter`` for ``targets`` on a free port; yield its URL."""
    argv = _servemon(
        "exporter",
        "--listen",
        "127.0.0.1:0",
        *(a for t in targets for a in ("--target", t)),
        *extra_args,
    )
    async with child_process("the exporter", argv) as url:
        yield url


@contextlib.asynccontextmanager
async def embedded_prometheus(
    config: Path, data_dir: Path, port: int
) -> AsyncIterator[str | None]:
    """Start Debian's ``prometheus`` if it is installed; yield its URL, or None."""
    binary = shutil.which("prometheus")
    if binary is None:
        yield None
        return
    argv = [
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={data_dir}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--web.enable-lifecycle",
    ]
    ready = re.compile(rb"Server is ready to receive web requests")
    async with child_process("prometheus", argv, ready=ready, stream="stderr"):
        yield f"http://127.0.0.1:{port}"
