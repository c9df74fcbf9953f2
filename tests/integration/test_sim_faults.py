"""Every fault in :class:`servemon.simulator.config.Faults` does what it says, and
``PUT /sim/config`` changes faults and speed while the simulator runs."""

from __future__ import annotations

import json
import socket
import time
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from prometheus_client.parser import text_string_to_metric_families

from servemon.simulator.config import SimConfig
from servemon.simulator.server import SimServer, is_loopback_peer
from tests.support.margins import Margin

pytestmark = pytest.mark.integration

LABELS = {"model_name": "sim-tiny", "engine": "0"}
DELAY = 0.3


async def post_chat(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any]
) -> tuple[int, Any]:
    async with http.post(f"{url}/v1/chat/completions", json=body) as resp:
        return resp.status, await resp.json()


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("fault", "status", "kind"),
    [
        ("http_500_fraction", 500, "InternalServerError"),
        ("http_503_fraction", 503, "ServiceUnavailableError"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
async def test_http_error_faults_answer_openai_error_json(
    fault: str,
    status: int,
    kind: str,
    stream: bool,
    start_sim: Any,
    http: aiohttp.ClientSession,
    chat: Any,
) -> None:
    async with start_sim(faults={fault: 1.0}) as server:
        for _ in range(3):
            got, body = await post_chat(
                http, server.url, chat("hi", max_tokens=3, stream=stream)
            )
            assert got == status
            assert body["error"]["code"] == status
            assert body["error"]["type"] == kind
            assert body["error"]["message"]
        assert server.engine.stats.requests_received == 0


@pytest.mark.asyncio
async def test_a_fraction_of_requests_fail(
    start_sim: Any, http: aiohttp.ClientSession, chat: Any
) -> None:
    async with start_sim(faults={"http_500_fraction": 0.5}) as server:
        statuses = [
            (await post_chat(http, server.url, chat("hi", max_tokens=1)))[0]
            for _ in range(40)
        ]
    assert set(statuses) == {200, 500}
    assert 5 <= statuses.count(500) <= 35


@pytest.mark.asyncio
async def test_a_cut_stream_ends_without_done_and_counts_an_abort(
    start_sim: Any,
    http: aiohttp.ClientSession,
    read_sse: Any,
    chat: Any,
    contents: Any,
    scrape: Any,
    poll_until: Any,
) -> None:
    async with start_sim(faults={"cut_stream_fraction": 1.0}) as server:
        body = chat("hi", max_tokens=40, ignore_eos=True, stream=True)
        async with http.post(f"{server.url}/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
            stream = await read_sse(resp)
        assert not stream.done
        assert all(e.data != "[DONE]" for e in stream.events)
        received = contents(stream.chunks())
        assert 1 <= len(received) < 40

        async def aborted() -> bool:
            metrics = await scrape(http, server.url)
            return (
                metrics.get("vllm:request_success_total", finished_reason="abort") == 1
                and metrics.get("vllm:kv_cache_usage_perc", **LABELS) == 0.0
            )

        await poll_until(aborted, timeout=2, what="the cut request counted as abort")
        metrics = await scrape(http, server.url)
        assert metrics.get("vllm:request_success_total", finished_reason="length") == 0


@pytest.mark.asyncio
async def test_malformed_sse_sends_a_data_line_that_is_not_json(
    start_sim: Any, http: aiohttp.ClientSession, read_sse: Any, chat: Any
) -> None:
    async with start_sim(faults={"malformed_sse_fraction": 1.0}) as server:
        body = chat("hi", max_tokens=10, ignore_eos=True, stream=True)
        async with http.post(f"{server.url}/v1/chat/completions", json=body) as resp:
            stream = await read_sse(resp)
    assert stream.done
    bad = []
    for event in stream.events[:-1]:
        try:
            json.loads(event.data)
        except json.JSONDecodeError:
            bad.append(event.data)
    assert len(bad) == 1


@pytest.mark.asyncio
async def test_first_token_stall_delays_the_first_content_chunk(
    start_sim: Any,
    http: aiohttp.ClientSession,
    read_sse: Any,
    chat: Any,
    margin: Margin,
) -> None:
    async with start_sim(faults={"first_token_stall_s": DELAY}) as server:
        body = chat("hi", max_tokens=3, ignore_eos=True, stream=True)
        sent = time.monotonic()
        async with http.post(f"{server.url}/v1/chat/completions", json=body) as resp:
            stream = await read_sse(resp)
        role, first_content = stream.events[0], stream.events[1]
        assert "role" in role.json()["choices"][0]["delta"]
        margin(
            "first content after sent s",
            first_content.at - sent,
            low=DELAY,
            causal=True,
        )

        sent = time.monotonic()
        status, _ = await post_chat(http, server.url, chat("hi", max_tokens=1))
        assert status == 200
        margin("answer after sent s", time.monotonic() - sent, low=DELAY, causal=True)


@pytest.mark.asyncio
async def test_slow_headers_delay_the_response_headers(
    start_sim: Any, http: aiohttp.ClientSession, chat: Any, margin: Margin
) -> None:
    async with start_sim(faults={"slow_headers_s": DELAY}) as server:
        body = chat("hi", max_tokens=2, stream=True)
        sent = time.monotonic()
        async with http.post(f"{server.url}/v1/chat/completions", json=body) as resp:
            headers_at = time.monotonic()
            assert resp.status == 200
            await resp.read()
    margin("headers after sent s", headers_at - sent, low=DELAY, causal=True)


@pytest.mark.asyncio
async def test_without_the_role_chunk_the_first_chunk_carries_content(
    start_sim: Any, http: aiohttp.ClientSession, read_sse: Any, chat: Any
) -> None:
    async with start_sim(faults={"role_chunk": False}) as server:
        body = chat("hi", max_tokens=4, ignore_eos=True, stream=True)
        async with http.post(f"{server.url}/v1/chat/completions", json=body) as resp:
            stream = await read_sse(resp)
    chunks = stream.chunks()
    assert len(chunks) == 4
    for chunk in chunks:
        delta = chunk["choices"][0]["delta"]
        assert "role" not in delta
        assert delta["content"].strip()


@pytest.mark.asyncio
async def test_a_delayed_role_chunk(
    start_sim: Any,
    http: aiohttp.ClientSession,
    read_sse: Any,
    chat: Any,
    margin: Margin,
) -> None:
    # The role chunk never comes after content: stall the engine past the delay.
    faults = {"role_chunk_delay_s": DELAY, "first_token_stall_s": 2 * DELAY}
    async with start_sim(faults=faults) as server:
        body = chat("hi", max_tokens=2, ignore_eos=True, stream=True)
        sent = time.monotonic()
        async with http.post(f"{server.url}/v1/chat/completions", json=body) as resp:
            stream = await read_sse(resp)
    role, first_content = stream.events[0], stream.events[1]
    assert role.json()["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    margin("role chunk after sent s", role.at - sent, low=DELAY, causal=True)
    # Before the stall ends: 0.3 s of room for the client's wake.
    margin("role chunk after sent, below the stall s", role.at - sent, below=2 * DELAY)
    margin(
        "first content after sent s",
        first_content.at - sent,
        low=2 * DELAY,
        causal=True,
    )
    assert stream.done


#: The engine's stall before the first token in the test below.
STALL = 0.2


# The gap is read on the client, which reads the role chunk when its loop next
# wakes and the content chunk when the server's timer has fired: with the role chunk
# at once the gap was 0.1989-0.2058 s in 10 runs beside a fleet test (once short of
# the stall), with vLLM's way 20-59 us. Half the stall and a quarter of it leave
# both far apart.
@pytest.mark.parametrize(
    ("delay", "gap"),
    [(None, (0.0, STALL / 4)), (0.0, (STALL / 2, 10.0))],
    ids=["vllm", "at-once"],
)
@pytest.mark.asyncio
async def test_the_role_chunk_comes_with_the_first_token_unless_told_otherwise(
    start_sim: Any,
    http: aiohttp.ClientSession,
    read_sse: Any,
    chat: Any,
    delay: float | None,
    gap: tuple[float, float],
    margin: Margin,
) -> None:
    # A stall before the engine separates "at once" from "with the token".
    faults = {"role_chunk_delay_s": delay, "first_token_stall_s": STALL}
    async with start_sim(faults=faults) as server:
        body = chat("hi", max_tokens=2, ignore_eos=True, stream=True)
        async with http.post(f"{server.url}/v1/chat/completions", json=body) as resp:
            stream = await read_sse(resp)
    role, first_content = stream.events[0], stream.events[1]
    assert role.json()["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    gap_s = first_content.at - role.at
    margin("role chunk to first content s", gap_s, low=gap[0], high=gap[1])


@pytest.mark.asyncio
async def test_metrics_garbage_does_not_parse(
    start_sim: Any, http: aiohttp.ClientSession
) -> None:
    async with (
        start_sim(faults={"metrics": "garbage"}) as server,
        http.get(f"{server.url}/metrics") as resp,
    ):
        assert resp.status == 200
        text = await resp.text()
    assert "vllm:" in text
    with pytest.raises(ValueError, match="invalid metric name"):
        list(text_string_to_metric_families(text))


@pytest.mark.asyncio
async def test_metrics_503(start_sim: Any, http: aiohttp.ClientSession) -> None:
    async with (
        start_sim(faults={"metrics": "503"}) as server,
        http.get(f"{server.url}/metrics") as resp,
    ):
        assert resp.status == 503


@pytest.mark.asyncio
async def test_metrics_hang_times_out_a_client(
    start_sim: Any, http: aiohttp.ClientSession
) -> None:
    async with start_sim(faults={"metrics": "hang"}) as server:
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            async with http.get(
                f"{server.url}/metrics", timeout=aiohttp.ClientTimeout(total=DELAY)
            ) as resp:
                await resp.read()
        assert time.monotonic() - started >= DELAY
        # Only /metrics hangs: the API still answers.
        async with http.get(f"{server.url}/health") as resp:
            assert resp.status == 200


# -- changing the simulator while it runs -----------------------------------------


async def put_config(
    http: aiohttp.ClientSession, url: str, body: object
) -> tuple[int, Any]:
    async with http.put(f"{url}/sim/config", json=body) as resp:
        return resp.status, await resp.json()


@pytest.mark.asyncio
async def test_put_sim_config_turns_a_healthy_server_failing_and_back(
    start_sim: Any, http: aiohttp.ClientSession, chat: Any
) -> None:
    body = chat("hi", max_tokens=2)
    async with start_sim() as server:
        assert (await post_chat(http, server.url, body))[0] == 200

        status, config = await put_config(
            http, server.url, {"faults": {"http_503_fraction": 1.0}}
        )
        assert status == 200
        assert config["faults"]["http_503_fraction"] == 1.0
        assert config["faults"]["http_500_fraction"] == 0.0
        assert (await post_chat(http, server.url, body))[0] == 503

        status, _ = await put_config(
            http, server.url, {"faults": {"http_503_fraction": 0.0, "metrics": "503"}}
        )
        assert status == 200
        assert (await post_chat(http, server.url, body))[0] == 200
        async with http.get(f"{server.url}/metrics") as resp:
            assert resp.status == 503

        async with http.get(f"{server.url}/sim/config") as resp:
            current = await resp.json()
        assert current["faults"]["metrics"] == "503"
        assert current["faults"]["http_503_fraction"] == 0.0


@pytest.mark.asyncio
async def test_put_sim_config_changes_speed_and_eos(
    start_sim: Any, http: aiohttp.ClientSession, chat: Any
) -> None:
    tokens = 20
    body = chat("hi", max_tokens=tokens, ignore_eos=True)
    async with start_sim() as server:
        started = time.monotonic()
        assert (await post_chat(http, server.url, body))[0] == 200
        fast = time.monotonic() - started

        status, config = await put_config(http, server.url, {"speed": 0.1})
        assert status == 200
        assert config["speed"] == 0.1
        started = time.monotonic()
        assert (await post_chat(http, server.url, body))[0] == 200
        slow = time.monotonic() - started
        # Each step is at least 0.9 ms of overhead at speed 1, so 9 ms at 0.1.
        assert slow >= tokens * 0.009
        assert fast < slow

        status, config = await put_config(http, server.url, {"eos_probability": 1.0})
        assert status == 200
        assert config["eos_probability"] == 1.0
        status, reply = await post_chat(http, server.url, chat("hi", max_tokens=9))
        assert reply["usage"]["completion_tokens"] == 1
        assert reply["choices"][0]["finish_reason"] == "stop"


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"max_num_seqs": 8}, "max_num_seqs"),
        ({"faults": {"http_500": 1}}, "faults.http_500"),
        ({"faults": {"http_500_fraction": 2}}, "faults.http_500_fraction"),
        ({"faults": {"metrics": "slow"}}, "faults.metrics"),
        ({"speed": 0}, "speed"),
        (["speed", 2], "expected a JSON object"),
    ],
)
async def test_put_sim_config_rejects_bad_fields_naming_them(
    body: object, named: str, start_sim: Any, http: aiohttp.ClientSession
) -> None:
    async with start_sim(speed=2.0) as server:
        status, reply = await put_config(http, server.url, body)
        assert status == 400
        assert reply["error"]["code"] == 400
        assert named in reply["error"]["message"]
        assert "\n" not in reply["error"]["message"]
        async with http.get(f"{server.url}/sim/config") as resp:
            unchanged = await resp.json()
    assert unchanged["speed"] == 2.0
    assert unchanged["faults"]["http_500_fraction"] == 0.0
    assert unchanged["faults"]["metrics"] == "ok"


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("method", "remote", "status"),
    [
        ("GET", "203.0.113.7", 403),
        ("PUT", "203.0.113.7", 403),
        ("PUT", "10.0.0.1", 403),
        ("GET", "127.0.0.1", 200),
        ("GET", "127.0.0.53", 200),
        ("GET", "::1", 200),
        # A dual-stack socket (--host ::) sees IPv4 peers as IPv4-mapped IPv6.
        ("GET", "::ffff:127.0.0.1", 200),
        ("PUT", "::ffff:10.0.0.1", 403),
        ("PUT", "fe80::1%eth0", 403),
        ("PUT", "", 403),
    ],
)
async def test_sim_config_answers_only_on_loopback(
    method: str, remote: str, status: int
) -> None:
    # The handlers, called with a request that seems to come from ``remote``.
    server = SimServer(SimConfig(host="127.0.0.1", port=0, profile="tiny"))
    app = server.app()
    request = make_mocked_request(method, "/sim/config", app=app).clone(remote=remote)
    match = await app.router.resolve(request)
    response = await match.handler(request)
    assert response.status == status
    if status == 403:
        assert isinstance(response, web.Response)
        assert response.text is not None
        assert "loopback" in json.loads(response.text)["error"]["message"]
    assert server.engine.speed == 1.0


