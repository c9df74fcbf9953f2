"""The coordinator's fast path for an open-loop schedule: slices out, batches back.

Where a run's schedule is fixed ahead (a ramp, a replay, a capacity step, a control
tick's rate) the coordinator does not make a task, a timer and a future for each
request. :class:`SliceLoop` walks the seeded schedule as
:class:`~servemon.loadgen.send.dispatch.OpenLoop` does, but wakes once a slice
(:data:`SLICE_S`): every request due within :data:`~.coordinator.AHEAD_S` is made
ready (its body, encoded once) and dealt to the live workers in turn, and each
worker gets the slice's share as one ``due`` message: ``[id, stage, time, body,
options]`` per request, its time already on that worker's clock, and the offset it
was converted with. The worker sends each at its time and writes each record as
the ``requests.jsonl`` line the run keeps, moved into the coordinator's frame by
that same offset; its ``recs`` message carries those lines as they are. The
coordinator parses a batch once, writes its bytes to ``requests.jsonl`` as they
came and folds its figures into the run a column at a time
(:mod:`servemon.loadgen.run.batch`).

What is per request here is the body, a place in a list and a dictionary entry
(the request owed, so that a lost worker's or a cancelled slice's requests are
recorded as cancelled). A slice's share is one task (:class:`Share`), so that a
stop's grace period waits on and cancels shares as it does requests.

The closed loop of a sweep, a sessions workload's conversations and a driver
that listens to each request as it goes out or as its first token arrives
(``servemon control`` holding TTFT, the waiting queue or the KV cache) keep the
per-request credits of :class:`~.coordinator.Fleet`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Unpack

import orjson

from servemon.loadgen.fleet.members import Member, unsent, wire_options
from servemon.loadgen.fleet.wire import WireError, encode, read_recs
from servemon.loadgen.record.line import Line, request_line, timing_from_line
from servemon.loadgen.run.batch import BatchError
from servemon.loadgen.run.sender import Hooks, LoopOptions, Sender
from servemon.loadgen.send.arrivals import WAKE, Due
from servemon.loadgen.send.dispatch import DispatchCounts

__all__ = ["SLICE_S", "Share", "SliceLoop", "Slicer"]

#: The least time between two hand-outs: requests go out in slices of about this
#: much schedule, each 90-100 ms ahead of its time.
SLICE_S = 0.01

#: A request handed out: its id, stage, time (this process's clock), body JSON
#: and the options a worker is told (None: none).
Item = tuple[str, int, float, bytes, dict[str, object] | None]
#: A request owed by a worker: its share, stage and time.
Owed = tuple["Share", int, float]


@dataclass(slots=True, eq=False)
class Share:
    """One slice's requests dealt to one worker, until their records are back."""

    loop: SliceLoop
    member: Member
    ids: list[str]
    left: int
    done: asyncio.Future[None]


@dataclass(slots=True, eq=False)
class Slicer:
    """The fleet's side of sliced credits: deals them, takes their records back."""

    #: The fleet's live workers (its own list, as it changes).
    live: list[Member]
    #: Whose turn it is (shared with the fleet's per-request credits).
    turn: Iterator[int]
    #: Sends a message to a worker without waiting.
    post: Callable[[Member, bytes], None]
    ahead_s: float
    hooks: Hooks
    #: What each worker owes, by request id.
    owed: dict[Member, dict[str, Owed]] = field(default_factory=dict)

    def owed_by(self, member: Member) -> dict[str, Owed]:
        found = self.owed.get(member)
        if found is None:
            found = self.owed[member] = {}
        return found

    def deal(self, loop: SliceLoop, items: list[Item]) -> None:
        """Hand ``items`` to the live workers in turn, one ``due`` message each."""
        live = list(self.live)
        if not live:
            for request_id, stage, at, _body, _options in items:
                loop.done(1)
                self.hooks.finished(unsent(request_id, stage, at, "no worker left"))
            return
        shares: dict[int, list[Item]] = {}
        turn = self.turn
        count = len(live)
        for item in items:
            member = live[next(turn) % count]
            shares.setdefault(member.index, []).append(item)
        loop_ = asyncio.get_running_loop()
        for member in live:
            credits = shares.get(member.index)
            if not credits:
                continue
            est = member.clock.estimate()
            delta = 0.0 if est is None else est.delta_s
            ids: list[str] = []
            share = Share(loop, member, ids, len(credits), loop_.create_future())
            owed = self.owed_by(member)
            wire = []
            for request_id, stage, at, body, options in credits:
                ids.append(request_id)
                owed[request_id] = (share, stage, at)
                wire.append(
                    (request_id, stage, at - delta, orjson.Fragment(body), options)
                )
            member.credits += len(credits)
            self.post(member, encode({"k": "due", "d": delta, "c": wire}))
            task = asyncio.create_task(self._wait(share))
            loop.tasks.add(task)
            task.add_done_callback(loop.tasks.discard)

    async def _wait(self, share: Share) -> None:
        try:
            await share.done
        except asyncio.CancelledError:
            member = share.member
            owed = self.owed_by(member)
            left = [i for i in share.ids if i in owed and owed[i][0] is share]
            if left:
                self.post(member, encode({"k": "cancel", "i": left}))
            self._settle(member, left, "cancelled")

    def _settle(self, member: Member, ids: Iterable[str], why: str) -> None:
        """Record ``ids`` (owed by ``member``) as cancelled, for ``why``."""
        owed = self.owed_by(member)
        for request_id in ids:
            entry = owed.pop(request_id, None)
            if entry is None:
                continue
            share, stage, at = entry
            self._count(share)
            self.hooks.finished(unsent(request_id, stage, at, why, member.index))

    def _count(self, share: Share) -> None:
        share.left -= 1
        share.loop.done(1)
        if share.left == 0 and not share.done.done():
            share.done.set_result(None)

    def lost(self, member: Member) -> None:
        """``member`` is gone: what it owed is recorded as cancelled."""
        self._settle(member, list(self.owed_by(member)), f"worker {member.index} lost")

    def taken(self, member: Member, data: bytes) -> None:
        """A ``recs`` frame from ``member``: its lines into the run."""
        try:
            raw, lines = read_recs(data)
        except WireError:
            member.malformed += 1
            return
        owed = self.owed_by(member)
        kept: list[Line] = []
        for line in lines:
            entry = owed.pop(line.get("id"), None)  # type: ignore[arg-type]
            if entry is None:  # not owed (cancelled meanwhile, or not ours)
                continue
            self._count(entry[0])
            kept.append(line)
        member.records += len(kept)
        if not kept:
            return
        if len(kept) < len(lines):
            raw = b"".join(orjson.dumps(line) + b"\n" for line in kept)
        try:
            self.hooks.finished_lines(raw, kept)
        except BatchError:
            self._one_by_one(member, kept)

    def _one_by_one(self, member: Member, lines: list[Line]) -> None:
        """A batch that did not fold (a line that does not read): each line on
        its own, one that does not read recorded as cancelled, saying why."""
        for line in lines:
            try:
                timing = timing_from_line(line)
                request_line(timing)
            except (KeyError, TypeError, ValueError) as exc:
                member.malformed += 1
                why = f"worker {member.index} sent a record that does not read: {exc}"
                at = line.get("scheduled_s")
                timing = unsent(
                    str(line.get("id")),
                    int(line.get("stage") or 0),
                    at if isinstance(at, float) else time.monotonic(),
                    why,
                    member.index,
                )
            self.hooks.finished(timing)


