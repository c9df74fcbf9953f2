"""The built-in simulator as a child process, for load commands run without a target.

It runs as its own process (``python -m servemon sim --port 0``) so that it does not
share the load generator's event loop or core.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
from collections.abc import AsyncIterator, Sequence

from servemon.errors import TargetError

__all__ = ["embedded_simulator"]


@contextlib.asynccontextmanager
async def embedded_simulator(
    profile: str, extra_args: Sequence[str] = ()
) -> AsyncIterator[str]:
    """Start ``servemon sim`` on a free loopback port; yield its base URL."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "servemon",
        "sim",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--profile",
        profile,
        "--exit-with-parent",
        *extra_args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        # Its own session: a Ctrl-C in the terminal reaches the load generator,
        # which stops gracefully while the simulator keeps serving the requests in
        # flight; --exit-with-parent ends it should the load generator be killed.
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), timeout=30)
        except TimeoutError:
            line = b""
        match = re.search(rb"http://127\.0\.0\.1:\d+", line)
        if match is None:
            err = b""
            if proc.stderr is not None and proc.returncode is not None:
                err = await proc.stderr.read()
            detail = (err or line).decode(errors="replace").strip().splitlines()
            raise TargetError(
                "the built-in simulator did not start"
                + (f": {detail[-1]}" if detail else "")
            )
        yield match.group(0).decode()
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), timeout=10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
