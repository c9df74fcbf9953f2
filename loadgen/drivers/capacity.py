"""``servemon capacity``: the highest request rate that meets the SLO, and what gives.

The search runs open-loop steps in one run directory (each a stage of its own):
it doubles the rate from ``--rps-min`` until a step breaks the SLO, then bisects
between the last good and the first bad rate until they are within ``--precision``
of each other, or ``--max-duration`` runs out. A step is judged on the requests
scheduled after its settle time: every ``--slo`` term must hold, and no saturation
signal may have ended it early.

Read from Prometheus (``--prometheus``), a step is judged on the server's signals
only when it had them: if fewer than half of its Prometheus reads carried a fresh
queue, KV-cache or preemption signal (Prometheus down, restarting or its series
stale), the step is *blind*: never judged good (its client figures may still break
the SLO), and the search stops there with the capacity found so far and the reason,
rather than raise the rate on signals it never saw.

While a step runs, the target's own metrics can cut it short: the waiting queue
growing sample after sample, preemptions climbing, or the KV cache pinned at the top
while the client's TTFT rises; and the client itself, if its dispatch lag grows (then
it is the load generator, not the server, that gave out). Without the target's
``/metrics`` (Transformers Serve, a gateway) the search judges on client figures
alone.

The result — ``capacity_rps`` (the highest good rate), the bracket it lies in, the
SLO term that broke first and what saturated first (``queue``, ``kv_cache``,
``client`` or ``none``) — goes into ``summary.json`` and is printed.

Given several named SLOs (tiers: ``--slo interactive=... --slo batch=...``), one
search finds each one's capacity: every step is judged against every tier, and
which rate comes next is :class:`~servemon.loadgen.drivers.tiersearch.TierSearch`'s
choice (strictest tier first, from what the steps measured so far say of each).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Iterable, Sequence

from servemon.core.slo import SloTerm, SloTier
from servemon.loadgen.drivers.openloop import open_loop
from servemon.loadgen.drivers.tiersearch import TierSearch
from servemon.loadgen.record.line import Line
from servemon.loadgen.record.reading import Reading
from servemon.loadgen.record.runrecord import (
    CapacityResult,
    StepVerdict,
    TierResult,
    rate_label,
)
from servemon.loadgen.record.summary import Summarizer, Summary
from servemon.loadgen.run.batch import group_lines, summarize_lines
from servemon.loadgen.run.clientwatch import (
    LAG_LOST_S,
    LAG_WINDOW,
    fell_behind,
    lag_median,
)
from servemon.loadgen.run.context import Drive, Driven
from servemon.loadgen.run.plan import LOOPBACK_RPS_MAX
from servemon.loadgen.run.sections import CapacityArgs
from servemon.loadgen.run.stages import StageRecord
from servemon.loadgen.send.arrivals import Stage
from servemon.loadgen.send.timing import RequestTiming

__all__ = ["CapacityResult", "StepVerdict", "drive_capacity"]


class _Step:
    """A sink that sums up one step's own requests as they finish: those scheduled
    after its settle time (what the step is judged on), all of them, and the
    dispatch lag of the most recent ones."""

    def __init__(self, record: StageRecord, slo: list[SloTerm], settle_s: float):
        self.record, self.settle_s = record, settle_s
        self.judged = Summarizer(slo)
        self.every = Summarizer(slo)
        self.lags: deque[float] = deque(maxlen=LAG_WINDOW)

    def __call__(self, timing: RequestTiming) -> None:
        if timing.stage != self.record.index:
            return
        self.lags.append(timing.dispatch_lag)
        self.every.add(timing)
        start = self.record.start_s
        if start is not None and timing.scheduled_s >= start + self.settle_s:
            self.judged.add(timing)

    def take_lines(self, lines: list[Line]) -> None:
        """Several finished requests as ``requests.jsonl`` lines (a fleet's batch,
        :meth:`~servemon.loadgen.run.sender.Hooks.finished_lines`): the same sums
        as one timing at a time."""
        own = [line for line in lines if line["stage"] == self.record.index]
        if not own:
            return
        self.lags.extend(line["dispatch_lag_s"] for line in own)
        for group in group_lines(own):
            summarize_lines(self.every, group)
        start = self.record.start_s
        if start is not None:
            after = [x for x in own if x["scheduled_s"] >= start + self.settle_s]
            for group in group_lines(after):
                summarize_lines(self.judged, group)

    def summary(self) -> Summary:
        """What the step is judged on (all its requests if none came after the
        settle time)."""
        own = self.judged if self.judged.requests else self.every
        return own.summary()


def _window(readings: Iterable[Reading], start: float, end: float) -> list[Reading]:
    """The server's readings between ``start`` and ``end`` that carry any of the
    engine's four signals (waiting, running, KV-cache usage, preemptions)."""
    return [
        r
        for r in readings
        if start <= r.at <= end and (r.judged() or r.running is not None)
    ]


