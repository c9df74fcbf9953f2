"""Each server's stream grammar, spoken by the simulator, read by the load generator.

The simulator's ``--dialect`` speaks vLLM's, Transformers Serve's and llama.cpp's
wire formats (written down in docs/simulator.md from the real servers, which the
engines tier runs too). Every answer must be judged by what it carries, not by the
grammar's details: ``[DONE]`` optional, a cut before the finish an error that says
where, a connection the server closed while idle sent again and counted, and what
the server reports about the request (cached tokens, queue and prefill time) joined
with the client's own timings.
"""

from __future__ import annotations

import asyncio
import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from servemon.loadgen.send.client import ClientSettings, make_session, send_request
from servemon.loadgen.send.timing import Outcome, RequestTiming, TokenSource
from servemon.loadgen.workloads.workload import chat_body

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

DIALECTS = ("vllm", "transformers", "llamacpp")


def chat(prompt: str, tokens: int, *, stream: bool = True) -> dict[str, Any]:
    """A chat body without a model (the simulator serves its one model)."""
    out = chat_body("", prompt, tokens, stream=stream)
    del out["model"]
    return out


def body(api: str, *, stream: bool = True, tokens: int = 6) -> dict[str, Any]:
    if api == "chat":
        return chat("alpha bravo charlie delta", tokens, stream=stream)
    out: dict[str, Any] = {"prompt": "alpha bravo", "max_tokens": tokens}
    out["stream"] = stream
    if stream:
        out["stream_options"] = {"include_usage": True}
    return out


async def one(
    session: aiohttp.ClientSession, url: str, api: str, **kwargs: Any
) -> RequestTiming:
    path = "/v1/chat/completions" if api == "chat" else "/v1/completions"
    return await send_request(
        session, url + path, body(api, **kwargs), request_id="t", timeout_s=10
    )


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("api", ["chat", "completions"])
@pytest.mark.parametrize("stream", [True, False])
async def test_every_dialect_answers_ok_with_tokens_from_usage(
    start_sim: Callable[..., Any], dialect: str, api: str, stream: bool
) -> None:
    async with (
        start_sim(dialect=dialect, eos_probability=0.0) as server,
        make_session(ClientSettings()) as session,
    ):
        timing = await one(session, server.url, api, stream=stream)
    assert timing.outcome is Outcome.OK, timing.error
    assert timing.output_tokens == 6
    assert timing.token_source is TokenSource.USAGE
    assert timing.finish_reason == "length"
    if stream:
        # [DONE] is what the dialect sends, and never what decides completeness.
        assert timing.done_sentinel is (dialect != "transformers")
        assert len(timing.content_s) == 6
        assert timing.ttft is not None
        assert timing.time_to_first_chunk is not None


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_stream_cut_before_its_finish_is_an_error_that_says_where(
    start_sim: Callable[..., Any], dialect: str
) -> None:
    async with (
        start_sim(
            dialect=dialect, eos_probability=0.0, faults={"cut_stream_fraction": 1.0}
        ) as server,
        make_session(ClientSettings()) as session,
    ):
        timing = await one(session, server.url, "chat", tokens=12)
    assert timing.outcome is Outcome.STREAM_ERROR
    assert timing.error is not None
    assert "connection cut mid-answer, after 6 content chunks" in timing.error


async def sse_server(events: list[bytes]) -> tuple[aiohttp.web.AppRunner, str]:
    """A server that writes exactly ``events`` and ends the body cleanly."""
    from aiohttp import web

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for event in events:
            await response.write(event)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}"


def chunk(**fields: Any) -> bytes:
    return b"data: " + json.dumps(fields).encode() + b"\n\n"


CONTENT = chunk(choices=[{"index": 0, "delta": {"content": "hi"}}])
FINISH = chunk(choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}])
USAGE = chunk(choices=[], usage={"prompt_tokens": 3, "completion_tokens": 2})


@pytest.mark.parametrize(
    ("events", "outcome", "message"),
    [
        ([CONTENT, CONTENT, FINISH], Outcome.OK, None),
        ([CONTENT, CONTENT, USAGE], Outcome.OK, None),  # the end in the usage chunk
        ([CONTENT, CONTENT], Outcome.STREAM_ERROR, "after 2 content chunks"),
        ([], Outcome.STREAM_ERROR, "before any chunk"),
        ([b": keep-alive\n\n", CONTENT], Outcome.STREAM_ERROR, "without a finish"),
    ],
)
async def test_a_clean_end_is_complete_only_after_a_finish(
    events: list[bytes], outcome: Outcome, message: str | None
) -> None:
    runner, url = await sse_server(events)
    try:
        async with make_session(ClientSettings()) as session:
            timing = await one(session, url, "chat")
    finally:
        await runner.cleanup()
    assert timing.outcome is outcome, timing.error
    if message is None:
        assert timing.error is None
        assert not timing.done_sentinel
    else:
        assert timing.error is not None
        assert message in timing.error


