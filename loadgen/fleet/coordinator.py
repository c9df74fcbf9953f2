"""The coordinator of a fleet: the one process that owns the run.

It listens for workers (:mod:`.worker`) on one port (a WebSocket each; the shared
token at the upgrade; TLS from ``--web-config-file``), measures each one's clock
(:mod:`.clock`) before it gets any work and again every quarter second for the whole
run (the pings are the heartbeat too), and hands each the plan: the target's URL,
its headers, the client's limits. Everything else stays here: the schedule, every
capacity step's and control tick's rate, the SLO judgement, the guard rails and the
run directory.

The run's drivers send as they always do, through the run's
:class:`~servemon.loadgen.run.sender.Sender`; its transport here is a :class:`Fleet`.
An open-loop schedule goes out in slices (:mod:`.slices`: many requests a message,
their records back many a message, folded into the run a batch at once); anything
else (a sweep's closed loop, a conversation's turns) as one credit a send. Either
way a request reaches its worker ahead of its time (:data:`AHEAD_S`), its time on
that worker's clock, and its record comes back in this process's frame: one
``requests.jsonl``, one live ``/metrics``, exact percentiles. Requests go round the
live workers in turn; a session's turns stay on the worker of its first.

A worker that goes silent (:data:`LOSS_S`) or away is lost: the requests it had are
recorded as cancelled, the share it sent stops at that time (said on screen and in
``run.json``), and the run either aborts (the default) or goes on with the others at
the same total rate (``--on-worker-loss continue``). A worker that joins once the
run is going gets credits from then on, never the ones due before.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import socket
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Unpack

import aiohttp
import orjson
from aiohttp import web

from servemon.core.errors import ConfigError
from servemon.core.wire.webconfig import WebConfig, site_url, web_middleware
from servemon.loadgen.fleet.clock import ClockFilter, Frame, Sample
from servemon.loadgen.fleet.members import (
    FleetPlan,
    Member,
    joined_line,
    post,
    unsent,
    wire_options,
)
from servemon.loadgen.fleet.settings import FleetSettings
from servemon.loadgen.fleet.slices import SliceLoop, Slicer
from servemon.loadgen.fleet.wire import (
    MAX_MESSAGE,
    PATH,
    RECS,
    WireError,
    decode,
    encode,
    token_matches,
)
from servemon.loadgen.record.fleet import FleetRecord
from servemon.loadgen.record.line import timing_from_line
from servemon.loadgen.run.sender import LoopOptions, Sender
from servemon.loadgen.send.client import RequestOptions
from servemon.loadgen.send.timing import RequestTiming

__all__ = ["AHEAD_S", "LOSS_S", "Fleet", "FleetPlan"]

#: How long before its time a credit leaves for its worker: room for the network
#: and the worker's own scheduling (a capacity step's or control tick's new rate
#: reaches the workers within this).
AHEAD_S = 0.1
#: Seconds between pings (each one also a heartbeat).
PING_S = 0.25
#: Pings taken before a worker gets work.
FIRST_PINGS = 12
#: Silence after which a worker is lost.
LOSS_S = 1.5


class Fleet:
    """The coordinator's side of a fleet (see the module docstring), and the
    run's transport (:class:`~servemon.loadgen.run.sender.Transport`)."""

    ahead_s = AHEAD_S

    def __init__(
        self,
        settings: FleetSettings,
        say: Callable[[str], None] = print,
        web_config: WebConfig | None = None,
    ) -> None:
        self.settings = settings
        self.expect = settings.expect
        self.on_loss = settings.on_loss
        self._token = settings.token
        self._say = say
        self._web_config = web_config
        self._frame = Frame.here()
        self._members: list[Member] = []
        self._live: list[Member] = []
        self._turn = itertools.count()
        self._sessions: dict[str, Member] = {}
        self._plan: FleetPlan | None = None
        self._runner: web.AppRunner | None = None
        self._enough = asyncio.Event()
        self._flushing = False
        self._sends: set[asyncio.Future[None]] = set()
        #: Sliced credits' side, once an open-loop schedule uses them.
        self.slicer: Slicer | None = None
        #: Told when a worker is lost and the run should stop (the runner's abort).
        self.on_abort: Callable[[str], None] = lambda _reason: None
        self.origin_s = time.monotonic()
        self.url: str | None = None
        self.refused = 0

    # -- listening and joining -------------------------------------------------

    async def listen(self) -> str:
        """Take workers on ``--fleet-listen`` (port 0: a free one); return the URL
        they join."""
        host, port = self.settings.host, self.settings.port
        middlewares = []
        if self._web_config is not None:
            middlewares.append(web_middleware(self._web_config))
        app = web.Application(middlewares=middlewares)
        app.router.add_get(PATH, self._join)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        context = self._web_config.ssl_context if self._web_config else None
        site = web.TCPSite(self._runner, host, port, ssl_context=context)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            raise ConfigError(
                f"--fleet-listen {host}:{port}: cannot listen: {exc.strerror or exc}"
            ) from None
        self.url = site_url(self._runner.addresses[0], self._web_config)
        said = f"servemon: coordinating: {self.expect} workers to join at {self.url}"
        if host in ("0.0.0.0", "::", ""):  # every address: name this machine's
            port = self._runner.addresses[0][1]
            said += f" (every address here: e.g. --join {_scheme(self.url)}"
            said += f"://{socket.gethostname()}:{port})"
        self._say(said)
        if self.settings.spawn is not None:
            await self.settings.spawn(self.url)
        return self.url

    async def gather(self, plan: FleetPlan) -> None:
        """Wait for the workers expected, their clocks measured, and hand each the
        plan; a one-line error when they do not come in ``--fleet-wait``."""
        timeout_s = self.settings.wait_s
        self._plan = plan
        for member in list(self._members):  # measured before the plan was made
            if member.ready.is_set():
                await self._hand_plan(member)
        try:
            await asyncio.wait_for(self._enough.wait(), timeout_s)
        except TimeoutError:
            raise ConfigError(
                f"--fleet-workers {self.expect}: {len(self._live)} joined in "
                f"{timeout_s:g} s (--fleet-wait); the coordinator is at {self.url}"
            ) from None
        self.origin_s = time.monotonic()

    async def _join(self, request: web.Request) -> web.StreamResponse:
        if not token_matches(self._token, request.headers.get("Authorization")):
            self.refused += 1
            self._say(
                f"servemon: refused a worker from {request.remote}: no valid token"
            )
            return web.Response(status=401, text="a fleet token is required\n")
        ws = web.WebSocketResponse(max_msg_size=MAX_MESSAGE, autoping=True)
        await ws.prepare(request)
        try:
            hello = decode(await ws.receive_bytes(timeout=10))
            anchor_s = float(hello.get("anchor_s") or 0.0)
        except (WireError, TypeError, ValueError, TimeoutError):
            await ws.close()
            return ws
        if hello.get("k") != "hello":
            await ws.close()
            return ws
        member = Member(
            index=len(self._members),
            name=str(hello.get("name") or f"worker-{len(self._members)}"),
            host=str(hello.get("host") or ""),
            address=str(request.remote or ""),
            ws=ws,
            clock=ClockFilter(self._frame, Frame(anchor_s)),
            joined_s=time.monotonic(),
        )
        self._members.append(member)
        pinging = asyncio.create_task(self._ping(member))
        try:
            await self._receive(member)
        finally:
            pinging.cancel()
            await asyncio.gather(pinging, return_exceptions=True)
            if member.stopped_s is None and member.working_s is not None:
                self._lose(member, "connection closed")
            elif member.stopped_s is None:
                member.stopped_s = time.monotonic()
                member.stop_reason = member.stop_reason or "left before work"
        return ws

    async def _ping(self, member: Member) -> None:
        """The clock's exchanges: a quick burst first, then one a quarter second,
        which is also the heartbeat both sides watch."""
        for n in itertools.count():
            sent = time.monotonic()
            est = member.clock.estimate()
            member.pings[n] = sent
            await member.ws.send_bytes(
                encode({"k": "ping", "n": n, "o": None if est is None else est.delta_s})
            )
            if n + 1 == FIRST_PINGS:
                await asyncio.sleep(0.05)
                member.clock.settle()
                member.ready.set()
                self._say(joined_line(member))
                if self._plan is not None:
                    await self._hand_plan(member)
            if n >= FIRST_PINGS and time.monotonic() - member.heard_s > LOSS_S:
                self._lose(member, f"silent for {LOSS_S:g} s")
                await member.ws.close()
                return
            await asyncio.sleep(0.01 if n < FIRST_PINGS else PING_S)

    async def _hand_plan(self, member: Member) -> None:
        assert self._plan is not None
        if member.working_s is not None or member.stopped_s is not None:
            return
        await member.ws.send_bytes(
            encode({**self._plan.message(), "index": member.index})
        )
        member.working_s = time.monotonic()
        self._live.append(member)
        if len(self._live) >= self.expect:
            self._enough.set()

    async def _receive(self, member: Member) -> None:
        async for msg in member.ws:
            member.heard_s = time.monotonic()
            if msg.type != aiohttp.WSMsgType.BINARY:
                continue
            if msg.data.startswith(RECS) and self.slicer is not None:
                self.slicer.taken(member, msg.data)
                continue
            try:
                self._take(member, decode(msg.data))
            except (WireError, KeyError, TypeError, ValueError, AttributeError):
                # Not one of ours (a worker of another version, a broken one):
                # counted, never the coordinator's end.
                member.malformed += 1

    def _take(self, member: Member, message: dict[str, Any]) -> None:
        """One message from ``member``."""
        kind = message["k"]
        if kind == "rec":
            for line in message.get("r") or ():
                future = member.pending.pop(str(line.get("id")), None)
                member.records += 1
                if future is not None and not future.done():
                    future.set_result(line)
        elif kind == "pong":
            sent = member.pings.pop(int(message.get("n") or 0), None)
            if sent is not None:
                member.clock.add(Sample(sent, float(message["t"]), member.heard_s))
        elif kind == "ft":
            for request_id, _at in message.get("r") or ():
                hook = member.first_tokens.pop(str(request_id), None)
                if hook is not None:
                    hook()
        elif kind == "bye":
            member.stopped_s = time.monotonic()
            member.stop_reason = "run ended"
            if member in self._live:
                self._live.remove(member)
            member.bye.set()

    def _lose(self, member: Member, reason: str) -> None:
        """``member`` is gone: its share stops now; its requests end cancelled."""
        if member.stopped_s is not None:
            return
        member.stopped_s = time.monotonic()
        member.stop_reason = reason
        if member in self._live:
            self._live.remove(member)
        for future in member.pending.values():
            if not future.done():
                future.set_result(None)
        member.pending.clear()
        if self.slicer is not None:
            self.slicer.lost(member)
        at = member.stopped_s - self.origin_s
        self._say(
            f"servemon: worker {member.index} ({member.name}) stopped at {at:.1f} s: "
            f"{reason}; its {member.records} records are kept"
        )
        if self.on_loss == "abort":
            self.on_abort(
                f"worker {member.index} ({member.name}) lost at {at:.1f} s ({reason})"
            )

    # -- the run's transport -----------------------------------------------------

    def _pick(self, session: str | None) -> Member | None:
        if not self._live:
            return None
        if session is not None:
            member = self._sessions.get(session)
            if member is None or member not in self._live:
                member = self._live[next(self._turn) % len(self._live)]
                self._sessions[session] = member
            return member
        return self._live[next(self._turn) % len(self._live)]

    async def send(
        self,
        body: dict[str, object],
        *,
        request_id: str,
        stage: int,
        scheduled_s: float | None,
        started: Callable[[], None],
        on_first_token: Callable[[], None] | None,
        options: RequestOptions,
    ) -> RequestTiming:
        """Send one request through a worker (``scheduled_s`` None: at once, a
        closed loop's); its record, in this process's frame."""
        tags = options.get("tags")
        member = self._pick(None if tags is None else tags.session)
        est = None if member is None else member.clock.estimate()
        now_s = time.monotonic()
        due_s = now_s if scheduled_s is None else scheduled_s
        if member is None or est is None:
            return unsent(request_id, stage, due_s, "no worker left")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[dict[str, Any] | None] = loop.create_future()
        member.pending[request_id] = future
        if on_first_token is not None:
            member.first_tokens[request_id] = on_first_token
        encoded = options.get("encoded")
        credit: dict[str, object] = {
            "i": request_id,
            "s": stage,
            "t": None if scheduled_s is None else scheduled_s - est.delta_s,
            "b": body if encoded is None else orjson.Fragment(encoded),
            "o": wire_options(options),
            "ft": on_first_token is not None,
        }
        member.credits += 1
        member.outbox.append(credit)
        if not self._flushing:
            self._flushing = True
            loop.call_soon(self._flush)
        starting = loop.call_later(max(0.0, due_s - now_s), started)
        try:
            line = await future
        except asyncio.CancelledError:
            starting.cancel()
            member.pending.pop(request_id, None)
            member.first_tokens.pop(request_id, None)
            with contextlib.suppress(Exception):
                await member.ws.send_bytes(encode({"k": "cancel", "i": [request_id]}))
            return unsent(request_id, stage, due_s, "cancelled", member.index)
        member.first_tokens.pop(request_id, None)
        if line is None:
            why = f"worker {member.index} lost"
            return unsent(request_id, stage, due_s, why, member.index)
        # Back with the offset the credit went out with: the request's times stay
        # on one frame with the time it was scheduled for.
        line["worker"] = member.index
        try:
            timing = timing_from_line(line, shift_s=est.delta_s)
        except (KeyError, TypeError, ValueError) as exc:
            member.malformed += 1
            why = f"worker {member.index} sent a record that does not read: {exc}"
            return unsent(request_id, stage, due_s, why, member.index)
        text = line.get("text")
        return timing if text is None else replace(timing, text=str(text))

    def _flush(self) -> None:
        self._flushing = False
        for member in self._live:
            if member.outbox:
                credits, member.outbox = member.outbox, []
                post(self._sends, member, encode({"k": "go", "c": credits}))

    def open_loop(
        self, sender: Sender, **options: Unpack[LoopOptions]
    ) -> SliceLoop | None:
        """An open-loop schedule's fast path (:mod:`.slices`); None: one a send."""
        if not sender.hooks.batchable():
            return None
        if self.slicer is None or self.slicer.hooks is not sender.hooks:
            sending = functools.partial(post, self._sends)
            self.slicer = Slicer(
                self._live, self._turn, sending, self.ahead_s, sender.hooks
            )
        return SliceLoop(self.slicer, sender, **options)

    # -- the end -----------------------------------------------------------------

    async def stop(self, grace_s: float) -> None:
        """Tell every worker to stop (requests in flight get ``grace_s``), wait for
        their last records, and stop listening."""
        live = list(self._live)
        for member in live:
            with contextlib.suppress(Exception):
                await member.ws.send_bytes(encode({"k": "stop", "grace": grace_s}))
        if live:
            with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
                await asyncio.wait_for(
                    asyncio.gather(*(m.bye.wait() for m in live)), grace_s + 5
                )
        for member in live:
            if member.stopped_s is None:
                member.stopped_s = time.monotonic()
                member.stop_reason = "run ended"
            with contextlib.suppress(Exception):
                await member.ws.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def record(self, origin_s: float) -> FleetRecord:
        """What ``run.json`` keeps of the fleet."""
        return FleetRecord(
            coordinator=self.url or "",
            expected=self.expect,
            on_worker_loss=self.on_loss,
            ahead_s=AHEAD_S,
            refused=self.refused,
            workers=[m.record(origin_s) for m in self._members],
        )


def _scheme(url: str) -> str:
    return url.partition("://")[0]
