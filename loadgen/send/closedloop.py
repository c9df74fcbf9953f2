"""Closed loop, EvalScope's ``--parallel``/``--number`` semantics.

At most ``concurrency`` requests are in flight; as one finishes the next is sent,
until ``number`` have finished. ``warmup`` requests go first and are not returned.
Setting ``stop`` ends the loop: no new request starts, those in flight finish.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from typing import Protocol, Unpack

import aiohttp

from servemon.loadgen.send.client import RequestOptions, send_request
from servemon.loadgen.send.timing import RequestTiming

__all__ = ["SendNow", "run_closed_loop"]


class SendNow(Protocol):
    """Sends one request at once and returns its record (a closed loop's send
    when it does not go out from this process's session: a fleet's)."""

    def __call__(
        self,
        body: dict[str, object],
        *,
        request_id: str,
        stage: int,
        **options: Unpack[RequestOptions],
    ) -> Awaitable[RequestTiming]: ...


async def run_closed_loop(
    session: aiohttp.ClientSession,
    url: str,
    make_body: Callable[[int], dict[str, object]],
    *,
    concurrency: int,
    number: int,
    warmup: int = 0,
    id_prefix: str = "req",
    headers: dict[str, str] | None = None,
    timeout_s: float = 600.0,
    stage: int = 0,
    on_done: Callable[[RequestTiming], None] | None = None,
    on_send: Callable[[str], None] | None = None,
    stop: asyncio.Event | None = None,
    options: Callable[[int], RequestOptions] | None = None,
    send: SendNow | None = None,
) -> list[RequestTiming]:
    """Run ``warmup + number`` requests with ``concurrency`` in flight.

    ``options(index)`` may add keyword arguments of :func:`send_request` (such as
    ``cancel_after_s``) per request; ``on_send`` (given the request id) and
    ``on_done`` see each measured request go out and finish. The measured timings
    are returned when there is no ``on_done`` (with one, the caller keeps what it
    needs: a long level stays bounded in memory). ``send`` sends each request
    instead of ``session`` (a fleet's workers).
    """
    total = warmup + number
    counter = itertools.count()  # rebound per phase below; workers read the current
    measured: list[RequestTiming] = []

    async def worker(end: int) -> None:
        while not (stop is not None and stop.is_set()):
            index = next(counter)
            if index >= end:
                return
            request_id = f"{id_prefix}-{index}"
            if index >= warmup and on_send is not None:
                on_send(request_id)
            given = options(index) if options is not None else {}
            if send is not None:
                timing = await send(
                    make_body(index), request_id=request_id, stage=stage, **given
                )
            else:
                timing = await send_request(
                    session,
                    url,
                    make_body(index),
                    request_id=request_id,
                    stage=stage,
                    headers=headers,
                    timeout_s=timeout_s,
                    record_interruption=True,
                    **given,
                )
            if index >= warmup:
                if on_done is not None:
                    on_done(timing)
                else:
                    measured.append(timing)
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                return  # the run was cancelled: the interrupted request is recorded

    # Warm-up requests run as a phase of their own, then the measured ones.
    for start, end in ((0, warmup), (warmup, total)):
        counter = itertools.count(start)
        async with asyncio.TaskGroup() as group:
            for _ in range(min(concurrency, end - start)):
                group.create_task(worker(end))
    return measured
