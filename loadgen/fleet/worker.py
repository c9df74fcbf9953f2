"""``servemon worker``: a load machine of a fleet. It holds nothing of the run but
where its coordinator is and the shared token; it sends what it is told, when it is
told, to the one target the plan names, and streams back what it measured.

The coordinator's ``plan`` names the target's URL and headers; ``go`` messages carry
credits, each a request (its body, its options) and a time on this worker's own
monotonic clock (the coordinator converts with the offset it measured). Each credit
waits on a precise timer (:class:`~servemon.loadgen.send.dispatch.KernelTimer`) and goes
out at its time; its record goes back in the next batch, on this worker's clock (the
coordinator moves it into its own frame). Every record is also appended to a spool
file on this machine, moved into the coordinator's frame with the offset the
coordinator last told, so that what could not be delivered is kept
(``servemon merge RUN_DIR --spool FILE`` takes it in).

A worker that hears nothing from its coordinator for :data:`SILENCE_S` (its pings
come every quarter second) or loses the connection stops at once: credits not yet
sent are dropped and requests in flight are cancelled, so that no endpoint is left
under a load nobody watches.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

import aiohttp
import orjson

from servemon.core.errors import ServemonError
from servemon.core.fields import Secret
from servemon.core.version import __version__
from servemon.loadgen.fleet.clock import Frame
from servemon.loadgen.fleet.wire import (
    MAX_MESSAGE,
    PATH,
    WireError,
    bearer,
    decode,
    encode,
    recs_message,
)
from servemon.loadgen.record.line import request_line, timing_from_line
from servemon.loadgen.send.client import (
    ClientSettings,
    RequestOptions,
    RequestTags,
    make_session,
    send_request,
)
from servemon.loadgen.send.dispatch import KernelTimer, Pacer
from servemon.loadgen.send.timing import RequestTiming

__all__ = ["LINES_S", "RETRY_S", "SILENCE_S", "WorkerEnd", "run_worker"]

#: Silence from the coordinator after which a worker stops sending.
SILENCE_S = 1.0
#: Seconds between tries to reach a coordinator not there yet (``--join-timeout``).
RETRY_S = 1.0
#: The most records one ``rec`` message carries.
BATCH = 512
#: How long a sliced credit's record waits for others to go back with it (one
#: ``recs`` message per worker every 20 ms, not one a record: the coordinator's
#: cost is per message as much as per record).
LINES_S = 0.02


@dataclass(slots=True)
class WorkerEnd:
    """How a worker's part ended."""

    #: ``stopped`` (the coordinator said so), ``lost`` (the coordinator went
    #: silent or away), ``refused`` (no plan: the token, or a full fleet).
    how: str
    reason: str = ""
    sent: int = 0
    recorded: int = 0
    spool: Path | None = None


@dataclass(slots=True, eq=False)
class _Worker:
    ws: aiohttp.ClientWebSocketResponse
    spool: TextIO | None
    end: WorkerEnd
    heard_s: float = field(default_factory=time.monotonic)
    delta_s: float | None = None
    session: aiohttp.ClientSession | None = None
    url: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 600.0
    #: This worker's index in the fleet (the plan says; its lines carry it).
    index: int | None = None
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    outbox: list[dict[str, object]] = field(default_factory=list)
    #: Records of sliced credits (``due``), as ``requests.jsonl`` lines already
    #: in the coordinator's frame, and how many.
    lines: bytearray = field(default_factory=bytearray)
    counted: int = 0
    first_tokens: list[tuple[str, float]] = field(default_factory=list)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    stopping: bool = False
    sleep_until: Callable[[float], Awaitable[None]] | None = None

    def queue(self, timing: RequestTiming) -> None:
        line = request_line(timing)
        if timing.text is not None:
            line["text"] = timing.text
        self.outbox.append(line)
        self.wake.set()
        if self.spool is not None:  # on the coordinator's clock, as it last said
            moved = timing_from_line(line, shift_s=self.delta_s or 0.0)
            self.spool.write(orjson.dumps(request_line(moved)).decode() + "\n")

    def queue_line(self, timing: RequestTiming, shift_s: float) -> None:
        """A sliced credit's record, moved into the coordinator's frame with the
        offset its credit went out with, as the line the run writes."""
        moved = timing_from_line(request_line(timing), shift_s=shift_s)
        line = request_line(replace(moved, worker=self.index))
        data = orjson.dumps(line) + b"\n"
        if not self.lines:  # the first of a batch: the batch goes in LINES_S
            asyncio.get_running_loop().call_later(LINES_S, self.wake.set)
        self.lines += data
        self.counted += 1
        if self.spool is not None:
            self.spool.write(data.decode())

    async def flush(self) -> None:
        """Send what finishes, in batches, as it finishes."""
        while True:
            await self.wake.wait()
            self.wake.clear()
            await self.send_all()

    async def send_all(self) -> None:
        """Send every record and first token not sent yet."""
        if self.lines:
            lines, count = bytes(self.lines), self.counted
            self.lines.clear()
            self.counted = 0
            await self.ws.send_bytes(recs_message(count, lines))
        while self.outbox or self.first_tokens:
            if self.first_tokens:
                firsts, self.first_tokens = self.first_tokens, []
                await self.ws.send_bytes(encode({"k": "ft", "r": firsts}))
            batch, self.outbox = self.outbox[:BATCH], self.outbox[BATCH:]
            if batch:
                await self.ws.send_bytes(encode({"k": "rec", "r": batch}))


