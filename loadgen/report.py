"""``report.html``: one self-contained page per run directory, built from it alone.

The page holds the run's conditions (target, model, engine config, workload, command,
environment), the summary table, and plots drawn with matplotlib as inline SVG (no
JavaScript, no external URL, opens offline):

- throughput and latency percentiles against the offered load (rate or concurrency);
- one time line, shared x axis, stage boundaries marked: target vs achieved request
  rate, running and waiting requests, KV cache usage, prefix-cache hit ratio, and the
  client's TTFT p95.
"""

from __future__ import annotations

import html
import io
import json
import math
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from loadgen.record import UNFINISHED, rebuild_summary, write_summary
from monitor import names
from servemon.errors import ConfigError

__all__ = ["RunData", "load_run", "render_report", "svg", "write_report"]

plt.rcParams.update({"svg.fonttype": "none", "font.size": 9, "figure.dpi": 96})


@dataclass(slots=True)
class RunData:
    """What a run directory holds, loaded."""

    path: Path
    run: dict[str, Any]
    summary: dict[str, Any]
    requests: list[dict[str, Any]]
    samples: list[dict[str, Any]] = field(default_factory=list)

    @property
    def origin(self) -> float:
        """Monotonic time of the run's start."""
        return float(self.run.get("clock_origin", {}).get("monotonic_s", 0.0))


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            f"{path}: missing: is this a servemon run directory?"
        ) from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: line {exc.lineno}: not valid JSON") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    return data


def _read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    if not path.exists():
        return
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            try:
                item = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a kill: everything before it is kept
            if isinstance(item, dict):
                yield item


def load_run(path: Path) -> RunData:
    """Load a run directory (one-line ConfigError if it is not one).

    A run that never wrote ``summary.json`` (killed with ``kill -9``, crashed) gets
    one rebuilt from ``requests.jsonl`` and written beside it; its status then says
    the run did not finish.
    """
    run = _read_json(path / "run.json")
    requests = list(_read_jsonl(path / "requests.jsonl"))
    if (path / "summary.json").exists():
        summary = _read_json(path / "summary.json")
    else:
        summary, rows = rebuild_summary(path, run, requests)
        write_summary(path, summary, rows)
    if summary.get("status") == "unfinished":
        run = {**run, "status": f"unfinished: {UNFINISHED}"}
    return RunData(
        path=path,
        run=run,
        summary=summary,
        requests=requests,
        samples=list(_read_jsonl(path / "server_metrics.jsonl")),
    )


def svg(fig: Any) -> str:
    """A matplotlib figure as inline SVG text."""
    buffer = io.StringIO()
    # No metadata: it names matplotlib's web site and a timestamp (no URL may appear
    # in a report, and the same run should render the same bytes).
    fig.savefig(
        buffer,
        format="svg",
        bbox_inches="tight",
        metadata={"Creator": None, "Date": None, "Format": None, "Type": None},
    )
    plt.close(fig)
    text = buffer.getvalue()
    return text[text.index("<svg") :]


def _stages(data: RunData) -> list[dict[str, Any]]:
    return list(data.summary.get("stages", []))


def _load_axis(data: RunData) -> tuple[str, list[float]]:
    stages = _stages(data)
    if data.run.get("kind") == "sweep":
        return "concurrency", [float(s.get("parallel") or 0) for s in stages]
    return "offered rate (req/s)", [float(s.get("target_rate") or 0) for s in stages]


def _stat(stage: Mapping[str, Any], figure: str, stat: str) -> float:
    dist = stage.get("summary", {}).get(figure)
    return float(dist[stat]) if dist else math.nan


