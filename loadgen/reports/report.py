"""``report.html``: one self-contained page per run directory, built from it alone.

The page holds the run's conditions (target, model, engine config, workload,
arrival process, command, environment), the stage table and what the server said
about each request (both from :mod:`servemon.loadgen.record.columns`), and the plots of
:mod:`servemon.loadgen.reports.plots`. It is built from the typed record
(:func:`servemon.loadgen.record.runrecord.read_record`) and one streaming pass over the
request and sample files (:mod:`servemon.loadgen.record.scan`), so its memory does not
grow with the run.

A run that never wrote ``summary.json`` (killed with ``kill -9``, crashed) gets one
rebuilt from ``requests.jsonl`` and written beside it; its status then says the run
did not finish.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from pathlib import Path

from servemon.core.errors import RecordError
from servemon.loadgen.record.capacityrows import TIER_HEADER, tier_rows
from servemon.loadgen.record.columns import (
    ENERGY_COLUMNS,
    GROUP_COLUMNS,
    REASONING_COLUMNS,
    SERVER_COLUMNS,
    STAGE_COLUMNS,
    Column,
    cells,
    group_rows,
    measured_energy,
    prefix_lines,
    reasons,
    repeat_header,
    repeat_rows,
    table_rows,
)
from servemon.loadgen.record.record import UNFINISHED, read_run
from servemon.loadgen.record.runrecord import RunResult, RunSummary
from servemon.loadgen.record.scan import RunScan, scan
from servemon.loadgen.record.sections import GpuRecord
from servemon.loadgen.reports.controlplot import plot_control
from servemon.loadgen.reports.marks import tiers_of
from servemon.loadgen.reports.plots import (
    plot_by_turn,
    plot_cdf,
    plot_energy_vs_load,
    plot_timeline,
    plot_ttft_parts,
    plot_ttft_scatter,
    plot_vs_load,
    svg,
)
from servemon.loadgen.run.clientwatch import limit_lines

__all__ = ["CSS", "render_report", "svg", "write_report"]


def _table(head: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    cells_ = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{cells_}</tr></thead><tbody>{body}</tbody></table>"


def _columns_table(
    columns: Sequence[Column], record: RunSummary, *, overall: bool
) -> str:
    rows = table_rows(record, overall=overall)
    return _table([c.header for c in columns], cells(columns, rows))


def _has_server_facts(record: RunSummary) -> bool:
    return any(
        s.figure("server_prefill") or s.cached_fraction is not None or s.reconnects
        for s in record.summaries
    )


def _conditions(data: RunResult) -> list[tuple[str, str]]:
    info = data.info
    target, env, workload = info.target, info.environment, info.workload
    engine = info.engine_info
    reason = data.record.stop_reason
    stopped = [("stopped because", reason)] if reason and reason != UNFINISHED else []
    return [
        ("status", info.status),
        *stopped,
        ("target", f"{target.url} (model {target.model})"),
        ("engine", ", ".join(f"{k}={v}" for k, v in sorted(engine.items())) or "none"),
        (
            "workload",
            f"{workload.spec} (prompt tokens: {workload.token_source})",
        ),
        ("arrival", info.arrival or "closed loop (none)"),
        ("SLO", _slo(data)),
        ("command", " ".join(info.command)),
        ("servemon", info.servemon_version),
        ("engine version", info.engine_version),
        ("environment", f"Python {env.python}, {env.platform}"),
        ("GPUs here", _gpus(env.gpus)),
        (
            "started / ended (UTC)",
            f"{info.clock_origin.utc} / {info.ended_utc}",
        ),
    ]


def _slo(data: RunResult) -> str:
    """The SLO, or a capacity search's tiers (goodput counts the first one's)."""
    found = data.record.capacity
    if found is not None and found.tiers:
        return "; ".join(f"{t.name}: {t.slo}" for t in found.tiers)
    return ", ".join(data.info.slo) or "none"


def _gpus(gpus: list[GpuRecord] | str) -> str:
    if isinstance(gpus, list):
        return (
            "; ".join(
                f"{g.name} (driver {g.driver}, "
                f"{(g.memory_total_bytes or 0) / 2**30:.0f} GiB)"
                for g in gpus
            )
            or "none"
        )
    return gpus or "none"


CSS = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1100px}
h1{font-size:20px} h2{font-size:16px;margin-top:28px}
table{border-collapse:collapse;font-size:12px} td,th{border:1px solid #ccc;
padding:3px 6px;text-align:right} th{background:#f3f3f3}
dl{display:grid;grid-template-columns:max-content auto;gap:2px 12px;font-size:13px}
dt{font-weight:600} dd{margin:0;word-break:break-all} svg{max-width:100%;height:auto}
"""


