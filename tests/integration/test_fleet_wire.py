"""The coordinator's side of a fleet over real sockets, with a worker played by the
test: the token at the door, the clock measured, a credit turned into a record in
the coordinator's frame, a slice of a schedule out as one message and its lines
back as they came, and messages that are not ours skipped, never fatal."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any, cast

import aiohttp
import orjson
import pytest
import pytest_asyncio

from servemon.core.fields import Secret
from servemon.loadgen.fleet.coordinator import Fleet
from servemon.loadgen.fleet.members import FleetPlan
from servemon.loadgen.fleet.settings import FleetSettings
from servemon.loadgen.fleet.wire import PATH, recs_message
from servemon.loadgen.record.line import request_line
from servemon.loadgen.run.config import LoadConfig
from servemon.loadgen.run.sender import Hooks, Ready, Sender
from servemon.loadgen.send.arrivals import Due
from servemon.loadgen.send.client import RequestOptions
from servemon.loadgen.send.stopping import grace
from servemon.loadgen.send.timing import Outcome, RequestTiming

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

TOKEN = "a-token-for-the-wire-tests-0123"
#: The played worker's clock runs this far behind the coordinator's (monotonic).
BEHIND_S = 1234.5


@pytest_asyncio.fixture
async def fleet() -> AsyncIterator[Fleet]:
    settings = FleetSettings(
        host="127.0.0.1",
        port=0,
        expect=1,
        wait_s=20,
        on_loss="abort",
        token=Secret(TOKEN),
    )
    coordinator = Fleet(settings, say=lambda _line: None)
    await coordinator.listen()
    try:
        yield coordinator
    finally:
        await coordinator.stop(0.0)


class PlayedWorker:
    """A worker played by the test: answers pings on a clock ``BEHIND_S`` behind,
    and answers each credit with the record the test gives."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.credits: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.dues: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.cancelled: list[str] = []
        self.plan: dict[str, Any] | None = None

    async def run(self) -> None:
        async for msg in self.ws:
            message = orjson.loads(msg.data)
            if message["k"] == "ping":
                now = time.monotonic() - BEHIND_S
                await self.send({"k": "pong", "n": message["n"], "t": now})
            elif message["k"] == "plan":
                self.plan = message
            elif message["k"] == "go":
                for credit in message["c"]:
                    await self.credits.put(credit)
            elif message["k"] == "due":
                await self.dues.put(message)
            elif message["k"] == "cancel":
                self.cancelled.extend(message["i"])
            elif message["k"] == "stop":
                await self.send({"k": "bye", "sent": 0, "recorded": 0})

    async def send(self, message: Any) -> None:
        await self.ws.send_bytes(orjson.dumps(message))


async def test_a_credit_comes_back_as_a_record_in_the_coordinators_frame(
    fleet: Fleet, http: aiohttp.ClientSession
) -> None:
    assert fleet.url is not None
    ws = await http.ws_connect(
        fleet.url + PATH, headers={"Authorization": f"Bearer {TOKEN}"}
    )
    worker = PlayedWorker(ws)
    await worker.send({"k": "hello", "name": "played", "anchor_s": 0.0})
    playing = asyncio.create_task(worker.run())
    try:
        plan = FleetPlan("http://127.0.0.1:1/v1/chat/completions", {}, LoadConfig())
        await fleet.gather(plan)
        assert worker.plan is not None
        assert worker.plan["url"] == plan.url
        # Not ours: skipped and counted, and the coordinator goes on.
        for junk in (b"\x00not json", b"[1, 2]", b'{"k": "pong", "n": 0}'):
            await ws.send_bytes(junk)
        await worker.send({"k": "rec", "r": [7, "x"]})

        due = time.monotonic() + 0.2
        sending = asyncio.create_task(
            fleet.send(
                {"model": "m", "messages": []},
                request_id="r-1",
                stage=0,
                scheduled_s=due,
                started=lambda: None,
                on_first_token=None,
                options={},
            )
        )
        credit = await asyncio.wait_for(worker.credits.get(), 5)
        # The credit's time is on the worker's clock, to well under a millisecond.
        assert credit["t"] == pytest.approx(due - BEHIND_S, abs=1e-3)
        assert credit["b"] == {"model": "m", "messages": []}
        at = credit["t"]
        timing = RequestTiming(
            request_id="r-1",
            scheduled_s=at,
            sent_s=at + 0.001,
            end_s=at + 0.5,
            outcome=Outcome.OK,
            content_s=(at + 0.1, at + 0.2),
            output_tokens=2,
        )
        await worker.send({"k": "rec", "r": [request_line(timing)]})
        got = await asyncio.wait_for(sending, 5)
        assert got.worker == 0
        assert got.outcome is Outcome.OK
        assert got.scheduled_s == pytest.approx(due, abs=1e-9)
        assert got.ttft == pytest.approx(0.099, abs=1e-9)
        record = fleet.record(fleet.origin_s).workers[0]
        assert record.malformed == 3  # a pong for no ping is passed over
        assert record.credits == record.records == 1
        assert record.uncertainty_s is not None
        assert record.uncertainty_s < 0.01
    finally:
        playing.cancel()
        await asyncio.gather(playing, return_exceptions=True)
        await ws.close()


