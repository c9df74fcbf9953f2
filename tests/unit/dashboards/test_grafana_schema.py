"""The generated dashboards against Grafana's own published schema (``@grafana/schema``,
vendored under tests/data/grafana/ by scripts/grafana-schema), at its schemaVersion."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
from grafanalib._gen import DashboardEncoder

from servemon.dashboards.build import DASHBOARDS, dashboard_json
from servemon.dashboards.grafana_json import SCHEMA_VERSION
from tests.support.grafana_schema import dashboard_errors, schema_version

Dashboard = dict[str, Any]


def generated(name: str = "servemon-overview") -> Dashboard:
    data: Dashboard = json.loads(dashboard_json(name))
    return data


def first(data: Dashboard, kind: str) -> dict[str, Any]:
    return next(p for p in data["panels"] if p["type"] == kind)


@pytest.mark.parametrize("name", DASHBOARDS)
def test_every_dashboard_is_valid_under_grafanas_schema(name: str) -> None:
    data = generated(name)
    assert "timeseries" in {p["type"] for p in data["panels"]}
    assert dashboard_errors(data) == []


@pytest.mark.parametrize("name", DASHBOARDS)
def test_dashboards_are_at_the_schema_version_grafana_writes(name: str) -> None:
    assert schema_version() == SCHEMA_VERSION
    assert generated(name)["schemaVersion"] == SCHEMA_VERSION


def test_grafanalibs_own_output_is_not() -> None:
    data = DASHBOARDS["servemon-overview"]().to_json_data()
    legacy = json.loads(json.dumps(data, cls=DashboardEncoder))
    errors = "\n".join(dashboard_errors(legacy))
    assert "'rows', 'sharedCrosshair', 'style' were unexpected" in errors
    assert "'${datasource}' is not of type 'object'" in errors
    assert "heatmap) options/: [] is not of type 'object'" in errors  # legacy heatmap
    assert "custom/axisSoftMin: None is not of type 'number'" in errors


def _set(path: str, value: Any) -> Callable[[Dashboard], None]:
    """A change setting ``path`` (keys and indexes split by "/") to ``value``."""

    def change(data: Dashboard) -> None:
        *parents, last = path.split("/")
        node: Any = data
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[int(last) if isinstance(node, list) else last] = value

    return change


def _on_first(kind: str, path: str, value: Any) -> Callable[[Dashboard], None]:
    def change(data: Dashboard) -> None:
        _set(path, value)(first(data, kind))

    return change


#: Shapes current Grafana no longer has, each what the schema must refuse: a change
#: to a valid dashboard, and a fragment of the message.
INVALID: dict[str, tuple[Callable[[Dashboard], None], str]] = {
    "a datasource by name": (
        _on_first("timeseries", "datasource", "${datasource}"),
        "is not of type 'object'",
    ),
    "a legacy graph panel's y axes": (
        _on_first("timeseries", "yaxes", [{"format": "s"}]),
        "'yaxes' was unexpected",
    ),
    "a misspelt panel key": (
        _on_first("stat", "fieldconfig", {}),
        "'fieldconfig' was unexpected",
    ),
    "thresholds that are no list": (
        _on_first("stat", "fieldConfig/defaults/thresholds/steps", ""),
        "is not of type 'array'",
    ),
    "a legend without showLegend": (
        _on_first("timeseries", "options/legend", {"calcs": [], "placement": "bottom"}),
        "'showLegend' is a required property",
    ),
    "a tooltip mode no Grafana has": (
        _on_first("timeseries", "options/tooltip/mode", "shared"),
        "'shared' is not one of",
    ),
    "a legacy heatmap option": (
        _on_first("heatmap", "options/dataFormat", "tsbuckets"),
        "'dataFormat' was unexpected",
    ),
    "a custom field option the plugin lacks": (
        _on_first("timeseries", "fieldConfig/defaults/custom/nullPointMode", "null"),
        "'nullPointMode' was unexpected",
    ),
    "a template variable's removed tags": (
        _set("templating/list/1/useTags", False),
        "'useTags' was unexpected",
    ),
    "no schemaVersion": (
        lambda data: data.pop("schemaVersion"),
        "'schemaVersion' is a required property",
    ),
    "a panel type with no schema here": (
        _on_first("stat", "type", "singlestat"),
        "no schema for singlestat panels",
    ),
}


@pytest.mark.parametrize("case", INVALID)
def test_an_invalid_dashboard_fails(case: str) -> None:
    change, message = INVALID[case]
    data = copy.deepcopy(generated())
    change(data)
    errors = dashboard_errors(data)
    assert any(message in e for e in errors), errors


def test_rows_panels_are_checked_too() -> None:
    data = generated()
    row = first(data, "row")
    panel = copy.deepcopy(first(data, "timeseries"))
    panel["datasource"] = "${datasource}"
    row["panels"] = [panel]
    assert any("is not of type 'object'" in e for e in dashboard_errors(data))


def _meaning(panel: dict[str, Any]) -> dict[str, Any]:
    """What a panel shows, in either shape: its place, queries, unit and overrides."""
    defaults = panel.get("fieldConfig", {}).get("defaults", {})
    options = panel.get("options") or {}
    unit = defaults.get("unit") or options.get("yAxis", {}).get("unit")
    series = panel["type"] == "timeseries"
    return {
        "type": panel["type"],
        "title": panel["title"],
        "gridPos": panel["gridPos"],
        "queries": [
            (
                t["refId"],
                t["expr"],
                t.get("legendFormat"),
                t.get("format", "time_series"),
            )
            for t in panel.get("targets", [])
        ],
        "unit": unit or panel.get("yAxis", {}).get("format"),
        "custom": {k: v for k, v in defaults.get("custom", {}).items() if v is not None}
        if series
        else None,
        "overrides": panel.get("fieldConfig", {}).get("overrides", []),
        # The heatmap's legacy options were elsewhere; checked by the test below.
        "legend": options.get("legend", {}).get("displayMode") if series else None,
        "tooltip": options.get("tooltip", {}).get("mode") if series else None,
        "reduce": options.get("reduceOptions"),
    }


@pytest.mark.parametrize("name", DASHBOARDS)
def test_every_panel_shows_what_grafanalib_described(name: str) -> None:
    data = DASHBOARDS[name]().to_json_data()
    legacy = json.loads(json.dumps(data, cls=DashboardEncoder))["panels"]
    panels = generated(name)["panels"]
    assert [p["id"] for p in panels] == [p["id"] for p in legacy]
    for old, new in zip(legacy, panels, strict=True):
        assert _meaning(new) == _meaning(old), old["title"]
    heatmaps = [p for p in panels if p["type"] == "heatmap"]
    for panel in heatmaps:
        assert panel["options"]["calculate"] is False  # the query returns buckets
        assert panel["options"]["filterValues"] == {"le": 1e-9}  # hideZeroBuckets
