"""The Grafana dashboards, generated with grafanalib on servemon's schema.

Three dashboards: **Serving overview** (load, queueing, cache, latency client and
server side by side, throughput, GPU, SLO), **Ramp test** (stage boundaries as
annotations, target vs achieved rate, dispatch lag, latency against queue and KV
usage) and **GPU** (per GPU and per process). Every panel has a unit, every rate uses
``$__rate_interval``, and the template variables are datasource, target and model
(and gpu). ``python -m dashboards.build dashboards/json`` (or ``servemon
dashboards --out DIR``) writes the JSON; the committed files under
``dashboards/json/`` are checked against a fresh generation by a test.

grafanalib 0.7 writes the legacy ``heatmap`` panel (not Grafana 10's reworked one);
Grafana migrates it on load. Rows are ``row`` panels in the flat panel list.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grafanalib import core as g
from grafanalib._gen import DashboardEncoder

from dashboards.queries import count, current, hist_quantile, rate, ratio_of_rates
from monitor import names as n

__all__ = ["DASHBOARDS", "dashboard_json", "main", "write_dashboards"]

DS = "${datasource}"
#: Failed client requests: as the availability SLO counts them (a cancelled request
#: is the client's own doing).
FAILED = 'outcome!~"ok|cancelled"'
NOT_CANCELLED = 'outcome!="cancelled"'
WIDTH = 24


@dataclass(slots=True)
class _Layout:
    """Places panels left to right, two (or three) to a row, with unique ids."""

    panels: list[g.Panel] = field(default_factory=list)
    next_id: int = 1
    y: int = 0
    x: int = 0
    height: int = 0

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append(
            g.RowPanel(
                title=title,
                id=self._id(),
                gridPos=g.GridPos(h=1, w=WIDTH, x=0, y=self.y),
            )
        )
        self.y += 1

    def add(self, panel: g.Panel, width: int = 12, height: int = 8) -> None:
        if self.x + width > WIDTH:
            self._newline()
        panel.id = self._id()
        panel.gridPos = g.GridPos(h=height, w=width, x=self.x, y=self.y)
        self.panels.append(panel)
        self.x += width
        self.height = max(self.height, height)

    def _newline(self) -> None:
        if self.x:
            self.y += self.height
            self.x = 0
            self.height = 0

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id - 1


def _targets(*queries: tuple[str, str]) -> list[g.Target]:
    return [
        g.Target(expr=expr, legendFormat=legend, refId=chr(ord("A") + i), datasource=DS)
        for i, (expr, legend) in enumerate(queries)
    ]


def _ts(
    title: str,
    unit: str,
    *queries: tuple[str, str],
    description: str = "",
    overrides: Sequence[dict[str, Any]] = (),
    stack: bool = False,
) -> g.TimeSeries:
    return g.TimeSeries(
        title=title,
        dataSource=DS,
        targets=_targets(*queries),
        unit=unit,
        description=description,
        overrides=list(overrides),
        legendDisplayMode="list",
        tooltipMode="multi",
        stacking={"mode": "normal" if stack else "none"},
    )


def _stat(title: str, unit: str, query: str, description: str = "") -> g.Stat:
    return g.Stat(
        title=title,
        dataSource=DS,
        targets=_targets((query, "")),
        format=unit,
        description=description,
        reduceCalc="lastNotNull",
        graphMode="area",
    )


def _right_axis(field_name: str, unit: str) -> dict[str, Any]:
    return {
        "matcher": {"id": "byName", "options": field_name},
        "properties": [
            {"id": "custom.axisPlacement", "value": "right"},
            {"id": "unit", "value": unit},
        ],
    }


def _percentiles(series: n.Series, who: str) -> Iterator[tuple[str, str]]:
    for q in (0.5, 0.95, 0.99):
        yield hist_quantile(series, q), f"{who} p{round(q * 100)}"


def _variables(*, gpu: bool = False) -> g.Templating:
    ds = g.Template(
        name="datasource",
        query="prometheus",
        type="datasource",
        label="Data source",
        default="Prometheus",
    )
    target = g.Template(
        name="target",
        label="Target",
        dataSource=DS,
        includeAll=True,
        multi=True,
        query=f"label_values({n.TARGET_UP.name}, target)",
        allValue=".*",
        default="$__all",
    )
    model = g.Template(
        name="model",
        label="Model",
        dataSource=DS,
        includeAll=True,
        multi=True,
        query=f'label_values({n.ENGINE_INFO.name}{{target=~"$target"}}, model)',
        allValue=".*",
        default="$__all",
    )
    items = [ds, target, model]
    if gpu:
        items.append(
            g.Template(
                name="gpu",
                label="GPU",
                dataSource=DS,
                includeAll=True,
                multi=True,
                query=f"label_values({n.GPU_UTILIZATION.name}, gpu)",
                allValue=".*",
                default="$__all",
            )
        )
    return g.Templating(list=items)


def _stage_annotations() -> g.Annotations:
    return g.Annotations(
        list=[
            {
                "name": "Stage boundaries",
                "datasource": DS,
                "enable": True,
                "iconColor": "rgba(255, 96, 96, 1)",
                "expr": f"changes(max({n.CLIENT_CURRENT_STAGE.name})[1m:5s]) > 0",
                "step": "5s",
                "titleFormat": "stage change",
                "textFormat": "the load generator moved to its next stage",
            }
        ]
    )


def _gpu_panels(lay: _Layout) -> None:
    lay.add(
        _ts(
            "GPU utilization",
            "percentunit",
            (current(n.GPU_UTILIZATION, agg="max", by="gpu"), "gpu {{gpu}}"),
            (current(n.GPU_MEMORY_UTILIZATION, agg="max", by="gpu"), "memory {{gpu}}"),
        )
    )
    lay.add(
        _ts(
            "GPU memory",
            "bytes",
            (current(n.GPU_MEMORY_USED, by="gpu"), "used {{gpu}}"),
            (current(n.GPU_MEMORY_TOTAL, by="gpu"), "total {{gpu}}"),
        )
    )
    lay.add(
        _ts(
            "Power",
            "watt",
            (current(n.GPU_POWER, by="gpu"), "draw {{gpu}}"),
            (current(n.GPU_POWER_LIMIT, by="gpu"), "limit {{gpu}}"),
        ),
        width=8,
    )
    lay.add(
        _ts(
            "Temperature",
            "celsius",
            (current(n.GPU_TEMPERATURE, agg="max", by="gpu"), "{{gpu}}"),
        ),
        width=8,
    )
    lay.add(
        _ts(
            "Clocks",
            "hertz",
            (current(n.GPU_SM_CLOCK, agg="max", by="gpu"), "SM {{gpu}}"),
            (current(n.GPU_MEMORY_CLOCK, agg="max", by="gpu"), "memory {{gpu}}"),
        ),
        width=8,
    )
    lay.add(
        _ts(
            "Clock throttling (active reasons)",
            "short",
            (
                current(n.GPU_THROTTLE, 'reason!="gpu_idle"', by="gpu, reason"),
                "{{gpu}} {{reason}}",
            ),
        ),
        width=24,
        height=6,
    )


def overview() -> g.Dashboard:
    """Serving overview: load, queueing, cache, latency, throughput, GPU, SLO."""
    lay = _Layout()
    lay.row("Load")
    lay.add(
        _ts(
            "Target vs achieved request rate",
            "reqps",
            (f'sum({n.CLIENT_TARGET_RATE.name}{{target=~"$target"}})', "target"),
            (rate(n.CLIENT_REQUESTS), "client achieved"),
            (rate(n.ENGINE_REQUESTS_FINISHED), "server finished"),
        ),
        width=8,
    )
    lay.add(
        _ts(
            "Completions by outcome",
            "reqps",
            (rate(n.CLIENT_REQUESTS, by="outcome"), "{{outcome}}"),
            (rate(n.ENGINE_REQUESTS_FINISHED, by="reason"), "server {{reason}}"),
            stack=False,
        ),
        width=8,
    )
    lay.add(
        _ts(
            "In flight",
            "short",
            (current(n.CLIENT_IN_FLIGHT), "client in flight"),
            (current(n.ENGINE_REQUESTS_RUNNING), "server running"),
        ),
        width=8,
    )
    lay.row("Queueing")
    lay.add(
        _ts(
            "Running vs waiting",
            "short",
            (current(n.ENGINE_REQUESTS_RUNNING, by="target"), "running {{target}}"),
            (current(n.ENGINE_REQUESTS_WAITING, by="target"), "waiting {{target}}"),
        ),
        width=8,
    )
    lay.add(_ts("Queue time", "s", *_percentiles(n.ENGINE_QUEUE, "queue")), width=8)
    lay.add(
        _ts(
            "Preemptions",
            "short",
            (rate(n.ENGINE_PREEMPTIONS, by="target"), "{{target}}"),
            description="Requests evicted from the batch per second.",
        ),
        width=8,
    )
    lay.row("Cache")
    lay.add(
        _ts(
            "KV cache usage",
            "percentunit",
            (current(n.ENGINE_KV_CACHE_USAGE, agg="max", by="target"), "{{target}}"),
        )
    )
    lay.add(
        _ts(
            "Prefix cache hit ratio",
            "percentunit",
            (
                ratio_of_rates(
                    n.ENGINE_PREFIX_HITS, n.ENGINE_PREFIX_QUERIES, by="target"
                ),
                "{{target}}",
            ),
            (
                current(n.ENGINE_PREFIX_HIT_RATIO, agg="avg", by="target"),
                "{{target}} (engine ratio)",
            ),
            description="rate(hits) / rate(queries) where the engine counts "
            "both; the engine's own ratio where it only gives one.",
        )
    )
    lay.row("Latency: the client's and the server's view")
    lay.add(
        _ts(
            "TTFT",
            "s",
            *_percentiles(n.CLIENT_TTFT, "client"),
            *_percentiles(n.ENGINE_TTFT, "server"),
            (hist_quantile(n.PROBE_TTFT, 0.95), "probe p95"),
            description="Client: to the first content chunk. Server: the "
            "engine's own histogram.",
        ),
        width=8,
    )
    lay.add(
        _ts(
            "Inter-token latency",
            "s",
            *_percentiles(n.CLIENT_ITL, "client"),
            *_percentiles(n.ENGINE_ITL, "server"),
        ),
        width=8,
    )
    lay.add(
        _ts(
            "End-to-end latency",
            "s",
            *_percentiles(n.CLIENT_E2E, "client"),
            *_percentiles(n.ENGINE_E2E, "server"),
        ),
        width=8,
    )
    lay.row("Throughput")
    lay.add(
        _ts(
            "Tokens per second",
            "short",
            (rate(n.ENGINE_PROMPT_TOKENS), "prompt (server)"),
            (rate(n.ENGINE_GENERATION_TOKENS), "generation (server)"),
            (rate(n.CLIENT_OUTPUT_TOKENS), "output (client)"),
        )
    )
    lay.add(
        g.Heatmap(
            title="Client TTFT distribution",
            dataSource=DS,
            dataFormat="tsbuckets",
            targets=[
                g.Target(
                    expr=f"sum by (le) (increase({n.CLIENT_TTFT.name}_bucket"
                    f'{{target=~"$target",model=~"$model"}}[$__rate_interval]))',
                    legendFormat="{{le}}",
                    format="heatmap",
                    refId="A",
                    datasource=DS,
                )
            ],
            yAxis=g.YAxis(format="s"),
            hideZeroBuckets=True,
        )
    )
    lay.row("GPU")
    _gpu_panels(lay)
    lay.row("SLO")
    lay.add(
        _stat(
            "Goodput (client, TTFT within 0.5 s)",
            "reqps",
            rate(n.CLIENT_TTFT, 'le="0.5"', suffix="_bucket"),
            "Requests per second whose TTFT met 0.5 s (a bucket edge).",
        ),
        width=6,
    )
    lay.add(
        _stat(
            "Client error ratio",
            "percentunit",
            f"({rate(n.CLIENT_REQUESTS, FAILED)} or vector(0)) / "
            f"{rate(n.CLIENT_REQUESTS, NOT_CANCELLED)}",
        ),
        width=6,
    )
    lay.add(
        _stat("Targets up", "short", f'sum({n.TARGET_UP.name}{{target=~"$target"}})'),
        width=6,
    )
    lay.add(_stat("Probe p95 TTFT", "s", hist_quantile(n.PROBE_TTFT, 0.95)), width=6)
    lay.add(
        _ts(
            "SLO burn rate (from servemon rules)",
            "short",
            (
                '{__name__=~"target_model:servemon_.*:burn_rate.*",target=~"$target"}',
                "{{__name__}}",
            ),
            description="Recording rules generated by `servemon rules`; one line "
            "per SLO and window. 1 = spending the budget exactly at the "
            "allowed pace.",
        ),
        width=24,
    )
    return _dashboard("servemon: serving overview", "servemon-overview", lay, gpu=True)


def ramp() -> g.Dashboard:
    """Reading a ramp: stages, offered vs achieved, lag, latency against pressure."""
    lay = _Layout()
    lay.add(
        _ts(
            "Target vs achieved request rate",
            "reqps",
            (f'sum({n.CLIENT_TARGET_RATE.name}{{target=~"$target"}})', "target"),
            (rate(n.CLIENT_REQUESTS), "achieved (finished)"),
            (count(n.CLIENT_DISPATCH_LAG), "sent"),
        ),
        width=12,
    )
    lay.add(
        _ts(
            "Dispatch lag (client behind its schedule)",
            "s",
            *_percentiles(n.CLIENT_DISPATCH_LAG, "lag"),
            (rate(n.CLIENT_HELD_BACK), "held back by --max-inflight /s"),
            description="Actual send minus scheduled send. Lag means the client, "
            "not the server, limited the offered load.",
        ),
        width=12,
    )
    lay.add(
        _ts(
            "TTFT against waiting requests",
            "s",
            *_percentiles(n.CLIENT_TTFT, "TTFT"),
            (current(n.ENGINE_REQUESTS_WAITING), "waiting"),
            overrides=[_right_axis("waiting", "short")],
        ),
        width=12,
    )
    lay.add(
        _ts(
            "ITL against KV cache usage",
            "s",
            *_percentiles(n.CLIENT_ITL, "ITL"),
            (current(n.ENGINE_KV_CACHE_USAGE, agg="max"), "KV usage"),
            overrides=[_right_axis("KV usage", "percentunit")],
        ),
        width=12,
    )
    lay.add(
        _ts(
            "Requests in flight, running, waiting",
            "short",
            (current(n.CLIENT_IN_FLIGHT), "client in flight"),
            (current(n.ENGINE_REQUESTS_RUNNING), "running"),
            (current(n.ENGINE_REQUESTS_WAITING), "waiting"),
        ),
        width=12,
    )
    lay.add(
        _ts(
            "Outcomes and preemptions",
            "reqps",
            (rate(n.CLIENT_REQUESTS, by="outcome"), "{{outcome}}"),
            (rate(n.ENGINE_PREEMPTIONS), "preemptions"),
        ),
        width=12,
    )
    lay.add(
        _ts("End-to-end latency", "s", *_percentiles(n.CLIENT_E2E, "E2E")), width=12
    )
    lay.add(
        _ts(
            "Output tokens per second",
            "short",
            (rate(n.CLIENT_OUTPUT_TOKENS), "client"),
            (rate(n.ENGINE_GENERATION_TOKENS), "server"),
        ),
        width=12,
    )
    return _dashboard("servemon: ramp test", "servemon-ramp", lay)


def gpu() -> g.Dashboard:
    """Per GPU and per process."""
    lay = _Layout()
    _gpu_panels(lay)
    lay.add(
        _ts(
            "GPU memory per process",
            "bytes",
            (
                current(n.GPU_PROCESS_MEMORY, by="gpu, pid, process"),
                "{{gpu}} {{process}} ({{pid}})",
            ),
        ),
        width=12,
    )
    lay.add(
        _ts(
            "PCIe throughput",
            "Bps",
            (current(n.GPU_PCIE_RX, by="gpu"), "rx {{gpu}}"),
            (current(n.GPU_PCIE_TX, by="gpu"), "tx {{gpu}}"),
        ),
        width=12,
    )
    lay.add(
        _ts(
            "ECC errors",
            "short",
            (
                f"sum by (gpu, type) (increase({n.GPU_ECC_ERRORS.name}"
                f'{{gpu=~"$gpu"}}[$__rate_interval]))',
                "{{gpu}} {{type}}",
            ),
        ),
        width=12,
    )
    lay.add(_stat("NVML readable", "short", f"min({n.GPU_UP.name})"), width=6)
    lay.add(_stat("GPU sample age", "s", f"max({n.GPU_SAMPLE_AGE.name})"), width=6)
    return _dashboard("servemon: GPU", "servemon-gpu", lay, gpu=True)


def _dashboard(title: str, uid: str, lay: _Layout, *, gpu: bool = False) -> g.Dashboard:
    return g.Dashboard(
        title=title,
        uid=uid,
        tags=["servemon"],
        templating=_variables(gpu=gpu),
        panels=lay.panels,
        timezone="browser",
        refresh="10s",
        time=g.Time("now-1h", "now"),
        annotations=_stage_annotations(),
        graphTooltip=1,
    )


#: File name (without .json) -> builder.
DASHBOARDS = {"servemon-overview": overview, "servemon-ramp": ramp, "servemon-gpu": gpu}


def dashboard_json(name: str) -> str:
    """One dashboard as the JSON text that is committed."""
    data = DASHBOARDS[name]().to_json_data()
    return json.dumps(data, cls=DashboardEncoder, sort_keys=True, indent=2) + "\n"


def write_dashboards(out_dir: Path) -> list[Path]:
    """Write every dashboard to ``out_dir/NAME.json``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in DASHBOARDS:
        path = out_dir / f"{name}.json"
        path.write_text(dashboard_json(name), encoding="utf-8")
        paths.append(path)
    return paths


def main(argv: list[str]) -> int:
    """``python -m dashboards.build OUT_DIR``."""
    out = Path(argv[0]) if argv else Path(__file__).parent / "json"
    for path in write_dashboards(out):
        sys.stdout.write(f"{path}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
