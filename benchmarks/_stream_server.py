"""A minimal OpenAI-style streaming server, for benchmarks that measure the client.

``POST /v1/chat/completions`` answers at once with vLLM's stream shape: a role
chunk, ``--chunks`` content chunks (`` tok`` each, ``finish_reason`` null), a
finish chunk, a usage chunk (``completion_tokens`` = chunks) and ``data: [DONE]``,
each written to the socket as its own write (as a serving engine flushes token by
token). There is no sleep between them unless ``--token-sleep`` asks for one after
the role chunk and after each content chunk. A non-streaming request gets one JSON
completion. ``GET /v1/models`` lists one model; ``GET /metrics`` (and every other
path) is 404, so a load generator's sampler has nothing to scrape. The answers are
built once at start-up: the server does as little per request as aiohttp allows,
so that the client is what a benchmark measures.

    python benchmarks/_stream_server.py --chunks 64 [--port 0] [--cpu 0]

prints ``serving http://127.0.0.1:PORT`` once it listens, and runs until SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal

from aiohttp import web

MODEL = "bench-stream"
PROMPT_TOKENS = 16
_ID = "chatcmpl-bench"
_CREATED = 1_790_000_000


def _event(choices: list[dict[str, object]], **extra: object) -> bytes:
    body = {
        "id": _ID,
        "object": "chat.completion.chunk",
        "created": _CREATED,
        "model": MODEL,
        "choices": choices,
        **extra,
    }
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


def stream_parts(chunks: int) -> list[bytes]:
    """The SSE events of one streamed answer, in order."""

    def choice(delta: dict[str, str], finish: str | None) -> dict[str, object]:
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}

    parts = [_event([choice({"role": "assistant", "content": ""}, None)])]
    parts += [_event([choice({"content": " tok"}, None)])] * chunks
    parts.append(_event([choice({}, "length")]))
    usage = {
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": chunks,
        "total_tokens": PROMPT_TOKENS + chunks,
    }
    parts.append(_event([], usage=usage))
    parts.append(b"data: [DONE]\n\n")
    return parts


def whole_answer(chunks: int) -> bytes:
    """The body of a non-streamed answer."""
    body = {
        "id": _ID,
        "object": "chat.completion",
        "created": _CREATED,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": " tok" * chunks},
                "finish_reason": "length",
            }
        ],
        "usage": {
            "prompt_tokens": PROMPT_TOKENS,
            "completion_tokens": chunks,
            "total_tokens": PROMPT_TOKENS + chunks,
        },
    }
    return json.dumps(body, separators=(",", ":")).encode()


def make_app(chunks: int, token_sleep: float | None = None) -> web.Application:
    """The app: chat completions, the model list, nothing else."""
    parts = stream_parts(chunks)
    paced = chunks + 1  # the role chunk and the content chunks
    whole = whole_answer(chunks)
    models = {
        "object": "list",
        "data": [
            {
                "id": MODEL,
                "object": "model",
                "created": _CREATED,
                "owned_by": "servemon-bench",
                "max_model_len": 4096,
            }
        ],
    }
    sse_headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}

    async def chat(request: web.Request) -> web.StreamResponse:
        try:
            body = json.loads(await request.read())
        except ValueError:
            return web.json_response({"error": {"message": "bad JSON"}}, status=400)
        if not body.get("stream"):
            return web.Response(body=whole, content_type="application/json")
        resp = web.StreamResponse(headers=sse_headers)
        try:
            await resp.prepare(request)
            for part in parts[:paced]:
                await resp.write(part)
                if token_sleep is not None:
                    await asyncio.sleep(token_sleep)
            for part in parts[paced:]:  # finish, usage, [DONE], end: together
                await resp.write(part)
            await resp.write_eof()
        except ConnectionResetError:  # the client went away; nothing to answer
            pass
        return resp

    async def list_models(request: web.Request) -> web.Response:
        return web.json_response(models)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", list_models)
    return app


async def serve(host: str, port: int, chunks: int, token_sleep: float | None) -> None:
    """Serve until SIGTERM or SIGINT."""
    runner = web.AppRunner(make_app(chunks, token_sleep), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=4096)
    await site.start()
    bound_host, bound_port = runner.addresses[0][:2]
    print(f"serving http://{bound_host}:{bound_port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--chunks", type=int, default=64)
    parser.add_argument(
        "--token-sleep",
        type=float,
        help="seconds of asyncio.sleep after each chunk (0: yield to the loop); "
        "without it, every chunk is written back to back",
    )
    parser.add_argument("--cpu", type=int, help="pin this process to one CPU")
    args = parser.parse_args()
    if args.cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {args.cpu})
    coro = serve(args.host, args.port, args.chunks, args.token_sleep)
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(coro)


if __name__ == "__main__":
    main()
