"""Open-loop sending: every request goes out at its scheduled absolute time.

The dispatcher walks the schedule (:mod:`loadgen.arrivals`), sleeps until each
request is due on the monotonic clock, and starts it as its own task, whatever is
still in flight: a slow server never slows the schedule down (no coordinated
omission). Two things can still hold a request back, and both are counted:

- ``max_inflight``, a safety cap: a request due while the cap is reached waits for a
  slot (``held_back``);
- the late policy: with ``late="skip"``, a request that could only go out more than
  ``late_tolerance_s`` after its time is not sent at all (``skipped``); with
  ``late="send"`` it goes out late, and its dispatch lag says by how much.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from loadgen.arrivals import Due

__all__ = ["DispatchCounts", "OpenLoop"]

Send = Callable[[Due, float], Awaitable[None]]
#: The last stretch of a wait that a thread sleeps, for precision.
PRECISE_S = 0.003


def _sleep_to(at: float) -> None:
    delay = at - time.monotonic()
    if delay > 0:
        time.sleep(delay)


@dataclass(slots=True)
class DispatchCounts:
    """What the dispatcher did, per stage index."""

    sent: Counter[int] = field(default_factory=Counter)
    held_back: Counter[int] = field(default_factory=Counter)
    skipped: Counter[int] = field(default_factory=Counter)


class OpenLoop:
    """Sends a precomputed schedule; ``send(due, scheduled_s)`` does one request."""

    def __init__(
        self,
        send: Send,
        *,
        max_inflight: int,
        late: Literal["send", "skip"] = "send",
        late_tolerance_s: float = 1.0,
        on_stage: Callable[[int], None] | None = None,
        on_skip: Callable[[Due], None] | None = None,
        on_hold: Callable[[Due], None] | None = None,
    ) -> None:
        self._send = send
        self._max = max_inflight
        self._late = late
        self._tolerance = late_tolerance_s
        self._on_stage = on_stage
        self._on_skip = on_skip
        self._on_hold = on_hold
        self._slot = asyncio.Event()
        self.in_flight = 0
        self.tasks: set[asyncio.Task[None]] = set()
        self.counts = DispatchCounts()

    async def run(self, schedule: Iterable[Due], start_s: float) -> None:
        """Send every due request; ``start_s`` is the monotonic time of offset 0."""
        stage = -1
        for due in schedule:
            if due.stage != stage:
                stage = due.stage
                if self._on_stage is not None:
                    self._on_stage(stage)
            at = start_s + due.offset_s
            await self._sleep_until(at)
            if self.in_flight >= self._max:
                self.counts.held_back[stage] += 1
                if self._on_hold is not None:
                    self._on_hold(due)
                while self.in_flight >= self._max:
                    self._slot.clear()
                    await self._slot.wait()
            if self._late == "skip" and time.monotonic() - at > self._tolerance:
                self.counts.skipped[stage] += 1
                if self._on_skip is not None:
                    self._on_skip(due)
                continue
            self.in_flight += 1
            self.counts.sent[stage] += 1
            task = asyncio.create_task(self._one(due, at))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _one(self, due: Due, at: float) -> None:
        try:
            await self._send(due, at)
        finally:
            self.in_flight -= 1
            self._slot.set()

    @staticmethod
    async def _sleep_until(at: float) -> None:
        """Wake at ``at`` on the monotonic clock, to well under a millisecond.

        The event loop's timers wake up to a millisecond late (epoll's resolution),
        which would bunch Poisson arrivals together. So the loop sleeps until shortly
        before, and a thread sleeps the rest with the OS's fine-grained sleep and wakes
        the loop at once (without burning a core in a spin).
        """
        delay = at - time.monotonic()
        if delay > PRECISE_S:
            await asyncio.sleep(delay - PRECISE_S)
        if at - time.monotonic() > 0:
            await asyncio.get_running_loop().run_in_executor(None, _sleep_to, at)
