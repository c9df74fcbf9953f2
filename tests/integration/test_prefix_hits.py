"""A ``prefix`` workload meets its hit rate on the simulator's own counters.

The workload is built as a run builds it: the simulator's ``/tokenize`` as the
counter, its block size and cache size from ``vllm:cache_config_info``, and what the
server adds around the content (the chat template) through ``/tokenize``
(:func:`~servemon.loadgen.run.prefixcache.find_prefix_target`). The warm prompts go
first; then 160 requests, 8 at a time, and the deltas of
``vllm:prefix_cache_hits_total`` over ``vllm:prefix_cache_queries_total``. Last, a whole
ramp does the same itself.
"""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import aiohttp
import pytest
from aiohttp import web
from rich.console import Console

from servemon.loadgen.record.columns import HIT_MARGIN, prefix_lines
from servemon.loadgen.run.flat import config_of
from servemon.loadgen.run.plan import make_plan
from servemon.loadgen.run.prefixcache import PrefixTarget, find_prefix_target
from servemon.loadgen.run.progress import Progress
from servemon.loadgen.runner import Stopper, run_load
from servemon.loadgen.workloads.prefix import PrefixWorkload
from servemon.loadgen.workloads.prompts import Prompt
from servemon.loadgen.workloads.tokens import pick_counter
from servemon.loadgen.workloads.workload import (
    build_workload,
    parse_workload,
    request_body,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

REQUESTS = 160
CONCURRENCY = 8


def prefix_counters(metrics: Any) -> tuple[float, float]:
    return (
        metrics.get("vllm:prefix_cache_hits_total"),
        metrics.get("vllm:prefix_cache_queries_total"),
    )


async def send_all(
    http: aiohttp.ClientSession,
    url: str,
    model: str,
    api: Literal["chat", "completions"],
    prompts: Sequence[Prompt],
) -> list[int]:
    """Send ``prompts``, ``CONCURRENCY`` at a time; the prompt tokens of each."""
    gate = asyncio.Semaphore(CONCURRENCY)
    path = "chat/completions" if api == "chat" else "completions"

    async def one(prompt: Prompt) -> int:
        body = request_body(
            prompt, api=api, model=model, stream=False, ignore_eos=True, extra_body=None
        )
        async with gate, http.post(f"{url}/v1/{path}", json=body) as resp:
            assert resp.status == 200, await resp.text()
            usage: int = (await resp.json())["usage"]["prompt_tokens"]
            return usage

    return list(await asyncio.gather(*(one(p) for p in prompts)))


@pytest.mark.parametrize("api", ["completions", "chat"])
@pytest.mark.parametrize("hit", [0.2, 0.5, 0.8])
async def test_the_simulators_counters_show_the_asked_rate(
    start_sim: Any, http: aiohttp.ClientSession, scrape: Any, hit: float, api: str
) -> None:
    assert api in ("chat", "completions")
    kind: Literal["chat", "completions"] = "chat" if api == "chat" else "completions"
    async with start_sim(eos_probability=0.0) as server:
        url, model = server.url, server.model
        counter = await pick_counter(http, url, model, None)
        assert counter.source == "server"
        found = await find_prefix_target(http, url, model, kind, {})
        assert (found.block_size, found.cache_tokens) == (16, 4096 * 16)
        head, tail = (found.overhead_tokens, found.tail_tokens)
        # The chat template: start, role ... end, the reply's start.
        assert (head, tail) == ((2, 2) if kind == "chat" else (0, 0))
        workload = await build_workload(
            parse_workload(f"prefix:hit={hit},prompt=512,groups=4,output=2"),
            counter=counter,
            seed=11,
            **found.build_options(),
        )
        assert isinstance(workload, PrefixWorkload)
        assert abs(workload.expected_hit - hit) < 0.03
        await send_all(http, url, model, kind, workload.warm)
        hits_before, queries_before = prefix_counters(await scrape(http, url))
        counted = await send_all(
            http, url, model, kind, [workload.prompt(i) for i in range(REQUESTS)]
        )
        hits, queries = prefix_counters(await scrape(http, url))
    assert set(counted) == {512 + head + tail}
    assert queries - queries_before == REQUESTS * (512 + head + tail)
    measured = (hits - hits_before) / (queries - queries_before)
    print(f"hit={hit} api={api}: measured {measured:.4f}")  # noqa: T201
    assert abs(measured - hit) <= 0.03
    assert measured == pytest.approx(workload.expected_hit, abs=1e-9)


async def test_a_ramp_reads_the_engine_warms_the_groups_and_meets_the_rate(
    start_sim: Any, http: aiohttp.ClientSession, scrape: Any, tmp_path: Path
) -> None:
    async with start_sim(eos_probability=0.0) as server:
        flags = {
            "target": server.url,
            "out": str(tmp_path / "runs"),
            "metrics_port": 0,
            "timeout": 20.0,
            "grace": 1.0,
            "workload": "prefix:hit=0.5,prompt=512,groups=4,output=2",
            "stages": "100:3",
            "arrival": "constant",
            "max_requests": REQUESTS,
        }
        config = config_of("ramp", ("test", flags))
        result = await run_load(
            make_plan("ramp", config),
            config,
            server.url,
            argv=["servemon", "ramp", "(test)"],
            stop=Stopper(),
            env={},
            progress=Progress(Console(file=io.StringIO()), live=False),
        )
        hits, queries = prefix_counters(await scrape(http, server.url))
    recorded = json.loads((result.path / "run.json").read_text())["workload"]
    assert recorded["block_size"] == 16
    assert recorded["block_source"] == "cache_config_info"
    assert recorded["cache_tokens"] == 4096 * 16
    assert (recorded["overhead_tokens"], recorded["tail_tokens"]) == (2, 2)
    assert recorded["overhead_source"] == "tokenize"
    lines = (result.path / "requests.jsonl").read_text().splitlines()
    assert len(lines) == REQUESTS  # the warm prompts are not recorded
    # The four warm prompts went first and hit nothing; the requests hit as planned.
    assert queries == (REQUESTS + 4) * 516
    measured = hits / (REQUESTS * 516)
    assert measured == pytest.approx(recorded["expected_hit"], abs=1e-6)
    assert abs(measured - 0.5) <= 0.03
    # The run measured it too, from the samples of the server's counters around
    # the stage, and its end lines say so without a warning.
    (stage,) = result.record.stages
    assert stage.server_hit_rate is not None
    assert abs(stage.server_hit_rate - 0.5) <= HIT_MARGIN
    shown, missed = prefix_lines(result.info.workload, result.record)
    assert "asked 0.5" in shown[0]
    assert missed == []


async def test_an_engine_that_says_nothing_gets_vllms_block_and_no_overhead(
    http: aiohttp.ClientSession,
) -> None:
    async def nothing(request: web.Request) -> web.Response:
        return web.Response(status=404)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", nothing)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        found = await find_prefix_target(http, f"http://{host}:{port}", "m", "chat", {})
    finally:
        await runner.cleanup()
    assert found == PrefixTarget(
        block_size=16,
        cache_tokens=None,
        overhead_tokens=0,
        tail_tokens=0,
        block_source="default",
        overhead_source="none",
    )