class SliceLoop:
    """Sends a schedule through the fleet in slices (see the module docstring);
    what :class:`~servemon.loadgen.send.dispatch.OpenLoop` is to one process."""

    def __init__(
        self, slicer: Slicer, sender: Sender, **options: Unpack[LoopOptions]
    ) -> None:
        self._slicer = slicer
        self._sender = sender
        self._prepare = options["prepare"]
        self._not_sent = options["not_sent"]
        self._first = options["first_index"]
        self._max = options["max_inflight"]
        self._late = options["late"]
        self._tolerance = options["late_tolerance_s"]
        self._on_stage = options.get("on_stage")
        self._on_skip = options.get("on_skip")
        self._on_hold = options.get("on_hold")
        self._ahead = slicer.ahead_s
        self._slot = asyncio.Event()
        #: Requests handed out and not back.
        self.in_flight = 0
        #: One task a share handed out and not back.
        self.tasks: set[asyncio.Task[None]] = set()
        self.counts = DispatchCounts()
        self._items: list[Item] = []

    def done(self, count: int) -> None:
        """``count`` of this loop's requests are back (or given up)."""
        self.in_flight -= count
        self._slot.set()

    async def run(self, schedule: Iterable[Due], start_s: float) -> None:
        """Hand out every due request; ``start_s`` is the monotonic time of offset
        0. Returns once the last is handed out; their shares are in :attr:`tasks`."""
        stage = -1
        try:
            for due in schedule:
                if due.stage != stage:
                    stage = due.stage
                    if self._on_stage is not None:
                        self._on_stage(stage)
                at = start_s + due.offset_s
                wait = at - self._ahead - time.monotonic()
                if wait > 0:
                    self._hand_out()
                    await asyncio.sleep(max(wait, SLICE_S))
                if due.index == WAKE:
                    continue
                if self.in_flight >= self._max:
                    await self._hold(due)
                late = time.monotonic() + self._ahead - at
                if self._late == "skip" and late > self._tolerance:
                    self.counts.skipped[stage] += 1
                    if self._on_skip is not None:
                        self._on_skip(due)
                    continue
                self.counts.sent[stage] += 1
                self._add(due, at)
        finally:
            self._hand_out()

    def _add(self, due: Due, at: float) -> None:
        ready = self._prepare(due)
        if ready is None or isinstance(ready, str):
            self._not_sent(due, ready or "not sent")
            return
        body, options, _tokens = ready
        encoded = options.get("encoded")
        if encoded is None:
            encoded = orjson.dumps(body)
        wire = wire_options(options) or None
        request_id = f"{self._sender.tag}-{self._first + due.index}"
        self.in_flight += 1
        self._items.append((request_id, due.stage, at, encoded, wire))

    async def _hold(self, due: Due) -> None:
        self._hand_out()
        self.counts.held_back[due.stage] += 1
        if self._on_hold is not None:
            self._on_hold(due)
        while self.in_flight >= self._max:
            self._slot.clear()
            await self._slot.wait()

    def _hand_out(self) -> None:
        if not self._items:
            return
        items, self._items = self._items, []
        self._sender.sent += len(items)
        self._sender.hooks.handed(len(items))
        self._slicer.deal(self, items)
