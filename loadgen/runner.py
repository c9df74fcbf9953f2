"""A whole load run: plan, send, record, sample, publish, summarize.

:func:`run_load` drives a ramp (open loop over stages) or a sweep (closed-loop
levels) against a target, writing the run directory (:mod:`loadgen.record`) as it
goes, serving live client metrics (:mod:`loadgen.live`) and sampling the target's
``/metrics`` (:mod:`loadgen.sampler`). Setting ``stop`` (Ctrl-C, SIGTERM) stops
sending, gives requests in flight ``grace`` seconds, cancels the rest (recorded as
``cancelled``) and still writes a complete summary.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import ipaddress
import logging
import platform
import random
import secrets
import sys
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

import aiohttp

from loadgen.arrivals import (
    Due,
    Shard,
    Stage,
    linear_stages,
    parse_arrival,
    parse_stages,
)
from loadgen.arrivals import schedule as make_schedule
from loadgen.client import ClientSettings, make_session, send_request
from loadgen.closedloop import run_closed_loop
from loadgen.config import LoadConfig, auth_headers
from loadgen.dispatch import OpenLoop
from loadgen.guard import GuardRail
from loadgen.live import LiveMetrics
from loadgen.progress import Progress
from loadgen.record import RunDirectory
from loadgen.sampler import ServerSampler
from loadgen.slo import SloTerm, parse_slo
from loadgen.summary import Summary, summarize_stages
from loadgen.timing import RequestTiming
from loadgen.tokens import pick_counter
from loadgen.workload import Workload, build_workload, check_workload, request_body
from monitor import names
from servemon.errors import ConfigError, TargetError

if TYPE_CHECKING:
    from loadgen.capacity import CapacityResult

__all__ = [
    "DEFAULT_STAGES",
    "RunResult",
    "StageRecord",
    "Stopper",
    "discover_model",
    "run_load",
]

DEFAULT_STAGES = "1:10,2:10,4:10"
#: How long cancelled requests get to record themselves before the run goes on.
ABANDON_AFTER_S = 5.0
log = logging.getLogger("servemon.loadgen")
ENGINE_WAITING = names.ENGINE_REQUESTS_WAITING.name
Kind = Literal["ramp", "sweep", "capacity"]


@dataclass(frozen=True, slots=True)
class Stopper:
    """How a run is stopped from outside: ``requested`` stops sending and gives the
    requests in flight the grace period; ``hurry`` cancels them at once."""

    requested: asyncio.Event = field(default_factory=asyncio.Event)
    hurry: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(slots=True)
class StageRecord:
    """One stage (ramp) or level (sweep) as it ran."""

    index: int
    label: str
    target_rate: float | None
    parallel: int | None
    planned_s: float | None
    start_s: float | None = None
    end_s: float | None = None
    sent: int = 0
    held_back: int = 0
    skipped: int = 0
    timings: list[RequestTiming] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class RunResult:
    """Where the run went and how it ended."""

    path: Path
    status: str
    stages: list[StageRecord]
    summaries: list[Summary]
    overall: Summary
    capacity: CapacityResult | None = None
    stop_reason: str | None = None


async def target_version(session: aiohttp.ClientSession, base_url: str) -> str | None:
    """The engine version from ``/version`` (vLLM has it), else None."""
    try:
        async with session.get(
            base_url.rstrip("/") + "/version", timeout=aiohttp.ClientTimeout(total=5)
        ) as resp:
            if resp.status != 200:
                return None
            body = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    version = body.get("version") if isinstance(body, dict) else None
    return str(version) if version is not None else None


def local_gpus() -> list[dict[str, Any]] | str:
    """GPU names, driver and memory from NVML where the load generator runs, or
    why there are none (blocking: call through a thread)."""
    from monitor.gpu import GpuUnavailable, NvmlReader

    reader = NvmlReader()
    try:
        reader.open()
        snapshot = reader.read()
    except GpuUnavailable as exc:
        return f"none ({exc})"
    except Exception as exc:
        return f"none ({type(exc).__name__}: {exc})"
    finally:
        reader.close()
    return [
        {
            "index": g.index,
            "name": g.name,
            "uuid": g.uuid,
            "driver": snapshot.driver_version,
            "memory_total_bytes": g.memory_total_bytes,
        }
        for g in snapshot.gpus
    ]


async def discover_model(
    session: aiohttp.ClientSession, base_url: str, model: str | None
) -> tuple[str, Any]:
    """The model to use (``model`` or the first of ``/v1/models``) and the listing."""
    url = base_url.rstrip("/") + "/v1/models"
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=10)) as resp:
            if resp.status != 200:
                raise TargetError(f"{url}: HTTP {resp.status}")
            listing = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise TargetError(f"{url}: {type(exc).__name__}: {exc}") from None
    ids = [m.get("id") for m in listing.get("data", []) if isinstance(m, dict)]
    if model is None:
        if not ids or not isinstance(ids[0], str):
            raise TargetError(f"{url}: no models listed; give --model")
        model = ids[0]
    return model, listing


def check_load_config(kind: Kind, config: LoadConfig) -> None:
    """Every check of a load command's settings that needs no target: stages, SLO,
    arrival, shard, start time, cancellations, the workload spec (and file). Run
    before anything is started, so a bad flag costs nothing."""
    if config.slo:
        parse_slo(config.slo)
    plan_stages(kind, config)
    if kind == "capacity":
        from loadgen.capacity import check_config

        check_config(config)
    if config.shard is not None:
        Shard.parse(config.shard)
    if config.start_at is not None:
        parse_start_at(config.start_at)
    parse_arrival(config.arrival)
    if config.cancel_fraction > 0 and (
        config.cancel_after is None and config.cancel_after_tokens is None
    ):
        raise ConfigError(
            "--cancel-fraction: give --cancel-after or --cancel-after-tokens"
        )
    check_workload(config.workload)


def plan_stages(kind: Kind, config: LoadConfig) -> list[StageRecord]:
    """The stages of a ramp or the levels of a sweep (a capacity search makes its
    steps as it goes)."""
    if kind == "capacity":
        return []
    if kind == "ramp":
        if config.stages is not None:
            stages = parse_stages(config.stages)
        elif config.rps_start is not None:
            stages = linear_stages(
                config.rps_start,
                config.rps_end if config.rps_end is not None else config.rps_start,
                config.rps_step if config.rps_step is not None else 1.0,
                config.step_seconds if config.step_seconds is not None else 30.0,
            )
        else:
            stages = parse_stages(DEFAULT_STAGES)
        return [
            StageRecord(s.index, f"{s.rate:g} rps", s.rate, None, s.duration_s)
            for s in stages
        ]
    numbers = list(config.number)
    if len(numbers) == 1:
        numbers *= len(config.parallel)
    if len(numbers) != len(config.parallel):
        raise ConfigError(
            f"--number: {len(numbers)} values for {len(config.parallel)} --parallel "
            "levels (give one, or one per level)"
        )
    return [
        StageRecord(i, f"parallel {p}", None, p, None)
        for i, p in enumerate(config.parallel)
    ]


def parse_start_at(text: str) -> datetime:
    """``--start-at``: an ISO 8601 time; without a zone it is UTC."""
    try:
        at = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(
            f"--start-at {text!r}: expected an ISO 8601 time, e.g. 2026-12-01T10:00:00Z"
        ) from None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def is_loopback(url: str) -> bool:
    """Whether ``url`` points at this machine."""
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_rate_bound(
    kind: str, config: LoadConfig, target: str, stages: Sequence[StageRecord]
) -> None:
    """A guard rail: open-loop load on another machine needs ``--rps-max``."""
    if kind == "sweep":
        return
    if config.rps_max is None:
        if not is_loopback(target):
            raise ConfigError(
                f"--rps-max: required when the target is not on this machine "
                f"({urlsplit(target).hostname}): it bounds the load servemon may send"
            )
        return
    over = [r for s in stages if (r := s.target_rate or 0.0) > config.rps_max]
    if over:
        raise ConfigError(
            f"--stages: {max(over):g} req/s is over --rps-max {config.rps_max:g}"
        )


def redact_argv(argv: Sequence[str]) -> list[str]:
    """The command line with every ``--header`` value replaced by ``<redacted>``."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            name = arg.partition(":")[0]
            out.append(f"{name}: <redacted>")
            hide_next = False
        elif arg == "--header":
            out.append(arg)
            hide_next = True
        elif arg.startswith("--header="):
            out.append(
                f"--header={arg.removeprefix('--header=').partition(':')[0]}: "
                "<redacted>"
            )
        else:
            out.append(arg)
    return out


