"""``servemon sweep``: the closed-loop driver — each level keeps ``--parallel N``
requests in flight until ``--number`` have finished (after ``--warmup``). With a
sessions workload a level is ``N`` users, each running conversations back to back,
until ``--number`` turns have been sent
(:func:`loadgen.workloads.sessions.run_users`)."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

from servemon.loadgen.drivers.conversation import run_users
from servemon.loadgen.run.context import Driven, RunContext
from servemon.loadgen.run.plan import stage_numbers
from servemon.loadgen.send.arrivals import Arrival
from servemon.loadgen.send.closedloop import run_closed_loop
from servemon.loadgen.send.stopping import Stopper, grace, until_stopped
from servemon.loadgen.workloads.sessions import SessionWorkload

__all__ = ["drive_sweep"]


async def drive_sweep(
    ctx: RunContext, stop: Stopper, arrival: Arrival, found: Driven
) -> None:
    """Run the levels in order (``arrival`` is not used: a closed loop sends when a
    request finishes)."""
    found.interrupted = await _levels(ctx, stop)


async def _levels(ctx: RunContext, stop: Stopper) -> bool:
    """Each level in turn; True if the run was stopped before the last ended."""
    c = ctx.config
    numbers = stage_numbers(c, len(ctx.stages))
    first = 0  # each level's prompts follow the last level's: none sent twice
    sessions = itertools.count()  # and so do its sessions
    for record, number in zip(ctx.stages, numbers, strict=True):
        if stop.requested.is_set():
            return True
        offset = first
        first += c.warmup + number
        assert record.parallel is not None
        record.start_s = time.monotonic()
        ctx.live.stage(record.index, 0.0)
        ctx.progress.stage_started(record.index)
        if isinstance(ctx.workload, SessionWorkload):
            users = run_users(
                ctx, record.parallel, number, record.index, sessions, stop.requested
            )
            running = asyncio.create_task(users)
            interrupted = await _level(ctx, running, stop)
            record.end_s = time.monotonic()
            record.sent = ctx.turns_sent[record.index]
            if running.done() and not running.cancelled() and not running.exception():
                record.sessions, record.sessions_cut = running.result()
            if interrupted:
                return True
            continue

        def body(index: int, offset: int = offset) -> dict[str, Any]:
            return ctx.body(offset + index)

        def options(index: int, offset: int = offset) -> dict[str, Any]:
            return ctx.request_options(offset + index)

        level = asyncio.create_task(
            run_closed_loop(
                ctx.session,
                ctx.url,
                body,
                concurrency=record.parallel,
                number=number,
                warmup=c.warmup,
                headers=ctx.headers,
                id_prefix=f"{ctx.tag}-p{record.parallel}"
                + (f"r{record.repeat}" if record.repeat else ""),
                timeout_s=c.timeout,
                stage=record.index,
                on_done=ctx.finished,
                on_send=ctx.started,
                stop=stop.requested,
                options=options,
            )
        )
        interrupted = await _level(ctx, level, stop)
        record.end_s = time.monotonic()
        record.sent = ctx.tally.finished(record.index)
        if interrupted:
            return True
    return False


async def _level(ctx: RunContext, level: asyncio.Task[Any], stop: Stopper) -> bool:
    """Wait for a level's task; True if the run was stopped meanwhile (its
    requests in flight then get the grace period)."""
    try:
        return await until_stopped(level, stop.requested)
    finally:
        if not level.done():
            wait = ctx.config.grace if stop.requested.is_set() else 0.0
            await grace({level}, wait, stop.hurry)
