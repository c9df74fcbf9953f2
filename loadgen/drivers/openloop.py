"""Sending open loop: the machinery the open-loop drivers share (ramp, replay,
capacity, control), not a driver of its own.

:func:`wait_for_start` waits for ``--start-at`` (shared by shards); :func:`open_loop`
sends one plan at the times the seeded arrival process (or a trace) gives, whatever
the target does, and keeps each stage's bookkeeping (start, end, sent, held back,
skipped).
"""

from __future__ import annotations

import asyncio
import bisect
import gc
import time
from collections import Counter
from collections.abc import Iterable
from datetime import UTC, datetime

from servemon.core.wire.http import encode_json
from servemon.loadgen.drivers.conversation import run_session
from servemon.loadgen.run.context import Drive, Driven
from servemon.loadgen.run.sender import Dispatcher, Ready
from servemon.loadgen.send.arrivals import Due, Shard, Stage
from servemon.loadgen.send.arrivals import schedule as make_schedule
from servemon.loadgen.send.dispatch import OpenLoop
from servemon.loadgen.send.stopping import grace, until_stopped
from servemon.loadgen.workloads.sessions import SessionWorkload

__all__ = ["open_loop", "wait_for_start"]


async def wait_for_start(run: Drive[object], found: Driven) -> float | None:
    """The monotonic start of the schedule: ``--start-at`` (shared by shards) or
    now; None if the run was stopped while waiting (``found`` then says so)."""
    start_at = run.sending.start_at
    if start_at is None:
        return time.monotonic() + 0.05 + run.sender.ahead_s
    delay = (start_at - datetime.now(UTC)).total_seconds()
    found.start_late_s = max(0.0, -delay)
    if delay > 0:
        run.board.say(
            f"servemon: waiting {delay:.1f} s for --start-at {start_at.isoformat()}"
        )
        if await until_stopped(asyncio.sleep(delay), run.stop.requested):
            found.interrupted = True
            return None
    return time.monotonic()


