"""What a load driver gets, and the run behind it.

A driver (:mod:`servemon.loadgen.drivers.ramp`, :mod:`servemon.loadgen.drivers.sweep`,
:mod:`servemon.loadgen.drivers.capacity`, ...) is an async function
``drive(run, found)``. It gets a :class:`Drive`, the parts of the run it may use: its
own settings (its command's section of
:class:`~servemon.loadgen.run.config.LoadConfig`, itself:
:mod:`servemon.loadgen.run.sections`), how every driver sends (:class:`Sending`) and
where the server's signals come from (:class:`SignalSource`), both views of the
flags the commands share (:func:`~servemon.loadgen.run.config.settings_of`), the
run's SLO, a
:class:`~servemon.loadgen.run.sender.Sender` to send measured requests with (and its
hooks, to listen to them), the server's signals (one typed
:class:`~servemon.loadgen.record.reading.Reading` per sample, from either sampler), the
:class:`Board` of the stages it runs, the stop and the arrival process. What it
finds goes into ``found``, its :class:`Driven`, and nowhere else. A driver keeps
its own state; nothing reaches into another driver.

The :class:`RunContext` is the runner's: it owns the run directory, the live metrics,
the run's :class:`~servemon.loadgen.record.tally.Tally`, the progress display, the guard
rail and the watch on the client's own health (:mod:`servemon.loadgen.run.clientwatch`),
and is the first of the sender's hooks, so that every request a driver sends reaches
them all.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, Literal, TypeVar

from servemon.core.slo import SloTier
from servemon.loadgen.record.reading import Reading, reading_of
from servemon.loadgen.record.record import RunDirectory
from servemon.loadgen.record.runrecord import CapacityResult, ControlResult
from servemon.loadgen.record.tally import Tally
from servemon.loadgen.run.batch import RunBatch
from servemon.loadgen.run.clientwatch import CHECK_S, ClientWatch, Verdict
from servemon.loadgen.run.config import LoadConfig, Settings, settings_of
from servemon.loadgen.run.guard import GuardRail
from servemon.loadgen.run.live import ControlGauges, LiveMetrics
from servemon.loadgen.run.plan import Kind
from servemon.loadgen.run.progress import InFlight, Progress
from servemon.loadgen.run.sender import Sender
from servemon.loadgen.run.stages import StageRecord
from servemon.loadgen.send.arrivals import Arrival
from servemon.loadgen.send.stopping import Stopper
from servemon.loadgen.send.timing import RequestTiming
from servemon.loadgen.workloads.replayplan import ReplayPlan

__all__ = ["Board", "Drive", "Driven", "RunContext", "Sending", "SignalSource"]

#: A driver's own settings, as a driver reads them.
S = TypeVar("S", covariant=True)


@dataclass(slots=True)
class Driven:
    """What a driver found, filled in as it drives.

    The runner makes one and reads it however the driver ends. A driver cancelled
    midway (a second Ctrl-C, a crash beside it) returns nothing, so what it found
    until then (the ticks ``servemon control`` held, how late a ``--start-at`` run
    started) is kept here rather than in a return value.
    """

    #: Whether the run was stopped from outside (Ctrl-C, SIGTERM) while it drove.
    interrupted: bool = False
    #: What a capacity search found.
    capacity: CapacityResult | None = None
    #: What ``servemon control`` held, tick by tick.
    control: ControlResult | None = None
    #: How late a ``--start-at`` run started.
    start_late_s: float | None = None


@dataclass(slots=True, eq=False)
class Board:
    """The stages a driver runs, and what is shown and kept of them as it goes:
    their records (a capacity search adds its steps), the live metrics' stage
    gauges and counts of requests not sent, the progress display, and the ticks
    ``servemon control`` writes to the run directory."""

    stages: list[StageRecord]
    live: LiveMetrics
    progress: Progress
    tally: Tally
    rundir: RunDirectory

    @property
    def origin_s(self) -> float:
        """The monotonic time the run's record counts from."""
        return self.rundir.origin_s

    def add(self, record: StageRecord) -> None:
        """A stage planned as the run goes (a capacity step)."""
        self.stages.append(record)

    def begin(self, index: int, rate: float, start_s: float) -> None:
        """Stage ``index`` begins at ``start_s`` (monotonic), at ``rate`` (0 for a
        closed loop's level)."""
        self.stages[index].start_s = start_s
        self.live.stage(index, rate)
        self.progress.stage_started(index)

    def not_sent(self, stage: int, reason: str) -> None:
        """A request of ``stage`` not sent, for ``reason`` (``late``,
        ``over_context``)."""
        self.live.skip(stage, reason)

    def held_back(self, stage: int) -> None:
        """A request of ``stage`` held back by ``--max-inflight``."""
        self.live.hold_back(stage)

    def finished(self, stage: int) -> int:
        """Measured requests of ``stage`` finished so far."""
        return self.tally.finished(stage)

    def follow(self, loop: InFlight) -> None:
        """Show what ``loop`` has in flight."""
        self.progress.open_loop = loop

    def say(self, message: str) -> None:
        """Print ``message`` above the progress display."""
        self.progress.console.print(message, soft_wrap=True)

    def control_gauges(self, signal: str) -> ControlGauges:
        """The live gauges of ``servemon control`` holding ``signal``."""
        return self.live.control(signal)

    def control_tick(self, line: Mapping[str, Any], offered: float) -> None:
        """A tick of ``servemon control``: ``offered`` req/s from now on, and the
        tick's line in the run directory."""
        self.live.target_rate.set(offered)
        self.rundir.append_control(line)


