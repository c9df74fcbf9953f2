"""What the tables of a run show, declared once: the terminal table at the end of a
run, the report's HTML tables and ``servemon compare`` render these specs.

A figure is defined in :data:`servemon.loadgen.record.figures.FIGURES` (which also puts
it in ``summary.json`` and every statistic of it in ``summary.csv``); to show it in a
table, add a column here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from servemon.loadgen.record.runrecord import RunSummary
from servemon.loadgen.record.sections import WorkloadRecord
from servemon.loadgen.record.summary import Summary

__all__ = [
    "COMPARED",
    "ENERGY_COLUMNS",
    "GROUP_COLUMNS",
    "HIT_MARGIN",
    "REASONING_COLUMNS",
    "SERVER_COLUMNS",
    "STAGE_COLUMNS",
    "Column",
    "Compared",
    "Row",
    "cells",
    "energy_text",
    "group_rows",
    "measured_energy",
    "prefix_lines",
    "reasons",
    "repeat_header",
    "repeat_rows",
    "table_rows",
]


@dataclass(frozen=True, slots=True)
class Row:
    """One row of a stage table: a stage, or ``all``."""

    name: str
    load: str
    sent: int
    achieved_rate: float
    summary: Summary


@dataclass(frozen=True, slots=True)
class Column:
    """A table column: its header and how a row gives its cell."""

    header: str
    cell: Callable[[Row], str]


def _ms(key: str) -> Callable[[Row], str]:
    def cell(row: Row) -> str:
        value = row.summary.value(key)
        return "-" if value is None else f"{value * 1000:.1f}"

    return cell


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


STAGE_COLUMNS: tuple[Column, ...] = (
    Column("stage", lambda r: r.name),
    Column("load", lambda r: r.load),
    Column("sent", lambda r: str(r.sent)),
    Column("ok", lambda r: str(r.summary.ok)),
    Column("errors", lambda r: str(r.summary.failed)),
    Column("cancelled", lambda r: str(r.summary.cancelled)),
    Column("achieved rps", lambda r: f"{r.achieved_rate:.2f}"),
    Column("out tok/s", lambda r: f"{r.summary.output_throughput:.1f}"),
    Column("TTFT p50", _ms("ttft_p50")),
    Column("TTFT p95", _ms("ttft_p95")),
    Column("TTFT p99", _ms("ttft_p99")),
    Column("ITL p95", _ms("itl_p95")),
    Column("TPOT mean", _ms("tpot_mean")),
    Column("E2E p95", _ms("e2e_p95")),
    Column("lag p99", _ms("dispatch_lag_p99")),
    Column(
        "goodput",
        lambda r: "-" if r.summary.goodput is None else f"{r.summary.goodput:.2f}",
    ),
)

#: What the server said about each request, and connection churn.
SERVER_COLUMNS: tuple[Column, ...] = (
    Column("stage", lambda r: r.name),
    Column("load", lambda r: r.load),
    Column("cached prompt", lambda r: _share(r.summary.cached_fraction)),
    Column("queue p50", _ms("server_queue_p50")),
    Column("queue p95", _ms("server_queue_p95")),
    Column("prefill p50", _ms("server_prefill_p50")),
    Column("prefill p95", _ms("server_prefill_p95")),
    Column("decode p50", _ms("server_decode_p50")),
    Column("TTFT gap p50", _ms("ttft_gap_p50")),
    Column("TTFT gap p95", _ms("ttft_gap_p95")),
    Column("reconnects", lambda r: str(r.summary.reconnects)),
    Column("no [DONE]", lambda r: str(r.summary.without_done)),
)


def _tokens(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


#: A group of a run's requests: a conversation's turn index, or a model of a mix.
GROUP_COLUMNS: tuple[Column, ...] = (
    Column("group", lambda r: r.name),
    Column("requests", lambda r: str(r.summary.requests)),
    Column("ok", lambda r: str(r.summary.ok)),
    Column("TTFT p50", _ms("ttft_p50")),
    Column("TTFT p95", _ms("ttft_p95")),
    Column("TTFA p50", _ms("ttfa_p50")),
    Column("ITL p95", _ms("itl_p95")),
    Column("E2E p95", _ms("e2e_p95")),
    Column("cached prompt", lambda r: _share(r.summary.cached_fraction)),
    Column("history tok", lambda r: _tokens(r.summary.mean_history_tokens)),
    Column("prompt tok", lambda r: _tokens(r.summary.mean_prompt_tokens)),
    Column("reasoning tok", lambda r: _tokens(r.summary.mean_reasoning_tokens)),
)

#: Reasoning: the first token of any kind against the first token of the answer.
REASONING_COLUMNS: tuple[Column, ...] = (
    Column("stage", lambda r: r.name),
    Column("load", lambda r: r.load),
    Column("TTFT p50", _ms("ttft_p50")),
    Column("TTFT p95", _ms("ttft_p95")),
    Column("TTFA p50", _ms("ttfa_p50")),
    Column("TTFA p95", _ms("ttfa_p95")),
    Column("reasoning tok", lambda r: _tokens(r.summary.mean_reasoning_tokens)),
    Column("output tok", lambda r: _tokens(r.summary.mean_output_tokens)),
)


def group_rows(record: RunSummary, key: str) -> list[Row]:
    """A row per group of ``record.by_turn`` (``key="turn"``) or ``by_model``."""
    groups = (record.by_turn if key == "turn" else record.by_model) or {}
    return [
        Row(f"{key} {name}", "", summary.requests, summary.request_throughput, summary)
        for name, summary in groups.items()
    ]


#: The figures a repeated run's pooled table shows with their spread.
SPREAD = ("output tok/s", "TTFT p95 ms", "ITL p95 ms", "E2E p95 s", "error rate")


def repeat_header() -> list[str]:
    """Column names of :func:`repeat_rows`."""
    return ["level", "repeats", "requests", *SPREAD]


def repeat_rows(record: RunSummary) -> list[list[str]]:
    """A repeated run's levels: each figure pooled over the level's repeats, with
    the lowest and highest repeat's in brackets (how much runs of one level
    differ, the noise a comparison has to beat); none without ``--repeats``."""
    figures = {f.label: f for f in COMPARED}
    out = []
    for level, pooled in (record.by_level or {}).items():
        own = [
            summary
            for stage, summary in zip(record.stages, record.summaries, strict=True)
            if stage.repeat is not None and stage.label == level
        ]
        row = [level, str(len(own)), str(pooled.requests)]
        for label in SPREAD:
            value = figures[label].value
            each = [v for s in own if (v := value(s)) is not None]
            whole = value(pooled)
            row.append(
                "-"
                if whole is None
                else f"{_short(whole)} [{_short(min(each))}-{_short(max(each))}]"
                if each
                else _short(whole)
            )
        out.append(row)
    return out


def _short(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"


def _energy(key: str, digits: int = 3) -> Callable[[Row], str]:
    def cell(row: Row) -> str:
        value = row.summary.value(key)
        return "-" if value is None else f"{value:.{digits}g}"

    return cell


#: Energy and cost per stage (``--energy``; cost with a price), where measured.
ENERGY_COLUMNS: tuple[Column, ...] = (
    Column("stage", lambda r: r.name),
    Column("load", lambda r: r.load),
    Column(
        "GPUs",
        lambda r: "-" if r.summary.energy is None else str(r.summary.energy.gpus),
    ),
    Column("W", _energy("watts", 4)),
    Column("J/token", _energy("joules_per_token")),
    Column("J/good req", _energy("joules_per_good")),
    Column("$/Mtok", _energy("cost_per_mtok")),
    Column("$/1k good", _energy("cost_per_kgood")),
)


def measured_energy(record: RunSummary) -> bool:
    """Whether any stage of the run has its energy."""
    return any(s.energy is not None for s in (*record.summaries, record.overall))


def energy_text(summary: Summary) -> str | None:
    """A stage's energy and cost in words ("0.41 J/token, 350 W, $0.83 per
    million output tokens"); None where it was not measured."""
    if summary.energy is None:
        return None
    parts = []
    for key, unit in (("joules_per_token", " J/token"), ("watts", " W")):
        value = summary.value(key)
        if value is not None:
            parts.append(f"{value:.3g}{unit}")
    for key, what in (
        ("cost_per_mtok", "per million output tokens"),
        ("cost_per_kgood", "per thousand good requests"),
    ):
        value = summary.value(key)
        if value is not None:
            parts.append(f"${value:.3g} {what}")
    return ", ".join(parts) or None