async def test_connections_llamacpp_closes_after_each_answer_are_resent_and_counted(
    start_sim: Callable[..., Any],
) -> None:
    # Closed loop, 4 at a time, as `servemon sweep --parallel 4` sends: each next
    # request goes out at once on a connection the server is about to close.
    async with (
        start_sim(dialect="llamacpp", eos_probability=0.0) as server,
        make_session(ClientSettings()) as session,
    ):

        async def worker(n: int) -> list[RequestTiming]:
            return [await one(session, server.url, "chat", tokens=3) for _ in range(n)]

        done = await asyncio.gather(*(worker(12) for _ in range(4)))
    timings = [t for batch in done for t in batch]
    assert {t.outcome for t in timings} == {Outcome.OK}, {t.error for t in timings}
    assert sum(t.reconnects for t in timings) > 0
    # Each resend drops one closed connection: never more than the pool can hold.
    assert max(t.reconnects for t in timings) <= 8


async def test_a_fresh_connection_closed_unanswered_is_a_connect_error() -> None:
    async def close_at_once(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        writer.close()

    server = await asyncio.start_server(close_at_once, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with make_session(ClientSettings()) as session:
            timing = await one(session, f"http://127.0.0.1:{port}", "chat")
    finally:
        server.close()
        await server.wait_closed()
    assert timing.outcome is Outcome.CONNECT_ERROR
    assert timing.reconnects == 0
    assert timing.error is not None
    assert "fresh connection" in timing.error


# --- what the server says about each request -------------------------------------


def read_trace(path: Path) -> dict[str, dict[str, Any]]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return {row["request_id"]: row for row in map(json.loads, lines)}


@pytest.mark.parametrize("stream", [True, False])
async def test_vllm_per_request_metrics_split_ttft_as_the_server_saw_it(
    start_sim: Callable[..., Any], tmp_path: Path, stream: bool
) -> None:
    trace = tmp_path / "trace.jsonl"
    timings: list[RequestTiming] = []
    async with (
        start_sim(
            enable_per_request_metrics=True,
            enable_prompt_tokens_details=True,
            trace=str(trace),
        ) as server,
        make_session(ClientSettings()) as session,
    ):
        url = server.url + "/v1/chat/completions"
        for i in range(20):  # one at a time: an idle server
            timings.append(
                await send_request(
                    session,
                    url,
                    chat(f"w{i} alpha bravo", 4, stream=stream),
                    request_id=f"r{i}",
                    timeout_s=10,
                )
            )
    truth = read_trace(trace)
    queue_err, prefill_err = [], []
    for t in timings:
        assert t.outcome is Outcome.OK, t.error
        row = truth[t.request_id]
        assert t.server_source == "vllm"
        assert t.cached_tokens is not None
        assert t.server_queue_s is not None
        assert t.server_prefill_s is not None
        queue_err.append(abs(t.server_queue_s - (row["scheduled_s"] - row["queued_s"])))
        prefill_err.append(
            abs(t.server_prefill_s - (row["engine_first_token_s"] - row["scheduled_s"]))
        )
        if stream:
            # The rest of TTFT is the client's side: never negative, and equal to
            # what the server's own clock says lay outside queue and prefill.
            assert t.ttft_gap is not None
            assert t.ttft_gap >= 0
    assert statistics.median(queue_err) < 0.001
    assert statistics.median(prefill_err) < 0.001


async def test_the_ttft_gap_matches_the_simulator_truth(
    start_sim: Callable[..., Any], tmp_path: Path
) -> None:
    trace = tmp_path / "trace.jsonl"
    timings: list[RequestTiming] = []
    async with (
        start_sim(enable_per_request_metrics=True, trace=str(trace)) as server,
        make_session(ClientSettings()) as session,
    ):
        url = server.url + "/v1/chat/completions"
        for i in range(20):
            timings.append(
                await send_request(
                    session,
                    url,
                    chat(f"x{i} alpha bravo", 4),
                    request_id=f"g{i}",
                    timeout_s=10,
                )
            )
    truth = read_trace(trace)
    errors = []
    for t in timings:
        row = truth[t.request_id]
        assert t.ttft is not None
        assert t.ttft_gap is not None
        # Client and simulator share one clock: the true gap is everything between
        # the client's send and its first content that is not queue or prefill.
        server_part = row["engine_first_token_s"] - row["queued_s"]
        errors.append(abs(t.ttft_gap - (t.ttft - server_part)))
    assert statistics.median(errors) < 0.001


async def test_llamacpp_timings_and_cached_tokens_follow_the_prefix_cache(
    start_sim: Callable[..., Any],
) -> None:
    prompt = " ".join(["alpha"] * 64)  # four blocks the second request can reuse
    async with (
        start_sim(dialect="llamacpp") as server,
        make_session(ClientSettings()) as session,
    ):
        url = server.url + "/v1/chat/completions"
        first, second = [
            await send_request(session, url, chat(prompt, 4), request_id=f"c{i}")
            for i in range(2)
        ]
    assert first.server_source == second.server_source == "llamacpp"
    assert first.server_queue_s is None  # llama.cpp reports none
    assert first.server_prefill_s is not None
    assert first.server_decode_s is not None
    assert first.cached_tokens == 0
    assert second.cached_tokens is not None
    assert second.cached_tokens >= 48
    assert second.cached_fraction is not None
    assert second.cached_fraction > 0.6


async def test_without_the_flags_nothing_is_made_up(
    start_sim: Callable[..., Any],
) -> None:
    async with start_sim() as server, make_session(ClientSettings()) as session:
        timing = await one(session, server.url, "chat")
    assert timing.outcome is Outcome.OK
    assert timing.cached_tokens is None
    assert timing.server_source is None
    assert timing.server_prefill_s is None
    assert timing.ttft_gap is None
    assert timing.cached_fraction is None
