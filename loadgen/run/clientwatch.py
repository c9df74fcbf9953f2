"""Is the load generator itself the limit? Watched in every load command.

A client that cannot keep up measures itself: its requests go out late, its event
loop answers streams late, and the target looks slower than it is. Three signals
are checked every :data:`CHECK_S` seconds, each against a limit:

- ``lag``: the median dispatch lag (actual minus scheduled send) of the last
  :data:`LAG_WINDOW` requests above :data:`LAG_LIMIT_S` — the schedule is slipping
  (open-loop runs only; a closed loop has no schedule). The median, so that one
  stall of the process does not count as falling behind;
- ``loop``: the event loop woke :data:`LOOP_LIMIT_S` or more later than it asked, so
  every stream it reads meanwhile gets late timestamps (a probe sleeps
  :data:`PROBE_S` and measures how late it wakes);
- ``cpu``: the process used :data:`CPU_LIMIT` or more of one core over the check;
  an event loop runs on one core, so that is all it has.

The first time a signal trips in a stage a warning line is printed (with what to do:
``--workers``, a bigger machine), and every check it stays tripped counts. Each
stage's record (``summary.json``) lists them as
:class:`~servemon.loadgen.record.runrecord.ClientLimit` — when it began, for how long,
the worst value — and the report shows them. Live,
``servemon_client_cpu_ratio`` and ``servemon_client_event_loop_delay_seconds`` show the
signals and ``servemon_client_limited_seconds_total`` counts the seconds flagged.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from servemon.loadgen.record.runrecord import ClientLimit, StageResult
from servemon.loadgen.send.timing import RequestTiming

__all__ = [
    "CHECK_S",
    "CPU_LIMIT",
    "LAG_LIMIT_S",
    "LAG_LOST_S",
    "LOOP_LIMIT_S",
    "ClientWatch",
    "Verdict",
    "fell_behind",
    "lag_median",
    "limit_lines",
]

CHECK_S = 1.0
PROBE_S = 0.05
LAG_WINDOW = 50
#: "The client fell behind its schedule": a median lag over this warns (the
#: schedule is slipping; the figures still stand).
LAG_LIMIT_S = 0.005
#: ... and over this a capacity step is lost to the client (ten times the warning:
#: then the client, not the server, is what gave out; a shared machine whose server
#: keeps every core busy lags a few ms without that being so).
LAG_LOST_S = 0.05
LOOP_LIMIT_S = 0.1
CPU_LIMIT = 0.9


def lag_median(lags: Collection[float]) -> float | None:
    """The median dispatch lag of a window of requests; None under half a window
    (too few to say)."""
    return statistics.median(lags) if len(lags) >= LAG_WINDOW // 2 else None


def fell_behind(median_lag: float | None, limit: float = LAG_LIMIT_S) -> bool:
    """Whether a median dispatch lag says the client fell behind its schedule: the
    one definition, with its two limits side by side here -- the watch warns past
    :data:`LAG_LIMIT_S`, the capacity search gives a step up past
    :data:`LAG_LOST_S`."""
    return median_lag is not None and median_lag > limit


ADVICE = (
    "figures from here on measure the client, not the target; "
    "send from more processes (--workers) or a bigger machine"
)


@dataclass(slots=True)
class Verdict:
    """What one check found: each tripped signal's worst value."""

    cpu: float | None = None
    loop_delay: float = 0.0
    lag: float | None = None
    tripped: dict[str, float] = field(default_factory=dict)


def _message(reason: str, worst: float) -> str:
    if reason == "lag":
        return (
            f"the client fell behind its schedule (median dispatch lag "
            f"{worst * 1000:.1f} ms over the last {LAG_WINDOW} requests)"
        )
    if reason == "loop":
        late = worst * 1000
        return f"the client's event loop woke {late:.0f} ms late (busy or blocked)"
    return f"the client used {worst * 100:.0f} % of its core"


