"""Token counters against real servers: the simulator's /tokenize and a server
without one, and workloads whose lengths the simulator's usage confirms."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

import aiohttp
import pytest
from aiohttp import web

from servemon.core.errors import ConfigError, TargetError
from servemon.loadgen.workloads.tokens import (
    EstimateCounter,
    LocalTokenizer,
    ServerTokenizer,
    pick_counter,
)
from servemon.loadgen.workloads.workload import (
    build_workload,
    parse_workload,
    request_body,
)

pytestmark = pytest.mark.integration

CHAT_OVERHEAD = 4  # the simulator's template: 3 tokens a message, 1 to open the reply
APIS: tuple[tuple[Literal["chat", "completions"], int], ...] = (
    ("completions", 0),
    ("chat", CHAT_OVERHEAD),
)

TEXTS = [
    "hello world",
    "Hello, world! How's it going?",
    "  spaces   and\ttabs\nand newlines  ",
    "numbers 1 22 333 and symbols #$%",
    "x",
]


async def tokenize(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any]
) -> dict[str, Any]:
    async with http.post(f"{url}/tokenize", json=body) as resp:
        assert resp.status == 200, await resp.text()
        answer: dict[str, Any] = await resp.json()
        return answer


@pytest.mark.asyncio
async def test_server_tokenizer_counts_what_the_simulator_counts(
    start_sim: Any, http: aiohttp.ClientSession
) -> None:
    async with start_sim() as server:
        counter = ServerTokenizer(http, server.url + "/", server.model)
        assert counter.source == "server"
        for text in TEXTS:
            truth = await tokenize(http, server.url, {"prompt": text})
            assert await counter.count(text) == truth["count"] == len(truth["tokens"])


@pytest.mark.asyncio
async def test_random_prompts_arrive_with_exactly_the_asked_length(
    start_sim: Any, http: aiohttp.ClientSession
) -> None:
    async with start_sim() as server:
        counter = await pick_counter(http, server.url, server.model, None)
        assert counter.source == "server"
        workload = await build_workload(
            parse_workload("random:prompt=100,output=2"),
            counter=counter,
            seed=11,
            pool_size=32,
        )
        assert workload.token_source == "server"
        for index in range(12):
            prompt = workload.prompt(index)
            assert prompt.prompt_tokens == 100
            for api, overhead in APIS:
                body = request_body(
                    prompt,
                    api=api,
                    model=server.model,
                    stream=False,
                    ignore_eos=True,
                    extra_body=None,
                )
                async with http.post(f"{server.url}/v1/{_path(api)}", json=body) as r:
                    assert r.status == 200, await r.text()
                    usage = (await r.json())["usage"]
                assert usage["prompt_tokens"] == 100 + overhead
                assert usage["completion_tokens"] == 2


@pytest.mark.asyncio
async def test_shared_prefix_lengths_agree_with_the_simulator(
    start_sim: Any, http: aiohttp.ClientSession
) -> None:
    async with start_sim() as server:
        counter = await pick_counter(http, server.url, server.model, None)
        workload = await build_workload(
            parse_workload("shared-prefix:prefix=64,prompts=3,suffix=16,output=1"),
            counter=counter,
            seed=5,
        )
        for index in range(9):
            prompt = workload.prompt(index)
            assert prompt.prompt_tokens == 80
            truth = await tokenize(http, server.url, {"prompt": prompt.text})
            assert truth["count"] == 80


def _path(api: str) -> str:
    return "chat/completions" if api == "chat" else "completions"


@contextlib.asynccontextmanager
async def serve(app: web.Application) -> AsyncIterator[str]:
    """Serve ``app`` on a free loopback port; yield its base URL."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


async def models(request: web.Request) -> web.Response:
    return web.json_response({"data": [{"id": "plain"}]})


async def garbage(request: web.Request) -> web.Response:
    return web.Response(text="<html>not json</html>")


@pytest.mark.asyncio
async def test_without_tokenize_the_counter_falls_back_to_the_estimate(
    http: aiohttp.ClientSession,
) -> None:
    app = web.Application()
    app.router.add_get("/v1/models", models)
    async with serve(app) as url:
        counter = await pick_counter(http, url, "plain", None)
        assert isinstance(counter, EstimateCounter)
        assert counter.source == "estimate"
        with pytest.raises(TargetError, match=r"/tokenize: HTTP 404$"):
            await ServerTokenizer(http, url, "plain").count("hello")
        workload = await build_workload(
            parse_workload("random:prompt=20"), counter=counter, seed=1
        )
        assert workload.token_source == "estimate"
    # Refused connections fall back too.
    assert (await pick_counter(http, url, "plain", None)).source == "estimate"


@pytest.mark.asyncio
async def test_a_guarded_tokenize_is_sent_the_runs_headers(
    http: aiohttp.ClientSession,
) -> None:
    """llama-server's ``--api-key`` (and a gateway) guard ``/tokenize`` as well:
    without the run's key the counter fell back to the estimate."""

    async def guarded(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != "Bearer sk-test":
            return web.json_response({"error": "unauthorized"}, status=401)
        body = await request.json()
        return web.json_response({"count": len(body["prompt"].split())})

    app = web.Application()
    app.router.add_post("/tokenize", guarded)
    key = {"Authorization": "Bearer sk-test"}
    async with serve(app) as url:
        assert (await pick_counter(http, url, "plain", None)).source == "estimate"
        counter = await pick_counter(http, url, "plain", None, key)
        assert counter.source == "server"
        assert await counter.count("three words here") == 3


@pytest.mark.asyncio
async def test_a_tokenize_that_answers_garbage_falls_back_to_the_estimate(
    http: aiohttp.ClientSession,
) -> None:
    app = web.Application()
    app.router.add_post("/tokenize", garbage)
    async with serve(app) as url:
        assert (await pick_counter(http, url, "plain", None)).source == "estimate"


@pytest.mark.asyncio
async def test_a_tokenizer_path_wins_and_a_bad_one_names_the_flag(
    start_sim: Any, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"[UNK]": 0, "hello": 1, "world": 2, ",": 3}
    tokenizer = tokenizers.Tokenizer(
        tokenizers.models.WordLevel(vocab=vocab, unk_token="[UNK]")
    )
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    async with start_sim() as server:
        counter = await pick_counter(http, server.url, server.model, str(path))
        assert isinstance(counter, LocalTokenizer)
        assert counter.source == "tokenizer"
        assert await counter.count("hello, world") == 3
        assert await counter.count("unknown words here") == 3
        with pytest.raises(ConfigError, match=r"^--tokenizer: .*missing\.json"):
            await pick_counter(
                http, server.url, server.model, str(tmp_path / "missing.json")
            )