def test_loopback_peers() -> None:
    assert is_loopback_peer("127.0.0.1")
    assert is_loopback_peer("::ffff:127.1.2.3")
    for remote in (None, "", "0.0.0.0", "::", "10.0.0.1", "::ffff:10.0.0.1", "x"):
        assert not is_loopback_peer(remote)


def _own_address() -> str | None:
    """One of this machine's non-loopback IPv4 addresses (a UDP "connect" sends
    nothing; it only picks the route's source address), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("192.0.2.1", 9))
        except OSError:
            return None
        address: str = sock.getsockname()[0]
    return None if address.startswith("127.") or address == "0.0.0.0" else address


@pytest.mark.asyncio
async def test_sim_config_on_all_interfaces_refuses_other_peers(
    start_sim: Any, http: aiohttp.ClientSession
) -> None:
    """Listening on 0.0.0.0, the simulator still serves its API to anyone but its
    control endpoint to loopback only: a request to this machine's own
    non-loopback address comes from that address, so it is refused."""
    own = _own_address()
    if own is None:
        pytest.skip("no non-loopback IPv4 address on this machine")
    async with start_sim(host="0.0.0.0") as server:
        port = urlsplit(server.url).port
        async with http.put(
            f"http://{own}:{port}/sim/config", json={"speed": 5.0}
        ) as resp:
            assert resp.status == 403
            message = (await resp.json())["error"]["message"]
        assert "\n" not in message
        async with http.get(f"http://{own}:{port}/v1/models") as resp:
            assert resp.status == 200
        async with http.put(
            f"http://127.0.0.1:{port}/sim/config", json={"speed": 5.0}
        ) as resp:
            assert resp.status == 200
        assert server.engine.speed == 5.0
