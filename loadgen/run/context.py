"""What a load driver gets: one narrow context for the run it drives.

A driver (:mod:`loadgen.drivers.ramp`, :mod:`loadgen.drivers.sweep`,
:mod:`loadgen.drivers.capacity`, ...) is an async function ``drive(ctx, stop, arrival,
found)``. What it finds goes into ``found``, its :class:`Driven`, and nowhere else.
Through the :class:`RunContext` it builds request bodies, sends on the shared session to
``ctx.url``, appends the stages it runs to ``ctx.stages`` and reads the target's
recent samples; every finished request goes to :meth:`RunContext.finished`, which
hands it to the sinks: the run directory, the live metrics, the run's
:class:`~loadgen.record.tally.Tally`, the progress display, the guard rail, the
watch on the client's own health (:mod:`loadgen.run.clientwatch`), and any
sink a driver adds for itself (a capacity step judging its own requests). A driver
keeps its own state; nothing reaches into another driver.
"""

from __future__ import annotations

import random
import secrets
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from servemon.core.slo import SloTerm
from servemon.loadgen.record.record import RunDirectory
from servemon.loadgen.record.runrecord import CapacityResult, ControlResult
from servemon.loadgen.record.tally import Tally
from servemon.loadgen.run.clientwatch import CHECK_S, ClientWatch, Verdict
from servemon.loadgen.run.config import LoadConfig
from servemon.loadgen.run.guard import GuardRail
from servemon.loadgen.run.live import LiveMetrics
from servemon.loadgen.run.plan import Kind, StageRecord
from servemon.loadgen.run.progress import Progress
from servemon.loadgen.run.reading import Reading, reading_of
from servemon.loadgen.send.client import RequestTags
from servemon.loadgen.send.stopping import Stopper
from servemon.loadgen.send.timing import RequestTiming
from servemon.loadgen.workloads.replayplan import ReplayPlan
from servemon.loadgen.workloads.workload import Prompt, Workload, request_body

__all__ = [
    "Driven",
    "FirstToken",
    "RunContext",
    "Sink",
    "Starter",
]

#: Something that takes each finished request.
Sink = Callable[[RequestTiming], None]
#: Something told of each measured request as it goes out.
Starter = Callable[[str, float, int | None], None]
#: Something told as a measured request's first token arrives (request id,
#: monotonic time).
FirstToken = Callable[[str, float], None]


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