@dataclass(frozen=True, slots=True)
class Sending:
    """How any driver sends, whatever it sends: the flags every kind of run reads."""

    seed: int
    #: Seconds the requests in flight get when sending stops (``--grace``).
    grace: float
    #: Seconds a request may take (``--timeout``; a closed loop's own limit).
    timeout: float
    max_inflight: int
    #: Seconds the requests in flight when an open loop's schedule ends get before
    #: they are cancelled (``--drain``); None: until they finish or time out.
    drain: float | None
    late: Literal["send", "skip"]
    late_tolerance: float
    #: When an open-loop schedule starts (``--start-at``, shared by shards);
    #: None: now.
    start_at: datetime | None
    #: The most any driver may offer (``--rps-max``); None: not given (the plan
    #: has checked the target is on this machine).
    rps_max: float | None


@dataclass(frozen=True, slots=True)
class SignalSource:
    """Where the server's signals come from and how often, for a driver that
    steers by them."""

    #: The Prometheus the signals come from; None: the target's ``/metrics``.
    prometheus: str | None
    #: Seconds between servemon's reads of them (``--sample-interval``).
    sample_interval: float
    #: Prometheus' scrape interval of the targets (``--scrape-interval``, or read
    #: from Prometheus); None: assumed.
    scrape_interval: float | None
    #: Seconds a rate or a quantile is taken over (``--signal-window``).
    signal_window: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Drive(Generic[S]):
    """What a driver gets (see the module docstring)."""

    #: The driver's own settings.
    settings: S
    sending: Sending
    source: SignalSource
    sender: Sender
    #: The run's SLO (``--slo``): one, or several named tiers (capacity).
    slo: tuple[SloTier, ...]
    #: The server's signals, newest last (either sampler's, read once).
    signals: deque[Reading]
    board: Board
    stop: Stopper
    arrival: Arrival
    #: Stop the run at once for a reason (nothing happens for None).
    abort: Callable[[str | None], None]
    #: A replay's sends, planned with the run
    #: (:class:`~servemon.loadgen.run.plan.Plan`).
    replay: ReplayPlan | None = None


