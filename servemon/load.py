"""The load commands run (``ramp``, ``sweep``, ``capacity``, ``replay``,
``control``): plan, workers, target, signals, run, summary table."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from servemon.embedded import embedded_simulator
from servemon.lifecycle import stop_on_signals
from servemon.loadgen.fleet.settings import FleetSettings, fleet_settings
from servemon.loadgen.record.capacityrows import at_capacity
from servemon.loadgen.record.columns import (
    ENERGY_COLUMNS,
    GROUP_COLUMNS,
    STAGE_COLUMNS,
    Column,
    Row,
    cells,
    energy_text,
    group_rows,
    measured_energy,
    prefix_lines,
    repeat_header,
    repeat_rows,
    table_rows,
)
from servemon.loadgen.record.runrecord import (
    CapacityResult,
    ControlResult,
    RunResult,
    RunSummary,
    TierResult,
)
from servemon.loadgen.record.sections import EmbeddedSimulator
from servemon.loadgen.run.clientwatch import limit_lines
from servemon.loadgen.run.config import LoadConfig
from servemon.loadgen.run.plan import Kind, Plan, make_plan
from servemon.loadgen.run.progress import Progress
from servemon.loadgen.runner import Stopper, run_load
from servemon.loadgen.send.clientcost import WorkerChoice, workers_for
from servemon.workers import local_workers

__all__ = ["capacity_lines", "console_for", "run_command", "summary_table"]


def console_for() -> Console:
    """A console for servemon's output: wide tables when not on a terminal."""
    console = Console(soft_wrap=True)
    if not console.is_terminal:
        console = Console(soft_wrap=True, width=200)
    return console


async def run_command(
    kind: Kind,
    config: LoadConfig,
    argv: Sequence[str],
    *,
    console: Console | None = None,
) -> RunResult:
    """Run a load command to the end (or to Ctrl-C/SIGTERM) and print the summary.

    The settings are checked first: a bad one fails before the built-in simulator
    or any worker is started.
    """
    # In a thread: a file: or trace: workload is read whole to check every line.
    plan = await asyncio.to_thread(make_plan, kind, config)
    fleet = fleet_settings(kind, config)
    console = console or console_for()
    if kind == "ramp" and config.workers == "auto":
        choice = auto_workers(config, plan)
        console.print(f"servemon: {choice.explain()}", soft_wrap=True)
        config = replace(config, workers=choice.workers)
    stop = Stopper()

    def stopping() -> None:
        console.print(
            f"servemon: stopping: no new requests; {config.grace:g} s for those in "
            "flight (signal again to cancel them now)"
        )

    def cancelling() -> None:
        console.print("servemon: cancelling the requests in flight")

    with stop_on_signals(
        stop.requested, stop.hurry, on_stop=stopping, on_hurry=cancelling
    ):
        async with (
            _target(config, console) as (url, embedded),
            _senders(config, fleet) as fleet,
        ):
            result = await run_load(
                plan,
                config,
                url,
                argv=argv,
                stop=stop,
                env=os.environ,
                progress=Progress(console),
                embedded=embedded,
                fleet=fleet,
            )
    console.print(summary_table(kind, result))
    if measured_energy(result.record):
        console.print(
            _table(
                "energy (the target's GPUs)",
                ENERGY_COLUMNS,
                table_rows(result.record),
            )
        )
    if result.record.by_level:
        pooled = Table(
            title="repeats pooled (in brackets: the lowest and highest repeat)",
            title_justify="left",
        )
        for header in repeat_header():
            pooled.add_column(header, justify="right")
        for row in repeat_rows(result.record):
            pooled.add_row(*row)
        console.print(pooled)
    for key in ("turn", "model"):
        rows = group_rows(result.record, key)
        if rows:
            console.print(_table(f"by {key}", GROUP_COLUMNS, rows))
    for line in limit_lines(result.stages):
        console.print(f"warning: {line}", soft_wrap=True)
    shown, missed = prefix_lines(result.info.workload, result.record)
    for line in shown:
        console.print(line, soft_wrap=True)
    for line in missed:
        console.print(f"warning: {line}", soft_wrap=True)
    if result.stop_reason:
        console.print(f"stopped early: {result.stop_reason}")
    if result.capacity is not None:
        console.print(capacity_lines(result.capacity, result.record))
    if result.record.control is not None:
        console.print(control_lines(result.record.control), soft_wrap=True)
    console.print(f"run directory: {result.path} ({result.status})")
    if not config.report:
        console.print(
            f"report: not written (--no-report; servemon report {result.path})"
        )
        return result
    # The report's plotting (matplotlib) is loaded only here, once a run has
    # ended: a bad flag is refused without it (1.0 s sooner on a busy 2-core VM).
    from servemon.loadgen.reports.report import write_report

    report = write_report(result.path)
    console.print(f"report: {report}")
    return result


@contextlib.asynccontextmanager
async def _target(
    config: LoadConfig, console: Console
) -> AsyncIterator[tuple[str, EmbeddedSimulator | None]]:
    if config.target is not None:
        yield config.target, None
        return
    async with embedded_simulator(config.sim_profile, config.sim_args) as url:
        console.print(
            f"servemon: no --target given: started the built-in simulator "
            f"(profile {config.sim_profile}) at {url}"
        )
        yield url, EmbeddedSimulator(config.sim_profile, list(config.sim_args))


