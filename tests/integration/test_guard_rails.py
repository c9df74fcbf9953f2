"""Guard rails and cancellation, in-process against the simulator over real sockets.

A run that harms its target stops at once with the reason recorded and every
measured request kept; a client that walks away from its streams leaves the server
with nothing running and nothing held in its KV cache (``shared/seeds/001``: the
server must notice the disconnect and free the batch slot and the blocks).
"""

from __future__ import annotations

import asyncio
import io
import json
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from rich.console import Console
from scipy import stats

from servemon.loadgen.record.runrecord import RunResult
from servemon.loadgen.run.config import LoadConfig
from servemon.loadgen.run.flat import config_of
from servemon.loadgen.run.plan import make_plan
from servemon.loadgen.run.progress import Progress
from servemon.loadgen.runner import Stopper, run_load
from tests.support.margins import Margin

pytestmark = pytest.mark.integration

#: A steady ramp that would run for 20 s if nothing stopped it.
RATE, PLANNED_S = 25.0, 20.0


def config_for(target: str, tmp_path: Path, **fields: Any) -> LoadConfig:
    base: dict[str, Any] = {
        "target": target,
        "out": str(tmp_path / "runs"),
        "metrics_port": 0,
        "workload": "random:prompt=16,output=8",
        "timeout": 10.0,
        "grace": 1.0,
        "stages": f"{RATE:g}:{PLANNED_S:g}",
        "sample_interval": 0.25,
    }
    return config_of("ramp", ("test", {**base, **fields}))


async def run(config: LoadConfig) -> RunResult:
    assert config.target is not None
    return await run_load(
        make_plan("ramp", config),
        config,
        config.target,
        argv=["servemon", "ramp", "(test)"],
        stop=Stopper(),
        env={},
        progress=Progress(Console(file=io.StringIO()), live=False),
    )


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every line parsed; the file ends with a newline (no partial line)."""
    text = path.read_text(encoding="utf-8")
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


async def recorded(
    out: Path, count: int, poll_until: Callable[..., Any]
) -> list[dict[str, Any]]:
    """The records of the one run under ``out`` once it holds ``count``."""

    def ready() -> list[dict[str, Any]] | None:
        for path in out.glob("*/requests.jsonl"):
            lines = path.read_text(encoding="utf-8").splitlines()
            if len(lines) >= count:
                return [json.loads(line) for line in lines]
        return None

    found: list[dict[str, Any]] = await poll_until(
        ready, 10, interval=0.02, what=f"{count} recorded requests"
    )
    return found


async def stopped(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` if it is still running (a failed test) and wait for it."""
    if not task.done():
        task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def assert_nothing_lost(result: RunResult) -> list[dict[str, Any]]:
    """Every request sent is a parseable line, counted alike everywhere."""
    records = read_jsonl(result.path / "requests.jsonl")
    summary = read_json(result.path / "summary.json")
    run_json = read_json(result.path / "run.json")
    outcomes = dict(Counter(r["outcome"] for r in records))
    assert summary["overall"]["requests"] == len(records)
    assert summary["overall"]["outcomes"] == outcomes
    assert sum(s["summary"]["requests"] for s in summary["stages"]) == len(records)
    assert sum(s["sent"] for s in summary["stages"]) == len(records)
    assert sum(s["sent"] for s in run_json["stages"]) == len(records)
    assert len({r["id"] for r in records}) == len(records)
    return records


@pytest.mark.asyncio
async def test_half_the_requests_failing_stops_the_run_within_seconds(
    start_sim: Any,
    tmp_path: Path,
    http: aiohttp.ClientSession,
    poll_until: Callable[..., Any],
) -> None:
    trace = tmp_path / "trace.jsonl"
    async with start_sim(trace=str(trace)) as server:
        started = time.monotonic()
        running = asyncio.create_task(run(config_for(server.url, tmp_path)))
        try:
            await recorded(tmp_path / "runs", 25, poll_until)
            fault = {"faults": {"http_500_fraction": 0.5}}
            async with http.put(f"{server.url}/sim/config", json=fault) as resp:
                assert resp.status == 200, await resp.text()
            faulted = time.monotonic()
            result = await asyncio.wait_for(running, PLANNED_S + 10)
        finally:
            await stopped(running)
        ended = time.monotonic()
    # Trace lines are complete once the simulator has stopped.
    served = {json.loads(line)["request_id"] for line in trace.read_text().splitlines()}

    assert result.status == "aborted"
    assert result.stop_reason is not None
    assert "error rate" in result.stop_reason, result.stop_reason
    assert "--abort-error-rate 0.2" in result.stop_reason, result.stop_reason
    # Within seconds of the fault (about one at this rate), long before the plan.
    assert ended - faulted < 5.0, ended - faulted
    assert ended - started < PLANNED_S - 5
    for path in ("summary.json", "run.json"):
        written = read_json(result.path / path)
        assert written["status"] == "aborted"
        assert written["stop_reason"] == result.stop_reason

    records = assert_nothing_lost(result)
    assert max(r["sent_s"] for r in records) - faulted < 5.0
    outcomes = Counter(r["outcome"] for r in records)
    assert outcomes["http_error"] >= 5, outcomes
    assert outcomes["ok"] >= 25, outcomes
    assert set(outcomes) <= {"ok", "http_error", "cancelled"}, outcomes
    # Every request the simulator served was measured.
    assert served <= {r["id"] for r in records}, served - {r["id"] for r in records}


