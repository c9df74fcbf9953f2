"""``servemon control`` against the simulator over real sockets: it raises the rate
until the queue forms and then holds it near the setpoint, records every tick and
shows them live; blind (a Prometheus that has no data), it holds its rate and then
stops, and never reads the missing signal as zero."""

from __future__ import annotations

import asyncio
import json
import statistics
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from servemon.loadgen.record.runrecord import RunResult
from servemon.simulator.config import SimConfig
from servemon.simulator.server import SimServer
from tests.support.margins import Margin
from tests.support.runs import config_for, run

pytestmark = pytest.mark.integration


def _ticks(result: RunResult) -> list[dict[str, Any]]:
    text = (result.path / "control.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()]


def test_control_finds_the_queue_and_holds_it(tmp_path: Path) -> None:
    live: list[str] = []

    async def go() -> RunResult:
        # About 4 requests/s: four at a time, each a second and a half of decode.
        config = SimConfig(host="127.0.0.1", port=0, max_num_seqs=4)
        async with SimServer(config) as server:
            load = config_for(
                server,
                tmp_path,
                kind="control",
                hold="waiting=6",
                duration=30.0,
                rps_start=1.0,
                workload="random:prompt=16,output=48",
                timeout=30.0,
            )
            task = asyncio.create_task(run("control", load))
            async with aiohttp.ClientSession() as session:
                for _ in range(40):
                    await asyncio.sleep(0.5)
                    runs = list((tmp_path / "runs").glob("*/run.json"))
                    if not runs:
                        continue
                    url = json.loads(runs[0].read_text())["client"]["live_metrics"]
                    async with session.get(url) as resp:
                        live.append(await resp.text())
                    if "servemon_client_control_measured{" in live[-1]:
                        break
            return await task

    result = asyncio.run(asyncio.wait_for(go(), 90))
    assert result.status == "completed"
    ticks = _ticks(result)
    assert len(ticks) >= 8
    assert {t["state"] for t in ticks} <= {"tracking", "unreachable"}
    assert all(t["setpoint"] == 6 and t["signal"] == "waiting" for t in ticks)
    # It raised the rate from where it started until a queue formed...
    assert max(t["offered_rps"] for t in ticks) > 2.0  # from 1
    late = [t["measured"] for t in ticks[len(ticks) // 2 :]]
    assert statistics.mean(late) > 1.0
    # ...and held it near the setpoint rather than letting it run away.
    assert statistics.mean(late) < 30.0
    held = result.record.control
    assert held is not None
    assert held.ticks == len(ticks)
    assert held.blind == 0
    assert result.stages[0].label == "hold waiting=6"
    assert any("servemon_client_control_setpoint{" in text for text in live)
    summary = json.loads((result.path / "summary.json").read_text())
    assert summary["control"]["signal"] == "waiting"


def test_a_blind_controller_holds_its_rate_then_stops(tmp_path: Path) -> None:
    """A Prometheus that answers but has no series for the signal: every tick is
    blind, the rate never moves (no zero read as 'room to grow'), and the run stops
    after --blind-timeout with the reason."""

    async def empty(_request: web.Request) -> web.Response:
        return web.json_response(
            {"status": "success", "data": {"resultType": "vector", "result": []}}
        )

    async def go() -> RunResult:
        app = web.Application()
        app.router.add_get("/api/v1/query", empty)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        prometheus = f"http://127.0.0.1:{runner.addresses[0][1]}"
        try:
            config = SimConfig(host="127.0.0.1", port=0, profile="tiny")
            async with SimServer(config) as server:
                load = config_for(
                    server,
                    tmp_path,
                    kind="control",
                    hold="waiting=6",
                    duration=60.0,
                    rps_start=3.0,
                    prometheus=prometheus,
                    scrape_interval=1.0,
                    control_interval=1.0,
                    blind_timeout=4.0,
                )
                return await run("control", load)
        finally:
            await runner.cleanup()

    result = asyncio.run(asyncio.wait_for(go(), 60))
    assert result.status == "aborted"
    assert result.stop_reason is not None
    assert result.stop_reason.startswith("blind: no fresh waiting")
    ticks = _ticks(result)
    assert ticks
    assert {t["state"] for t in ticks} == {"blind"}
    assert {t["measured"] for t in ticks} == {None}
    assert {t["offered_rps"] for t in ticks} == {3.0}
    missing = [
        json.loads(line).get("missing", {}).get("waiting")
        for line in (result.path / "server_metrics.jsonl").read_text().splitlines()
    ]
    assert "no data" in missing
    info = json.loads((result.path / "run.json").read_text())
    assert info["server_metrics"]["source"] == "prometheus"
    assert (
        "servemon_engine_requests_waiting"
        in (info["server_metrics"]["queries"]["waiting"]["value"])
    )


def test_control_holds_kv_usage_on_its_model_of_the_requests(
    tmp_path: Path, margin: Margin
) -> None:
    """Requests that live a few seconds into a small cache: once a few have
    finished, the law steers on the client's model of what its requests hold (each
    tick says the model's scale), and KV usage ends near the setpoint."""

    async def go() -> RunResult:
        # 1,000 blocks of 16 tokens; a request holds up to 160 tokens (10 blocks):
        # about 50 in flight at the setpoint.
        config = SimConfig(host="127.0.0.1", port=0, num_gpu_blocks=1000, block_size=16)
        async with SimServer(config) as server:
            load = config_for(
                server,
                tmp_path,
                kind="control",
                hold="kv_cache_usage=0.5",
                duration=40.0,
                rps_start=4.0,
                workload="random:prompt=64,output=96",
                ignore_eos=True,
                sample_interval=0.5,
                control_interval=2.0,
                timeout=30.0,
            )
            return await run("control", load)

    result = asyncio.run(asyncio.wait_for(go(), 120))
    assert result.status == "completed"
    ticks = _ticks(result)
    assert ticks[0]["scale"] is None  # nothing had finished: the integral step
    modelled = [t for t in ticks if t["scale"] is not None]
    assert len(modelled) >= len(ticks) // 2
    # The scale is KV usage per modelled token: 1 / (1,000 x 16), and rounding.
    assert 0.5 / 16_000 < statistics.median(t["scale"] for t in modelled) < 2 / 16_000
    late = [t["measured"] for t in ticks[-len(ticks) // 3 :]]
    margin("late mean KV usage", statistics.mean(late), above=0.3, below=0.7)


@pytest.mark.parametrize("pace", [True, False])
def test_control_of_ttft_paces_its_sends_by_the_prefill_backlog(
    tmp_path: Path, pace: bool, margin: Margin
) -> None:
    """Long prompts: every stream's first token reaches the backlog (the pace
    moves off 1 both ways), what goes out is the law's rate, and ``--no-pace``
    draws at the law's rate alone."""

    async def go() -> RunResult:
        config = SimConfig(host="127.0.0.1", port=0)
        async with SimServer(config) as server:
            load = config_for(
                server,
                tmp_path,
                kind="control",
                hold="ttft_p95=0.4",
                duration=24.0,
                rps_start=6.0,
                workload="random:prompt=1024,output=8",
                signal_window=6.0,
                control_interval=3.0,
                pace=pace,
                timeout=30.0,
            )
            return await run("control", load)

    result = asyncio.run(asyncio.wait_for(go(), 90))
    assert result.status == "completed"
    ticks = _ticks(result)
    assert len(ticks) >= 6
    paces = [t["pace"] for t in ticks]
    if not pace:
        assert paces == [None] * len(ticks)
        return
    assert all(p is not None for p in paces)
    # The record of the pace is what went out over what was drawn at, which the
    # sends owed keep near 1 however the backlog moves (it is not always 1).
    margin("median pace", statistics.median(paces), above=0.7, below=1.3)
    assert min(paces) != max(paces)
    sent = sum(t["achieved_rps"] for t in ticks[1:])
    offered = sum(t["offered_rps"] for t in ticks[:-1])  # the rate of the next tick
    margin("sent / offered", sent / offered, above=0.75, below=1.25)
