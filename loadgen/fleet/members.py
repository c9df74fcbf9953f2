"""The coordinator's view of its workers: what a worker is told (:class:`FleetPlan`),
what it holds while connected (:class:`Member`), and the records made for requests
a worker never answered for."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from aiohttp import web

from servemon.loadgen.fleet.clock import ClockFilter
from servemon.loadgen.record.fleet import WorkerRecord
from servemon.loadgen.run.config import LoadConfig
from servemon.loadgen.send.client import RequestOptions
from servemon.loadgen.send.timing import Outcome, RequestTiming

__all__ = ["FleetPlan", "Member", "joined_line", "post", "unsent", "wire_options"]


@dataclass(frozen=True, slots=True)
class FleetPlan:
    """What a worker is told: where to send and how (the URL and headers of the
    run's requests, its timeout and connection limit)."""

    url: str
    headers: dict[str, str]
    config: LoadConfig

    def message(self) -> dict[str, object]:
        return {
            "k": "plan",
            "url": self.url,
            "headers": self.headers,
            "timeout_s": self.config.timeout,
            "max_connections": self.config.max_connections,
        }


@dataclass(slots=True, eq=False)
class Member:
    """One worker while it is connected."""

    index: int
    name: str
    host: str
    address: str
    ws: web.WebSocketResponse
    clock: ClockFilter
    joined_s: float
    pending: dict[str, asyncio.Future[dict[str, Any] | None]] = field(
        default_factory=dict
    )
    first_tokens: dict[str, Callable[[], None]] = field(default_factory=dict)
    outbox: list[dict[str, object]] = field(default_factory=list)
    pings: dict[int, float] = field(default_factory=dict)
    heard_s: float = field(default_factory=time.monotonic)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    working_s: float | None = None
    stopped_s: float | None = None
    stop_reason: str | None = None
    credits: int = 0
    records: int = 0
    #: Messages or records from it that did not read (skipped).
    malformed: int = 0
    bye: asyncio.Event = field(default_factory=asyncio.Event)

    def record(self, origin_s: float) -> WorkerRecord:
        est = self.clock.estimate()
        first = self.clock.first
        return WorkerRecord(
            index=self.index,
            name=self.name,
            host=self.host,
            address=self.address,
            offset_s=None if est is None else est.offset_s,
            uncertainty_s=None if est is None else est.uncertainty_s,
            rtt_s=None if est is None else est.rtt_s,
            first_offset_s=None if first is None else first.offset_s,
            clock_samples=self.clock.count,
            joined_s=self.joined_s - origin_s,
            working_s=None if self.working_s is None else self.working_s - origin_s,
            stopped_s=None if self.stopped_s is None else self.stopped_s - origin_s,
            stop_reason=self.stop_reason,
            credits=self.credits,
            records=self.records,
            malformed=self.malformed,
        )


def joined_line(member: Member) -> str:
    est = member.clock.estimate()
    clock = (
        "clock unknown"
        if est is None
        else f"clock {est.offset_s * 1e3:+.3f} ms ± {est.uncertainty_s * 1e3:.3f} ms"
    )
    return f"servemon: worker {member.index} ({member.name}, {member.address}): {clock}"


def post(sends: set[asyncio.Future[None]], member: Member, data: bytes) -> None:
    """Send ``data`` to ``member`` without waiting; ``sends`` holds the sends
    until they are done. A broken connection is its reader's to find: the send's
    error is taken here, never left for the loop to warn of."""
    task = asyncio.ensure_future(member.ws.send_bytes(data))
    sends.add(task)
    task.add_done_callback(functools.partial(_sent, sends))


def _sent(sends: set[asyncio.Future[None]], task: asyncio.Future[None]) -> None:
    sends.discard(task)
    if not task.cancelled():
        task.exception()


def wire_options(options: RequestOptions) -> dict[str, object]:
    out: dict[str, object] = {}
    for key in ("cancel_after_s", "cancel_after_tokens", "keep_text"):
        value = options.get(key)
        if value is not None:
            out[key] = value
    tags = options.get("tags")
    if tags is not None:
        out["tags"] = asdict(tags)
    return out


def unsent(
    request_id: str,
    stage: int,
    scheduled_s: float,
    why: str,
    worker: int | None = None,
) -> RequestTiming:
    """The record of a request whose worker never answered for it (cancelled: how
    it ended is not known)."""
    now = time.monotonic()
    return RequestTiming(
        request_id=request_id,
        stage=stage,
        scheduled_s=scheduled_s,
        sent_s=min(scheduled_s, now),
        end_s=now,
        outcome=Outcome.CANCELLED,
        error=why,
        worker=worker,
    )
