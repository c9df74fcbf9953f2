"""The simulator's OpenAI-compatible API over real HTTP on 127.0.0.1."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

pytestmark = pytest.mark.integration

MODEL = "sim-tiny"
CHAT_OVERHEAD = 4  # chat template tokens around one user message


@pytest.mark.asyncio
async def test_streaming_chat_sends_role_content_usage_then_done(
    start_sim: Any, http: aiohttp.ClientSession, read_sse: Any, chat: Any
) -> None:
    body = chat(
        "hello there",
        max_tokens=12,
        ignore_eos=True,
        stream=True,
        stream_options={"include_usage": True},
    )
    async with (
        start_sim() as server,
        http.post(
            f"{server.url}/v1/chat/completions",
            json=body,
            headers={"X-Request-Id": "req-42"},
        ) as resp,
    ):
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        assert resp.headers["X-Request-Id"] == "req-42"
        stream = await read_sse(resp)
    assert stream.error is None
    assert stream.done
    assert stream.events[-1].data == "[DONE]"
    chunks = stream.chunks()
    role, *content, usage = chunks
    for chunk in chunks:
        assert chunk["id"] == "chatcmpl-req-42"
        assert chunk["object"] == "chat.completion.chunk"
        assert chunk["model"] == MODEL
    assert role["choices"] == [
        {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
    ]
    # One token per content chunk at low load with the tiny profile.
    assert len(content) == 12
    pieces = []
    for chunk in content:
        (choice,) = chunk["choices"]
        assert set(choice["delta"]) == {"content"}
        pieces.append(choice["delta"]["content"])
    assert all(len(p.split()) == 1 and p.startswith(" ") for p in pieces)
    reasons = [c["choices"][0]["finish_reason"] for c in content]
    assert reasons == [None] * 11 + ["length"]
    assert usage["choices"] == []
    assert usage["usage"] == {
        "prompt_tokens": 2 + CHAT_OVERHEAD,
        "completion_tokens": 12,
        "total_tokens": 2 + CHAT_OVERHEAD + 12,
    }
    assert len("".join(pieces).split()) == usage["usage"]["completion_tokens"]


@pytest.mark.asyncio
async def test_streaming_without_include_usage_has_no_usage_chunk(
    start_sim: Any, http: aiohttp.ClientSession, read_sse: Any, chat: Any
) -> None:
    body = chat("hi", max_tokens=5, ignore_eos=True, stream=True)
    async with (
        start_sim() as server,
        http.post(f"{server.url}/v1/chat/completions", json=body) as resp,
    ):
        stream = await read_sse(resp)
    assert stream.done
    chunks = stream.chunks()
    assert all(c["choices"] for c in chunks)
    assert all("usage" not in c for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    # Without X-Request-Id the server makes one up and still returns it.
    assert chunks[0]["id"] == "chatcmpl-" + resp.headers["X-Request-Id"]
    assert len(resp.headers["X-Request-Id"]) >= 16


@pytest.mark.asyncio
async def test_streaming_completions(
    start_sim: Any,
    http: aiohttp.ClientSession,
    read_sse: Any,
    contents: Any,
    make_prompt: Any,
) -> None:
    body = {
        "model": MODEL,
        "prompt": make_prompt(20),
        "max_tokens": 9,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with (
        start_sim() as server,
        http.post(
            f"{server.url}/v1/completions", json=body, headers={"X-Request-Id": "c1"}
        ) as resp,
    ):
        assert resp.status == 200
        stream = await read_sse(resp)
    assert stream.done
    *content, usage = stream.chunks()
    assert len(content) == 9  # no role chunk on the completions API
    for chunk in content:
        assert chunk["id"] == "cmpl-c1"
        assert chunk["object"] == "text_completion"
        assert set(chunk["choices"][0]) == {
            "index",
            "text",
            "logprobs",
            "finish_reason",
        }
    assert content[-1]["choices"][0]["finish_reason"] == "length"
    assert usage["usage"]["prompt_tokens"] == 20
    assert usage["usage"]["completion_tokens"] == 9
    assert len("".join(contents(content)).split()) == 9


@pytest.mark.asyncio
async def test_non_streaming_chat_and_completions(
    start_sim: Any, http: aiohttp.ClientSession, chat: Any, make_prompt: Any
) -> None:
    async with start_sim() as server:
        async with http.post(
            f"{server.url}/v1/chat/completions",
            json=chat(make_prompt(30), model=MODEL, max_tokens=7),
            headers={"X-Request-Id": "whole-1"},
        ) as resp:
            assert resp.status == 200
            assert resp.headers["X-Request-Id"] == "whole-1"
            reply = await resp.json()
        assert reply["id"] == "chatcmpl-whole-1"
        assert reply["object"] == "chat.completion"
        (choice,) = reply["choices"]
        assert choice["message"]["role"] == "assistant"
        assert choice["finish_reason"] == "length"
        assert len(choice["message"]["content"].split()) == 7
        assert reply["usage"] == {
            "prompt_tokens": 30 + CHAT_OVERHEAD,
            "completion_tokens": 7,
            "total_tokens": 30 + CHAT_OVERHEAD + 7,
        }

        async with http.post(
            f"{server.url}/v1/completions",
            json={"prompt": [5, 6, 7, 8], "max_tokens": 3},
        ) as resp:
            assert resp.status == 200
            reply = await resp.json()
        assert reply["object"] == "text_completion"
        assert reply["id"].startswith("cmpl-")
        (choice,) = reply["choices"]
        assert len(choice["text"].split()) == 3
        assert reply["usage"]["prompt_tokens"] == 4
        assert reply["usage"]["completion_tokens"] == 3

        # Re-tokenizing the generated text gives back the reported count.
        async with http.post(
            f"{server.url}/tokenize", json={"prompt": choice["text"]}
        ) as resp:
            assert (await resp.json())["count"] == 3


@pytest.mark.asyncio
async def test_models_health_version_tokenize(
    start_sim: Any, http: aiohttp.ClientSession, chat: Any
) -> None:
    async with start_sim(max_model_len=2048) as server:
        async with http.get(f"{server.url}/v1/models") as resp:
            assert resp.status == 200
            models = await resp.json()
        assert models["object"] == "list"
        (card,) = models["data"]
        assert card["id"] == MODEL
        assert card["object"] == "model"
        assert card["max_model_len"] == 2048

        async with http.get(f"{server.url}/health") as resp:
            assert resp.status == 200

        async with http.get(f"{server.url}/version") as resp:
            assert resp.status == 200
            assert (await resp.json())["version"] == "0.11.0"

        async with http.post(
            f"{server.url}/tokenize", json={"prompt": "Hello, world! foo"}
        ) as resp:
            assert resp.status == 200
            tokenized = await resp.json()
        assert tokenized["count"] == 5
        assert len(tokenized["tokens"]) == 5
        assert tokenized["max_model_len"] == 2048

        async with http.post(
            f"{server.url}/tokenize", json=chat("one two three")
        ) as resp:
            assert (await resp.json())["count"] == 3 + CHAT_OVERHEAD


@pytest.mark.asyncio
async def test_served_model_name(start_sim: Any, http: aiohttp.ClientSession) -> None:
    async with start_sim(served_model_name="my/model") as server:
        async with http.get(f"{server.url}/v1/models") as resp:
            assert [m["id"] for m in (await resp.json())["data"]] == ["my/model"]
        async with http.post(
            f"{server.url}/v1/completions",
            json={"model": "my/model", "prompt": "x", "max_tokens": 1},
        ) as resp:
            assert resp.status == 200
            assert (await resp.json())["model"] == "my/model"


ONE_MESSAGE = {"messages": [{"role": "user", "content": "x"}]}
BAD_REQUESTS = [
    ("chat", {"max_tokens": 3}, 400, "messages"),
    ("chat", {"messages": []}, 400, "messages"),
    ("chat", {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages"),
    ("chat", {**ONE_MESSAGE, "max_tokens": 0}, 400, "max_tokens"),
    ("chat", {**ONE_MESSAGE, "n": 2}, 400, "n"),
    ("chat", {**ONE_MESSAGE, "stream": "yes"}, 400, "stream"),
    ("chat", {**ONE_MESSAGE, "stream_options": {"include_usage": True}}, 400,
     "stream_options"),
    ("chat", {**ONE_MESSAGE, "max_tokens": 2, "min_tokens": 3}, 400, "min_tokens"),
    ("chat", {**ONE_MESSAGE, "model": "gpt-4"}, 404, "model"),
    ("completions", {"prompt": 17}, 400, "prompt"),
    ("completions", {"prompt": ["a", "b"]}, 400, "prompt"),
    ("completions", {"prompt": "x", "max_tokens": "ten"}, 400, "max_tokens"),
    ("completions", {"prompt": "x", "model": "other"}, 404, "model"),
]  # fmt: skip


@pytest.mark.asyncio
async def test_bad_requests_get_openai_error_json(
    start_sim: Any, http: aiohttp.ClientSession
) -> None:
    async with start_sim() as server:
        for api, body, status, param in BAD_REQUESTS:
            path = "/v1/chat/completions" if api == "chat" else "/v1/completions"
            async with http.post(f"{server.url}{path}", json=body) as resp:
                assert resp.status == status, (body, await resp.text())
                error = (await resp.json())["error"]
            assert error["param"] == param, body
            assert error["code"] == status
            assert isinstance(error["message"], str)
            assert error["message"]
            expected = "NotFoundError" if status == 404 else "BadRequestError"
            assert error["type"] == expected
        # Nothing reached the engine.
        assert server.engine.stats.requests_received == 0


@pytest.mark.asyncio
async def test_a_body_that_is_not_json_is_refused(
    start_sim: Any, http: aiohttp.ClientSession
) -> None:
    async with (
        start_sim() as server,
        http.post(
            f"{server.url}/v1/chat/completions",
            data=b"{not json",
            headers={"Content-Type": "application/json"},
        ) as resp,
    ):
        assert resp.status == 400
        error = (await resp.json())["error"]
    assert error["code"] == 400
    assert "JSON object" in error["message"]


@pytest.mark.asyncio
async def test_a_prompt_longer_than_max_model_len_is_refused(
    start_sim: Any, http: aiohttp.ClientSession, make_prompt: Any
) -> None:
    async with start_sim(max_model_len=64) as server:
        async with http.post(
            f"{server.url}/v1/completions",
            json={"prompt": make_prompt(60), "max_tokens": 10},
        ) as resp:
            assert resp.status == 400
            error = (await resp.json())["error"]
        assert error["param"] == "max_tokens"
        assert "maximum context length is 64" in error["message"]
        assert "70" in error["message"]
        # The same prompt with room for its output is served.
        async with http.post(
            f"{server.url}/v1/completions",
            json={"prompt": make_prompt(60), "max_tokens": 4},
        ) as resp:
            assert resp.status == 200


@pytest.mark.asyncio
async def test_ignore_eos_and_min_tokens_are_honoured(
    start_sim: Any, http: aiohttp.ClientSession, read_sse: Any, chat: Any, contents: Any
) -> None:
    # EOS is drawn at the first chance, so only min_tokens and ignore_eos lengthen.
    async with start_sim(eos_probability=1.0) as server:

        async def run(**fields: Any) -> tuple[int, str]:
            async with http.post(
                f"{server.url}/v1/chat/completions",
                json=chat("go", max_tokens=10, **fields),
            ) as resp:
                assert resp.status == 200
                reply = await resp.json()
            (choice,) = reply["choices"]
            count = reply["usage"]["completion_tokens"]
            assert len(choice["message"]["content"].split()) == count
            return count, choice["finish_reason"]

        assert await run() == (1, "stop")
        assert await run(min_tokens=4) == (4, "stop")
        assert await run(ignore_eos=True) == (10, "length")
        assert await run(min_tokens=10) == (10, "length")

        async with http.post(
            f"{server.url}/v1/chat/completions",
            json=chat("go", max_tokens=10, min_tokens=3, stream=True),
        ) as resp:
            stream = await read_sse(resp)
        chunks = stream.chunks()
        assert len(contents(chunks)) == 3
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
