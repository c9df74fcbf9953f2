"""Open-loop sending: every request goes out at its scheduled absolute time.

The dispatcher walks the schedule (:mod:`servemon.loadgen.send.arrivals`) and starts
each request as its own task, whatever is still in flight: a slow server never slows the
schedule down (no coordinated omission). Two things can still hold a request back, and
both are counted:

- ``max_inflight``, a safety cap: a request due while the cap is reached waits for a
  slot (``held_back``);
- the late policy: with ``late="skip"``, a request that could only go out more than
  ``late_tolerance_s`` after its time is not sent at all (``skipped``); with
  ``late="send"`` it goes out late, and its dispatch lag says by how much.

A request is made ready a little ahead of its time (:data:`LEAD_S`): ``prepare``
builds what it sends (the body, its options) and its task starts, then waits on a
precise timer for its own time. At that time the timer's callback wakes the task,
which sends at once: one turn of the event loop between the timer and the send,
with nothing else of servemon's to do first. Dispatching at the due time instead
(wake the dispatcher, which makes a task, which builds the body, then sends) took
three turns, each behind whatever else the loop had ready (streams being read,
records being written): that was most of a replay's tail of dispatch lag.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import heapq
import itertools
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from servemon.loadgen.send.arrivals import WAKE, Due

__all__ = ["DispatchCounts", "KernelTimer", "OpenLoop", "Pacer"]

#: ``send(due, scheduled_s, prepared)`` sends one request; ``prepared`` is what
#: ``prepare(due)`` returned for it, ahead of its time.
Send = Callable[[Due, float, Any], Awaitable[None]]
Prepare = Callable[[Due], Any]
#: How long before its time a request is made ready and its task started.
LEAD_S = 0.005
#: The last stretch of a wait that a thread sleeps, for precision.
PRECISE_S = 0.003


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():  # not cancelled meanwhile
        future.set_result(None)


class _Waits:
    """Futures to wake at their times, earliest first (a heap; a cancelled
    wait stays in it until its time comes, and is passed over then)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def push(self, at: float, future: asyncio.Future[None]) -> bool:
        """Add a wait; True if it is now the earliest."""
        heapq.heappush(self._heap, (at, next(self._order), future))
        return self._heap[0][2] is future

    def first(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float) -> list[asyncio.Future[None]]:
        """The waits due by ``now``, in time order, taken out."""
        due = []
        while self._heap and self._heap[0][0] <= now:
            due.append(heapq.heappop(self._heap)[2])
        return due


class Pacer:
    """One thread that ends the dispatcher's waits precisely (where there is no
    :class:`KernelTimer`).

    The thread sleeps until the earliest wait, the last stretch with the OS's
    fine-grained sleep, then wakes the loop. A thread of its own, rather than the
    loop's executor: measured on one core, 19 µs of CPU a wake-up against 39 µs for
    ``run_in_executor`` (its queue, its concurrent future and their locks).
    """

    def __init__(self) -> None:
        self._asked = threading.Condition()
        self._waits = _Waits()
        self._closed = False
        self._thread: threading.Thread | None = None

    async def sleep_until(self, at: float) -> None:
        """Return at ``at`` (monotonic), to well under a millisecond."""
        if at <= time.monotonic():
            return
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._asked:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, args=(loop,), name="servemon-pacer", daemon=True
                )
                self._thread.start()
            if self._waits.push(at, future):
                self._asked.notify()
        await future

    def close(self) -> None:
        """End the thread (it ends by itself with the process too)."""
        with self._asked:
            self._closed = True
            self._asked.notify()

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        while True:
            with self._asked:
                while not self._closed:
                    first = self._waits.first()
                    if first is not None and first - time.monotonic() <= PRECISE_S:
                        break
                    # Coarse: until shortly before the earliest, or an earlier one.
                    self._asked.wait(
                        None if first is None else first - PRECISE_S - time.monotonic()
                    )
                if self._closed:
                    return
                at = self._waits.first()
            assert at is not None
            delay = at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            with self._asked:
                due = self._waits.pop_due(time.monotonic())
            for future in due:
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    loop.call_soon_threadsafe(_wake, future)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


_CLOCK_MONOTONIC = 1  # time.monotonic()'s clock on Linux
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = 0o2000000
_OS: Any = os  # os.timerfd_* exist from Python 3.13


