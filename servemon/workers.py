"""``servemon ramp --workers N``: one run's requests sent by N processes of this
machine, the way a fleet of machines sends them (:mod:`servemon.loadgen.fleet`), over
loopback.

When one process cannot keep its dispatch lag low at the rate asked for, this
process coordinates (the schedule, the run directory, the live ``/metrics``) and N
``servemon worker`` children send, each on its own event loop and core. They join
127.0.0.1 with a token made for the run, given in their environment (a command line
is public); the request headers reach them over that connection only. They run in
sessions of their own, so a terminal's Ctrl-C reaches the coordinator alone, which
stops them as a fleet is stopped (the requests in flight get ``--grace``); a
coordinator that dies leaves them without word, and they stop within a second.
Their logs and spools are kept in ``OUT/.workers-STAMP/``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import sys
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from pathlib import Path

from servemon.core.fields import Secret
from servemon.loadgen.fleet.settings import FleetSettings
from servemon.loadgen.fleet.wire import TOKEN_ENV

__all__ = ["local_workers", "worker_argv"]

#: Seconds the workers get to join (they start in a second or two here).
JOIN_S = 60.0


def worker_argv(url: str, index: int, folder: Path) -> Sequence[str]:
    """The command line of local worker ``index``: no token, no header."""
    return (
        sys.executable,
        "-m",
        "servemon",
        "worker",
        "--join",
        url,
        "--name",
        f"local-{index}",
        "--spool",
        str(folder),
    )


@contextlib.asynccontextmanager
async def local_workers(n: int, out: Path) -> AsyncIterator[FleetSettings]:
    """The fleet settings of a run sent by ``n`` worker processes of this machine;
    they are started once the coordinator listens and waited for (then killed)
    when the block ends."""
    folder = out / f".workers-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S-%f')}"
    folder.mkdir(parents=True)
    token = secrets.token_urlsafe(24)
    procs: list[asyncio.subprocess.Process] = []

    async def spawn(url: str) -> None:
        env = {**os.environ, TOKEN_ENV: token}
        for i in range(n):
            with (folder / f"worker-{i}.log").open("wb") as log:
                procs.append(
                    await asyncio.create_subprocess_exec(
                        *worker_argv(url, i, folder),
                        stdin=asyncio.subprocess.DEVNULL,
                        stdout=log,
                        stderr=log,
                        env=env,
                        start_new_session=True,
                    )
                )

    try:
        yield FleetSettings(
            host="127.0.0.1",
            port=0,
            expect=n,
            wait_s=JOIN_S,
            on_loss="abort",
            token=Secret(token),
            spawn=spawn,
        )
    finally:
        waiting = [p.wait() for p in procs if p.returncode is None]
        if waiting:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*waiting), 5.0)
        for proc in procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