def render_report(data: RunResult, found: RunScan | None = None) -> str:
    """The report as one HTML document (``data`` loaded with its scan)."""
    if found is None:
        found = scan(data.path, data.info.origin_s)
    info, record = data.info, data.record
    kind = info.kind
    conditions = "".join(
        f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>"
        for k, v in _conditions(data)
    )
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>servemon {html.escape(kind)}: {html.escape(data.path.name)}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>servemon {html.escape(kind)} — {html.escape(data.path.name)}</h1>",
        f"<dl>{conditions}</dl>",
        "<h2>Summary</h2>",
        _columns_table(STAGE_COLUMNS, record, overall=True),
        "<p>Latencies in ms; goodput in requests/s meeting every SLO term.</p>",
    ]
    limits = limit_lines(record.stages)
    if record.capacity is not None:
        parts += [
            "<h2 id='capacity'>Capacity</h2>",
            "<p>The highest rate each SLO met (strictest first), the bracket it "
            "was found in, what broke and saturated first at the rates above it, "
            "and the energy and cost per output token of the step at it.</p>",
            _table(list(TIER_HEADER), tier_rows(record)),
        ]
    if limits:
        parts += [
            "<h2 id='client-limits'>The client was the limit</h2>",
            "<p>In these stages the load generator itself could not keep up, so "
            "their figures measure the client as much as the target: send from "
            "more processes (<code>--workers</code>) or a bigger machine.</p>",
            "<ul>" + "".join(f"<li>{html.escape(x)}</li>" for x in limits) + "</ul>",
        ]
    if record.stages:
        parts += ["<h2>Against offered load</h2>", plot_vs_load(info, record)]
    shown, missed = prefix_lines(info.workload, record)
    if shown:
        parts += [
            "<h2 id='prefix-cache'>Prefix cache</h2>",
            "<ul>"
            + "".join(f"<li>{html.escape(x)}</li>" for x in shown)
            + "".join(f"<li><b>{html.escape(x)}</b></li>" for x in missed)
            + "</ul>",
        ]
    if measured_energy(record):
        parts += [
            "<h2 id='energy'>Energy and cost per token</h2>",
            "<p>What the target's GPUs used over each stage's window "
            f"({html.escape(_energy_source(record))}), per output token and per "
            "good request (one that met every SLO term), and with a price the cost "
            "per million output tokens and per thousand good requests.</p>",
            _columns_table(ENERGY_COLUMNS, record, overall=True),
        ]
        plot = plot_energy_vs_load(info, record)
        if plot:
            parts.append(plot)
    parts += _groups(record)
    if record.control is not None:
        parts += _control(data.path, record)
    if found.cdf:
        parts += ["<h2>Latency distributions</h2>", plot_cdf(found, record)]
    if found.scatter:
        parts += ["<h2>TTFT over the run</h2>", plot_ttft_scatter(found, record)]
    if _has_server_facts(record):
        parts += [
            "<h2>What the server said about each request</h2>",
            "<p>Cached prompt tokens, queue and prefill time as the server reported "
            "them (vLLM's per-request metrics, llama.cpp's timings); the TTFT gap "
            "is the client's TTFT minus the server's queue and prefill.</p>",
            _columns_table(SERVER_COLUMNS, record, overall=False),
        ]
        plot = plot_ttft_parts(found, record)
        parts.append(
            plot or "<p>The server reported no queue or prefill time per request.</p>"
        )
    parts += ["<h2>Time line</h2>"]
    if not found.has_server_metrics():
        parts.append(
            "<p>The target served no engine metrics at <code>/metrics</code> "
            f"({found.samples} samples taken): queue, KV cache and prefix-cache "
            "panels are left out; the client's figures are all there is.</p>"
        )
    parts += [plot_timeline(found, record, tiers_of(info, record)), "</body></html>"]
    return "\n".join(parts)


