"""What the fleet's tests share: workers with clocks of their own (libfaketime), a
proxy in front of the target that notes when each request reaches it, and the
coordinator's URL from its output."""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from servemon.loadgen.send.arrivals import Arrival, Stage, schedule
from tests.support.rundirs import read_json, read_jsonl

__all__ = [
    "COORDINATOR",
    "FAKETIME_LIB",
    "RecordingProxy",
    "clock_env",
    "sent_one_schedule",
]

#: The line a coordinating load command prints once it takes workers.
COORDINATOR = re.compile(r"workers to join at (https?://\S+)")

FAKETIME_LIB = next(
    (
        path
        for path in (
            Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"),
            Path("/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1"),
            Path("/usr/lib/faketime/libfaketime.so.1"),
        )
        if path.exists()
    ),
    None,
)


def clock_env(offset_s: float, drift: float | None = None) -> dict[str, str]:
    """The environment that sets a process's wall clock ``offset_s`` off (and
    running ``drift`` times as fast); its monotonic clock stays the machine's, as
    the kernel's timers (which libfaketime does not move) need. Empty without
    libfaketime (Debian's ``faketime``)."""
    if FAKETIME_LIB is None or shutil.which("faketime") is None:
        return {}
    spec = f"{offset_s:+.3f}" + ("" if drift is None else f" x{drift}")
    return {
        "LD_PRELOAD": str(FAKETIME_LIB),
        "FAKETIME": spec,
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_NO_CACHE": "1",
    }


class RecordingProxy:
    """A reverse proxy on 127.0.0.1 that passes every request on to ``target`` and
    notes the monotonic time it arrived: when the target saw load, seen from the
    target's side. It runs its own event loop in a thread, so that a test can wait
    on processes meanwhile."""

    def __init__(self, target: str) -> None:
        self.target = target.rstrip("/")
        self.arrivals: list[float] = []
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RecordingProxy:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the recording proxy did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def last_arrival(self) -> float | None:
        return self.arrivals[-1] if self.arrivals else None

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._start())
        self._ready.set()
        self._loop.run_forever()
        with contextlib.suppress(Exception):
            self._loop.run_until_complete(self._runner.cleanup())
        with contextlib.suppress(Exception):
            self._loop.run_until_complete(self._session.close())
        self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        self._loop.close()  # else its self-pipe is an unclosed socket at exit

    async def _start(self) -> None:
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=60), trust_env=False
        )
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._pass)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.2)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"

    async def _pass(self, request: web.Request) -> web.StreamResponse:
        if request.path.endswith("/completions"):
            self.arrivals.append(time.monotonic())
        body = await request.read()
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower() in ("content-type", "authorization", "accept")
        }
        async with self._session.request(
            request.method,
            self.target + request.path_qs,
            data=body or None,
            headers=headers,
        ) as upstream:
            response = web.StreamResponse(status=upstream.status)
            response.content_type = upstream.content_type
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response


def sent_one_schedule(
    run: Path, stages: Sequence[tuple[float, float]], seed: int
) -> list[dict[str, Any]]:
    """Assert that a fleet's run sent the schedule one process draws for ``stages``
    ((rate, seconds) each) and ``seed``: every scheduled time, in the coordinator's
    frame, within 1 us of it, each one ok. Its ``requests.jsonl`` records."""
    info = read_json(run / "run.json")
    records = read_jsonl(run / "requests.jsonl")
    plan, offset = [], 0.0
    for index, (rate, secs) in enumerate(stages):
        plan.append(Stage(index, rate, secs, offset))
        offset += secs
    expected = [due.offset_s for due in schedule(plan, Arrival(), seed)]
    start = info["clock_origin"]["monotonic_s"] + info["stages"][0]["start_s"]
    sent = sorted(r["scheduled_s"] - start for r in records)
    assert len(sent) == len(expected)
    assert max(abs(a - b) for a, b in zip(sent, expected, strict=True)) < 1e-6
    assert {r["outcome"] for r in records} == {"ok"}
    return records
