"""How a long-running command lives: its event loop, its signals, its parent.

- :func:`run_async` runs a command's coroutine (on uvloop where it is installed).
- :func:`stop_on_signals` turns SIGINT and SIGTERM into a graceful stop: the first
  sets a stop event, a later one (Ctrl-C again) a hurry event.
- :func:`stop_when_orphaned` sets a stop event once the parent process is gone
  (``--exit-with-parent``: servemon's own children end with it).

Every command that runs until stopped (``sim``, ``exporter``, the load commands,
``demo --keep``) stops through these, so a signal means the same everywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, TypeVar

__all__ = ["run_async", "stop_on_signals", "stop_when_orphaned"]

T = TypeVar("T")

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run on uvloop where it is installed, else asyncio's default loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


@contextlib.contextmanager
def stop_on_signals(
    stop: asyncio.Event,
    hurry: asyncio.Event | None = None,
    *,
    on_stop: Callable[[], None] | None = None,
    on_hurry: Callable[[], None] | None = None,
) -> Iterator[None]:
    """While inside (on a running loop), SIGINT and SIGTERM stop gracefully.

    A signal while ``stop`` is clear calls ``on_stop`` and sets ``stop``. With a
    ``hurry`` event, a signal once ``stop`` is set (by a signal or by anything else)
    sets ``hurry``, calling ``on_hurry`` the first time only; without one, it sets
    ``stop`` again. The handlers are removed on the way out.
    """
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if hurry is not None and stop.is_set():
            if not hurry.is_set() and on_hurry is not None:
                on_hurry()
            hurry.set()
            return
        if not stop.is_set() and on_stop is not None:
            on_stop()
        stop.set()

    for sig in SIGNALS:
        loop.add_signal_handler(sig, on_signal)
    try:
        yield
    finally:
        for sig in SIGNALS:
            loop.remove_signal_handler(sig)


@contextlib.asynccontextmanager
async def stop_when_orphaned(
    stop: asyncio.Event, enabled: bool = True
) -> AsyncIterator[None]:
    """While inside, set ``stop`` once this process's parent has gone (if
    ``enabled``): the process has then been re-parented."""
    if not enabled:
        yield
        return
    watchdog = asyncio.create_task(_watch_parent(os.getppid(), stop))
    try:
        yield
    finally:
        watchdog.cancel()


async def _watch_parent(parent: int, stop: asyncio.Event) -> None:
    while os.getppid() == parent:  # noqa: ASYNC110 (no event exists for this)
        await asyncio.sleep(0.5)
    stop.set()