def recorded_config(config: LoadConfig) -> dict[str, Any]:
    """The config as run.json keeps it: header values redacted."""
    data = asdict(config)
    data["header"] = [
        f"{h.partition(':')[0].strip()}: <redacted>" for h in config.header
    ]
    return data


async def run_load(
    kind: Kind,
    config: LoadConfig,
    target: str,
    *,
    argv: Sequence[str],
    stop: Stopper,
    env: Mapping[str, str],
    progress: Progress,
    embedded: Mapping[str, Any] | None = None,
) -> RunResult:
    """Run a ramp or a sweep against ``target`` (a base URL); see module docstring."""
    check_load_config(kind, config)
    slo = parse_slo(config.slo) if config.slo else []
    stages = plan_stages(kind, config)
    check_rate_bound(kind, config, target, stages)
    arrival = parse_arrival(config.arrival)
    headers = {k: v.reveal() for k, v in auth_headers(config, env).items()}
    settings = ClientSettings(
        max_connections=config.max_connections, timeout_s=config.timeout
    )
    base = target.rstrip("/")
    async with make_session(settings) as session:
        model, listing = await discover_model(session, base, config.model)
        version, gpus = await asyncio.gather(
            target_version(session, base), asyncio.to_thread(local_gpus)
        )
        label = config.target_name or urlsplit(base).netloc
        live = LiveMetrics(label, model, slo)
        try:
            await live.serve(config.metrics_host, config.metrics_port)
        except OSError as exc:
            raise ConfigError(
                f"--metrics-port {config.metrics_port}: cannot listen on "
                f"{config.metrics_host}: {exc.strerror or exc}"
            ) from None
        try:
            counter = await pick_counter(session, base, model, config.tokenizer)
            workload = await build_workload(
                config.workload, counter=counter, seed=config.seed
            )
            rundir = RunDirectory.create(Path(config.out), kind)
            run = RunState(
                kind,
                config,
                base,
                model,
                session,
                rundir,
                live,
                workload,
                headers,
                slo,
                stages,
                progress,
            )
            info: dict[str, Any] = {
                "kind": kind,
                "status": "running",
                "servemon_version": _version(),
                "command": redact_argv(argv),
                "config": recorded_config(config),
                "target": {
                    "url": base,
                    "model": model,
                    "models": listing,
                    "embedded_simulator": embedded,
                },
                "workload": {
                    "spec": workload.spec,
                    "token_source": workload.token_source,
                },
                "client": {
                    **asdict(settings),
                    "trust_env": False,
                    "loop": _loop_name(),
                    "live_metrics": live.url,
                },
                "arrival": str(arrival) if kind == "ramp" else None,
                "slo": [str(t) for t in slo],
                "clock_origin": rundir.clock_origin,
                "environment": {
                    "python": sys.version.split()[0],
                    "platform": platform.platform(),
                    "host": platform.node(),
                    "gpus": gpus,
                },
                "engine_version": version or "none",
                # The plan, so that a run killed before its end still knows its
                # stages (the end rewrites them with what happened).
                "stages": [
                    {
                        "stage": r.index,
                        "label": r.label,
                        "target_rate": r.target_rate,
                        "parallel": r.parallel,
                        "planned_s": r.planned_s,
                    }
                    for r in stages
                ],
            }
            rundir.write_run(info)
            return await run.execute(info, stop, arrival)
        finally:
            await live.stop()