@pytest.mark.asyncio
async def test_a_dead_target_stops_the_run(
    start_sim: Any, tmp_path: Path, poll_until: Callable[..., Any], margin: Margin
) -> None:
    # --abort-error-rate 1 leaves the dead-target rule to trip: otherwise the
    # connection errors pass the error-rate rule first (also a stop, another reason).
    config_fields = {"abort_error_rate": 1.0}
    async with start_sim() as server:
        started = time.monotonic()
        running = asyncio.create_task(
            run(config_for(server.url, tmp_path, **config_fields))
        )
        try:
            await recorded(tmp_path / "runs", 25, poll_until)
            await server.stop()
            killed = time.monotonic()
            result = await asyncio.wait_for(running, PLANNED_S + 10)
        finally:
            await stopped(running)
        ended = time.monotonic()

    assert result.status == "aborted"
    assert result.stop_reason is not None
    assert "stopped answering" in result.stop_reason, result.stop_reason
    # 5 s of nothing but connection errors, then at once.
    margin("end after the kill s", ended - killed, above=4.0, below=9.0)
    assert ended - started < PLANNED_S - 5
    records = assert_nothing_lost(result)
    outcomes = Counter(r["outcome"] for r in records)
    assert outcomes["connect_error"] >= 0.8 * 5 * RATE, outcomes
    assert outcomes["ok"] >= 25, outcomes
    assert read_json(result.path / "run.json")["stop_reason"] == result.stop_reason


# -- cancellation -----------------------------------------------------------------

CANCEL_FRACTION, CANCEL_RATE, CANCEL_S = 0.2, 30.0, 5.0
#: Long answers, cut after a few chunks: a server that kept generating for a client
#: that left would take about 100 steps more for each.
CANCEL_OUTPUT, CANCEL_AFTER = 120, 4


@pytest.mark.asyncio
async def test_cancelled_streams_free_the_servers_slots_and_kv_cache(
    start_sim: Any,
    tmp_path: Path,
    http: aiohttp.ClientSession,
    poll_until: Callable[..., Any],
    scrape: Callable[..., Any],
) -> None:
    trace = tmp_path / "trace.jsonl"
    async with start_sim(trace=str(trace), max_num_seqs=16, speed=0.5) as server:
        before = await scrape(http, server.url)
        assert before.get("vllm:num_requests_running") == 0
        config = config_for(
            server.url,
            tmp_path,
            stages=f"{CANCEL_RATE:g}:{CANCEL_S:g}",
            workload=f"random:prompt=16,output={CANCEL_OUTPUT}",
            ignore_eos=True,
            cancel_fraction=CANCEL_FRACTION,
            cancel_after_tokens=CANCEL_AFTER,
            seed=5,
        )
        result = await run(config)
        records = assert_nothing_lost(result)
        cancelled = [r for r in records if r["outcome"] == "cancelled"]

        async def idle() -> Any:
            now = await scrape(http, server.url)
            settled = (
                now.get("vllm:num_requests_running") == 0
                and now.get("vllm:num_requests_waiting") == 0
                and now.get("vllm:kv_cache_usage_perc") == 0
                and now.get("vllm:request_success_total", finished_reason="abort")
                == len(cancelled)
            )
            return now if settled else None

        after = await poll_until(idle, 5, interval=0.05, what="an idle simulator")
    served = {
        r["request_id"]: r
        for r in (json.loads(line) for line in trace.read_text().splitlines())
    }

    assert result.status == "completed"
    outcomes = Counter(r["outcome"] for r in records)
    assert set(outcomes) == {"ok", "cancelled"}, outcomes
    # About a fifth of the streams were cut (a fair draw: two-sided p > 0.001).
    n = len(records)
    test = stats.binomtest(len(cancelled), n, CANCEL_FRACTION)
    assert test.pvalue > 0.001, (len(cancelled), n)
    # Mid-stream: after the first chunks, long before the end.
    for r in cancelled:
        assert r["first_content_s"] is not None, r
        assert 0 < r["output_tokens"] < CANCEL_OUTPUT // 2, r
    assert all(
        r["output_tokens"] == CANCEL_OUTPUT for r in records if r["outcome"] == "ok"
    )

    # The server saw each cut as an abort, stopped generating for it at once, and
    # counted exactly those.
    assert after.get("vllm:request_success_total", finished_reason="abort") == len(
        cancelled
    )
    assert (
        after.get("vllm:request_success_total", finished_reason="length")
        == (outcomes["ok"])
    )
    for r in cancelled:
        server_side = served[r["id"]]
        assert server_side["finish_reason"] == "abort", server_side
        assert server_side["status"] == 499, server_side
        assert server_side["output_tokens"] < CANCEL_OUTPUT // 2, server_side
        assert server_side["finished_s"] - r["end_s"] < 0.5, (r, server_side)
    assert after.get("vllm:num_requests_running") == 0
    assert after.get("vllm:kv_cache_usage_perc") == 0
