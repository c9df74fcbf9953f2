"""A whole load run: plan, send, record, sample, publish, summarize.

:func:`run_load` checks the settings (:mod:`servemon.loadgen.run.plan`), finds out about
the target (:mod:`servemon.loadgen.run.target`), opens the run directory, the live
client metrics and the sampler of the target's ``/metrics``, builds the run's
:class:`~servemon.loadgen.run.context.RunContext` and hands it to the driver of the
run's kind (:data:`DRIVERS`), with its command's section. However the driver ends —
done, stopped by Ctrl-C or SIGTERM (:mod:`servemon.loadgen.send.stopping`), a guard
rail, a crash — the record is finished through
:func:`servemon.loadgen.record.runrecord.write_record` with a complete summary.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Generic
from urllib.parse import urlsplit

import aiohttp

from servemon.core.errors import ConfigError, RecordError
from servemon.core.version import __version__
from servemon.core.wire.webconfig import WebConfig
from servemon.loadgen.drivers.capacity import drive_capacity
from servemon.loadgen.drivers.control import drive_control
from servemon.loadgen.drivers.ramp import drive_ramp
from servemon.loadgen.drivers.replay import drive_replay
from servemon.loadgen.drivers.sweep import drive_sweep
from servemon.loadgen.fleet.coordinator import Fleet
from servemon.loadgen.fleet.members import FleetPlan
from servemon.loadgen.fleet.settings import FleetSettings
from servemon.loadgen.record.record import RunDirectory
from servemon.loadgen.record.runrecord import (
    RunInfo,
    RunResult,
    RunSummary,
    write_record,
)
from servemon.loadgen.record.sections import (
    ClientRecord,
    EmbeddedSimulator,
    EnergyRecord,
    WorkloadRecord,
)
from servemon.loadgen.record.tally import with_hit_rates
from servemon.loadgen.run import sections
from servemon.loadgen.run.config import LoadConfig, Settings, auth_headers
from servemon.loadgen.run.context import Drive, Driven, RunContext
from servemon.loadgen.run.energy import (
    EnergySampler,
    late_line,
    never_line,
    open_energy,
)
from servemon.loadgen.run.live import LiveMetrics
from servemon.loadgen.run.plan import (
    Kind,
    Plan,
    check_rate_bound,
    recorded_config,
    redact_argv,
)
from servemon.loadgen.run.prefixcache import find_prefix_target, send_warm
from servemon.loadgen.run.progress import Progress
from servemon.loadgen.run.promsource import PrometheusSampler
from servemon.loadgen.run.promtargets import ScrapeInterval
from servemon.loadgen.run.sampler import ServerSampler
from servemon.loadgen.run.sender import Sender, endpoint, model_picker
from servemon.loadgen.run.sources import (
    make_sampler,
    prom_headers,
    scrape_interval_of,
    server_metrics_record,
)
from servemon.loadgen.run.stages import StageRecord
from servemon.loadgen.run.target import TargetFacts, is_loopback, survey
from servemon.loadgen.run.workloadrecord import workload_record
from servemon.loadgen.send.arrivals import Arrival
from servemon.loadgen.send.client import ClientSettings, make_session
from servemon.loadgen.send.cpulatency import hold_cpu_latency
from servemon.loadgen.send.stopping import Stopper
from servemon.loadgen.workloads.modelmix import ModelMix
from servemon.loadgen.workloads.prefix import PrefixWorkload
from servemon.loadgen.workloads.prompts import Workload
from servemon.loadgen.workloads.tokens import pick_counter
from servemon.loadgen.workloads.traceprompts import TraceWorkload
from servemon.loadgen.workloads.workload import build_workload

__all__ = [
    "DRIVERS",
    "Stopper",
    "recorded_config",
    "redact_argv",
    "run_load",
]


@dataclass(frozen=True, slots=True)
class Driver(Generic[Settings]):
    """A kind of run's driver, and the settings it reads: its command's section of
    :class:`LoadConfig` (:data:`~servemon.loadgen.run.sections.SECTIONS`)."""

    settings: type[Settings]
    drive: Callable[[Drive[Settings], Driven], Awaitable[None]]

    async def __call__(self, ctx: RunContext, arrival: Arrival, found: Driven) -> None:
        await self.drive(ctx.drive(self.settings, arrival), found)


#: The driver of each kind of load run.
DRIVERS: dict[Kind, Driver[Any]] = {
    "ramp": Driver(sections.RampArgs, drive_ramp),
    "sweep": Driver(sections.SweepArgs, drive_sweep),
    "capacity": Driver(sections.CapacityArgs, drive_capacity),
    "replay": Driver(sections.ReplayArgs, drive_replay),
    "control": Driver(sections.ControlArgs, drive_control),
}


async def run_load(
    plan: Plan,
    config: LoadConfig,
    target: str,
    *,
    argv: Sequence[str],
    stop: Stopper,
    env: Mapping[str, str],
    progress: Progress,
    embedded: EmbeddedSimulator | None = None,
    fleet: FleetSettings | None = None,
) -> RunResult:
    """Run a load command, checked and planned already
    (:func:`~servemon.loadgen.run.plan.make_plan`), against ``target`` (a base
    URL); with ``fleet``, sent by its workers.

    The steps: find out about the target (:func:`survey`), serve the live client
    metrics, build the workload, open the run directory and write the record's
    opening, warm a ``prefix:`` workload's cache, then drive (:func:`_execute`)."""
    check_rate_bound(plan.kind, config, target, plan.stages)
    headers = {k: v.reveal() for k, v in auth_headers(env, plan.headers).items()}
    settings = ClientSettings(
        max_connections=config.max_connections, timeout_s=config.timeout
    )
    models = None if config.model is None else config.model.mix
    async with make_session(settings) as session:
        facts = await survey(session, target.rstrip("/"), config.model, headers)
        given = config
        scrape = await scrape_interval_of(session, config, progress)
        if scrape is not None:
            config = replace(config, scrape_interval=scrape.seconds)
        live = await _serve_live(config, facts, plan.web_config)
        say = progress.console.print
        coordinator = None if fleet is None else Fleet(fleet, say, plan.web_config)
        try:
            if coordinator is not None:
                await coordinator.listen()
            workload, recorded = await _build_workload(
                session, facts, config, headers, progress
            )
            url = endpoint(facts.base, config.api)
            if coordinator is not None:
                await coordinator.gather(FleetPlan(url, headers, config))
            sender = Sender(
                session=session,
                url=url,
                headers=headers,
                config=config,
                workload=workload,
                model=facts.model,
                pick_model=model_picker(config.seed, models, facts.model, workload),
                transport=coordinator,
            )
            ctx = RunContext(
                kind=plan.kind,
                replay=plan.replay,
                config=config,
                base=facts.base,
                rundir=RunDirectory.create(Path(config.out), plan.kind),
                live=live,
                stages=plan.stages,
                progress=progress,
                stopper=stop,
                sender=sender,
            )
            info = _opening(ctx, given, argv, facts, recorded, embedded, settings)
            # Its workers: a killed run's spools are told apart by their names.
            if coordinator is not None:
                info = replace(info, fleet=coordinator.record(ctx.rundir.origin_s))
            write_record(ctx.rundir.path, info)
            if isinstance(workload, PrefixWorkload):
                await _warm(sender, workload, models, config.timeout)
            if coordinator is not None:
                coordinator.on_abort = ctx.abort
            with hold_cpu_latency(config.cpu_dma_latency):
                return await _execute(ctx, info, config.arrival, scrape, coordinator)
        finally:
            if coordinator is not None:
                await coordinator.stop(config.grace)
            await live.stop()