#: The least time between two of the readings a step's saturation is judged on:
#: four readings span 3 s or more whatever ``--sample-interval`` is (at 0.25 s,
#: four consecutive readings of a queue near its limit rose by chance, and cut a
#: step that met the SLO after 1 s).
SIGNAL_SPACING_S = 1.0


def _spaced(window: list[Reading], spacing_s: float) -> list[Reading]:
    """The newest reading, and going back, each one about ``spacing_s`` (nine
    tenths of it at least: a sampler's ticks jitter) before the one kept after it;
    oldest first."""
    kept: list[Reading] = []
    for reading in reversed(window):
        if not kept or kept[-1].at - reading.at >= 0.9 * spacing_s:
            kept.append(reading)
    kept.reverse()
    return kept


def _server_signal(window: list[Reading]) -> tuple[str, str] | None:
    """(what saturated, why) if the target plainly cannot sustain the step: its
    last four readings, :data:`SIGNAL_SPACING_S` apart at least."""
    spaced = _spaced(window, SIGNAL_SPACING_S)
    if len(spaced) < 4:
        return None
    recent = spaced[-4:]
    waiting = [r.waiting or 0.0 for r in recent]
    running = max(r.running or 0.0 for r in recent)
    kv = [r.kv_cache_usage or 0.0 for r in recent]
    pre = [r.preemptions or 0.0 for r in recent]
    if pre[-1] > pre[0] and all(b >= a for a, b in itertools.pairwise(pre)):
        return "kv_cache", f"preemptions climbing ({pre[0]:.0f} -> {pre[-1]:.0f})"
    if min(kv) >= 0.98 and waiting[-1] > 0:
        return "kv_cache", "KV cache pinned at the top with requests waiting"
    grows = all(b > a for a, b in itertools.pairwise(waiting))
    if grows and waiting[-1] > max(4.0, running):
        return "queue", f"waiting queue growing without bound ({waiting[-1]:.0f})"
    return None


