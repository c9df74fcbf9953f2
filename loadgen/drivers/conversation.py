"""Running conversations: the turns of a session, sent one after another.

:func:`run_session` sends one session of a
:class:`~servemon.loadgen.workloads.sessions.SessionWorkload` (each turn with the whole
history, after the last answer and a think time); :func:`run_users` keeps N users
running sessions back to back (the user-centric closed loop of ``sweep``). What a
session is, and how each way of setting the load meets coordinated omission, is
:mod:`servemon.loadgen.workloads.sessions`'.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from servemon.loadgen.run.sender import Sender
from servemon.loadgen.send.client import RequestTags
from servemon.loadgen.send.timing import Outcome, RequestTiming
from servemon.loadgen.workloads.prompts import Prompt
from servemon.loadgen.workloads.sessions import (
    Answer,
    SessionWorkload,
    Turn,
    system_messages,
)

__all__ = ["SessionEnd", "run_session", "run_users"]


@dataclass(slots=True)
class SessionEnd:
    """How a session ended: turns sent, and whether it was cut short."""

    sent: int
    cut: bool


async def run_session(
    sender: Sender,
    index: int,
    start_s: float,
    *,
    stage_at: Callable[[float], int],
    until_s: float | None = None,
    take_turn: Callable[[], bool] | None = None,
) -> SessionEnd:
    """Send session ``index``'s turns, the first at ``start_s`` (monotonic).

    ``stage_at(t)`` is the stage a turn due at ``t`` belongs to; a turn due after
    ``until_s`` is not sent; ``take_turn()`` is asked before each turn and False
    stops the session (a closed loop's budget of turns). Each turn is sent through
    ``sender``, which tells its hooks.
    """
    workload = sender.workload
    assert isinstance(workload, SessionWorkload)
    session = workload.session(index)
    model = sender.model_of(index)
    tagged = sender.pick_model is not None
    answer_mode = workload.options.answer
    history: list[dict[str, str]] = list(system_messages(session))
    history_tokens = session.system_tokens
    scheduled = start_s
    sent = 0
    for k, turn in enumerate(session.turns):
        if k:
            scheduled += turn.think_s
            if until_s is not None and scheduled > until_s:
                return SessionEnd(sent, cut=True)
            await _sleep_until(scheduled)
        if take_turn is not None and not take_turn():
            return SessionEnd(sent, cut=k < len(session.turns))
        user = {"role": "user", "content": turn.user}
        prompt = Prompt(None, (*history, user), None, turn.max_tokens)
        tags = RequestTags(
            model=model if tagged else None,
            session=f"{sender.tag}-s{index}",
            turn=k + 1,
            history_tokens=history_tokens,
        )
        stage = stage_at(scheduled)
        sender.turns_sent[stage] += 1
        timing = await sender.send(
            sender.body_of(prompt, model),
            request_id=f"{sender.tag}-s{index}-{k + 1}",
            stage=stage,
            scheduled_s=scheduled,
            keep_text=answer_mode == "own",
            tags=tags,
        )
        sent += 1
        task = asyncio.current_task()
        if timing.outcome is not Outcome.OK or (task and task.cancelling()):
            return SessionEnd(sent, cut=k + 1 < len(session.turns))
        answer = _answer(workload, answer_mode, turn, timing, index, k)
        history += [user, {"role": "assistant", "content": answer}]
        history_tokens = _next_history(history_tokens, turn, timing)
        scheduled = timing.end_s
    return SessionEnd(sent, cut=False)


async def run_users(
    sender: Sender,
    users: int,
    number: int,
    stage: int,
    indices: Iterator[int],
    stop: asyncio.Event,
) -> tuple[int, int]:
    """``users`` users, each running sessions back to back (indices from
    ``indices``), until ``number`` turns have been sent or ``stop`` is set: the
    user-centric closed loop. Returns the sessions started and those cut short."""
    left = number
    started = cut = 0

    def take_turn() -> bool:
        nonlocal left
        if left <= 0 or stop.is_set():
            return False
        left -= 1
        return True

    async def user() -> None:
        nonlocal started, cut
        task = asyncio.current_task()
        while left > 0 and not stop.is_set():
            ended = await run_session(
                sender,
                next(indices),
                time.monotonic(),
                stage_at=lambda _t: stage,
                take_turn=take_turn,
            )
            started += ended.sent > 0
            cut += ended.cut and ended.sent > 0
            if task is not None and task.cancelling():
                return

    async with asyncio.TaskGroup() as group:
        for _ in range(min(users, number)):
            group.create_task(user())
    return started, cut


def _answer(
    workload: SessionWorkload,
    mode: Answer,
    turn: Turn,
    timing: RequestTiming,
    index: int,
    k: int,
) -> str:
    if mode == "own":
        return timing.text or ""
    if mode == "file" and turn.answer is not None:
        return turn.answer
    return workload.words(f"answer:{index}:{k}", max(timing.output_tokens, 1))


def _next_history(before: int, turn: Turn, timing: RequestTiming) -> int:
    """Tokens of history the next turn sends: this turn's prompt and answer as the
    server counted them, else as the workload did."""
    if timing.prompt_tokens is not None:
        return timing.prompt_tokens + timing.output_tokens
    return before + (turn.user_tokens or 0) + timing.output_tokens


async def _sleep_until(at: float) -> None:
    """Return at ``at`` or just after, never before (a loop's timer may fire a
    little early)."""
    for pad in (0.0, 0.001):  # a second, padded wait where the first woke early
        delay = at - time.monotonic()
        if delay <= 0:
            return
        await asyncio.sleep(delay + pad)