async def _serve_live(
    config: LoadConfig, facts: TargetFacts, web_config: WebConfig | None
) -> LiveMetrics:
    """The live client metrics, listening (a port taken is a one-line
    :class:`ConfigError`)."""
    label = config.target_name or urlsplit(facts.base).netloc
    live = LiveMetrics(label, facts.model, list(config.slo_terms))
    try:
        await live.serve(
            config.metrics_host, config.metrics_port, web_config=web_config
        )
    except OSError as exc:
        raise ConfigError(
            f"--metrics-port {config.metrics_port}: cannot listen on "
            f"{config.metrics_host}: {exc.strerror or exc}"
        ) from None
    return live


async def _build_workload(
    session: aiohttp.ClientSession,
    facts: TargetFacts,
    config: LoadConfig,
    headers: Mapping[str, str],
    progress: Progress,
) -> tuple[Workload, WorkloadRecord]:
    """The run's prompts, counted by the target's tokenizer (else the
    ``--tokenizer``, else an estimate), fit to its context (a ``prefix:``
    workload: to its cache's blocks), and their record."""
    base, model = facts.base, facts.model
    counter = await pick_counter(session, base, model, config.tokenizer, headers)
    prefix = (
        await find_prefix_target(
            session, base, model.split(",")[0], config.api, headers
        )
        if config.workload.kind == "prefix"
        else None
    )
    context = facts.context
    workload = await build_workload(
        config.workload,
        counter=counter,
        seed=config.seed,
        context=context,
        over_context=config.over_context,
        **(prefix.build_options() if prefix else {}),
    )
    said = workload.said() if isinstance(workload, TraceWorkload) else None
    if said is not None:
        progress.console.print(said, soft_wrap=True)
    return workload, workload_record(workload, context, prefix)


