"""Closed loop, EvalScope's ``--parallel``/``--number`` semantics.

At most ``concurrency`` requests are in flight; as one finishes the next is sent,
until ``number`` have finished. ``warmup`` requests go first and are not returned.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

import aiohttp

from loadgen.client import send_request
from loadgen.timing import RequestTiming

__all__ = ["run_closed_loop"]


async def run_closed_loop(
    session: aiohttp.ClientSession,
    url: str,
    make_body: Callable[[int], dict[str, Any]],
    *,
    concurrency: int,
    number: int,
    warmup: int = 0,
    id_prefix: str = "req",
    headers: dict[str, str] | None = None,
    timeout_s: float = 600.0,
) -> list[RequestTiming]:
    """Run ``warmup + number`` requests with ``concurrency`` in flight."""
    total = warmup + number
    counter = itertools.count()
    measured: list[RequestTiming] = []

    async def worker() -> None:
        while (index := next(counter)) < total:
            timing = await send_request(
                session,
                url,
                make_body(index),
                request_id=f"{id_prefix}-{index}",
                headers=headers,
                timeout_s=timeout_s,
            )
            if index >= warmup:
                measured.append(timing)

    async with asyncio.TaskGroup() as group:
        for _ in range(min(concurrency, total)):
            group.create_task(worker())
    return measured
