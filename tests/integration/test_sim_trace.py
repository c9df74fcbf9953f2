"""The ground-truth trace: one JSON line per request with server-side monotonic times
that a client on the same machine can check its own observations against."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

pytestmark = pytest.mark.integration

CHAT_OVERHEAD = 4
SLACK_S = 0.01
FIELDS = {
    "request_id",
    "arrival_s",
    "scheduled_s",
    "first_token_s",
    "token_s",
    "finished_s",
    "finish_reason",
    "prompt_tokens",
    "cached_tokens",
    "output_tokens",
    "status",
    "queued_s",
    "engine_first_token_s",
    "engine_last_token_s",
}


def read_trace(path: Path) -> dict[str, dict[str, Any]]:
    records = [json.loads(line) for line in path.read_text().splitlines()]
    by_id = {r["request_id"]: r for r in records}
    assert len(by_id) == len(records), "one line per request"
    return by_id


def assert_ordered(record: dict[str, Any]) -> None:
    times = [
        record["arrival_s"],
        record["scheduled_s"],
        record["first_token_s"],
        *record["token_s"],
        record["finished_s"],
    ]
    assert times == sorted(times), record
    assert record["first_token_s"] == record["token_s"][0]


@pytest.mark.asyncio
async def test_each_request_writes_one_ordered_line_bracketed_by_the_client(
    tmp_path: Path,
    start_sim: Any,
    http: aiohttp.ClientSession,
    read_sse: Any,
    chat: Any,
    make_prompt: Any,
) -> None:
    trace = tmp_path / "trace.jsonl"
    prompt = make_prompt(100)  # 104 tokens with the chat template: 6 full blocks
    seen: dict[str, tuple[float, float, int]] = {}
    async with start_sim(trace=str(trace)) as server:
        for i, max_tokens in enumerate((8, 12, 5)):
            request_id = f"trace-{i}"
            body = chat(prompt, max_tokens=max_tokens, ignore_eos=True, stream=True)
            sent = time.monotonic()
            async with http.post(
                f"{server.url}/v1/chat/completions",
                json=body,
                headers={"X-Request-Id": request_id},
            ) as resp:
                stream = await read_sse(resp)
            assert stream.done
            first_content = next(
                e
                for e in stream.events[1:]
                if e.json()["choices"][0]["delta"]["content"]
            )
            seen[request_id] = (sent, first_content.at, max_tokens)
    records = read_trace(trace)
    assert set(records) == set(seen)
    for request_id, (sent, received, max_tokens) in seen.items():
        record = records[request_id]
        assert set(record) == FIELDS
        assert_ordered(record)
        assert len(record["token_s"]) == record["output_tokens"] == max_tokens
        assert record["prompt_tokens"] == 100 + CHAT_OVERHEAD
        assert record["finish_reason"] == "length"
        assert record["status"] == 200
        # Both sides read CLOCK_MONOTONIC: the server's times fall inside the
        # client's observations.
        assert sent <= record["arrival_s"]
        assert sent < record["first_token_s"] <= received + SLACK_S
    assert records["trace-0"]["cached_tokens"] == 0
    # Repeats of the prompt reuse its 6 full blocks (the last token recomputed).
    assert records["trace-1"]["cached_tokens"] == 96
    assert records["trace-2"]["cached_tokens"] == 96


@pytest.mark.asyncio
async def test_non_streaming_and_generated_ids_are_traced(
    tmp_path: Path, start_sim: Any, http: aiohttp.ClientSession
) -> None:
    trace = tmp_path / "sub" / "trace.jsonl"
    async with start_sim(trace=str(trace)) as server:
        sent = time.monotonic()
        async with http.post(
            f"{server.url}/v1/completions",
            json={"prompt": "one two three", "max_tokens": 6, "ignore_eos": True},
        ) as resp:
            assert resp.status == 200
            generated = resp.headers["X-Request-Id"]
            await resp.read()
        received = time.monotonic()
    (record,) = read_trace(trace).values()
    assert record["request_id"] == generated
    assert_ordered(record)
    assert record["output_tokens"] == len(record["token_s"]) == 6
    assert record["prompt_tokens"] == 3
    assert sent <= record["arrival_s"]
    assert record["finished_s"] <= received


@pytest.mark.asyncio
async def test_a_disconnected_request_is_traced_as_an_abort(
    tmp_path: Path,
    start_sim: Any,
    http: aiohttp.ClientSession,
    poll_until: Any,
    chat: Any,
) -> None:
    trace = tmp_path / "trace.jsonl"
    async with start_sim(trace=str(trace), speed=0.1) as server:
        body = chat("hi", max_tokens=2000, ignore_eos=True, stream=True)
        resp = await http.post(
            f"{server.url}/v1/chat/completions",
            json=body,
            headers={"X-Request-Id": "gone"},
        )
        try:
            chunks = 0
            async for line in resp.content:
                chunks += line.startswith(b"data: ")
                if chunks >= 3:  # the role chunk and two tokens
                    break
        finally:
            resp.close()
        await poll_until(
            lambda: trace.exists() and trace.read_text(), timeout=2, what="trace line"
        )
    record = read_trace(trace)["gone"]
    assert record["finish_reason"] == "abort"
    assert record["status"] == 499
    assert 2 <= len(record["token_s"]) <= record["output_tokens"] < 2000
    assert_ordered(record)
