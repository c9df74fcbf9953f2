"""Several model names, LoRA adapters and reasoning, over real sockets.

What vLLM does, as its sources say: ``/v1/models`` lists every served name and then
every adapter (``parent``: the first name); a model it does not serve is a 404
``NotFoundError``; the answer names the first served name, or the adapter; with
``--max-loras 1`` a request for a second adapter waits while the first runs, which
``vllm:lora_requests_info`` shows in its newest sample (value: wall-clock time).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

LORA = {
    "served_model_name": ["base", "alias"],
    "lora_modules": ["sql=/adapters/sql", "chat"],
}


def chat(model: str | None = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": 6,
        **extra,
    }
    if model is not None:
        body["model"] = model
    return body


def newest_lora_info(scraped: Any) -> dict[str, str] | None:
    """The labels of the newest ``vllm:lora_requests_info`` sample (none before the
    engine's first step, as vLLM records it once a step)."""
    stamped = [
        (value, dict(labels))
        for (name, labels), value in scraped.samples.items()
        if name == "vllm:lora_requests_info"
    ]
    return max(stamped, key=lambda pair: pair[0])[1] if stamped else None


async def test_models_lists_every_name_then_every_adapter(
    start_sim: Any, http: aiohttp.ClientSession
) -> None:
    async with (
        start_sim(**LORA) as server,
        http.get(f"{server.url}/v1/models") as resp,
    ):
        cards = (await resp.json())["data"]
    assert [(c["id"], c["root"], c["parent"]) for c in cards] == [
        ("base", "sim-tiny", None),
        ("alias", "sim-tiny", None),
        ("sql", "sql", "base"),
        ("chat", "chat", "base"),
    ]
    assert cards[0]["max_model_len"] == 4096
    assert cards[2]["max_model_len"] is None


async def test_each_name_is_answered_and_an_unknown_one_is_404(
    start_sim: Any, http: aiohttp.ClientSession
) -> None:
    async with start_sim(**LORA) as server:
        url = f"{server.url}/v1/chat/completions"
        for asked, answered in [
            ("base", "base"),
            ("alias", "base"),  # vLLM answers with the first name
            ("sql", "sql"),
            (None, "base"),
        ]:
            async with http.post(url, json=chat(asked)) as resp:
                assert resp.status == 200, await resp.text()
                assert (await resp.json())["model"] == answered
        async with http.post(url, json=chat("nope")) as resp:
            assert resp.status == 404
            assert await resp.json() == {
                "error": {
                    "message": "The model `nope` does not exist.",
                    "type": "NotFoundError",
                    "param": "model",
                    "code": 404,
                }
            }


async def test_no_lora_info_without_adapters(
    start_sim: Any, http: aiohttp.ClientSession, scrape: Any
) -> None:
    async with start_sim() as server:
        async with http.post(f"{server.url}/v1/chat/completions", json=chat()):
            pass
        scraped = await scrape(http, server.url)
    assert "vllm:lora_requests_info" not in scraped.types


@pytest.mark.parametrize("dialect", ["vllm", "vllm-0.10", "vllm-0.8", "vllm-v0"])
async def test_with_max_loras_one_the_second_adapter_waits(
    dialect: str,
    start_sim: Any,
    http: aiohttp.ClientSession,
    scrape: Any,
    poll_until: Any,
) -> None:
    async with start_sim(**LORA, metrics_dialect=dialect, speed=0.25) as server:
        url = f"{server.url}/v1/chat/completions"
        long = {"max_tokens": 400, "ignore_eos": True}
        first = asyncio.create_task(http.post(url, json=chat("sql", **long)))

        async def running(name: str) -> dict[str, str] | None:
            scraped = await scrape(http, server.url)
            assert "vllm:lora_requests_info" in scraped.types  # with LoRA: always
            info = newest_lora_info(scraped)
            return info if info and info["running_lora_adapters"] == name else None

        await poll_until(lambda: running("sql"), 10, what="sql running")
        second = asyncio.create_task(http.post(url, json=chat("chat", **long)))

        async def both() -> dict[str, str] | None:
            info = await running("sql")
            return info if info and info["waiting_lora_adapters"] == "chat" else None

        info = await poll_until(both, 10, what="chat waiting behind sql")
        assert info == {
            "max_lora": "1",
            "running_lora_adapters": "sql",
            "waiting_lora_adapters": "chat",
        }
        scraped = await scrape(http, server.url)
        assert scraped.types["vllm:lora_requests_info"] == "gauge"
        stamps = [v for (n, _), v in scraped.samples.items() if "lora" in n]
        assert max(stamps) == pytest.approx(time.time(), abs=30)
        for task in (first, second):  # the client goes: both are aborted
            task.cancel()
        await asyncio.gather(first, second, return_exceptions=True)


async def reasoning_stream(
    http: aiohttp.ClientSession, url: str, read_sse: Any, **body: Any
) -> list[dict[str, Any]]:
    payload = chat(
        stream=True,
        stream_options={"include_usage": True},
        ignore_eos=True,
        **body,
    )
    async with http.post(f"{url}/v1/chat/completions", json=payload) as resp:
        assert resp.status == 200, await resp.text()
        stream = await read_sse(resp)
    chunks: list[dict[str, Any]] = stream.chunks()
    return chunks


@pytest.mark.parametrize(
    ("config", "keys"),
    [
        ({}, ["reasoning_content"]),
        ({"reasoning_field": "reasoning"}, ["reasoning"]),
        ({"reasoning_field": "both"}, ["reasoning", "reasoning_content"]),
        ({"dialect": "llamacpp"}, ["reasoning_content"]),
    ],
)
async def test_reasoning_comes_first_in_its_own_delta_field(
    config: dict[str, Any],
    keys: list[str],
    start_sim: Any,
    http: aiohttp.ClientSession,
    read_sse: Any,
) -> None:
    async with start_sim(reasoning_tokens="3", **config) as server:
        chunks = await reasoning_stream(http, server.url, read_sse, max_tokens=7)
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    thinking = [d for d in deltas if any(k in d for k in keys)]
    answer = [d for d in deltas if d.get("content")]
    assert len(thinking) == 3
    assert len(answer) == 4
    assert deltas.index(thinking[-1]) < deltas.index(answer[0])
    for delta in thinking:
        assert {delta[k] for k in keys} == {delta[keys[0]]}  # both say the same
        assert "content" not in delta
    usage = chunks[-1]["usage"]
    assert usage["completion_tokens"] == 7  # reasoning counts, as vLLM's
    assert "completion_tokens_details" not in usage  # vLLM does not report it


async def test_usage_can_report_reasoning_tokens(
    start_sim: Any, http: aiohttp.ClientSession, read_sse: Any
) -> None:
    async with start_sim(reasoning_tokens="2:5", reasoning_usage=True) as server:
        chunks = await reasoning_stream(http, server.url, read_sse, max_tokens=9)
        async with http.post(
            f"{server.url}/v1/chat/completions",
            json=chat(max_tokens=9, ignore_eos=True),
        ) as resp:
            whole = await resp.json()
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    thought = sum(1 for d in deltas if "reasoning_content" in d)
    usage = chunks[-1]["usage"]
    assert 2 <= thought <= 5
    assert usage["completion_tokens"] == 9
    assert usage["completion_tokens_details"] == {"reasoning_tokens": thought}
    message = whole["choices"][0]["message"]
    reasoned = whole["usage"]["completion_tokens_details"]["reasoning_tokens"]
    assert 2 <= reasoned <= 5
    assert len(message["reasoning_content"].split()) == reasoned
    assert len(message["content"].split()) == 9 - reasoned


async def test_an_answer_that_is_all_reasoning_has_no_content(
    start_sim: Any, http: aiohttp.ClientSession
) -> None:
    async with (
        start_sim(reasoning_tokens="10", reasoning_field="reasoning") as server,
        http.post(f"{server.url}/v1/chat/completions", json=chat(max_tokens=4)) as resp,
    ):
        choice = (await resp.json())["choices"][0]
    assert choice["message"]["content"] is None
    assert len(choice["message"]["reasoning"].split()) == 4
    assert choice["finish_reason"] == "length"


async def test_a_completion_has_its_reasoning_as_plain_text(
    start_sim: Any, http: aiohttp.ClientSession
) -> None:
    async with (
        start_sim(reasoning_tokens="3", reasoning_usage=True) as server,
        http.post(
            f"{server.url}/v1/completions",
            json={"prompt": "x", "max_tokens": 5, "ignore_eos": True},
        ) as resp,
    ):
        body = await resp.json()
    assert len(body["choices"][0]["text"].split()) == 5
    assert "completion_tokens_details" not in body["usage"]
