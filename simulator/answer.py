"""How the simulator answers one request: streamed token by token in the
target's dialect (with the faults that cut or break a stream), or whole; the
role-only first chunk; what the trace keeps of it."""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from servemon.simulator.chunks import DONE, MALFORMED, ChunkWriter, ServerFacts
from servemon.simulator.engine import Engine, Request
from servemon.simulator.openai import ParsedRequest
from servemon.simulator.trace import TraceRecord

__all__ = ["RoleChunk", "facts", "stream_answer", "trace_record", "whole_answer"]


async def whole_answer(
    req: Request, writer: ChunkWriter, written: list[float]
) -> web.Response:
    """A non-streamed answer once the engine has finished the request."""
    while not req.finished:
        await req.wakeup.wait()
        req.wakeup.clear()
    thinking = req.reasoning_tokens
    body = writer.full(
        "".join(req.pieces[thinking:]),
        req.finish_reason,
        facts(req),
        reasoning="".join(req.pieces[:thinking]),
    )
    written.extend([time.monotonic()] * req.num_output)  # one time per token
    return web.json_response(body, headers={"X-Request-Id": req.request_id})


async def stream_answer(
    engine: Engine,
    req: Request,
    parsed: ParsedRequest,
    writer: ChunkWriter,
    response: web.StreamResponse,
    written: list[float],
    role: RoleChunk,
    cut: bool,
    malformed: bool,
) -> None:
    """Stream the request's tokens as the engine makes them, in ``writer``'s
    dialect; ``cut`` drops the connection half-way, ``malformed`` writes a
    broken event there."""
    transport = response._req.transport if response._req else None
    sent = 0
    thinking = req.reasoning_tokens
    cut_at = max(1, req.target_tokens // 2)
    while True:
        await req.wakeup.wait()
        req.wakeup.clear()
        new = req.pieces[sent:]
        if new:
            await role.send()
            start, sent = sent, sent + len(new)
            split = min(max(thinking, start), sent)  # reasoning first, then content
            last = req.finished and sent == len(req.pieces)
            await response.write(
                writer.content(
                    "".join(req.pieces[split:sent]),
                    req.finish_reason if last else None,
                    reasoning="".join(req.pieces[start:split]),
                )
            )
            now = time.monotonic()
            written.extend([now] * len(new))
            if malformed and sent >= cut_at:
                malformed = False
                await response.write(MALFORMED)
            if cut and sent >= cut_at and not req.finished:
                # Drop the connection mid-stream, as a crashed server would.
                engine.abort(req)
                response.force_close()
                if transport is not None:
                    transport.close()
                return
        if req.finished:
            break
    said = facts(req)
    usage = writer.usage(said) if parsed.include_usage else None
    finish = writer.finish(req.finish_reason, said, usage_follows=usage is not None)
    for event in (finish, usage, DONE if writer.sends_done else None):
        if event is not None:
            await response.write(event)
    await response.write_eof()
    if writer.dialect == "llamacpp" and transport is not None:
        # llama-server closes the connection after a streamed answer while
        # advertising keep-alive: read nothing more, close a moment later, so
        # a request sent on it meanwhile is reset unread.
        transport.pause_reading()
        asyncio.get_running_loop().call_later(0.005, transport.close)


def trace_record(req: Request, written: list[float], status: int) -> TraceRecord:
    """What the trace keeps of one answered request."""
    return TraceRecord(
        request_id=req.request_id,
        arrival_s=req.arrival_s,
        scheduled_s=req.scheduled_s,
        first_token_s=written[0] if written else None,
        token_s=written,
        # When the response was done, not when the engine finished: the
        # last token_s (a socket write) comes after the engine's finish.
        finished_s=time.monotonic() if req.finished else None,
        finish_reason=req.finish_reason,
        prompt_tokens=len(req.prompt),
        cached_tokens=req.cached_tokens,
        output_tokens=req.num_output,
        status=status,
        queued_s=req.queued_s,
        engine_first_token_s=req.first_token_s,
        engine_last_token_s=req.last_token_s,
    )


def facts(req: Request) -> ServerFacts:
    """What the server reports of a request, for the dialect to word."""
    return ServerFacts(
        prompt_tokens=len(req.prompt),
        completion_tokens=req.num_output,
        cached_tokens=req.cached_tokens,
        reasoning_tokens=min(req.reasoning_tokens, req.num_output),
        queued_s=req.queued_s,
        scheduled_s=req.scheduled_s,
        first_token_s=req.first_token_s,
        last_token_s=req.last_token_s,
    )


class RoleChunk:
    """The role-only first chat chunk, sent with the first token (vLLM's way) or a
    set time after the headers, and in any case before the first content."""

    def __init__(
        self, response: web.StreamResponse | None, data: bytes, delay: float | None
    ) -> None:
        self._response = response
        self._data = data
        self._delay = delay
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Send now if due now; else arm the timer, if there is one."""
        if self._response is None or self._delay is None:
            return
        if self._delay <= 0:
            await self.send()
        else:
            self._task = asyncio.create_task(self._later(self._delay))

    async def _later(self, delay: float) -> None:
        await asyncio.sleep(delay)
        self._task = None
        await self.send()

    async def send(self) -> None:
        """Send it unless already sent (or turned off)."""
        self.cancel()
        response, self._response = self._response, None
        if response is not None:
            await response.write(self._data)

    def cancel(self) -> None:
        """Disarm the timer."""
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()
        self._task = None
