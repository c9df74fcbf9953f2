"""``servemon sweep``: the closed-loop driver — each level keeps ``--parallel N``
requests in flight until ``--number`` have finished (after ``--warmup``)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from loadgen.arrivals import Arrival
from loadgen.closedloop import run_closed_loop
from loadgen.context import Driven, RunContext
from loadgen.stopping import Stopper, grace, until_stopped

__all__ = ["drive_sweep"]


async def drive_sweep(ctx: RunContext, stop: Stopper, arrival: Arrival) -> Driven:
    """Run the levels in order (``arrival`` is not used: a closed loop sends when a
    request finishes)."""
    c = ctx.config
    numbers = list(c.number) * (len(c.parallel) if len(c.number) == 1 else 1)
    first = 0  # each level's prompts follow the last level's: none sent twice
    for record, number in zip(ctx.stages, numbers, strict=True):
        if stop.requested.is_set():
            return Driven(interrupted=True)
        offset = first
        first += c.warmup + number
        assert record.parallel is not None
        record.start_s = time.monotonic()
        ctx.live.stage(record.index, 0.0)
        ctx.progress.stage_started(record.index)

        def body(index: int, offset: int = offset) -> dict[str, Any]:
            return ctx.body(offset + index)

        def options(index: int, offset: int = offset) -> dict[str, Any]:
            return ctx.cancel_options(offset + index)

        level = asyncio.create_task(
            run_closed_loop(
                ctx.session,
                ctx.url,
                body,
                concurrency=record.parallel,
                number=number,
                warmup=c.warmup,
                headers=ctx.headers,
                id_prefix=f"{ctx.tag}-p{record.parallel}",
                timeout_s=c.timeout,
                stage=record.index,
                on_done=ctx.finished,
                on_send=ctx.started,
                stop=stop.requested,
                options=options,
            )
        )
        try:
            interrupted = await until_stopped(level, stop.requested)
        finally:
            if not level.done():
                await grace(
                    {level}, c.grace if stop.requested.is_set() else 0.0, stop.hurry
                )
        record.end_s = time.monotonic()
        record.sent = ctx.tally.finished(record.index)
        if interrupted:
            return Driven(interrupted=True)
    return Driven(interrupted=False)