class ClientWatch:
    """Checks the client's own health while a run sends.

    ``stage_of()`` says which stage is running (-1: none); ``on_limit(stage,
    reason, message)`` is called the first time a signal trips in a stage, and
    ``on_check(verdict)`` after every check (for the live series).
    """

    def __init__(
        self,
        *,
        origin_s: float,
        stage_of: Callable[[], int],
        on_limit: Callable[[int, str, str], None],
        on_check: Callable[[Verdict], None] | None = None,
        open_loop: bool = True,
    ) -> None:
        self._origin = origin_s
        self._stage_of = stage_of
        self._on_limit = on_limit
        self._on_check = on_check
        self._open_loop = open_loop
        self._lags: deque[float] = deque(maxlen=LAG_WINDOW)
        self._fresh = 0  # requests since the last check
        self._loop_delay = 0.0
        self.limits: dict[int, dict[str, ClientLimit]] = {}

    def observe(self, timing: RequestTiming) -> None:
        """A request finished (a sink of the run)."""
        if self._open_loop:
            self._lags.append(timing.dispatch_lag)
            self._fresh += 1

    def observe_lags(self, lags: Sequence[float]) -> None:
        """Requests finished, a batch at once: their dispatch lags."""
        if self._open_loop:
            self._lags.extend(lags)
            self._fresh += len(lags)

    def stage_limits(self, stage: int) -> list[ClientLimit]:
        """What tripped during ``stage``, in the order it first did."""
        return list(self.limits.get(stage, {}).values())

    async def run(self) -> None:
        """Probe and check until cancelled."""
        checking = asyncio.create_task(self._check_every())
        try:
            await self._probe()
        finally:
            checking.cancel()
            await asyncio.gather(checking, return_exceptions=True)

    async def _probe(self) -> None:
        while True:
            asked = time.monotonic() + PROBE_S
            await asyncio.sleep(PROBE_S)
            self._loop_delay = max(self._loop_delay, time.monotonic() - asked)

    async def _check_every(self) -> None:
        wall, cpu = time.monotonic(), time.process_time()
        while True:
            await asyncio.sleep(CHECK_S)
            now, used = time.monotonic(), time.process_time()
            share = (used - cpu) / (now - wall) if now > wall else None
            wall, cpu = now, used
            self.check(share, now)

    def check(self, cpu_share: float | None, now: float) -> Verdict:
        """One check, from the CPU share since the last one and what was seen."""
        verdict = Verdict(cpu=cpu_share, loop_delay=self._loop_delay)
        self._loop_delay = 0.0
        if self._open_loop and self._fresh:
            verdict.lag = lag_median(self._lags)
        self._fresh = 0
        if verdict.lag is not None and fell_behind(verdict.lag):
            verdict.tripped["lag"] = verdict.lag
        if verdict.loop_delay >= LOOP_LIMIT_S:
            verdict.tripped["loop"] = verdict.loop_delay
        if cpu_share is not None and cpu_share >= CPU_LIMIT:
            verdict.tripped["cpu"] = cpu_share
        stage = self._stage_of()
        if stage >= 0:
            for reason, worst in verdict.tripped.items():
                self._count(stage, reason, worst, now)
        if self._on_check is not None:
            self._on_check(verdict)
        return verdict

    def _count(self, stage: int, reason: str, worst: float, now: float) -> None:
        seen = self.limits.setdefault(stage, {})
        limit = seen.get(reason)
        if limit is None:
            message = _message(reason, worst)
            seen[reason] = ClientLimit(
                reason=reason,
                message=message,
                first_s=now - self._origin,
                seconds=CHECK_S,
                worst=worst,
            )
            self._on_limit(stage, reason, f"{message}: {ADVICE}")
            return
        limit.seconds += CHECK_S
        if worst > limit.worst:
            limit.worst = worst
            limit.message = _message(reason, worst)


def limit_lines(stages: Sequence[StageResult]) -> list[str]:
    """One line per stage in which the client was the limit, for the terminal and
    the report: what tripped, from when, for how long."""
    lines = []
    for stage in stages:
        if not stage.client_limits:
            continue
        what = "; ".join(
            f"{x.message} from {x.first_s:.1f} s, {x.seconds:g} s in all"
            for x in stage.client_limits
        )
        lines.append(
            f"stage {stage.stage + 1} ({stage.load_label}): the client was the "
            f"limit: {what}"
        )
    return lines
