"""Every query of every generated dashboard, as Grafana sends it, checked for data
against a real Prometheus: what the end-to-end stacks (the simulators', the real
vLLM's) share."""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from servemon.dashboards.build import DASHBOARDS, dashboard_json
from servemon.dashboards.panels import PEAK_DEFAULTS
from tests.support.alerting import PrometheusError

__all__ = [
    "LABEL_VALUES",
    "PanelQuery",
    "dashboard_queries",
    "instantiate",
    "missing_data",
    "panels",
    "until_every_panel_has_data",
]

#: What ``$__rate_interval`` becomes (four scrape intervals and more).
RATE_INTERVAL = "30s"
LABEL_VALUES = re.compile(r"^label_values\((?P<expr>.*),\s*(?P<label>\w+)\)$")

Query = Callable[[str], Awaitable[list[dict[str, Any]]]]


@dataclass(frozen=True, slots=True)
class PanelQuery:
    where: str
    expr: str


def instantiate(expr: str) -> str:
    """A panel's PromQL as Grafana sends it with every variable at "All" and the
    typed-in numbers (the GPU's peaks) at their defaults."""
    out = expr.replace("$__rate_interval", RATE_INTERVAL)
    for var, value in PEAK_DEFAULTS.items():
        out = out.replace("${" + var + "}", value).replace("$" + var, value)
    for var in ("target", "model", "gpu"):
        out = out.replace("${" + var + "}", ".*").replace("$" + var, ".*")
    assert "$" not in out, f"a variable is left in {out}"
    return out


def panels(items: Sequence[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, rows' panels included."""
    for panel in items:
        yield panel
        yield from panels(panel.get("panels", []))


def dashboard_queries() -> tuple[list[PanelQuery], list[PanelQuery], list[PanelQuery]]:
    """(panel targets, annotations, variable queries) of every dashboard."""
    targets, annotations, variables = [], [], []
    for name in DASHBOARDS:
        data = json.loads(dashboard_json(name))
        for panel in panels(data["panels"]):
            for target in panel.get("targets", []):
                where = f"{name} / {panel['title']} [{target['refId']}]"
                targets.append(PanelQuery(where, target["expr"]))
        for note in data["annotations"]["list"]:
            if "expr" in note:
                annotations.append(PanelQuery(f"{name} / {note['name']}", note["expr"]))
        for var in data["templating"]["list"]:
            if var.get("type") == "query":
                variables.append(PanelQuery(f"{name} / ${var['name']}", var["query"]))
    return targets, annotations, variables


async def missing_data(
    query: Query, targets: Sequence[PanelQuery], excused: Mapping[str, str]
) -> list[str]:
    """The panel queries that return no data, an error, or only NaN/Inf, one line
    each. A query naming a series in ``excused`` (series -> why this stack has none)
    only has to be valid PromQL."""
    empty: list[str] = []
    for target in targets:
        promql = instantiate(target.expr)
        try:
            result = await query(promql)
        except PrometheusError as exc:
            empty.append(f"{target.where}: error {exc}")
            continue
        if not result:
            if not any(name in promql for name in excused):
                empty.append(f"{target.where}: no data: {promql}")
        elif not any(math.isfinite(float(r["value"][1])) for r in result):
            empty.append(f"{target.where}: only NaN or Inf: {promql}")
    return empty


async def until_every_panel_has_data(
    query: Query,
    alive: Callable[[], None],
    excused: Mapping[str, str],
    timeout_s: float = 90.0,
) -> list[str]:
    """Every query of every dashboard, asked again every 3 s until each returns data
    (the rate windows need a few scrapes of every series, the burn-rate panels a few
    rule evaluations) or ``timeout_s`` has passed; the ones still without, one line
    each (:func:`missing_data`). ``alive`` fails the test when a process of the
    stack has died."""
    everything, _, _ = dashboard_queries()
    deadline = time.monotonic() + timeout_s
    while True:
        alive()
        empty = await missing_data(query, everything, excused)
        if not empty or time.monotonic() >= deadline:
            return empty
        await asyncio.sleep(3)