def _control(path: Path, record: RunSummary) -> list[str]:
    held = record.control
    assert held is not None
    within = "-" if held.within is None else f"{held.within:.0%}"
    parts = [
        "<h2 id='control'>Control</h2>",
        f"<p>Held <code>{html.escape(held.signal)}</code> at {held.setpoint:g} "
        f"(signal from {html.escape(held.source)}; a rate change every "
        f"{held.interval_s:g} s): within ±15 % in {within} of the {held.judged} "
        f"ticks after the first {held.settle_s:.0f} s; {held.blind} ticks blind.</p>",
    ]
    if held.unreachable:
        parts.append(f"<p><b>Unreachable:</b> {html.escape(held.unreachable)}</p>")
    plot = plot_control(path, held)
    if plot:
        parts.append(plot)
    return parts


def _energy_source(record: RunSummary) -> str:
    sources = {s.energy.source for s in record.summaries if s.energy is not None}
    return ", ".join(sorted(sources)) or "not measured"


def _groups(record: RunSummary) -> list[str]:
    """The sections on repeats, conversations' turns, a mix's models and
    reasoning."""
    parts = []
    if record.by_level:
        parts += [
            "<h2 id='repeats'>Repeats pooled</h2>",
            "<p>Each level ran several times in a row (<code>--repeats</code>), "
            "each with new draws. A figure pooled over a level's repeats, and in "
            "brackets the lowest and highest single repeat's: the spread between "
            "runs of one level, the noise <code>servemon compare</code> judges a "
            "difference against.</p>",
            _table(repeat_header(), repeat_rows(record)),
        ]
    if record.by_turn:
        parts += [
            "<h2 id='by-turn'>By turn of the conversation</h2>",
            "<p>Each turn sends the whole conversation so far; the prefix cache can "
            "serve its history, so a later turn's TTFT against turn 1's shows what "
            "the cache buys. History tokens: what came before the new message.</p>",
            _table(
                [c.header for c in GROUP_COLUMNS],
                cells(GROUP_COLUMNS, group_rows(record, "turn")),
            ),
        ]
        plot = plot_by_turn(record)
        if plot:
            parts.append(plot)
    if record.by_model:
        parts += [
            "<h2 id='by-model'>By model</h2>",
            _table(
                [c.header for c in GROUP_COLUMNS],
                cells(GROUP_COLUMNS, group_rows(record, "model")),
            ),
        ]
    if reasons(record):
        parts += [
            "<h2 id='reasoning'>Reasoning</h2>",
            "<p>TTFT is the first token of any kind, reasoning included; TTFA the "
            "first token of the answer after it. Reasoning tokens as the server's "
            "usage reported them.</p>",
            _columns_table(REASONING_COLUMNS, record, overall=True),
        ]
    return parts


def write_report(run_dir: Path) -> Path:
    """Write ``RUN_DIR/report.html``; return its path."""
    page = render_report(read_run(run_dir))
    path = run_dir / "report.html"
    try:
        path.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise RecordError(f"cannot write {path}: {exc.strerror or exc}") from None
    return path
