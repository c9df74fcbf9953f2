"""What every servemon dashboard is made of: layout, panels, variables, annotations.

:class:`Layout` places panels left to right on Grafana's 24-column grid with unique
ids; rows are ``row`` panels in the flat panel list. Panels always have a unit and
read the ``$datasource`` variable; :func:`dashboard` adds the template variables
(datasource, target and model, and gpu) and the stage-boundary annotation.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from grafanalib import core as g

from servemon.core import names as n
from servemon.core.promql import aggregate, selector
from servemon.dashboards.queries import TARGET, hist_quantile

__all__ = [
    "DS",
    "PEAK_BANDWIDTH",
    "PEAK_DEFAULTS",
    "PEAK_TFLOPS",
    "Layout",
    "dashboard",
    "dashed",
    "peak_variables",
    "percentiles",
    "right_axis",
    "stat",
    "timeseries",
]

DS = "${datasource}"
WIDTH = 24


@dataclass(slots=True)
class Layout:
    """Places panels left to right, two (or three) to a row, with unique ids."""

    panels: list[g.Panel] = field(default_factory=list)
    next_id: int = 1
    y: int = 0
    x: int = 0
    height: int = 0

    def row(self, title: str) -> None:
        """Start a row titled ``title`` on a line of its own."""
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
        """Place ``panel`` after the last one, on a new line if it does not fit."""
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


def timeseries(
    title: str,
    unit: str,
    *queries: tuple[str, str],
    description: str = "",
    overrides: Sequence[Mapping[str, object]] = (),
    stack: bool = False,
) -> g.TimeSeries:
    """A time series panel of ``(expr, legend)`` queries."""
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


def stat(title: str, unit: str, query: str, description: str = "") -> g.Stat:
    """A single-value panel showing the last value and a sparkline."""
    return g.Stat(
        title=title,
        dataSource=DS,
        targets=_targets((query, "")),
        format=unit,
        description=description,
        reduceCalc="lastNotNull",
        graphMode="area",
    )


def right_axis(field_name: str, unit: str) -> dict[str, object]:
    """An override putting the series ``field_name`` on a right axis in ``unit``."""
    return {
        "matcher": {"id": "byName", "options": field_name},
        "properties": [
            {"id": "custom.axisPlacement", "value": "right"},
            {"id": "unit", "value": unit},
        ],
    }


def dashed(name_regex: str) -> dict[str, object]:
    """An override drawing the series whose names match ``name_regex`` dashed (a
    limit beside the values it bounds)."""
    return {
        "matcher": {"id": "byRegexp", "options": name_regex},
        "properties": [
            {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}}
        ],
    }


def percentiles(series: n.Series, who: str) -> Iterator[tuple[str, str]]:
    """p50, p95 and p99 of a histogram, legends ``<who> p50`` and so on."""
    for q in (0.5, 0.95, 0.99):
        yield hist_quantile(series, q), f"{who} p{round(q * 100)}"


def _variable(name: str, label: str, query: str) -> g.Template:
    return g.Template(
        name=name,
        label=label,
        dataSource=DS,
        includeAll=True,
        multi=True,
        query=query,
        allValue=".*",
        default="$__all",
    )


#: The GPU's peaks the utilization panels divide by, as dashboard variables: NVML
#: does not tell them. Defaults: an H100 SXM's dense BF16 TFLOP/s and its HBM3 GB/s.
PEAK_TFLOPS = "$peak_tflops"
PEAK_BANDWIDTH = "$peak_bandwidth_gbps"
PEAK_DEFAULTS = {"peak_tflops": "989", "peak_bandwidth_gbps": "3350"}


def peak_variables() -> list[g.Template]:
    """Text boxes for the GPU's peak TFLOP/s and memory bandwidth (GB/s) per GPU."""
    labels = {
        "peak_tflops": "Peak TFLOP/s per GPU",
        "peak_bandwidth_gbps": "Peak memory GB/s per GPU",
    }
    return [
        g.Template(
            name=name, label=labels[name], query=value, default=value, type="textbox"
        )
        for name, value in PEAK_DEFAULTS.items()
    ]


def _templating(*, gpu: bool = False) -> g.Templating:
    ds = g.Template(
        name="datasource",
        query="prometheus",
        type="datasource",
        label="Data source",
        default="Prometheus",
    )
    items = [
        ds,
        _variable("target", "Target", f"label_values({n.TARGET_UP.name}, target)"),
        _variable(
            "model",
            "Model",
            f"label_values({selector(n.ENGINE_INFO, TARGET)}, model)",
        ),
    ]
    if gpu:
        query = f"label_values({n.GPU_UTILIZATION.name}, gpu)"
        items.append(_variable("gpu", "GPU", query))
    return g.Templating(list=items)


def _stage_annotations() -> g.Annotations:
    # Over every target and model: a stage change anywhere is worth a mark.
    stage = aggregate("max", selector(n.CLIENT_CURRENT_STAGE))
    return g.Annotations(
        list=[
            {
                "name": "Stage boundaries",
                "datasource": DS,
                "enable": True,
                "iconColor": "rgba(255, 96, 96, 1)",
                "expr": f"changes({stage}[1m:5s]) > 0",
                "step": "5s",
                "titleFormat": "stage change",
                "textFormat": "the load generator moved to its next stage",
            }
        ]
    )


def dashboard(
    title: str,
    uid: str,
    lay: Layout,
    *,
    gpu: bool = False,
    variables: Sequence[g.Template] = (),
) -> g.Dashboard:
    """A servemon dashboard of ``lay``'s panels (with a ``$gpu`` variable if asked,
    and ``variables`` after the others)."""
    templating = _templating(gpu=gpu)
    templating.list.extend(variables)
    return g.Dashboard(
        title=title,
        uid=uid,
        tags=["servemon"],
        templating=templating,
        panels=lay.panels,
        timezone="browser",
        refresh="10s",
        time=g.Time("now-1h", "now"),
        annotations=_stage_annotations(),
        graphTooltip=1,
    )