async def test_a_worker_without_the_token_is_turned_away(
    fleet: Fleet, http: aiohttp.ClientSession
) -> None:
    assert fleet.url is not None
    for headers in ({}, {"Authorization": "Bearer wrong-token-wrong-token"}):
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(fleet.url + PATH, headers=headers)
        assert refused.value.status == 401
    assert fleet.refused == 2
    assert fleet.record(fleet.origin_s).workers == []


class Taken:
    """The run's bookkeeping as a test sees it: the batches, and the requests
    recorded one by one (those no worker answered for)."""

    def __init__(self) -> None:
        self.raw: list[bytes] = []
        self.lines: list[dict[str, Any]] = []
        self.one_by_one: list[RequestTiming] = []
        self.handed_out = 0

    def sink(self, timing: RequestTiming) -> None:
        self.one_by_one.append(timing)

    def starter(self, request_id: str, at: float, prompt_tokens: int | None) -> None:
        raise AssertionError("a sliced request is never started one by one")

    def handed(self, count: int) -> None:
        self.handed_out += count

    def lines_of(self, raw: bytes, lines: list[dict[str, Any]]) -> None:
        self.raw.append(raw)
        self.lines.extend(lines)


class _Batch:
    def __init__(self, taken: Taken) -> None:
        self.sink = taken.sink
        self.starter = taken.starter
        self.handed = taken.handed
        self.lines = taken.lines_of


def _sender(hooks: Hooks) -> Sender:
    """What a slice loop reads of the run's sender: its tag, hooks and count."""
    return cast(Sender, SimpleNamespace(tag="run", hooks=hooks, sent=0))


def _prepare(due: Due) -> Ready:
    body: dict[str, object] = {"model": "m", "prompt": f"p{due.index}"}
    options: RequestOptions = {"encoded": orjson.dumps(body)}
    return body, options, 4


