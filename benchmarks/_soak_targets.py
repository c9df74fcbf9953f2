"""Fake vLLM targets for a soak: full expositions that restart, change shape and flap.

``--targets`` servers of :class:`_vllm_exposition.VllmExposition` (``--ranks``
data-parallel ranks each), one port each, from one process (pinned with ``--cpu``),
plus a control port that the soak benchmark calls to make things happen to a target:

- ``POST /restart/I?down=S``: target I goes away as a restarted server does (its
  listening socket and every open connection closed, so the exporter's kept-alive
  connections are reset), stays away for S seconds (connection refused), then
  listens on the same port again with a new exposition whose counters start at 0;
- ``POST /shape/I``: target I's exposition changes shape: a new model name
  (every series gets a new ``model_name`` value), or, every other time, one more
  or one fewer data-parallel rank (a new ``engine`` label value appears or goes);
- ``POST /flap/I?mode=503|hang&seconds=S``: for S seconds ``/metrics`` answers
  503 with an HTML page (``503``) or accepts and never answers (``hang``: it
  answers nothing until the exporter gives up), then is well again.

Each target's next exposition is built when the process is idle, as in
``_vllm_exposition.py``. Prints ``serving CONTROL_URL URL URL ...`` once all
listen, and runs until SIGTERM.

    python benchmarks/_soak_targets.py --targets 8 [--ranks 4] [--cpu 0]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import time

from _vllm_exposition import MODEL, VllmExposition
from aiohttp import web

HEADERS = {"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
HTML_503 = (
    "<html><head><title>503 Service Temporarily Unavailable</title></head>"
    "<body><center><h1>503 Service Temporarily Unavailable</h1></center></body></html>"
)
SHAPE_HISTORY = 100  # requests already finished per rank on a changed exposition


class _Target:
    def __init__(self, index: int, host: str, ranks: int, wake: asyncio.Event) -> None:
        self.index = index
        self.host = host
        self.port = 0
        self.ranks = ranks
        self.model = MODEL
        self.generation = 0
        self.shapes = 0
        self.exposition = VllmExposition(ranks, seed=index)
        self.stale = False
        self.flap_mode = ""
        self.flap_until = 0.0
        self.runner: web.AppRunner | None = None
        self._wake = wake

    def _app(self) -> web.Application:
        async def metrics(request: web.Request) -> web.StreamResponse:
            if time.monotonic() < self.flap_until:
                if self.flap_mode == "503":
                    return web.Response(
                        status=503, text=HTML_503, content_type="text/html"
                    )
                # hang: answer nothing until the caller gives up (bounded).
                await asyncio.sleep(self.flap_until - time.monotonic() + 30)
            self.stale = True
            self._wake.set()
            return web.Response(body=self.exposition.body, headers=HEADERS)

        async def health(request: web.Request) -> web.Response:
            return web.Response()

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/health", health)
        return app

    async def start(self) -> str:
        self.runner = web.AppRunner(self._app(), access_log=None, shutdown_timeout=0.1)
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.host, self.port, reuse_address=True)
        await site.start()
        self.port = self.runner.addresses[0][1]
        return f"http://{self.host}:{self.port}"

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    async def restart(self, down_s: float) -> None:
        await self.stop()
        await asyncio.sleep(down_s)
        self.generation += 1
        seed = 1000 * self.generation + self.index
        self.exposition = VllmExposition(self.ranks, seed, self.model, history=0)
        await self.start()

    def change_shape(self) -> str:
        self.shapes += 1
        if self.shapes % 2:
            self.model = f"{MODEL}-v{self.shapes}"
            what = f"model {self.model}"
        else:
            self.ranks = self.ranks + 1 if self.ranks % 2 == 0 else self.ranks - 1
            what = f"{self.ranks} ranks"
        seed = 1000 * self.generation + 100 * self.shapes + self.index
        self.exposition = VllmExposition(
            self.ranks, seed, self.model, history=SHAPE_HISTORY
        )
        return what


async def serve(host: str, targets: int, ranks: int) -> None:
    wake = asyncio.Event()
    state = [_Target(i, host, ranks, wake) for i in range(targets)]
    urls = [await t.start() for t in state]
    tasks: set[asyncio.Task[None]] = set()

    async def restart(request: web.Request) -> web.Response:
        target = state[int(request.match_info["i"])]
        task = asyncio.create_task(target.restart(float(request.query.get("down", 2))))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        return web.json_response({"target": target.index, "restart": True})

    async def shape(request: web.Request) -> web.Response:
        target = state[int(request.match_info["i"])]
        return web.json_response(
            {"target": target.index, "shape": target.change_shape()}
        )

    async def flap(request: web.Request) -> web.Response:
        target = state[int(request.match_info["i"])]
        target.flap_mode = request.query.get("mode", "503")
        target.flap_until = time.monotonic() + float(request.query.get("seconds", 4))
        return web.json_response({"target": target.index, "flap": target.flap_mode})

    control = web.Application()
    control.router.add_post("/restart/{i}", restart)
    control.router.add_post("/shape/{i}", shape)
    control.router.add_post("/flap/{i}", flap)
    control_runner = web.AppRunner(control, access_log=None)
    await control_runner.setup()
    await web.TCPSite(control_runner, host, 0).start()
    control_url = "http://{}:{}".format(*control_runner.addresses[0][:2])

    async def refresh() -> None:
        """Builds the next expositions once requests have stopped for 2 ms."""
        while True:
            await wake.wait()
            wake.clear()
            with contextlib.suppress(TimeoutError):
                while True:
                    async with asyncio.timeout(0.002):
                        await wake.wait()
                    wake.clear()
            for target in state:
                if target.stale:
                    target.stale = False
                    target.exposition.advance()
                    await asyncio.sleep(0)

    print("serving " + " ".join([control_url, *urls]), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    refresher = asyncio.create_task(refresh())
    try:
        await stop.wait()
    finally:
        refresher.cancel()
        for task in list(tasks):
            task.cancel()
        await control_runner.cleanup()
        for target in state:
            await target.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--targets", type=int, default=8)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--cpu", type=int, help="pin this process to one CPU")
    args = parser.parse_args()
    pin = args.cpu is not None and hasattr(os, "sched_setaffinity")
    if pin and (os.cpu_count() or 1) > args.cpu:
        os.sched_setaffinity(0, {args.cpu})
    asyncio.run(serve(args.host, args.targets, args.ranks))


if __name__ == "__main__":
    main()