#: How far a stage's prefix-cache hit rate by the server's counters may be from
#: the one a ``prefix:`` workload asked for before its end lines say so.
HIT_MARGIN = 0.03


def prefix_lines(
    workload: WorkloadRecord, record: RunSummary
) -> tuple[list[str], list[str]]:
    """A run's prefix-cache hit rates by the server's counters, per stage: lines
    to show, and warnings where a ``prefix:`` workload's stage missed the rate it
    asked for by more than :data:`HIT_MARGIN`. Nothing where the server counted
    none."""
    measured = [(s, s.server_hit_rate) for s in record.stages]
    if all(rate is None for _, rate in measured):
        return [], []
    shown = ", ".join(
        f"{'-' if rate is None else f'{rate:.3f}'} ({s.load_label}"
        + ("" if s.repeat is None else f" #{s.repeat}")
        + ")"
        for s, rate in measured
    )
    prefix = workload.prefix
    if prefix is None:
        return [f"prefix cache (the server's counters): {shown}"], []
    asked = prefix.asked_hit
    lines = [
        f"prefix cache: asked {asked:g} of prompt tokens ({prefix.expected_hit:.3f} "
        f"with whole {prefix.block_size}-token blocks); the server's counters: "
        f"{shown}"
    ]
    missed = [
        f"prefix cache: stage {s.stage + 1} ({s.load_label}) hit {rate:.3f}, asked "
        f"{asked:g} (more than {HIT_MARGIN:g} off: evictions, or requests of a "
        "group arriving before its prefix was computed)"
        for s, rate in measured
        if rate is not None and abs(rate - asked) > HIT_MARGIN
    ]
    return lines, missed


