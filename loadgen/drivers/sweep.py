"""``servemon sweep``: the closed-loop driver — each level keeps ``--parallel N``
requests in flight until ``--number`` have finished (after ``--warmup``). With a
sessions workload a level is ``N`` users, each running conversations back to back,
until ``--number`` turns have been sent
(:func:`servemon.loadgen.drivers.conversation.run_users`)."""

from __future__ import annotations

import asyncio
import itertools
import time

from servemon.loadgen.drivers.conversation import run_users
from servemon.loadgen.run.context import Drive, Driven
from servemon.loadgen.run.sections import SweepArgs
from servemon.loadgen.send.client import RequestOptions
from servemon.loadgen.send.closedloop import run_closed_loop
from servemon.loadgen.send.stopping import Stopper, grace, until_stopped
from servemon.loadgen.workloads.sessions import SessionWorkload

__all__ = ["drive_sweep", "stage_numbers"]


def stage_numbers(number: tuple[int, ...], repeats: int, count: int) -> list[int]:
    """Each of a sweep's ``count`` stages' ``--number``, in stage order: one value
    for every level, or one per level, each repeat of a level running its level's
    (the plan has checked that the values fit the levels)."""
    levels = count // repeats
    per_level = list(number) * (levels if len(number) == 1 else 1)
    return [n for n in per_level for _ in range(repeats)]


async def drive_sweep(run: Drive[SweepArgs], found: Driven) -> None:
    """Run the levels in order (the arrival process is not used: a closed loop
    sends when a request finishes)."""
    found.interrupted = await _levels(run)


async def _levels(run: Drive[SweepArgs]) -> bool:
    """Each level in turn; True if the run was stopped before the last ended."""
    c, sender, board, stop = run.settings, run.sender, run.board, run.stop
    numbers = stage_numbers(c.number, c.repeats, len(board.stages))
    first = 0  # each level's prompts follow the last level's: none sent twice
    sessions = itertools.count()  # and so do its sessions
    for record, number in zip(board.stages, numbers, strict=True):
        if stop.requested.is_set():
            return True
        offset = first
        first += c.warmup + number
        assert record.parallel is not None
        board.begin(record.index, 0.0, time.monotonic())
        if isinstance(sender.workload, SessionWorkload):
            users = run_users(
                sender, record.parallel, number, record.index, sessions, stop.requested
            )
            running = asyncio.create_task(users)
            interrupted = await _level(running, stop, run.sending.grace)
            record.end_s = time.monotonic()
            record.sent = sender.turns_sent[record.index]
            if running.done() and not running.cancelled() and not running.exception():
                record.sessions, record.sessions_cut = running.result()
            if interrupted:
                return True
            continue

        def body(index: int, offset: int = offset) -> dict[str, object]:
            return sender.body(offset + index)

        def options(index: int, offset: int = offset) -> RequestOptions:
            return sender.request_options(offset + index)

        level = asyncio.create_task(
            run_closed_loop(
                sender.session,
                sender.url,
                body,
                concurrency=record.parallel,
                number=number,
                warmup=c.warmup,
                headers=sender.headers,
                id_prefix=f"{sender.tag}-p{record.parallel}"
                + (f"r{record.repeat}" if record.repeat else ""),
                timeout_s=run.sending.timeout,
                stage=record.index,
                on_done=sender.hooks.finished,
                on_send=sender.started,
                stop=stop.requested,
                options=options,
                send=None if sender.transport is None else sender.send_now,
            )
        )
        interrupted = await _level(level, stop, run.sending.grace)
        record.end_s = time.monotonic()
        record.sent = board.finished(record.index)
        if interrupted:
            return True
    return False


async def _level(level: asyncio.Task[object], stop: Stopper, grace_s: float) -> bool:
    """Wait for a level's task; True if the run was stopped meanwhile (its
    requests in flight then get ``grace_s``)."""
    try:
        return await until_stopped(level, stop.requested)
    finally:
        if not level.done():
            wait = grace_s if stop.requested.is_set() else 0.0
            await grace({level}, wait, stop.hurry)