def _attribute(
    readings: Iterable[Reading], record: StageRecord, summary: Summary
) -> str:
    """What gave out first during a bad step."""
    end = record.end_s or time.monotonic()
    window = _window(readings, record.start_s or 0.0, end)
    if window:
        kv = max(r.kv_cache_usage or 0.0 for r in window)
        preempted = (window[-1].preemptions or 0.0) - (window[0].preemptions or 0.0)
        if kv >= 0.95 or preempted > 0:
            return "kv_cache"
        queued = sum(1 for r in window if (r.waiting or 0.0) > 0)
        if queued >= max(1, len(window) // 5):
            return "queue"  # requests waited for a batch slot in a fifth of samples
    lag = summary.figure("dispatch_lag")
    if lag is not None and fell_behind(lag.p50, LAG_LOST_S):
        return "client"
    return "none"


async def _watch(
    readings: Iterable[Reading],
    step: _Step,
    halt: asyncio.Event,
    verdict: dict[str, str],
) -> None:
    """Cut a step short on a saturation signal (after its settle time)."""
    record = step.record
    while True:
        await asyncio.sleep(1.0)
        if record.start_s is None or time.monotonic() < record.start_s + step.settle_s:
            continue
        signal = _server_signal(_window(readings, record.start_s, time.monotonic()))
        # The client is behind when its recent lag stays high (the median of the
        # last requests), not when one stall of the process shows in a p99; by the
        # client watch's one definition.
        if signal is None and fell_behind(lag_median(step.lags), LAG_LOST_S):
            signal = ("client", "the client fell behind its schedule")
        if signal is not None:
            verdict["saturated"], verdict["reason"] = signal
            halt.set()
            return


def blind(readings: Iterable[Reading], start: float, end: float) -> str | None:
    """Why a step between ``start`` and ``end`` had too few fresh server signals
    from Prometheus to be judged on them (None: it had enough): fewer than half of
    its reads carried any of the signals a step is judged on."""
    reads = fresh = 0
    for r in readings:
        if start <= r.at <= end:
            reads += 1
            fresh += r.judged()
    if reads == 0:
        return "blind: no answer from Prometheus during the step"
    if fresh * 2 < reads:
        return (
            f"blind: {reads - fresh} of {reads} reads from Prometheus during the "
            "step had no fresh queue, KV-cache or preemption signal"
        )
    return None


def _breaches(summary: Summary, terms: Iterable[SloTerm]) -> list[str]:
    """The terms a step's summary breaks, each with the value it had."""
    broken = []
    for term in terms:
        value = summary.value(term.key)
        if value is None or value > term.threshold:
            shown = "none" if value is None else f"{value:.4g}"
            broken.append(f"{term} (was {shown})")
    return broken


def _judge(
    readings: Iterable[Reading],
    step: _Step,
    tiers: Sequence[SloTier],
    early: dict[str, str],
) -> tuple[StepVerdict, dict[str, list[str]]]:
    """The step's verdict, and each tier's broken terms."""
    summary = step.summary()
    by_tier = {t.name: _breaches(summary, t.terms) for t in tiers}
    breaches = list(dict.fromkeys(b for broken in by_tier.values() for b in broken))
    good = not breaches and not early
    saturated = (
        None
        if good
        else (early.get("saturated") or _attribute(readings, step.record, summary))
    )
    verdict = StepVerdict(
        step.record.index,
        step.record.target_rate or 0.0,
        good,
        breaches,
        saturated,
        early.get("reason"),
        summary.requests,
    )
    if any(t.name for t in tiers):
        verdict.tiers = {name: not b and not early for name, b in by_tier.items()}
    return verdict, by_tier


def _met(verdict: StepVerdict, tiers: Sequence[SloTier]) -> dict[str, bool]:
    """Whether the step met each tier (a blind step meets none)."""
    if not verdict.tiers:
        return {t.name: verdict.good for t in tiers}
    return {t.name: verdict.tiers[t.name] and not verdict.blind for t in tiers}


def _said(rate: float, verdict: StepVerdict, unseen: str | None) -> str:
    """The line a step's verdict prints."""
    head = f"capacity: {rate:.4g} req/s "
    if unseen is not None:
        return head + f"cannot be judged: {unseen}"
    why = "; ".join(verdict.breaches or [verdict.early_stop or ""])
    if not verdict.tiers:
        return head + ("meets the SLO" if verdict.good else "breaks: " + why)
    met = [name for name, ok in verdict.tiers.items() if ok]
    broke = [name for name, ok in verdict.tiers.items() if not ok]
    parts = [f"meets {', '.join(met)}"] if met else []
    if broke:
        parts.append(f"breaks {', '.join(broke)}: {why}")
    return head + "; ".join(parts)


async def _measure(
    run: Drive[CapacityArgs], rate: float, first_index: int
) -> tuple[_Step, dict[str, str], bool]:
    """Send one step at ``rate``: its sink, what cut it short, whether the run was
    interrupted."""
    c, board, signals = run.settings, run.board, run.signals
    duration = c.step_at(rate)
    record = StageRecord(len(board.stages), rate_label(rate), rate, None, duration)
    board.add(record)
    step = _Step(record, list(run.slo[0].terms), c.settle)
    halt = asyncio.Event()
    early: dict[str, str] = {}
    watcher = asyncio.create_task(_watch(signals, step, halt, early))
    try:
        with run.sender.hooks.sink(step):
            interrupted = await open_loop(
                run,
                [Stage(record.index, rate, duration, 0.0)],
                seed=run.sending.seed + record.index,
                first_index=first_index,
                halt=halt,
            )
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
    return step, early, interrupted


def _tier_result(
    tier: SloTier,
    search: TierSearch,
    steps: Sequence[StepVerdict],
    broken: Sequence[dict[str, list[str]]],
    ended: str,
) -> TierResult:
    """What the search found of one tier (``ended``: why the whole search ended,
    for a tier whose own search had not)."""
    good, bad = search.bracket(tier.name)
    first = next(
        (
            i
            for i, s in enumerate(steps)
            if not s.blind and not _met(s, [tier])[tier.name]
        ),
        None,
    )
    breach = None
    if first is not None:
        own = broken[first].get(tier.name) or []
        breach = own[0] if own else steps[first].early_stop
    return TierResult(
        name=tier.name,
        slo=tier.text,
        capacity_rps=good,
        bracket=(good, bad),
        first_breach=breach,
        saturated_first=None if first is None else steps[first].saturated,
        ended_because=search.settled(tier.name) or ended,
    )


async def drive_capacity(run: Drive[CapacityArgs], found: Driven) -> None:
    """Run the search (see the module docstring)."""
    c, board, signals = run.settings, run.board, run.signals
    tiers = list(run.slo)
    step_s = c.step_s
    rps_max = run.sending.rps_max
    cap = rps_max if rps_max is not None else LOOPBACK_RPS_MAX["capacity"]
    deadline = time.monotonic() + c.max_duration
    search = TierSearch([t.name for t in tiers], c.rps_min, cap, c.precision)
    steps: list[StepVerdict] = []
    broken: list[dict[str, list[str]]] = []
    first_index = 0
    ended = "precision reached"
    interrupted = False
    while (rate := search.next_rate()) is not None:
        if time.monotonic() + step_s > deadline:
            ended = "--max-duration reached"
            break
        duration = c.step_at(rate)
        if time.monotonic() + duration > deadline:
            ended = "--max-duration reached"
            break
        step, early, interrupted = await _measure(run, rate, first_index)
        record = step.record
        first_index += record.sent + record.skipped
        verdict, by_tier = _judge(signals, step, tiers, early)
        unseen = None
        if (
            run.source.prometheus is not None
            and verdict.good
            and record.start_s is not None
        ):
            unseen = blind(signals, record.start_s, time.monotonic())
        if unseen is not None:
            verdict.good, verdict.blind, verdict.early_stop = False, True, unseen
        steps.append(verdict)
        broken.append(by_tier)
        board.say(_said(rate, verdict, unseen))
        if interrupted:
            ended = "stopped"
            break
        if unseen is not None:
            ended = f"{unseen} at {rate:.4g} req/s"
            run.abort(f"capacity search stopped: {ended}")
            break
        search.add(rate, _met(verdict, tiers))
    found.interrupted = interrupted
    results = [
        _tier_result(tier, search, steps, broken, ended)
        for tier in sorted(tiers, key=lambda t: search.ranked().index(t.name))
    ]
    top = results[0]
    found.capacity = CapacityResult(
        capacity_rps=top.capacity_rps,
        bracket=top.bracket,
        first_breach=top.first_breach,
        saturated_first=top.saturated_first,
        ended_because=top.ended_because,
        steps=steps,
        tiers=results if any(t.name for t in tiers) else [],
    )