def _opening(
    ctx: RunContext,
    given: LoadConfig,
    argv: Sequence[str],
    facts: TargetFacts,
    workload: WorkloadRecord,
    embedded: EmbeddedSimulator | None,
    settings: ClientSettings,
) -> RunInfo:
    """``run.json`` as the run starts (``status: running``): its conditions, and
    the plan, so that a run killed before its end still knows its stages (the
    end rewrites them with what happened)."""
    config = ctx.config
    return RunInfo(
        kind=ctx.kind,
        status="running",
        clock_origin=ctx.rundir.clock_origin,
        servemon_version=__version__,
        command=redact_argv(argv),
        config=recorded_config(given),
        target=facts.record(embedded),
        workload=workload,
        client=ClientRecord.of(
            settings,
            loop=_loop_name(),
            cpu_dma_latency_us=config.cpu_dma_latency,
            live_metrics=ctx.live.url,
        ),
        arrival=str(config.arrival) if ctx.kind != "sweep" else None,
        slo_terms=list(config.slo_terms),
        environment=facts.environment(),
        engine_version=facts.version or "none",
        stages=[r.result(ctx.rundir.origin_s) for r in ctx.stages],
    )


async def _warm(
    sender: Sender, workload: PrefixWorkload, mix: ModelMix | None, wait_s: float
) -> None:
    """Each group's prefix in the cache before the first stage, for every model
    asked for (the one, or each of a mix); not recorded."""
    models = (sender.model,) if mix is None else mix.names
    bodies = [
        sender.body_of(prompt, name) for name in models for prompt in workload.warm
    ]
    await send_warm(sender.session, sender.url, bodies, sender.headers, wait_s)


