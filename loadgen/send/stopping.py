"""How a run stops: from outside (Ctrl-C, SIGTERM, a guard rail), or when a driver
ends its own part early, and how the requests in flight are wound down.

A :class:`Stopper` is set by whoever stops the run; drivers wait on their work with
:func:`until_stopped` and hand the requests still in flight to :func:`grace`, which
gives them the grace period (none once ``hurry`` is set), then cancels them (they
record themselves as ``cancelled``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass, field

__all__ = ["ABANDON_AFTER_S", "Stopper", "grace", "until_stopped"]

#: How long cancelled requests get to record themselves before the run goes on.
ABANDON_AFTER_S = 5.0
log = logging.getLogger("servemon.loadgen")


@dataclass(frozen=True, slots=True)
class Stopper:
    """How a run is stopped from outside: ``requested`` stops sending and gives the
    requests in flight the grace period; ``hurry`` cancels them at once."""

    requested: asyncio.Event = field(default_factory=asyncio.Event)
    hurry: asyncio.Event = field(default_factory=asyncio.Event)


async def until_stopped(work: Awaitable[object], *stops: asyncio.Event) -> bool:
    """Await ``work`` unless one of ``stops`` is set first; True if stopped.

    ``work`` that is a coroutine is cancelled when stopped; a Task is left to the
    caller.
    """
    task = work if isinstance(work, asyncio.Task) else asyncio.ensure_future(work)
    waiters = [asyncio.create_task(event.wait()) for event in stops]
    try:
        await asyncio.wait({task, *waiters}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
    if task.done():
        task.result()
        return False
    if not isinstance(work, asyncio.Task):
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return True


async def grace(
    tasks: Iterable[asyncio.Task[object]], grace_s: float, hurry: asyncio.Event
) -> None:
    """Wait up to ``grace_s`` (less if ``hurry`` is set) for ``tasks``, then cancel
    what is left and wait for it to wind down (it records itself as cancelled)."""
    pending = {t for t in tasks if not t.done()}
    if pending and grace_s > 0 and not hurry.is_set():
        waiter = asyncio.create_task(hurry.wait())
        deadline = time.monotonic() + grace_s
        try:
            while pending and not hurry.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                await asyncio.wait(
                    {*pending, waiter},
                    timeout=left,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                pending = {t for t in pending if not t.done()}
        finally:
            waiter.cancel()
    for task in pending:
        task.cancel()
    if pending:
        # A cancelled request records itself at once, unless the connection it waits
        # on never yields; do not let that hold the run (and its summary) forever.
        _done, stuck = await asyncio.wait(pending, timeout=ABANDON_AFTER_S)
        if stuck:
            log.warning("%d requests did not stop after cancellation; left", len(stuck))