def plot_vs_load(data: RunData) -> str:
    """Throughput and latency percentiles against the offered load."""
    label, x = _load_axis(data)
    stages = _stages(data)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.4))
    left.plot(
        x,
        [s["summary"]["request_throughput"] for s in stages],
        "o-",
        label="requests/s (ok)",
    )
    left.set_xlabel(label)
    left.set_ylabel("requests/s")
    twin = left.twinx()
    twin.plot(
        x,
        [s["summary"]["output_throughput"] for s in stages],
        "s--",
        color="tab:orange",
        label="output tokens/s",
    )
    twin.set_ylabel("output tokens/s")
    left.set_title("Throughput")
    left.legend(loc="upper left")
    twin.legend(loc="lower right")
    for figure, stat, style in (
        ("ttft", "p50", "o-"),
        ("ttft", "p95", "o-"),
        ("ttft", "p99", "o-"),
        ("itl", "p95", "^--"),
        ("e2e", "p95", "s:"),
    ):
        right.plot(
            x,
            [_stat(s, figure, stat) * 1000 for s in stages],
            style,
            label=f"{figure.upper()} {stat}",
        )
    right.set_xlabel(label)
    right.set_ylabel("ms")
    right.set_yscale("log")
    right.set_title("Latency (client)")
    right.legend(fontsize=7)
    for axis in (left, right):
        axis.grid(alpha=0.3)
    fig.subplots_adjust(wspace=0.55)
    return svg(fig)


