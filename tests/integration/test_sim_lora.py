"""Several model names and LoRA adapters, over real sockets.

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