async def open_loop(
    run: Drive[object],
    plan: list[Stage],
    *,
    seed: int,
    limit: int | None = None,
    first_index: int = 0,
    halt: asyncio.Event | None = None,
    shard: Shard | None = None,
    start_s: float | None = None,
    sends: Iterable[Due] | None = None,
) -> bool:
    """Send ``plan`` open loop; True if the run was stopped meanwhile.

    ``sends`` is the schedule when it is given (a replay's, from its trace);
    otherwise the seeded arrival process draws it for ``plan``.

    Setting ``halt`` ends this dispatch early (a capacity step judged already):
    sending stops and the requests in flight get the grace period.
    """
    c, sender, board, stop = run.sending, run.sender, run.board, run.stop
    if start_s is None:  # soon, and a transport's hand-over ahead after that
        start_s = time.monotonic() + 0.05 + sender.ahead_s
    start = start_s

    def on_stage(index: int) -> None:
        gc.freeze()  # what exists when a stage begins is there to stay
        stage = next(p for p in plan if p.index == index)
        board.begin(index, stage.rate, start + stage.start_s)

    def on_skip(due: Due) -> None:
        board.not_sent(due.stage, "late")

    def on_hold(due: Due) -> None:
        board.held_back(due.stage)

    sessions = isinstance(sender.workload, SessionWorkload)
    ends = [start + p.end_s for p in plan]
    until = max(ends, default=start)

    def stage_at(t: float) -> int:
        return plan[min(bisect.bisect_left(ends, t), len(plan) - 1)].index

    #: Requests of each stage the workload said not to send (counted as sent by the
    #: dispatcher, which only knows they went to ``send``).
    unsent: Counter[int] = Counter()
    #: Sessions of each stage cut short by the schedule's end.
    cut: Counter[int] = Counter()

    def prepare(due: Due) -> Ready:
        """The body (and its JSON: a long prompt's encoding is off the send's
        critical path), options and prompt tokens of request ``due``, built before
        its time."""
        if sessions:
            return None
        index = first_index + due.index
        model = sender.model_of(index)
        prompt = sender.workload.prompt(index)
        if prompt.skip is not None:
            return prompt.skip
        body = sender.body_of(prompt, model)
        options = sender.request_options(index, model)
        options["encoded"] = encode_json(body)
        return body, options, prompt.prompt_tokens

    async def send(due: Due, at: float, ready: Ready) -> None:
        index = first_index + due.index
        if ready is None:
            ended = await run_session(
                sender, index, at, stage_at=stage_at, until_s=until
            )
            if ended.cut:
                cut[due.stage] += 1
            return
        if isinstance(ready, str):  # not to be sent: why (over_context)
            not_sent(due, ready)
            return
        body, options, prompt_tokens = ready
        await sender.send(
            body,
            request_id=f"{sender.tag}-{index}",
            stage=due.stage,
            scheduled_s=at,
            prompt_tokens=prompt_tokens,
            **options,
        )

    def not_sent(due: Due, why: str) -> None:
        unsent[due.stage] += 1
        board.not_sent(due.stage, why)

    loop: Dispatcher | None = None
    if sender.transport is not None and not sessions:
        # A fleet's fast path: the schedule handed out in slices, the records
        # taken back in batches (servemon.loadgen.fleet.slices).
        loop = sender.transport.open_loop(
            sender,
            prepare=prepare,
            not_sent=not_sent,
            first_index=first_index,
            max_inflight=c.max_inflight,
            late=c.late,
            late_tolerance_s=c.late_tolerance,
            on_stage=on_stage,
            on_skip=on_skip,
            on_hold=on_hold,
        )
    if loop is None:
        loop = OpenLoop(
            send,
            max_inflight=c.max_inflight,
            prepare=prepare,
            late=c.late,
            late_tolerance_s=c.late_tolerance,
            on_stage=on_stage,
            on_skip=on_skip,
            on_hold=on_hold,
            ahead_s=sender.ahead_s,
        )
    board.follow(loop)
    due = (
        make_schedule(plan, run.arrival, seed, limit=limit, shard=shard)
        if sends is None
        else sends
    )
    dispatching = asyncio.create_task(loop.run(due, start))
    ending = (stop.requested,) if halt is None else (stop.requested, halt)
    try:
        interrupted = await until_stopped(dispatching, *ending)
    except BaseException:
        # This task itself was cancelled (or broke): stop sending, and cancel the
        # requests in flight, which record themselves, rather than leave them
        # running against a session about to close.
        dispatching.cancel()
        await asyncio.gather(dispatching, return_exceptions=True)
        await grace(set(loop.tasks), 0.0, stop.hurry)
        raise
    if interrupted:
        dispatching.cancel()
        await asyncio.gather(dispatching, return_exceptions=True)
    end_of_schedule = time.monotonic()
    for stage in plan:
        record = board.stages[stage.index]
        record.sent = loop.counts.sent[stage.index]
        record.held_back = loop.counts.held_back[stage.index]
        record.skipped = loop.counts.skipped[stage.index] + unsent[stage.index]
        record.sent -= unsent[stage.index]
        if sessions:
            record.sessions = record.sent
            record.sent = sender.turns_sent[stage.index]
        if record.start_s is not None:
            planned_end = start + stage.end_s
            if interrupted:
                planned_end = min(end_of_schedule, planned_end)
            record.end_s = planned_end
    # Requests in flight: let them finish (bounded by the request timeout, or by
    # --drain), or give them the grace period once a stop is asked for.
    if interrupted or await until_stopped(_all_done(loop, c.drain), *ending):
        await grace(set(loop.tasks), c.grace, stop.hurry)
    elif loop.tasks:  # what --drain left in flight: cut, recorded as cancelled
        board.say(
            f"servemon: {c.drain:g} s after the schedule's end (--drain): "
            "cancelling the requests still in flight"
        )
        await grace(set(loop.tasks), 0.0, stop.hurry)
    if sessions:  # the turns sent after the schedule's end, by sessions still going
        for stage in plan:
            record = board.stages[stage.index]
            record.sent = sender.turns_sent[stage.index]
            record.sessions_cut = cut[stage.index]
    return stop.requested.is_set()


async def _all_done(loop: Dispatcher, within_s: float | None) -> None:
    """Wait until ``loop`` has nothing in flight, or for ``within_s`` seconds."""
    deadline = None if within_s is None else time.monotonic() + within_s
    while loop.tasks:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return
        await asyncio.wait(set(loop.tasks), timeout=left)
