"""Faults a run survives, in-process against the simulator over real sockets (the
ones that stop a run, and what the terminal shows, are in tests/e2e/test_faults.py).

A target restarted mid-run (the same port: its connections reset, its counters back
at 0, its ``/metrics`` answering 503 for a while after) costs the requests it cut
and those sent while it was away, each with its outcome and a one-line error; the
run goes on, and the sampler records the gap and the reset as they were.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest

from servemon.core import names
from servemon.simulator.config import SimConfig, merge
from servemon.simulator.server import SimServer
from tests.support.runs import config_for, run

pytestmark = pytest.mark.integration

PROMPT_TOKENS = names.ENGINE_PROMPT_TOKENS.name


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def lines_of(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    text = path.read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.endswith("}")]


def prompt_tokens(line: dict[str, Any]) -> float:
    return sum(v for n, _l, v in line.get("samples", []) if n == PROMPT_TOKENS)


@pytest.mark.asyncio
async def test_a_target_restarted_mid_run_costs_only_the_requests_it_cut(
    tmp_path: Path, http: aiohttp.ClientSession, poll_until: Callable[..., Any]
) -> None:
    # Streams of a few seconds (200 tokens at speed 0.05), so that some are in flight
    # past the server's 1 s shutdown grace and get cut.
    sim = merge(
        SimConfig(host="127.0.0.1", port=free_port(), profile="tiny"),
        {"speed": 0.05},
        "test",
    )
    # The error-rate rail judges a restart by its share of the last 10 s, which
    # depends on the rate; left at 1 here, the dead-target rail (5 s of nothing but
    # connection errors) is the one a short restart must not trip.
    config = config_for(
        SimpleNamespace(url=f"http://127.0.0.1:{sim.port}"),
        tmp_path,
        stages="10:16",
        workload="random:prompt=16,output=200",
        ignore_eos=True,
        abort_error_rate=1.0,
        sample_interval=0.2,
    )
    out = tmp_path / "runs"

    def requests() -> list[dict[str, Any]]:
        return [x for p in out.glob("*/requests.jsonl") for x in lines_of(p)]

    def samples() -> list[dict[str, Any]]:
        return [x for p in out.glob("*/server_metrics.jsonl") for x in lines_of(p)]

    first = SimServer(sim)
    await first.start()
    running = asyncio.create_task(run("ramp", config))
    second: SimServer | None = None
    try:
        await poll_until(lambda: len(requests()) >= 10, 20, what="10 requests")
        await poll_until(
            lambda: prompt_tokens((samples() or [{}])[-1]) > 0, 10, what="a sample"
        )
        await first.stop()  # what a restart does first: every connection goes
        await poll_until(
            lambda: any(r["outcome"] == "connect_error" for r in requests()),
            10,
            what="a refused request",
        )
        second = SimServer(sim)  # the same port, every counter at 0
        await second.start()
        restarted_at = time.monotonic()
        fault = {"faults": {"metrics": "503"}}  # /metrics not ready yet
        async with http.put(f"{second.url}/sim/config", json=fault) as resp:
            assert resp.status == 200, await resp.text()
        await poll_until(
            lambda: any("503" in s.get("error", "") for s in samples()),
            10,
            what="a 503 from /metrics",
        )
        fault = {"faults": {"metrics": "ok"}}
        async with http.put(f"{second.url}/sim/config", json=fault) as resp:
            assert resp.status == 200, await resp.text()
        result = await asyncio.wait_for(running, 60)
    finally:
        if not running.done():
            running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        for server in (first, second):
            if server is not None:
                await server.stop()

    assert result.status == "completed", result.stop_reason
    got = lines_of(result.path / "requests.jsonl")
    summary = json.loads((result.path / "summary.json").read_text())
    outcomes = Counter(r["outcome"] for r in got)
    assert summary["overall"]["requests"] == len(got)
    assert summary["overall"]["outcomes"] == dict(outcomes)
    assert set(outcomes) <= {"ok", "connect_error", "stream_error"}, outcomes
    assert outcomes["connect_error"] >= 1, outcomes  # sent while it was away
    assert outcomes["stream_error"] >= 1, outcomes  # in flight when it went
    assert outcomes["ok"] > outcomes["connect_error"] + outcomes["stream_error"]
    for r in got:
        if r["outcome"] != "ok":
            assert r["error"], r
            assert "\n" not in r["error"], r
    # Sent after the restart (and its first connection), every request was served.
    late = [r for r in got if r["sent_s"] > restarted_at + 0.5]
    assert late
    assert {r["outcome"] for r in late} == {"ok"}, Counter(r["outcome"] for r in late)

    sampled = lines_of(result.path / "server_metrics.jsonl")
    errors = [s["error"] for s in sampled if "error" in s]
    assert any("ClientConnectorError" in e for e in errors), errors  # away
    assert "ValueError: HTTP 503" in errors, errors  # back, not ready
    # The counter reset shows as it happened: values fall back, then grow again.
    tokens = [prompt_tokens(s) for s in sampled if "samples" in s]
    fall = next(i for i in range(1, len(tokens)) if tokens[i] < tokens[i - 1])
    assert tokens[-1] > tokens[fall]