async def run_worker(
    url: str,
    token: Secret,
    *,
    name: str | None = None,
    spool_dir: Path | None = None,
    ssl_context: ssl.SSLContext | bool = True,
    join_timeout_s: float = 0.0,
    say: Callable[[str], None] = print,
) -> WorkerEnd:
    """Join the coordinator at ``url`` (``http://host:port`` or ``https://``) and
    send what it asks until it says stop or goes away; ``spool_dir`` (which must
    exist) keeps every record made. A coordinator that cannot be reached yet (no
    such host, nothing listening) is tried again every :data:`RETRY_S` for
    ``join_timeout_s`` seconds (0: once)."""
    name = name or f"{socket.gethostname()}-{os.getpid()}"
    spool_path = None if spool_dir is None else spool_dir / f"{name}.jsonl"
    end = WorkerEnd("lost", spool=spool_path)
    ws_url = url.rstrip("/").replace("http", "ws", 1) + PATH
    timeout = aiohttp.ClientTimeout(total=None, connect=10)
    async with aiohttp.ClientSession(timeout=timeout) as control:
        ws = await _connect(
            control, url, ws_url, token, ssl_context, join_timeout_s, say
        )
        spool = spool_path.open("a", encoding="utf-8") if spool_path else None
        worker = _Worker(ws, spool, end)
        try:
            await _serve(worker, name, say)
        finally:
            await _stop_all(worker)
            if worker.session is not None:
                await worker.session.close()
            if spool is not None:
                spool.close()
            await ws.close()
    return end


async def _connect(
    session: aiohttp.ClientSession,
    url: str,
    ws_url: str,
    token: Secret,
    ssl_context: ssl.SSLContext | bool,
    join_timeout_s: float,
    say: Callable[[str], None],
) -> aiohttp.ClientWebSocketResponse:
    """The connection to the coordinator, tried until ``join_timeout_s`` has passed
    while it cannot be reached; a refusal (the token, a full fleet) is final."""
    deadline = time.monotonic() + join_timeout_s
    waiting = False
    while True:
        try:
            return await session.ws_connect(
                ws_url,
                headers=bearer(token),
                max_msg_size=MAX_MESSAGE,
                autoping=True,
                ssl=ssl_context,
            )
        except aiohttp.WSServerHandshakeError as exc:
            if exc.status in (401, 403):
                raise ServemonError(
                    f"servemon worker: {url} refused this worker: the fleet token "
                    "does not match"
                ) from None
            raise ServemonError(
                f"servemon worker: {url} refused this worker: HTTP {exc.status} "
                f"{exc.message}"
            ) from None
        except (aiohttp.ClientError, OSError) as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                waited = f" (tried for {join_timeout_s:g} s)" if join_timeout_s else ""
                raise ServemonError(
                    f"servemon worker: cannot reach the coordinator at {url}{waited}: "
                    f"{exc}"
                ) from None
            if not waiting:
                waiting = True
                say(
                    f"servemon worker: waiting for the coordinator at {url} (up to "
                    f"{join_timeout_s:g} s): {exc}"
                )
            await asyncio.sleep(min(RETRY_S, left))


async def _serve(worker: _Worker, name: str, say: Callable[[str], None]) -> None:
    frame = Frame.here()
    await worker.ws.send_bytes(
        encode(
            {
                "k": "hello",
                "name": name,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "anchor_s": frame.anchor_s,
                "version": __version__,
            }
        )
    )
    loop = asyncio.get_running_loop()
    timer = KernelTimer(loop) if KernelTimer.available() else None
    pacer = Pacer()
    worker.sleep_until = timer.sleep_until if timer else pacer.sleep_until
    flushing = asyncio.create_task(worker.flush())
    watching = asyncio.create_task(_watch(worker))
    receiving = asyncio.create_task(_receive(worker, say))
    try:
        await asyncio.wait(
            {flushing, watching, receiving}, return_when=asyncio.FIRST_COMPLETED
        )
        if worker.end.how == "lost":
            say(f"servemon worker: {worker.end.reason}: stopped sending")
    finally:
        for task in (flushing, watching, receiving):
            task.cancel()
        await asyncio.gather(flushing, watching, receiving, return_exceptions=True)
        pacer.close()
        if timer is not None:
            timer.close()