@dataclass(slots=True, kw_only=True)
class RunContext:
    """One run while it executes (see the module docstring)."""

    kind: Kind
    config: LoadConfig
    base: str
    model: str
    session: aiohttp.ClientSession
    rundir: RunDirectory
    live: LiveMetrics
    workload: Workload
    headers: dict[str, str]
    slo: list[SloTerm]
    stages: list[StageRecord]
    progress: Progress
    #: The model of each request (or session) index, when requests differ in it:
    #: a ``--model`` mix's seeded draw, or the models a trace names. ``model`` is
    #: then the names the run uses, comma-joined.
    pick_model: Callable[[int], str] | None = None
    stopper: Stopper = field(default_factory=Stopper)
    #: A replay's sends, planned with the run (:class:`~loadgen.run.plan.Plan`).
    replay: ReplayPlan | None = None
    tally: Tally = field(init=False)
    guard: GuardRail = field(init=False)
    watch: ClientWatch = field(init=False)
    url: str = field(init=False)
    label: str = field(init=False)
    #: A prefix of this run's request ids (shards of one schedule differ in it).
    tag: str = field(default_factory=lambda: secrets.token_hex(3))
    #: Why a guard rail stopped the run, if one did.
    stop_reason: str | None = None
    #: The server's signals, newest last (:mod:`loadgen.run.reading`: either
    #: sampler's line, read once). A reading is a few floats where a whole sample
    #: of a target is about 15 kB: an hour of whole samples at one a second grew
    #: the load generator by 54 MB (benchmarks/loadgen_soak.py).
    readings: deque[Reading] = field(default_factory=lambda: deque(maxlen=3600))
    sinks: list[Sink] = field(default_factory=list)
    #: Told of every measured request as it goes out: (request id, monotonic
    #: time, prompt tokens where the workload knows them).
    starters: list[Starter] = field(default_factory=list)
    #: Told as a measured request's first token arrives (streams only).
    first_tokens: list[FirstToken] = field(default_factory=list)
    #: Measured requests sent so far.
    sent: int = 0
    #: A sessions workload's turns sent and sessions cut short, by stage.
    turns_sent: Counter[int] = field(default_factory=Counter)
    sessions_cut: Counter[int] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        c = self.config
        self.tally = Tally(self.slo)
        self.guard = GuardRail(
            abort_error_rate=c.abort_error_rate, max_waiting=c.abort_waiting
        )
        self.url = self.base + (
            "/v1/chat/completions" if c.api == "chat" else "/v1/completions"
        )
        self.label = c.target_name or urlsplit(self.base).netloc
        self.watch = ClientWatch(
            origin_s=self.rundir.origin_s,
            stage_of=lambda: self.progress.current,
            on_limit=self._client_limited,
            on_check=self._client_checked,
            open_loop=self.kind != "sweep",
        )

    def body(self, index: int) -> dict[str, Any]:
        """The request body of prompt ``index``."""
        return self.body_of(self.workload.prompt(index), self.model_of(index))

    def body_of(self, prompt: Prompt, model: str) -> dict[str, Any]:
        """The request body of ``prompt``, asking for ``model``."""
        c = self.config
        return request_body(
            prompt,
            api=c.api,
            model=model,
            stream=c.stream,
            ignore_eos=c.ignore_eos,
            extra_body=c.extra_body,
        )

    def model_of(self, index: int) -> str:
        """The model request (or session) ``index`` asks for: a ``--model`` mix's
        seeded draw, else the run's model."""
        pick = self.pick_model
        return self.model if pick is None else pick(index)

    def request_options(self, index: int, model: str | None = None) -> dict[str, Any]:
        """Keyword arguments of :func:`~loadgen.send.client.send_request` for request
        ``index``: whether the client walks away from it (seeded), and the model
        of a mix it asked for (``model``, where the caller has drawn it already)."""
        c = self.config
        options: dict[str, Any] = {}
        if self.pick_model is not None:
            drawn = self.pick_model(index) if model is None else model
            options["tags"] = RequestTags(model=drawn)
        if c.cancel_fraction <= 0:
            return options
        if random.Random(f"cancel:{c.seed}:{index}").random() >= c.cancel_fraction:
            return options
        return {
            **options,
            "cancel_after_s": c.cancel_after,
            "cancel_after_tokens": c.cancel_after_tokens,
        }

    def started(self, request_id: str, prompt_tokens: int | None = None) -> None:
        """A measured request goes out (every starter is told)."""
        self.sent += 1
        self.live.in_flight.inc()
        if self.starters:
            now = time.monotonic()
            for starter in self.starters:
                starter(request_id, now, prompt_tokens)

    def first_token_hook(self, request_id: str) -> Callable[[], None] | None:
        """What ``send_request`` calls at request ``request_id``'s first token
        (None when nothing listens)."""
        if not self.first_tokens:
            return None
        listeners = tuple(self.first_tokens)

        def arrived() -> None:
            now = time.monotonic()
            for listener in listeners:
                listener(request_id, now)

        return arrived

    def finished(self, timing: RequestTiming) -> None:
        """A measured request finished: every sink gets it."""
        self.live.in_flight.dec()
        self.rundir.append_request(timing)
        self.abort(self.rundir.failure)  # a full disk: stop, keep what is written
        self.live.observe(timing)
        self.tally.add(timing)
        self.progress.request_done(timing)
        self.watch.observe(timing)
        for sink in self.sinks:
            sink(timing)
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
                live.limited.labels(self.label, self.model, str(stage), reason).inc(
                    CHECK_S
                )

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
