"""Engine dynamics seen from outside: queueing, KV usage, prefix hits, preemption,
aborts, all through ``/metrics`` while requests are in flight."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

pytestmark = pytest.mark.integration

LABELS = {"model_name": "sim-tiny", "engine": "0"}


async def stream_chat(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any], read_sse: Any
) -> list[dict[str, Any]]:
    async with http.post(f"{url}/v1/chat/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        stream = await read_sse(resp)
    assert stream.done, stream.error
    return stream.chunks()


async def complete(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any]
) -> dict[str, Any]:
    async with http.post(f"{url}/v1/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        reply: dict[str, Any] = await resp.json()
        return reply


@pytest.mark.asyncio
async def test_a_full_batch_queues_requests_then_drains(
    start_sim: Any,
    http: aiohttp.ClientSession,
    scrape: Any,
    poll_until: Any,
    read_sse: Any,
    chat: Any,
) -> None:
    async with start_sim(max_num_seqs=4) as server:
        url = server.url
        seen_running: list[float] = []

        async def queued() -> bool:
            metrics = await scrape(http, url)
            seen_running.append(metrics.get("vllm:num_requests_running", **LABELS))
            return metrics.get("vllm:num_requests_waiting", **LABELS) > 0

        body = chat("count with me", max_tokens=60, ignore_eos=True, stream=True)
        async with asyncio.TaskGroup() as tg:
            tasks = [
                tg.create_task(stream_chat(http, url, body, read_sse))
                for _ in range(16)
            ]
            await poll_until(queued, timeout=5, what="requests waiting")
        assert max(seen_running) <= 4
        assert all(len(t.result()) == 61 for t in tasks)  # role + 60 tokens

        async def drained() -> bool:
            metrics = await scrape(http, url)
            return (
                metrics.get("vllm:num_requests_waiting", **LABELS) == 0
                and metrics.get("vllm:num_requests_running", **LABELS) == 0
            )

        await poll_until(drained, timeout=2, what="queue drained")
        metrics = await scrape(http, url)
        assert metrics.get("vllm:request_success_total", finished_reason="length") == 16
        # Queueing shows in the queue-time histogram: some waited a whole batch.
        assert metrics.get("vllm:request_queue_time_seconds_count") == 16
        assert metrics.get("vllm:request_queue_time_seconds_sum") > 0.05


@pytest.mark.asyncio
async def test_kv_usage_rises_with_load_and_returns_to_zero(
    start_sim: Any,
    http: aiohttp.ClientSession,
    scrape: Any,
    poll_until: Any,
    make_prompt: Any,
) -> None:
    # 256 blocks of 16 tokens; each request holds at least 13 blocks (200 tokens).
    async with start_sim(num_gpu_blocks=256) as server:
        url = server.url

        async def usage() -> float:
            metrics = await scrape(http, url)
            value: float = metrics.get("vllm:kv_cache_usage_perc", **LABELS)
            return value

        assert await usage() == 0.0

        def body(i: int) -> dict[str, Any]:
            return {
                "prompt": make_prompt(200, 1000 * i),
                "max_tokens": 150,
                "ignore_eos": True,
            }

        single = asyncio.create_task(complete(http, url, body(0)))
        one = await poll_until(usage, timeout=5, what="usage of one request")
        assert 13 / 256 <= one <= 22 / 256  # 200 to 350 tokens
        await single
        await poll_until(lambda: server.engine.pool.usage() == 0.0, timeout=2)

        async with asyncio.TaskGroup() as tg:
            for i in range(1, 9):
                tg.create_task(complete(http, url, body(i)))

            async def loaded() -> float | None:
                value = await usage()
                return value if value >= 8 * 13 / 256 else None

            heavy = await poll_until(loaded, timeout=5, what="usage under load")
        assert heavy > 4 * one

        async def idle() -> bool:
            return await usage() == 0.0

        await poll_until(idle, timeout=2, what="usage back to zero")
        # The blocks are free but their prefixes are still cached.
        assert server.engine.pool.num_cached > 0


@pytest.mark.asyncio
async def test_repeating_a_long_prompt_raises_prefix_hits(
    start_sim: Any, http: aiohttp.ClientSession, scrape: Any, make_prompt: Any
) -> None:
    prompt = make_prompt(500)
    async with start_sim() as server:
        await complete(http, server.url, {"prompt": prompt, "max_tokens": 2})
        first = await scrape(http, server.url)
        assert first.get("vllm:prefix_cache_hits_total", **LABELS) == 0
        assert first.get("vllm:prefix_cache_queries_total", **LABELS) == 500
        for _ in range(3):
            await complete(http, server.url, {"prompt": prompt, "max_tokens": 2})
        after = await scrape(http, server.url)
    # 31 full blocks of 16 tokens hit each time (the last token is recomputed).
    assert after.get("vllm:prefix_cache_hits_total", **LABELS) == 3 * 31 * 16
    assert after.get("vllm:prefix_cache_queries_total", **LABELS) == 4 * 500


@pytest.mark.asyncio
async def test_without_prefix_caching_there_are_no_hits(
    start_sim: Any, http: aiohttp.ClientSession, scrape: Any, make_prompt: Any
) -> None:
    prompt = make_prompt(500)
    async with start_sim(enable_prefix_caching=False) as server:
        for _ in range(3):
            await complete(http, server.url, {"prompt": prompt, "max_tokens": 2})
        metrics = await scrape(http, server.url)
    assert metrics.get("vllm:prefix_cache_hits_total", **LABELS) == 0
    assert metrics.get("vllm:request_success_total", finished_reason="length") == 3
    (info,) = metrics.labels_of("vllm:cache_config_info")
    assert info["enable_prefix_caching"] == "False"


@pytest.mark.asyncio
async def test_a_tiny_block_pool_forces_preemptions_and_all_finish(
    start_sim: Any,
    http: aiohttp.ClientSession,
    scrape: Any,
    read_sse: Any,
    chat: Any,
    contents: Any,
    make_prompt: Any,
) -> None:
    # 24 blocks of 16 tokens; six requests each grow to 20 + 4 + 150 tokens
    # (11 blocks), so they cannot all stay.
    async with start_sim(num_gpu_blocks=24, block_size=16) as server:
        url = server.url
        bodies = [
            chat(make_prompt(20, 100 * i), max_tokens=150, ignore_eos=True, stream=True)
            for i in range(6)
        ]
        async with asyncio.TaskGroup() as tg:
            tasks = [
                tg.create_task(stream_chat(http, url, body, read_sse))
                for body in bodies
            ]
        for task in tasks:
            chunks = task.result()
            assert len("".join(contents(chunks)).split()) == 150
            assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        metrics = await scrape(http, url)
    assert metrics.get("vllm:num_preemptions_total", **LABELS) > 0
    assert metrics.get("vllm:request_success_total", finished_reason="length") == 6
    assert metrics.get("vllm:request_success_total", finished_reason="abort") == 0
    assert metrics.get("vllm:kv_cache_usage_perc", **LABELS) == 0.0
    assert metrics.get("vllm:generation_tokens_total", **LABELS) >= 6 * 150


@pytest.mark.asyncio
async def test_a_disconnected_stream_frees_its_blocks_at_once(
    start_sim: Any,
    http: aiohttp.ClientSession,
    scrape: Any,
    poll_until: Any,
    chat: Any,
    make_prompt: Any,
) -> None:
    # A slow engine (a step of about 10 ms) and 2000 tokens to go: natural
    # completion would take about 20 s, so usage back to 0 within 1 s is the abort.
    async with start_sim(speed=0.1) as server:
        url = server.url
        body = chat(make_prompt(100), max_tokens=2000, ignore_eos=True, stream=True)
        resp = await http.post(f"{url}/v1/chat/completions", json=body)
        try:
            assert resp.status == 200
            received = 0
            async for line in resp.content:
                if line.startswith(b"data: ") and b'"content":" ' in line:
                    received += 1
                if received >= 3:
                    break
            metrics = await scrape(http, url)
            assert metrics.get("vllm:kv_cache_usage_perc", **LABELS) > 0
            assert metrics.get("vllm:num_requests_running", **LABELS) == 1
        finally:
            resp.close()  # drop the connection mid-stream

        async def freed() -> bool:
            metrics = await scrape(http, url)
            return (
                metrics.get("vllm:kv_cache_usage_perc", **LABELS) == 0.0
                and metrics.get("vllm:request_success_total", finished_reason="abort")
                == 1
            )

        await poll_until(freed, timeout=1.0, what="blocks freed by the abort")
        metrics = await scrape(http, url)
        assert metrics.get("vllm:num_requests_running", **LABELS) == 0
        assert metrics.get("vllm:request_success_total", finished_reason="length") == 0
        assert metrics.get("vllm:generation_tokens_total", **LABELS) < 200
