"""The coordinator's side of a fleet over real sockets, with a worker played by the
test: the token at the door, the clock measured, a credit turned into a record in
the coordinator's frame, and messages that are not ours skipped, never fatal."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
import pytest_asyncio

from servemon.core.fields import Secret
from servemon.loadgen.fleet.coordinator import Fleet
from servemon.loadgen.fleet.members import FleetPlan
from servemon.loadgen.fleet.settings import FleetSettings
from servemon.loadgen.fleet.wire import PATH
from servemon.loadgen.record.line import request_line
from servemon.loadgen.run.config import LoadConfig
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