@contextlib.asynccontextmanager
async def _senders(
    config: LoadConfig, fleet: FleetSettings | None
) -> AsyncIterator[FleetSettings | None]:
    """Who sends the run: this process, a fleet (``--fleet-listen``), or N worker
    processes of this machine as a fleet over loopback (``--workers N``)."""
    if isinstance(config.workers, int) and config.workers > 1:
        async with local_workers(config.workers, Path(config.out)) as local:
            yield local
        return
    yield fleet


def summary_table(kind: str, result: RunResult) -> Table:
    """The end-of-run table: one row per stage or level, then all (the columns of
    :data:`servemon.loadgen.record.columns.STAGE_COLUMNS`, as the report shows them)."""
    title = f"servemon {kind}: {result.status}"
    table = _table(title, STAGE_COLUMNS, table_rows(result.record))
    table.caption = "latencies in ms; goodput in requests/s meeting every --slo term"
    return table


def _table(title: str, columns: Sequence[Column], rows: Sequence[Row]) -> Table:
    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column.header, justify="right")
    for row in cells(columns, rows):
        table.add_row(*row)
    return table


def control_lines(held: ControlResult) -> str:
    """What ``servemon control`` held, in a few lines."""
    within = held.within
    share = "-" if within is None else f"{within:.0%}"
    mean = held.mean_offered_rps()
    lines = [
        f"held {held.signal}={held.setpoint:g} ({held.source}): within ±15 % in "
        f"{share} of {held.judged} ticks after the first {held.settle_s:.0f} s; "
        f"mean offered {mean or 0:.2f} req/s; {held.blind} ticks blind",
    ]
    if held.unreachable:
        lines.append(f"unreachable: {held.unreachable}")
    return "\n".join(lines)


def capacity_lines(found: CapacityResult, record: RunSummary | None = None) -> str:
    """The capacity search's answer, in a few lines (with ``record``: what a
    token cost at the capacity found, where energy was measured); over several SLO
    tiers, a few lines per tier, strictest first."""
    if found.tiers:
        return "\n".join(_tier_lines(found, tier, record) for tier in found.tiers)
    low, high = found.bracket
    if not found.steps:
        head = f"capacity: unknown (no step was judged: {found.ended_because})"
    elif found.capacity_rps is None and any(s.blind for s in found.steps):
        head = "capacity: unknown (blind before any rate was judged good)"
    elif found.capacity_rps is None:
        head = "capacity: below --rps-min (no rate met the SLO)"
    else:
        head = f"capacity: {found.capacity_rps:.4g} req/s meets the SLO"
        cost = _cost_at(found, record)
        if cost:
            head += f" at {cost}"
    bracket = f"between {low if low is not None else '-'} and "
    bracket += f"{high:.4g} req/s" if high is not None else "(no breaking rate found)"
    return "\n".join(
        [
            head,
            f"  found {bracket} ({found.ended_because})",
            f"  SLO that broke first: {found.first_breach or 'none'}",
            f"  saturated first: {found.saturated_first or 'nothing'}",
        ]
    )


def _tier_lines(
    found: CapacityResult, tier: TierResult, record: RunSummary | None
) -> str:
    """One tier's answer: its capacity, with the energy and cost per token of the
    step at it, its bracket, and what broke and saturated first."""
    low, high = tier.bracket
    name = f"capacity ({tier.name}: {tier.slo})"
    if tier.capacity_rps is None:
        head = f"{name}: below --rps-min (no rate met it)"
    else:
        head = f"{name}: {tier.capacity_rps:.4g} req/s meets it"
        at = None if record is None else at_capacity(found, record, tier.capacity_rps)
        cost = []
        for key, unit in (
            ("joules_per_token", "{:.3g} J/token"),
            ("cost_per_mtok", "${:.3g} per million output tokens"),
        ):
            value = None if at is None else at.value(key)
            if value is not None:
                cost.append(unit.format(value))
        if cost:
            head += " at " + ", ".join(cost)
    bracket = f"between {low if low is not None else '-'} and "
    bracket += f"{high:.4g} req/s" if high is not None else "(no breaking rate found)"
    return "\n".join(
        [
            head,
            f"  found {bracket} ({tier.ended_because})",
            f"  SLO that broke first: {tier.first_breach or 'none'}",
            f"  saturated first: {tier.saturated_first or 'nothing'}",
        ]
    )


def _cost_at(found: CapacityResult, record: RunSummary | None) -> str | None:
    """The energy and cost of the step that found the capacity (the good step at
    the capacity's rate)."""
    if record is None:
        return None
    good = [s.stage for s in found.steps if s.good and s.rate == found.capacity_rps]
    by_index = {s.stage: s for s in record.stages}
    for index in reversed(good):
        stage = by_index.get(index)
        if stage is not None and stage.summary is not None:
            text = energy_text(stage.summary)
            if text:
                return text
    return None


def auto_workers(config: LoadConfig, plan: Plan) -> WorkerChoice:
    """``--workers auto``: the workers the ramp's peak rate needs."""
    peak = max((s.target_rate or 0.0 for s in plan.stages), default=0.0)
    chunks = config.workload.output_ceiling if config.stream else 1
    return workers_for(peak, chunks)