@dataclass(slots=True, kw_only=True)
class RunContext:
    """One run while it executes: the runner's (see the module docstring)."""

    kind: Kind
    config: LoadConfig
    base: str
    rundir: RunDirectory
    live: LiveMetrics
    stages: list[StageRecord]
    progress: Progress
    #: What the driver sends with; the run hears of each request first.
    sender: Sender
    stopper: Stopper = field(default_factory=Stopper)
    #: A replay's sends, planned with the run
    #: (:class:`~servemon.loadgen.run.plan.Plan`).
    replay: ReplayPlan | None = None
    tally: Tally = field(init=False)
    guard: GuardRail = field(init=False)
    watch: ClientWatch = field(init=False)
    board: Board = field(init=False)
    #: Why a guard rail stopped the run, if one did.
    stop_reason: str | None = None
    #: The server's signals, newest last (:mod:`servemon.loadgen.record.reading`: either
    #: sampler's line, read once). A reading is a few floats where a whole sample
    #: of a target is about 15 kB: an hour of whole samples at one a second grew
    #: the load generator by 54 MB (benchmarks/loadgen_soak.py).
    readings: deque[Reading] = field(default_factory=lambda: deque(maxlen=3600))

    def __post_init__(self) -> None:
        c = self.config
        self.tally = Tally(list(c.slo_terms))
        self.guard = GuardRail(
            abort_error_rate=c.abort_error_rate, max_waiting=c.abort_waiting
        )
        self.watch = ClientWatch(
            origin_s=self.rundir.origin_s,
            stage_of=lambda: self.progress.current,
            on_limit=self._client_limited,
            on_check=self._client_checked,
            open_loop=self.kind != "sweep",
        )
        # The run's own bookkeeping hears of each request first.
        self.sender.hooks.starters.insert(0, self._started)
        self.sender.hooks.sinks.insert(0, self._finished)
        self.board = Board(
            self.stages, self.live, self.progress, self.tally, self.rundir
        )
        self.sender.hooks.batch = RunBatch(
            rundir=self.rundir,
            live=self.live,
            tally=self.tally,
            progress=self.progress,
            watch=self.watch,
            guard=self.guard,
            abort=self.abort,
            sink=self._finished,
            starter=self._started,
        )

    def drive(self, settings: type[Settings], arrival: Arrival) -> Drive[Settings]:
        """The parts of this run its driver gets, its ``settings`` among them."""
        return Drive(
            settings=settings_of(settings, self.config),
            sending=settings_of(Sending, self.config),
            source=settings_of(SignalSource, self.config),
            sender=self.sender,
            slo=self.config.slo,
            signals=self.readings,
            board=self.board,
            stop=self.stopper,
            arrival=arrival,
            abort=self.abort,
            replay=self.replay,
        )

    def _started(self, request_id: str, at: float, prompt_tokens: int | None) -> None:
        self.live.in_flight.inc()

    def _finished(self, timing: RequestTiming) -> None:
        self.live.in_flight.dec()
        self.rundir.append_request(timing)
        self.abort(self.rundir.failure)  # a full disk: stop, keep what is written
        self.live.observe(timing)
        self.tally.add(timing)
        self.progress.request_done(timing)
        self.watch.observe(timing)
        self.abort(self.guard.observe(timing))

    def _client_limited(self, stage: int, reason: str, message: str) -> None:
        """The client's own health tripped a limit the first time in ``stage``."""
        record = self.stages[stage] if 0 <= stage < len(self.stages) else None
        label = "" if record is None else f" ({record.label})"
        self.progress.console.print(
            f"servemon: warning: stage {stage + 1}{label}: {message}", soft_wrap=True
        )

    def _client_checked(self, verdict: Verdict) -> None:
        live = self.live
        if verdict.cpu is not None:
            live.cpu.set(verdict.cpu)
        live.loop_delay.set(verdict.loop_delay)
        stage = self.progress.current
        if stage >= 0:
            for reason in verdict.tripped:
                live.limit(stage, reason, CHECK_S)

    def client_limits(self) -> None:
        """Put what the client watch found into each stage's record."""
        for record in self.stages:
            record.client_limits = self.watch.stage_limits(record.index)

    def sampled(self, sample: Mapping[str, Any]) -> None:
        """A sample of the target's metrics (or of Prometheus' signals): record
        it, watch the queue."""
        self.rundir.append_server_sample(sample)
        self.abort(self.rundir.failure)
        reading = reading_of(sample)
        if reading is None:
            return
        self.readings.append(reading)
        if reading.waiting is not None:
            self.abort(self.guard.observe_waiting(reading.waiting))

    def abort(self, reason: str | None) -> None:
        """Stop the run at once for ``reason`` (a guard rail tripped)."""
        if reason is None or self.stop_reason is not None:
            return
        self.stop_reason = reason
        self.progress.console.print(f"servemon: stopping: {reason}")
        self.stopper.requested.set()
        self.stopper.hurry.set()