def _bins(values: Iterable[float], width: float) -> dict[int, list[float]]:
    out: dict[int, list[float]] = defaultdict(list)
    for v in values:
        out[int(v // width)].append(v)
    return out


def _series(data: RunData, name: str) -> tuple[list[float], list[float]]:
    """A sampled servemon series over time (summed over ranks)."""
    xs: list[float] = []
    ys: list[float] = []
    for line in data.samples:
        values = [v for n, _labels, v in line.get("samples", []) if n == name]
        if values:
            xs.append(float(line["mono_s"]) - data.origin)
            ys.append(sum(values))
    return xs, ys


def _hit_ratio(data: RunData) -> tuple[list[float], list[float]]:
    hx, hits = _series(data, names.ENGINE_PREFIX_HITS.name)
    _qx, queries = _series(data, names.ENGINE_PREFIX_QUERIES.name)
    xs, ys = [], []
    for i in range(1, min(len(hits), len(queries))):
        dq = queries[i] - queries[i - 1]
        if dq > 0:
            xs.append(hx[i])
            ys.append((hits[i] - hits[i - 1]) / dq)
    return xs, ys


def plot_timeline(data: RunData) -> str:
    """The run on one time axis, stage boundaries marked."""
    origin = data.origin
    fig, axes = plt.subplots(5, 1, figsize=(10, 9), sharex=True)
    rate_ax, queue_ax, kv_ax, hit_ax, ttft_ax = axes
    sent = [r["sent_s"] - origin for r in data.requests if r.get("sent_s")]
    per_second = _bins(sent, 1.0)
    if per_second:
        seconds = range(min(per_second), max(per_second) + 1)
        rate_ax.plot(
            list(seconds),
            [len(per_second.get(s, [])) for s in seconds],
            label="sent per second",
        )
    for stage in _stages(data):
        if stage.get("start_s") is not None and stage.get("target_rate"):
            rate_ax.hlines(
                stage["target_rate"],
                stage["start_s"],
                stage["end_s"],
                colors="tab:red",
                label=None,
            )
    rate_ax.set_ylabel("req/s")
    rate_ax.set_title("Target (red) vs achieved request rate")
    for series, label in (
        (names.ENGINE_REQUESTS_RUNNING, "running"),
        (names.ENGINE_REQUESTS_WAITING, "waiting"),
    ):
        xs, ys = _series(data, series.name)
        queue_ax.plot(xs, ys, label=label)
    queue_ax.set_ylabel("requests")
    queue_ax.legend(fontsize=7)
    xs, ys = _series(data, names.ENGINE_KV_CACHE_USAGE.name)
    kv_ax.plot(xs, [y * 100 for y in ys], color="tab:purple")
    kv_ax.set_ylabel("KV usage %")
    xs, ys = _hit_ratio(data)
    hit_ax.plot(xs, [y * 100 for y in ys], color="tab:green")
    hit_ax.set_ylabel("prefix hits %")
    windows = _bins(
        [
            r["first_content_s"] - origin
            for r in data.requests
            if r.get("outcome") == "ok" and r.get("first_content_s")
        ],
        5.0,
    )
    ttft_by_window: dict[int, list[float]] = defaultdict(list)
    for r in data.requests:
        if r.get("outcome") == "ok" and r.get("ttft_s") is not None:
            ttft_by_window[int((r["first_content_s"] - origin) // 5.0)].append(
                r["ttft_s"]
            )
    keys = sorted(k for k in ttft_by_window if k in windows)
    ttft_ax.plot(
        [k * 5 + 2.5 for k in keys],
        [_p95(ttft_by_window[k]) * 1000 for k in keys],
        "o-",
        markersize=3,
    )
    ttft_ax.set_ylabel("TTFT p95 ms")
    ttft_ax.set_xlabel("seconds since the run started")
    for axis in axes:
        axis.grid(alpha=0.3)
        for stage in _stages(data):
            if stage.get("start_s") is not None:
                axis.axvline(stage["start_s"], color="grey", linestyle=":", lw=0.8)
    return svg(fig)


def _p95(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def _ms(dist: Mapping[str, Any] | None, stat: str) -> str:
    return "-" if not dist else f"{dist[stat] * 1000:.1f}"


def _summary_table(data: RunData) -> str:
    head = (
        "stage",
        "load",
        "sent",
        "ok",
        "errors",
        "achieved rps",
        "out tok/s",
        "TTFT p50",
        "TTFT p95",
        "TTFT p99",
        "ITL p95",
        "TPOT mean",
        "E2E p95",
        "lag p99",
        "goodput",
    )
    rows = []
    for stage in _stages(data):
        s = stage["summary"]
        ok = s["outcomes"].get("ok", 0)
        load = _load_label(stage)
        rows.append(
            (
                str(stage["stage"] + 1),
                load,
                str(stage.get("sent", s["requests"])),
                str(ok),
                str(s["requests"] - ok),
                f"{stage.get('achieved_rate', 0):.2f}",
                f"{s['output_throughput']:.1f}",
                _ms(s.get("ttft"), "p50"),
                _ms(s.get("ttft"), "p95"),
                _ms(s.get("ttft"), "p99"),
                _ms(s.get("itl"), "p95"),
                _ms(s.get("tpot"), "mean"),
                _ms(s.get("e2e"), "p95"),
                _ms(s.get("dispatch_lag"), "p99"),
                "-" if s.get("goodput") is None else f"{s['goodput']:.2f}",
            )
        )
    return _table(head, rows)


def _has_server_facts(data: RunData) -> bool:
    return any(
        st["summary"].get(key)
        for st in _stages(data)
        for key in ("server_prefill", "cached_fraction", "reconnects")
    )


def _server_table(data: RunData) -> str:
    """Per stage: what the server reported, and connection churn."""
    head = (
        "stage",
        "load",
        "cached prompt",
        "queue p50",
        "queue p95",
        "prefill p50",
        "prefill p95",
        "TTFT gap p50",
        "TTFT gap p95",
        "reconnects",
        "no [DONE]",
    )
    rows = []
    for stage in _stages(data):
        s = stage["summary"]
        cached = s.get("cached_fraction")
        rows.append(
            (
                str(stage["stage"] + 1),
                _load_label(stage),
                "-" if cached is None else f"{cached:.1%}",
                _ms(s.get("server_queue"), "p50"),
                _ms(s.get("server_queue"), "p95"),
                _ms(s.get("server_prefill"), "p50"),
                _ms(s.get("server_prefill"), "p95"),
                _ms(s.get("ttft_gap"), "p50"),
                _ms(s.get("ttft_gap"), "p95"),
                str(s.get("reconnects", 0)),
                str(s.get("without_done", 0)),
            )
        )
    return _table(head, rows)


def _load_label(stage: Mapping[str, Any]) -> str:
    if stage.get("target_rate"):
        return f"{stage['target_rate']:g} rps"
    return f"parallel {stage.get('parallel')}"


def plot_ttft_parts(data: RunData) -> str:
    """Mean TTFT per stage split into server queue, prefill and the client-side
    rest, from the requests whose server reported its part (means add up)."""
    parts: dict[int, list[tuple[float, float, float]]] = defaultdict(list)
    for line in data.requests:
        if line.get("outcome") != "ok" or line.get("ttft_gap_s") is None:
            continue
        parts[int(line.get("stage", 0))].append(
            (
                float(line.get("server_queue_s") or 0.0),
                float(line.get("server_prefill_s") or 0.0),
                float(line["ttft_gap_s"]),
            )
        )
    stages = [st for st in _stages(data) if parts.get(st["stage"])]
    if not stages:
        return "<p>The server reported no queue or prefill time per request.</p>"
    labels = [_load_label(st) for st in stages]
    means = [
        [
            1000 * sum(p[i] for p in parts[st["stage"]]) / len(parts[st["stage"]])
            for st in stages
        ]
        for i in range(3)
    ]
    fig, axis = plt.subplots(figsize=(8, 3.2))
    bottom = [0.0] * len(stages)
    for values, name in zip(
        means,
        ("server queue", "server prefill", "client, network, front end"),
        strict=True,
    ):
        axis.bar(labels, values, bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    axis.set_ylabel("mean TTFT (ms)")
    axis.set_title("Where TTFT went (server-reported parts)")
    axis.legend(fontsize=7)
    axis.grid(alpha=0.3, axis="y")
    return svg(fig)


def _table(head: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    cells = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{cells}</tr></thead><tbody>{body}</tbody></table>"


def _conditions(data: RunData) -> list[tuple[str, str]]:
    run = data.run
    target = run.get("target", {})
    env = run.get("environment", {})
    engine = (run.get("server_metrics") or {}).get("engine_info") or {}
    workload = run.get("workload", {})
    return [
        ("status", str(run.get("status"))),
        ("target", f"{target.get('url')} (model {target.get('model')})"),
        ("engine", ", ".join(f"{k}={v}" for k, v in sorted(engine.items())) or "none"),
        (
            "workload",
            f"{workload.get('spec')} (prompt tokens: {workload.get('token_source')})",
        ),
        ("arrival", str(run.get("arrival"))),
        ("SLO", ", ".join(run.get("slo") or []) or "none"),
        ("command", " ".join(run.get("command") or [])),
        ("servemon", str(run.get("servemon_version"))),
        ("engine version", str(run.get("engine_version", "none"))),
        ("environment", f"Python {env.get('python')}, {env.get('platform')}"),
        ("GPUs here", _gpus(env.get("gpus"))),
        (
            "started / ended (UTC)",
            f"{run.get('clock_origin', {}).get('utc')} / {run.get('ended_utc')}",
        ),
    ]


def _gpus(gpus: Any) -> str:
    if isinstance(gpus, list):
        return (
            "; ".join(
                f"{g.get('name')} (driver {g.get('driver')}, "
                f"{(g.get('memory_total_bytes') or 0) / 2**30:.0f} GiB)"
                for g in gpus
            )
            or "none"
        )
    return str(gpus or "none")


CSS = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1100px}
h1{font-size:20px} h2{font-size:16px;margin-top:28px}
table{border-collapse:collapse;font-size:12px} td,th{border:1px solid #ccc;
padding:3px 6px;text-align:right} th{background:#f3f3f3}
dl{display:grid;grid-template-columns:max-content auto;gap:2px 12px;font-size:13px}
dt{font-weight:600} dd{margin:0;word-break:break-all} svg{max-width:100%;height:auto}
"""


def render_report(data: RunData) -> str:
    """The report as one HTML document."""
    kind = data.run.get("kind", "run")
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
        _summary_table(data),
    ]
    if _stages(data):
        parts += ["<h2>Against offered load</h2>", plot_vs_load(data)]
    if _has_server_facts(data):
        parts += [
            "<h2>What the server said about each request</h2>",
            "<p>Cached prompt tokens, queue and prefill time as the server reported "
            "them (vLLM's per-request metrics, llama.cpp's timings); the TTFT gap "
            "is the client's TTFT minus the server's queue and prefill.</p>",
            _server_table(data),
            plot_ttft_parts(data),
        ]
    parts += ["<h2>Time line</h2>", plot_timeline(data), "</body></html>"]
    return "\n".join(parts)


def write_report(run_dir: Path) -> Path:
    """Write ``RUN_DIR/report.html``; return its path."""
    page = render_report(load_run(run_dir))
    path = run_dir / "report.html"
    path.write_text(page, encoding="utf-8")
    return path