async def _execute(
    ctx: RunContext,
    info: RunInfo,
    arrival: Arrival,
    scrape: ScrapeInterval | None,
    fleet: Fleet | None,
) -> RunResult:
    sender = ctx.sender
    sampler = make_sampler(
        ctx.config, sender.session, ctx.base, ctx.sampled, sender.headers
    )
    c = ctx.config
    energy, said = await open_energy(
        c.energy,
        session=sender.session,
        target_is_local=is_loopback(ctx.base),
        prometheus=c.prometheus,
        select=c.select,
        prom_headers=prom_headers(c),
        sink=ctx.sampled,
        interval_s=c.sample_interval,
    )
    console = ctx.progress.console
    console.print(said, soft_wrap=True)
    origin = ctx.rundir.origin_s
    if energy is not None:
        energy.on_late_start = lambda e: console.print(
            late_line(e, origin), soft_wrap=True
        )
    sampling = asyncio.create_task(sampler.run())
    watching = asyncio.create_task(ctx.watch.run())
    metering = asyncio.create_task(energy.run()) if energy is not None else None
    # What exists now lives as long as the run: keep the collector off it.
    gc.freeze()
    ctx.progress.growing = ctx.kind == "capacity"
    ctx.progress.start(ctx.stages)
    status = "failed"
    found = Driven()
    try:
        await DRIVERS[ctx.kind](ctx, arrival, found)
        status = "interrupted" if found.interrupted else "completed"
        if ctx.stop_reason is not None:
            status = "aborted"
    except asyncio.CancelledError:
        status = "interrupted"
        raise
    finally:
        tasks = [t for t in (sampling, watching, metering) if t is not None]
        if energy is not None and status == "interrupted":
            await energy.sample_once()  # Ctrl-C: one last reading, no wait
        elif energy is not None:  # the last stage's end, read before it is summed
            await energy.read_past(time.monotonic(), 3 * energy.interval_s)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        ctx.live.stage(-1, 0.0)
        ctx.progress.stop()
        if energy is not None and energy.first.at is None:
            said = never_line(energy)
            console.print(said, soft_wrap=True)
        elif energy is not None and energy.late:
            said = late_line(energy, origin)
        info = replace(
            info,
            energy=EnergyRecord(said=said)
            if energy is None
            else energy.record(origin, said),
        )
        if fleet is not None:
            await fleet.stop(ctx.config.grace)
            info = replace(info, fleet=fleet.record(ctx.rundir.origin_s))
        try:
            result = _finish(ctx, info, status, sampler, found, scrape, energy)
        finally:
            ctx.rundir.close()
    return result


def _finish(
    ctx: RunContext,
    info: RunInfo,
    status: str,
    sampler: ServerSampler | PrometheusSampler,
    found: Driven,
    scrape: ScrapeInterval | None,
    energy: EnergySampler | None,
) -> RunResult:
    origin = ctx.rundir.origin_s
    ctx.client_limits()
    records: list[StageRecord] = ctx.stages
    durations = [r.duration_s() for r in records]
    stages, overall = ctx.tally.results([r.result(origin) for r in records], durations)
    windows = [(r.start_s, r.until_s()) for r in records]
    stages = with_hit_rates(ctx.readings, windows, stages)
    if energy is not None:
        prices = (ctx.config.gpu_hour_cost, ctx.config.node_hour_cost)
        stages, overall = energy.annotate(records, stages, overall, prices)
    summary = RunSummary(
        kind=ctx.kind,
        status=status,
        stages=stages,
        overall=overall,
        slo=[str(t) for t in ctx.config.slo_terms],
        stop_reason=ctx.stop_reason,
        capacity=found.capacity,
        control=found.control,
        **ctx.tally.groups(stages, durations),
    )
    info = replace(
        info,
        status=status,
        stop_reason=ctx.stop_reason,
        shard=None if ctx.config.shard is None else str(ctx.config.shard),
        start_at=None
        if ctx.config.start_at is None
        else ctx.config.start_at.isoformat(),
        start_late_s=found.start_late_s,
        ended_utc=datetime.now(UTC).isoformat(timespec="milliseconds"),
        stages=stages,
        server_metrics=server_metrics_record(ctx.config, sampler, scrape, origin),
    )
    try:
        write_record(ctx.rundir.path, info, summary)
        ctx.rundir.check()  # a request line that could not be written earlier
    except RecordError as exc:
        raise RecordError(
            f"{exc} (run {status}"
            + (f": {ctx.stop_reason}" if ctx.stop_reason else "")
            + f"); requests.jsonl keeps every request recorded before; "
            f"servemon report {ctx.rundir.path} rebuilds the summary once the "
            "directory can be written"
        ) from None
    return RunResult(ctx.rundir.path, info, summary)


def _loop_name() -> str:
    loop = asyncio.get_running_loop()
    return f"{type(loop).__module__}.{type(loop).__name__}"
