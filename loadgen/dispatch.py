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
import contextlib
import ctypes
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from loadgen.arrivals import Due

__all__ = ["DispatchCounts", "KernelTimer", "OpenLoop", "Pacer"]

Send = Callable[[Due, float], Awaitable[None]]
#: The last stretch of a wait that a thread sleeps, for precision.
PRECISE_S = 0.003


def _sleep_to(at: float) -> None:
    delay = at - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():  # not cancelled meanwhile
        future.set_result(None)


class Pacer:
    """One thread that ends the dispatcher's waits precisely.

    The last stretch of each wait is slept in this thread, which then wakes the
    loop. A thread of its own, rather than the loop's executor: measured on one
    core, 19 µs of CPU a wake-up against 39 µs for ``run_in_executor`` (its queue,
    its concurrent future and their locks), paid once per request sent.
    """

    def __init__(self) -> None:
        self._asked = threading.Condition()
        self._next: tuple[float, asyncio.Future[None]] | None = None
        self._closed = False
        self._thread: threading.Thread | None = None

    async def sleep_until(self, at: float) -> None:
        """Return at ``at`` (monotonic), to well under a millisecond."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._asked:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, args=(loop,), name="servemon-pacer", daemon=True
                )
                self._thread.start()
            self._next = (at, future)
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
                while self._next is None and not self._closed:
                    self._asked.wait()
                if self._closed:
                    return
                assert self._next is not None
                at, future = self._next
                self._next = None
            _sleep_to(at)
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(_wake, future)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


_CLOCK_MONOTONIC = 1  # time.monotonic()'s clock on Linux
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = 0o2000000
_TFD_TIMER_ABSTIME = 1
_OS: Any = os  # os.timerfd_* exist from Python 3.13


class KernelTimer:
    """A Linux ``timerfd`` the event loop waits on, for precise wake-ups.

    The kernel makes the descriptor readable at the time asked (to the
    microsecond), and an idle loop's ``epoll`` returns at once; a busy loop sees it
    at its next iteration, as it would its own timer. No thread is involved, so a
    wake-up never waits for the GIL: a thread that wakes while the loop's thread
    runs Python waits up to the interpreter's switch interval (5 ms) for it —
    measured, which is what the dispatch lag of a busy client showed with a pacing
    thread. Python 3.13 has ``os.timerfd_create``; before it, libc's is called
    through ctypes.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._future: asyncio.Future[None] | None = None
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
        self._future = self._loop.create_future()
        self._arm(at)
        await self._future

    def _arm(self, at: float) -> None:
        if self._libc is None:
            _OS.timerfd_settime(self._fd, flags=_OS.TFD_TIMER_ABSTIME, initial=at)
            return
        seconds = int(at)
        nanos = min(int((at - seconds) * 1e9), 999_999_999)
        spec = _Itimerspec(_Timespec(0, 0), _Timespec(seconds, nanos))
        if self._libc.timerfd_settime(
            self._fd, _TFD_TIMER_ABSTIME, ctypes.byref(spec), None
        ):
            raise OSError(ctypes.get_errno(), "timerfd_settime")

    def _fired(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(self._fd, 8)
        future, self._future = self._future, None
        if future is not None and not future.done():
            future.set_result(None)

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
        self._pacer = Pacer()
        self._timer: KernelTimer | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self.counts = DispatchCounts()

    async def run(self, schedule: Iterable[Due], start_s: float) -> None:
        """Send every due request; ``start_s`` is the monotonic time of offset 0."""
        if KernelTimer.available():
            self._timer = KernelTimer(asyncio.get_running_loop())
        try:
            await self._dispatch(schedule, start_s)
        finally:
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

    async def _sleep_until(self, at: float) -> None:
        """Wake at ``at`` on the monotonic clock, to well under a millisecond.

        The event loop's timers wake up to a millisecond late (epoll's resolution;
        uvloop's can also fire up to a millisecond early), which would bunch Poisson
        arrivals together. On Linux the wait is a kernel timer the loop waits on
        (:class:`KernelTimer`): precise, and no thread. Elsewhere the loop sleeps
        until shortly before and a thread (:class:`Pacer`) sleeps the rest with the
        OS's fine-grained sleep, then wakes the loop. A request already due when the
        one before has gone out (at high rates, often) needs no wait at all.
        """
        if self._timer is not None:
            await self._timer.sleep_until(at)
            return
        delay = at - time.monotonic()
        if delay > PRECISE_S:
            await asyncio.sleep(delay - PRECISE_S)
        if at - time.monotonic() > 0:
            await self._pacer.sleep_until(at)