class KernelTimer:
    """A Linux ``timerfd`` the event loop waits on, for precise wake-ups.

    The kernel makes the descriptor readable at the time asked (to the
    microsecond), and an idle loop's ``epoll`` returns at once; a busy loop sees it
    at its next iteration, as it would its own timer. No thread is involved, so a
    wake-up never waits for the GIL: a thread that wakes while the loop's thread
    runs Python waits up to the interpreter's switch interval (5 ms) for it —
    measured, which is what the dispatch lag of a busy client showed with a pacing
    thread. The one descriptor serves every wait: it is armed for the earliest,
    and when it fires every wait due is woken. Python 3.13 has
    ``os.timerfd_create``; before it, libc's is called through ctypes.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._waits = _Waits()
        self._libc: ctypes.CDLL | None = None
        if hasattr(os, "timerfd_create"):  # Python 3.13+
            self._fd = _OS.timerfd_create(
                time.CLOCK_MONOTONIC, flags=_OS.TFD_NONBLOCK | _OS.TFD_CLOEXEC
            )
        else:
            self._libc = ctypes.CDLL(None, use_errno=True)
            fd = self._libc.timerfd_create(
                _CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC
            )
            if fd < 0:
                raise OSError(ctypes.get_errno(), "timerfd_create")
            self._fd = fd
        loop.add_reader(self._fd, self._fired)

    @staticmethod
    def available() -> bool:
        """Whether this platform has ``timerfd`` (Linux)."""
        if not sys.platform.startswith("linux"):
            return False
        if hasattr(os, "timerfd_create"):
            return True
        try:
            return hasattr(ctypes.CDLL(None), "timerfd_settime")
        except OSError:
            return False

    async def sleep_until(self, at: float) -> None:
        """Return at ``at`` (monotonic seconds), or at once if it has passed."""
        if at <= time.monotonic():
            return
        future = self._loop.create_future()
        if self._waits.push(at, future):
            self._arm(at)
        await future

    def _arm(self, at: float) -> None:
        # Armed relative to now rather than at the absolute time: libfaketime
        # (which the fleet's tests give workers clocks of their own with) moves an
        # absolute monotonic time by its wall-clock offset, so a worker set 1 s
        # behind woke 1 s late. Reading the clock once more costs well under a
        # microsecond; a delay of 0 would disarm, so at least a nanosecond.
        delay = max(at - time.monotonic(), 1e-9)
        if self._libc is None:
            _OS.timerfd_settime(self._fd, initial=delay)
            return
        seconds = int(delay)
        nanos = max(min(int((delay - seconds) * 1e9), 999_999_999), 0)
        if seconds == 0 and nanos == 0:
            nanos = 1
        spec = _Itimerspec(_Timespec(0, 0), _Timespec(seconds, nanos))
        if self._libc.timerfd_settime(self._fd, 0, ctypes.byref(spec), None):
            raise OSError(ctypes.get_errno(), "timerfd_settime")

    def _fired(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(self._fd, 8)
        for future in self._waits.pop_due(time.monotonic()):
            _wake(future)
        first = self._waits.first()
        if first is not None:
            self._arm(first)  # a time already past fires at once

    def close(self) -> None:
        """Stop watching the descriptor and close it."""
        with contextlib.suppress(Exception):
            self._loop.remove_reader(self._fd)
        with contextlib.suppress(OSError):
            os.close(self._fd)


@dataclass(slots=True)
class DispatchCounts:
    """What the dispatcher did, per stage index."""

    sent: Counter[int] = field(default_factory=Counter)
    held_back: Counter[int] = field(default_factory=Counter)
    skipped: Counter[int] = field(default_factory=Counter)


def _nothing(due: Due) -> None:
    return None


class OpenLoop:
    """Sends a precomputed schedule: ``prepare(due)`` makes request ``due`` ready
    ahead of its time, ``send(due, scheduled_s, prepared)`` sends it at its time."""

    def __init__(
        self,
        send: Send,
        *,
        max_inflight: int,
        prepare: Prepare = _nothing,
        late: Literal["send", "skip"] = "send",
        late_tolerance_s: float = 1.0,
        on_stage: Callable[[int], None] | None = None,
        on_skip: Callable[[Due], None] | None = None,
        on_hold: Callable[[Due], None] | None = None,
        ahead_s: float = 0.0,
    ) -> None:
        self._send = send
        #: A request is handed to ``send`` this long before its time (a fleet's
        #: worker waits out the rest itself, :mod:`servemon.loadgen.fleet`).
        self._ahead = ahead_s
        self._prepare = prepare
        self._max = max_inflight
        self._late = late
        self._tolerance = late_tolerance_s
        self._on_stage = on_stage
        self._on_skip = on_skip
        self._on_hold = on_hold
        self._slot = asyncio.Event()
        #: Requests started and not finished, those still waiting for their time
        #: (at most :data:`LEAD_S` ahead) included.
        self.in_flight = 0
        self._pacer = Pacer()
        self._timer: KernelTimer | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        #: The tasks still waiting for their time.
        self._waiting: set[asyncio.Task[None]] = set()
        self._passed = asyncio.Event()
        self.counts = DispatchCounts()

    async def run(self, schedule: Iterable[Due], start_s: float) -> None:
        """Send every due request; ``start_s`` is the monotonic time of offset 0.

        Returns once the last request has gone out (or been skipped); the requests
        are then still in flight, in :attr:`tasks`. Cancelled, it cancels the
        requests that had not gone out yet.
        """
        if KernelTimer.available():
            self._timer = KernelTimer(asyncio.get_running_loop())
        try:
            await self._dispatch(schedule, start_s)
            while self._waiting:
                self._passed.clear()
                await self._passed.wait()
        finally:
            for task in list(self._waiting):
                task.cancel()
            self._pacer.close()
            if self._timer is not None:
                self._timer.close()

    async def _dispatch(self, schedule: Iterable[Due], start_s: float) -> None:
        stage = -1
        for due in schedule:
            if due.stage != stage:
                stage = due.stage
                if self._on_stage is not None:
                    self._on_stage(stage)
            at = start_s + due.offset_s
            await self._sleep_until(at - LEAD_S - self._ahead)
            if due.index == WAKE:
                continue  # nothing to send: the schedule reads its rate again
            if self.in_flight >= self._max:
                self.counts.held_back[stage] += 1
                if self._on_hold is not None:
                    self._on_hold(due)
                while self.in_flight >= self._max:
                    self._slot.clear()
                    await self._slot.wait()
            self.in_flight += 1
            prepared = self._prepare(due)
            task = asyncio.create_task(self._one(due, at, prepared))
            self.tasks.add(task)
            self._waiting.add(task)
            task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        self._passed_time(task)

    def _passed_time(self, task: asyncio.Task[None]) -> None:
        if task in self._waiting:
            self._waiting.discard(task)
            self._passed.set()

    async def _one(self, due: Due, at: float, prepared: Any) -> None:
        task = asyncio.current_task()
        try:
            await self._sleep_until(at - self._ahead)
            assert task is not None
            self._passed_time(task)
            late = time.monotonic() + self._ahead - at
            if self._late == "skip" and late > self._tolerance:
                self.counts.skipped[due.stage] += 1
                if self._on_skip is not None:
                    self._on_skip(due)
                return
            self.counts.sent[due.stage] += 1
            await self._send(due, at, prepared)
        finally:
            self.in_flight -= 1
            self._slot.set()

    async def _sleep_until(self, at: float) -> None:
        """Wake at ``at`` on the monotonic clock, to well under a millisecond.

        The event loop's timers wake up to a millisecond late (epoll's resolution;
        uvloop's can also fire up to a millisecond early), which would bunch Poisson
        arrivals together. On Linux the wait is a kernel timer the loop waits on
        (:class:`KernelTimer`): precise, and no thread. Elsewhere the loop sleeps
        until shortly before and a thread (:class:`Pacer`) sleeps the rest with the
        OS's fine-grained sleep, then wakes the loop. A request already due needs no
        wait at all.
        """
        if self._timer is not None:
            await self._timer.sleep_until(at)
            return
        delay = at - time.monotonic()
        if delay > PRECISE_S:
            await asyncio.sleep(delay - PRECISE_S)
        if at - time.monotonic() > 0:
            await self._pacer.sleep_until(at)