async def test_a_slice_goes_out_as_one_message_and_comes_back_as_lines(
    fleet: Fleet, http: aiohttp.ClientSession
) -> None:
    assert fleet.url is not None
    ws = await http.ws_connect(
        fleet.url + PATH, headers={"Authorization": f"Bearer {TOKEN}"}
    )
    worker = PlayedWorker(ws)
    await worker.send({"k": "hello", "name": "played", "anchor_s": 0.0})
    playing = asyncio.create_task(worker.run())
    taken = Taken()
    hooks = Hooks(sinks=[taken.sink], starters=[taken.starter])
    hooks.batch = _Batch(taken)
    try:
        await fleet.gather(FleetPlan("http://127.0.0.1:1/v1", {}, LoadConfig()))
        assert worker.plan is not None
        assert worker.plan["index"] == 0
        sender = _sender(hooks)
        loop = fleet.open_loop(
            sender,
            prepare=_prepare,
            not_sent=lambda _due, _why: None,
            first_index=10,
            max_inflight=100,
            late="send",
            late_tolerance_s=1.0,
        )
        assert loop is not None
        start = time.monotonic() + 0.05
        schedule = [Due(0, 0, 0.0), Due(1, 0, 0.002), Due(2, 1, 0.004)]
        await asyncio.wait_for(loop.run(schedule, start), 5)
        # The three due within the same 100 ms: one message, one share.
        message = await asyncio.wait_for(worker.dues.get(), 5)
        assert worker.dues.empty()
        assert [c[0] for c in message["c"]] == ["run-10", "run-11", "run-12"]
        assert [c[3] for c in message["c"]] == [{"model": "m", "prompt": "p0"}] + [
            {"model": "m", "prompt": f"p{i}"} for i in (1, 2)
        ]
        shift = message["d"]
        for credit, due in zip(message["c"], schedule, strict=True):
            # On the worker's clock; moved back by the offset it carries.
            assert credit[2] == pytest.approx(start + due.offset_s - BEHIND_S, abs=1e-3)
            assert credit[2] + shift == pytest.approx(start + due.offset_s, abs=1e-9)
        assert taken.handed_out == sender.sent == loop.in_flight == 3
        assert len(loop.tasks) == 1
        lines = b""
        for request_id, stage, at, _body, _options in message["c"][:2]:
            timing = RequestTiming(
                request_id=request_id,
                stage=stage,
                scheduled_s=at + shift,
                sent_s=at + shift + 0.0002,
                end_s=at + shift + 0.3,
                outcome=Outcome.OK,
                content_s=(at + shift + 0.05, at + shift + 0.06),
                output_tokens=2,
                worker=0,
            )
            lines += orjson.dumps(request_line(timing)) + b"\n"
        stranger = {**orjson.loads(lines.splitlines()[0]), "id": "run-99"}
        await ws.send_bytes(recs_message(3, lines + orjson.dumps(stranger) + b"\n"))
        for _ in range(100):
            if loop.in_flight == 1:
                break
            await asyncio.sleep(0.01)
        # Written as they came (the line not owed left out), and folded at once.
        assert taken.raw == [lines]
        assert [line["id"] for line in taken.lines] == ["run-10", "run-11"]
        assert loop.in_flight == 1
        assert len(loop.tasks) == 1
        # A stop's grace period runs out: what is owed is cancelled at the worker
        # and recorded as cancelled here.
        await grace(set(loop.tasks), 0.0, asyncio.Event())
        assert loop.in_flight == 0
        assert not loop.tasks
        [cancelled] = taken.one_by_one
        assert cancelled.request_id == "run-12"
        assert cancelled.outcome is Outcome.CANCELLED
        assert cancelled.stage == 1
        assert cancelled.worker == 0
        for _ in range(100):
            if worker.cancelled:
                break
            await asyncio.sleep(0.01)
        assert worker.cancelled == ["run-12"]
        record = fleet.record(fleet.origin_s).workers[0]
        assert record.credits == 3
        assert record.records == 2
    finally:
        playing.cancel()
        await asyncio.gather(playing, return_exceptions=True)
        await ws.close()


async def test_a_worker_measured_before_the_plan_is_made_gets_it(
    fleet: Fleet, http: aiohttp.ClientSession
) -> None:
    # `--workers N` starts its workers as the coordinator listens; on a busy
    # machine their clocks were measured before the run's plan was made, and
    # the run waited out --fleet-wait for workers that had come.
    assert fleet.url is not None
    ws = await http.ws_connect(
        fleet.url + PATH, headers={"Authorization": f"Bearer {TOKEN}"}
    )
    worker = PlayedWorker(ws)
    await worker.send({"k": "hello", "name": "early", "anchor_s": 0.0})
    playing = asyncio.create_task(worker.run())
    try:
        for _ in range(200):
            members = fleet.record(fleet.origin_s).workers
            if members and members[0].clock_samples >= 12:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # measured, and no plan yet
        plan = FleetPlan("http://127.0.0.1:1/v1", {}, LoadConfig())
        await asyncio.wait_for(fleet.gather(plan), 5)
        assert worker.plan is not None
        assert worker.plan["index"] == 0
    finally:
        playing.cancel()
        await asyncio.gather(playing, return_exceptions=True)
        await ws.close()