def reasons(record: RunSummary) -> bool:
    """Whether any request of the run reported reasoning tokens, or had its answer
    start after its first token."""
    for summary in (*record.summaries, record.overall):
        if summary.mean_reasoning_tokens:
            return True
        ttft, ttfa = summary.figure("ttft"), summary.figure("ttfa")
        if ttft and ttfa and ttfa.mean - ttft.mean > 1e-4:
            return True
    return False


def table_rows(record: RunSummary, *, overall: bool = True) -> list[Row]:
    """A row per stage, then (``overall``) one for the whole run."""
    rows = [
        Row(
            str(stage.stage + 1),
            stage.load_label + ("" if stage.repeat is None else f" #{stage.repeat}"),
            stage.sent,
            stage.achieved_rate or 0.0,
            summary,
        )
        for stage, summary in zip(record.stages, record.summaries, strict=True)
    ]
    if overall:
        sent = sum(stage.sent for stage in record.stages)
        span = record.overall.duration_s
        rows.append(Row("all", "", sent, sent / span if span else 0.0, record.overall))
    return rows


def cells(columns: Sequence[Column], rows: Sequence[Row]) -> list[list[str]]:
    """The table's text, row by row."""
    return [[column.cell(row) for column in columns] for row in rows]


@dataclass(frozen=True, slots=True)
class Compared:
    """A figure ``servemon compare`` lines up across runs: its label, its value in
    a summary, which way is better, and what it is made of (the latency figure of
    :data:`~servemon.loadgen.record.figures.FIGURES` and the quantile it takes, None for
    a mean; no figure for a rate), so a comparison can tell whether a difference is
    real (:mod:`servemon.loadgen.reports.significance`)."""

    label: str
    value: Callable[[Summary], float | None]
    higher_is_better: bool = False
    figure: str | None = None
    quantile: float | None = None


def _scaled(key: str, scale: float) -> Callable[[Summary], float | None]:
    def value(summary: Summary) -> float | None:
        v = summary.value(key)
        return None if v is None else v * scale

    return value


def _latency(label: str, key: str, scale: float) -> Compared:
    figure, _, stat = key.rpartition("_")
    quantile = None if stat == "mean" else int(stat.removeprefix("p")) / 100
    return Compared(label, _scaled(key, scale), False, figure, quantile)


COMPARED: tuple[Compared, ...] = (
    Compared("output tok/s", lambda s: s.output_throughput, True),
    Compared("requests/s", lambda s: s.request_throughput, True),
    _latency("TTFT mean ms", "ttft_mean", 1000.0),
    _latency("TTFT p95 ms", "ttft_p95", 1000.0),
    _latency("TTFA p95 ms", "ttfa_p95", 1000.0),
    _latency("TPOT mean ms", "tpot_mean", 1000.0),
    _latency("ITL p95 ms", "itl_p95", 1000.0),
    _latency("E2E mean s", "e2e_mean", 1.0),
    _latency("E2E p95 s", "e2e_p95", 1.0),
    Compared("error rate", lambda s: s.error_rate, figure="error_rate"),
    Compared("J/token", lambda s: s.value("joules_per_token")),
    Compared("W", lambda s: s.value("watts")),
    Compared("$/Mtok", lambda s: s.value("cost_per_mtok")),
)