class RunState:
    """The state of one run while it executes."""

    def __init__(
        self,
        kind: Kind,
        config: LoadConfig,
        base: str,
        model: str,
        session: aiohttp.ClientSession,
        rundir: RunDirectory,
        live: LiveMetrics,
        workload: Workload,
        headers: dict[str, str],
        slo: list[SloTerm],
        stages: list[StageRecord],
        progress: Progress,
    ) -> None:
        self.kind, self.config, self.base, self.model = kind, config, base, model
        self.label = config.target_name or urlsplit(base).netloc
        self.session, self.rundir, self.live = session, rundir, live
        self.workload, self.headers, self.slo = workload, headers, slo
        self.stages, self.progress = stages, progress
        self.url = base + (
            "/v1/chat/completions" if config.api == "chat" else "/v1/completions"
        )
        self.tag = secrets.token_hex(3)
        self.guard = GuardRail(
            abort_error_rate=config.abort_error_rate, max_waiting=config.abort_waiting
        )
        self.stop_reason: str | None = None
        self.capacity: CapacityResult | None = None
        self.start_late_s: float | None = None
        self.stopper = Stopper()
        #: (monotonic time, normalized samples) of the target, newest last.
        self.history: deque[tuple[float, list[list[Any]]]] = deque(maxlen=3600)

    def body(self, index: int) -> dict[str, Any]:
        c = self.config
        return request_body(
            self.workload.prompt(index),
            api=c.api,
            model=self.model,
            stream=c.stream,
            ignore_eos=c.ignore_eos,
            extra_body=c.extra_body,
        )

    def _body_from(self, offset: int, index: int) -> dict[str, Any]:
        return self.body(offset + index)

    def _cancel_from(self, offset: int, index: int) -> dict[str, Any]:
        return self.cancel_options(offset + index)

    def cancel_options(self, index: int) -> dict[str, Any]:
        c = self.config
        if c.cancel_fraction <= 0:
            return {}
        if random.Random(f"cancel:{c.seed}:{index}").random() >= c.cancel_fraction:
            return {}
        return {
            "cancel_after_s": c.cancel_after,
            "cancel_after_tokens": c.cancel_after_tokens,
        }

    def started(self) -> None:
        """A measured request goes out."""
        self.live.in_flight.inc()

    def finished(self, timing: RequestTiming) -> None:
        self.live.in_flight.dec()
        self.rundir.append_request(timing)
        self.live.observe(timing)
        self.stages[timing.stage].timings.append(timing)
        self.progress.request_done(timing)
        self.abort(self.guard.observe(timing))

    def sampled(self, sample: Mapping[str, Any]) -> None:
        """A sample of the target's metrics: record it, watch the queue."""
        self.rundir.append_server_sample(sample)
        values = sample.get("samples")
        if values:
            self.history.append((float(sample["mono_s"]), values))
            waiting = sum(v for n, _l, v in values if n == ENGINE_WAITING)
            self.abort(self.guard.observe_waiting(waiting))

    def abort(self, reason: str | None) -> None:
        """Stop the run at once for ``reason`` (a guard rail tripped)."""
        if reason is None or self.stop_reason is not None:
            return
        self.stop_reason = reason
        self.progress.console.print(f"servemon: stopping: {reason}")
        self.stopper.requested.set()
        self.stopper.hurry.set()

    async def execute(
        self, info: dict[str, Any], stop: Stopper, arrival: Any
    ) -> RunResult:
        self.stopper = stop
        sampler = ServerSampler(
            self.session,
            self.base + "/metrics",
            self.sampled,
            interval_s=self.config.sample_interval,
        )
        sampling = asyncio.create_task(sampler.run())
        # What exists now lives as long as the run: keep the collector off it.
        gc.freeze()
        self.progress.growing = self.kind == "capacity"
        self.progress.start(self.stages)
        status = "failed"
        try:
            if self.kind == "ramp":
                interrupted = await self._ramp(stop, arrival)
            elif self.kind == "capacity":
                from loadgen.capacity import search

                interrupted = await search(self, stop, arrival)
            else:
                interrupted = await self._sweep(stop)
            status = "interrupted" if interrupted else "completed"
            if self.stop_reason is not None:
                status = "aborted"
        except asyncio.CancelledError:
            status = "interrupted"
            raise
        finally:
            sampling.cancel()
            await asyncio.gather(sampling, return_exceptions=True)
            self.live.stage(-1, 0.0)
            self.progress.stop()
            result = self._finish(info, status, sampler)
            self.rundir.close()
        return result

    async def _ramp(self, stop: Stopper, arrival: Any) -> bool:
        plan: list[Stage] = []
        offset = 0.0
        for s in self.stages:
            duration = s.planned_s or 0.0
            plan.append(Stage(s.index, s.target_rate or 0.0, duration, offset))
            offset += duration
        c = self.config
        shard = Shard.parse(c.shard) if c.shard else None
        start = await self._wait_for_start(stop)
        if start is None:
            return True
        return await self.open_loop(
            plan,
            stop,
            arrival,
            seed=c.seed,
            limit=c.max_requests,
            shard=shard,
            start_s=start,
        )

    async def _wait_for_start(self, stop: Stopper) -> float | None:
        """The monotonic start of the schedule: ``--start-at`` (shared by shards)
        or now; None if the run was stopped while waiting."""
        c = self.config
        if c.start_at is None:
            return time.monotonic() + 0.05
        at = parse_start_at(c.start_at)
        delay = (at - datetime.now(UTC)).total_seconds()
        self.start_late_s = max(0.0, -delay)
        if delay > 0:
            self.progress.console.print(
                f"servemon: waiting {delay:.1f} s for --start-at {c.start_at}"
            )
            if await _until_stopped(asyncio.sleep(delay), stop.requested):
                return None
        return time.monotonic()

    async def open_loop(
        self,
        plan: list[Stage],
        stop: Stopper,
        arrival: Any,
        *,
        seed: int,
        limit: int | None = None,
        first_index: int = 0,
        halt: asyncio.Event | None = None,
        shard: Shard | None = None,
        start_s: float | None = None,
    ) -> bool:
        """Send ``plan`` open loop; True if the run was stopped meanwhile.

        Setting ``halt`` ends this dispatch early (a capacity step judged already):
        sending stops and the requests in flight get the grace period.
        """
        c = self.config
        start = time.monotonic() + 0.05 if start_s is None else start_s

        def on_stage(index: int) -> None:
            gc.freeze()  # the records of the stages before are there to stay
            stage = next(p for p in plan if p.index == index)
            self.stages[index].start_s = start + stage.start_s
            self.live.stage(index, stage.rate)
            self.progress.stage_started(index)

        def on_skip(due: Due) -> None:
            self.live.skipped.labels(
                self.label, self.model, str(due.stage), "late"
            ).inc()

        def on_hold(due: Due) -> None:
            self.live.held_back.labels(self.label, self.model, str(due.stage)).inc()

        async def send(due: Due, at: float) -> None:
            index = first_index + due.index
            self.started()
            timing = await send_request(
                self.session,
                self.url,
                self.body(index),
                request_id=f"{self.tag}-{index}",
                stage=due.stage,
                scheduled_s=at,
                headers=self.headers,
                timeout_s=c.timeout,
                record_interruption=True,
                **self.cancel_options(index),
            )
            self.finished(timing)

        loop = OpenLoop(
            send,
            max_inflight=c.max_inflight,
            late=c.late,
            late_tolerance_s=c.late_tolerance,
            on_stage=on_stage,
            on_skip=on_skip,
            on_hold=on_hold,
        )
        self.progress.open_loop = loop
        due = make_schedule(plan, arrival, seed, limit=limit, shard=shard)
        dispatching = asyncio.create_task(loop.run(due, start))
        ending = (stop.requested,) if halt is None else (stop.requested, halt)
        try:
            interrupted = await _until_stopped(dispatching, *ending)
        except BaseException:
            # This task itself was cancelled (or broke): stop sending, and cancel
            # the requests in flight, which record themselves, rather than leave
            # them running against a session about to close.
            dispatching.cancel()
            await asyncio.gather(dispatching, return_exceptions=True)
            await _grace(set(loop.tasks), 0.0, stop.hurry)
            raise
        if interrupted:
            dispatching.cancel()
            await asyncio.gather(dispatching, return_exceptions=True)
        end_of_schedule = time.monotonic()
        for stage in plan:
            record = self.stages[stage.index]
            record.sent = loop.counts.sent[stage.index]
            record.held_back = loop.counts.held_back[stage.index]
            record.skipped = loop.counts.skipped[stage.index]
            if record.start_s is not None:
                planned_end = start + stage.end_s
                if interrupted:
                    planned_end = min(end_of_schedule, planned_end)
                record.end_s = planned_end
        # Requests in flight: let them finish (bounded by the request timeout), or
        # give them the grace period once a stop is asked for.
        waited = await _until_stopped(_all_done(loop), *ending)
        if waited or interrupted:
            await _grace(set(loop.tasks), c.grace, stop.hurry)
        return stop.requested.is_set()

    async def _sweep(self, stop: Stopper) -> bool:
        c = self.config
        numbers = list(c.number) * (len(c.parallel) if len(c.number) == 1 else 1)
        first = 0  # each level's prompts follow the last level's: none sent twice
        for record, number in zip(self.stages, numbers, strict=True):
            if stop.requested.is_set():
                return True
            offset = first
            first += c.warmup + number
            assert record.parallel is not None
            record.start_s = time.monotonic()
            self.live.stage(record.index, 0.0)
            self.progress.stage_started(record.index)
            level = asyncio.create_task(
                run_closed_loop(
                    self.session,
                    self.url,
                    functools.partial(self._body_from, offset),
                    concurrency=record.parallel,
                    number=number,
                    warmup=c.warmup,
                    headers=self.headers,
                    id_prefix=f"{self.tag}-p{record.parallel}",
                    timeout_s=c.timeout,
                    stage=record.index,
                    on_done=self.finished,
                    on_send=self.started,
                    stop=stop.requested,
                    options=functools.partial(self._cancel_from, offset),
                )
            )
            try:
                interrupted = await _until_stopped(level, stop.requested)
            finally:
                if not level.done():
                    await _grace(
                        {level}, c.grace if stop.requested.is_set() else 0.0, stop.hurry
                    )
            record.end_s = time.monotonic()
            record.sent = len(record.timings)
            if interrupted:
                return True
        return False

    def _finish(
        self, info: dict[str, Any], status: str, sampler: ServerSampler
    ) -> RunResult:
        origin = self.rundir.origin_s
        metas: list[dict[str, Any]] = []
        durations: list[float | None] = []
        for record in self.stages:
            duration = None
            if record.planned_s is not None and record.start_s is not None:
                duration = record.planned_s
                if record.end_s is not None:
                    duration = min(record.planned_s, record.end_s - record.start_s)
            durations.append(duration)
            metas.append(
                {
                    "stage": record.index,
                    "label": record.label,
                    "target_rate": record.target_rate,
                    "parallel": record.parallel,
                    "planned_s": record.planned_s,
                    "start_s": None
                    if record.start_s is None
                    else record.start_s - origin,
                    "end_s": None if record.end_s is None else record.end_s - origin,
                    "sent": record.sent,
                    "held_back": record.held_back,
                    "skipped": record.skipped,
                }
            )
        built = summarize_stages(
            metas, [record.timings for record in self.stages], durations, self.slo
        )
        stage_json, summaries, overall = built.entries, built.summaries, built.overall
        self.rundir.write_summary(
            {
                "kind": self.kind,
                "status": status,
                "stages": stage_json,
                "overall": overall.to_json(),
                "slo": [str(t) for t in self.slo],
                "stop_reason": self.stop_reason,
                "capacity": None if self.capacity is None else self.capacity.to_json(),
            },
            built.rows,
        )
        info.update(
            status=status,
            stop_reason=self.stop_reason,
            shard=self.config.shard,
            start_at=self.config.start_at,
            start_late_s=self.start_late_s,
            ended_utc=datetime.now(UTC).isoformat(timespec="milliseconds"),
            stages=[
                {k: v for k, v in entry.items() if k != "summary"}
                for entry in stage_json
            ],
            server_metrics={
                "scrapes": sampler.scrapes,
                "errors": sampler.errors,
                "engine_info": sampler.engine_info or None,
            },
        )
        self.rundir.write_run(info)
        return RunResult(
            self.rundir.path,
            status,
            self.stages,
            summaries,
            overall,
            self.capacity,
            self.stop_reason,
        )


async def _until_stopped(work: Any, *stops: asyncio.Event) -> bool:
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


async def _grace(
    tasks: set[asyncio.Task[Any]], grace_s: float, hurry: asyncio.Event
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


async def _all_done(loop: OpenLoop) -> None:
    while loop.tasks:
        await asyncio.wait(set(loop.tasks))


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("servemon")
    except PackageNotFoundError:
        return "unknown"


def _loop_name() -> str:
    loop = asyncio.get_running_loop()
    return f"{type(loop).__module__}.{type(loop).__name__}"