async def _watch(worker: _Worker) -> None:
    """Stop when the coordinator has been silent too long."""
    while True:
        await asyncio.sleep(0.05)
        silent = time.monotonic() - worker.heard_s
        if silent > SILENCE_S:
            worker.end.how = "lost"
            worker.end.reason = f"no word from the coordinator for {silent:.1f} s"
            return


async def _receive(worker: _Worker, say: Callable[[str], None]) -> None:
    ws = worker.ws
    async for msg in ws:
        worker.heard_s = time.monotonic()
        if msg.type != aiohttp.WSMsgType.BINARY:
            continue
        try:
            message = decode(msg.data)
        except WireError:
            continue
        kind = message["k"]
        if kind == "ping":
            await ws.send_bytes(
                encode({"k": "pong", "n": message.get("n"), "t": time.monotonic()})
            )
            if isinstance(message.get("o"), float):
                worker.delta_s = message["o"]
        elif kind == "plan":
            await _take_plan(worker, message)
            say(f"servemon worker: joined; sending to {worker.url}")
        elif kind == "go":
            for credit in message.get("c") or ():
                _take_credit(worker, credit)
        elif kind == "due":
            shift = float(message.get("d") or 0.0)
            for i, s, t, b, o in message.get("c") or ():
                due = {"i": i, "s": s, "t": t, "b": b, "o": o, "shift": shift}
                _take_credit(worker, due)
        elif kind == "cancel":
            for request_id in message.get("i") or ():
                task = worker.tasks.get(request_id)
                if task is not None:
                    task.cancel()
        elif kind == "stop":
            await _finish(worker, float(message.get("grace") or 0.0))
            worker.end.how = "stopped"
            return
    worker.end.how = "lost"
    worker.end.reason = "the coordinator closed the connection"


async def _take_plan(worker: _Worker, plan: dict[str, Any]) -> None:
    worker.url = str(plan["url"])
    if isinstance(plan.get("index"), int):
        worker.index = plan["index"]
    worker.headers = {str(k): str(v) for k, v in (plan.get("headers") or {}).items()}
    worker.timeout_s = float(plan.get("timeout_s") or 600.0)
    settings = ClientSettings(
        max_connections=int(plan.get("max_connections") or 10_000),
        timeout_s=worker.timeout_s,
    )
    worker.session = make_session(settings)


def _options(given: dict[str, Any]) -> RequestOptions:
    options: RequestOptions = {}
    for key in ("cancel_after_s", "cancel_after_tokens"):
        if given.get(key) is not None:
            options[key] = given[key]
    if given.get("keep_text"):
        options["keep_text"] = True
    tags = given.get("tags")
    if isinstance(tags, dict):
        options["tags"] = RequestTags(**tags)
    return options


def _take_credit(worker: _Worker, credit: dict[str, Any]) -> None:
    if worker.stopping or worker.session is None:
        return
    request_id = str(credit["i"])
    task = asyncio.create_task(_send(worker, credit, request_id))
    worker.tasks[request_id] = task
    task.add_done_callback(lambda _t: worker.tasks.pop(request_id, None))


async def _send(worker: _Worker, credit: dict[str, Any], request_id: str) -> None:
    due = None if credit.get("t") is None else float(credit["t"])  # None: now
    body = credit["b"]
    options = _options(credit.get("o") or {})
    options["encoded"] = orjson.dumps(body)
    assert worker.sleep_until is not None
    assert worker.session is not None
    if due is not None:
        await worker.sleep_until(due)
    if worker.stopping:
        return
    on_first: Callable[[], None] | None = None
    if credit.get("ft"):

        def on_first() -> None:
            worker.first_tokens.append((request_id, time.monotonic()))
            worker.wake.set()

    worker.end.sent += 1
    timing: RequestTiming = await send_request(
        worker.session,
        worker.url,
        body,
        request_id=request_id,
        stage=int(credit.get("s") or 0),
        scheduled_s=due,
        headers=worker.headers,
        timeout_s=worker.timeout_s,
        record_interruption=True,
        on_first_token=on_first,
        **options,
    )
    worker.end.recorded += 1
    if "shift" in credit:
        worker.queue_line(timing, float(credit["shift"]))
    else:
        worker.queue(timing)


async def _finish(worker: _Worker, grace: float) -> None:
    """The coordinator's stop: nothing more goes out; the requests in flight get
    ``grace`` seconds, then are cancelled; every record is sent, then ``bye``."""
    worker.stopping = True
    tasks = set(worker.tasks.values())
    if tasks:
        await asyncio.wait(tasks, timeout=grace)
    await _stop_all(worker)
    await worker.send_all()
    end = worker.end
    await worker.ws.send_bytes(
        encode({"k": "bye", "sent": end.sent, "recorded": end.recorded})
    )


async def _stop_all(worker: _Worker) -> None:
    """Drop the credits not sent and cancel the requests in flight (each records
    itself as cancelled)."""
    worker.stopping = True
    tasks = list(worker.tasks.values())
    for task in tasks:
        task.cancel()
    with contextlib.suppress(Exception):
        await asyncio.gather(*tasks, return_exceptions=True)
