"""Current Grafana dashboard JSON from grafanalib's: the one place it is reshaped.

grafanalib 0.7 writes dashboards at ``schemaVersion`` 12, which Grafana migrates on
every load, and some shapes that Grafana's published schema (``@grafana/schema``;
``tests/data/grafana/``) no longer has. :func:`current` rewrites a dashboard's
``to_json_data()`` into the shape of :data:`SCHEMA_VERSION`, keeping what every panel
shows (queries, legends, units, axes, overrides, stacking):

- the envelope: the schema's keys only (no ``rows``, ``style``, ``sharedCrosshair``,
  ``hideControls``, ``__inputs``), the time picker without ``time_options``;
- datasources as a reference ``{"type": "prometheus", "uid": "${datasource}"}``, on
  panels, queries, query variables and the annotation, never a bare name;
- panels: the schema's keys without the unset (null) ones; the stat and timeseries
  options Grafana's panel schemas require, at the values Grafana defaults them to (a
  legend is shown unless its display mode was ``hidden``; a stat whose thresholds
  grafanalib leaves empty gets the one base step that thresholds must start with, and
  a threshold step is a colour and a value only);
  queries without the deprecated ``intervalFactor`` and the legacy ``step``,
  ``metric``, ``target`` and duplicate ``query`` fields;
- the legacy heatmap grafanalib writes (``dataFormat``, ``cards``, ``yAxis``, ...)
  becomes the current heatmap panel, as Grafana's migration of it on load would make
  it: pre-bucketed data (``calculate: false``), the bucket unit on the y axis, zero
  buckets hidden as a value filter, the same colour scheme and scale;
- template variables without the removed tag fields and the interval-only ``auto``
  fields.

The annotation keeps its Prometheus fields (``expr``, ``step``, ``titleFormat``,
``textFormat``) at the top level, the form Grafana's schema leaves open for a
datasource's own fields and its Prometheus datasource reads. A panel type this module
does not know passes through the generic rules, and the schema test says whether that
is enough.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = ["DATASOURCE", "SCHEMA_VERSION", "current"]

#: The ``schemaVersion`` of ``@grafana/schema`` 13.2 (its ``defaultDashboard``).
SCHEMA_VERSION = 42
#: Every query reads the Prometheus datasource the ``$datasource`` variable picks.
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

_DASHBOARD_KEYS = (
    "annotations",
    "description",
    "editable",
    "graphTooltip",
    "links",
    "refresh",
    "tags",
    "time",
    "timezone",
    "title",
    "uid",
    "version",
)
_PANEL_KEYS = frozenset(
    (
        "cacheTimeout",
        "description",
        "fieldConfig",
        "gridPos",
        "hideTimeOverride",
        "id",
        "interval",
        "libraryPanel",
        "links",
        "maxDataPoints",
        "maxPerRow",
        "options",
        "pluginVersion",
        "queryCachingTTL",
        "repeat",
        "repeatDirection",
        "timeCompare",
        "timeFrom",
        "timeShift",
        "title",
        "transformations",
        "transparent",
        "type",
    )
)
_TARGET_KEYS = (
    "expr",
    "legendFormat",
    "refId",
    "format",
    "instant",
    "interval",
    "hide",
)
_VARIABLE_KEYS = frozenset(
    (
        "allValue",
        "current",
        "description",
        "hide",
        "includeAll",
        "label",
        "multi",
        "name",
        "options",
        "query",
        "refresh",
        "regex",
        "skipUrlSync",
        "sort",
        "type",
    )
)
#: A threshold list starts at -Infinity, which JSON writes as null.
_BASE_STEP = {"color": "green", "value": None}


def current(data: Mapping[str, object]) -> dict[str, object]:
    """A dashboard's ``to_json_data()`` as JSON at :data:`SCHEMA_VERSION`."""
    out = {k: data[k] for k in _DASHBOARD_KEYS if data.get(k) is not None}
    out["schemaVersion"] = SCHEMA_VERSION
    picker = _object(data.get("timepicker", {}))
    out["timepicker"] = _present(picker, ("hidden", "nowDelay", "refresh_intervals"))
    variables = _array(_object(data["templating"])["list"])
    out["templating"] = {"list": [_variable(_object(v)) for v in variables]}
    annotations = _array(_object(data["annotations"])["list"])
    out["annotations"] = {"list": [_annotation(_object(a)) for a in annotations]}
    out["panels"] = [_panel(_object(p)) for p in _array(data["panels"])]
    return out


def _object(value: object) -> Mapping[str, object]:
    """A JSON object of grafanalib's output, as one."""
    if not isinstance(value, Mapping):
        raise TypeError(f"expected an object, got {type(value).__name__}")
    return value


def _array(value: object) -> list[object]:
    """A JSON array of grafanalib's output (a list or a tuple), as a list."""
    if not isinstance(value, list | tuple):
        raise TypeError(f"expected an array, got {type(value).__name__}")
    return list(value)


def _present(data: Mapping[str, object], keys: Iterable[str]) -> dict[str, object]:
    """The ``keys`` of ``data`` that are set (not missing, not null)."""
    return {k: data[k] for k in keys if data.get(k) is not None}


def _panel(panel: Mapping[str, object]) -> dict[str, object]:
    if panel["type"] == "row":
        row = _present(panel, ("id", "title", "gridPos", "collapsed", "repeat"))
        row["type"] = "row"
        row.setdefault("collapsed", False)
        row["panels"] = [_panel(_object(p)) for p in _array(panel.get("panels", []))]
        return row
    if panel["type"] == "heatmap" and "dataFormat" in panel:
        panel = _heatmap(panel)
    out = _present(panel, sorted(_PANEL_KEYS & panel.keys()))
    for key in ("description", "links", "transformations"):
        if not out.get(key):
            out.pop(key, None)
    out["datasource"] = dict(DATASOURCE)
    out["targets"] = [_target(_object(t)) for t in _array(panel.get("targets", []))]
    config = _object(panel.get("fieldConfig", {}))
    out["fieldConfig"] = _field_config(config, panel["type"])
    options = dict(_object(panel.get("options") or {}))
    if panel["type"] == "timeseries":
        options = _timeseries_options(options)
    elif panel["type"] == "stat":
        options = _stat_options(options)
    out["options"] = options
    return out


def _target(target: Mapping[str, object]) -> dict[str, object]:
    out = _present(target, _TARGET_KEYS)
    for key, default in (
        ("format", "time_series"),
        ("instant", False),
        ("hide", False),
    ):
        if out.get(key) == default:
            del out[key]
    if not out.get("interval"):
        out.pop("interval", None)
    out["datasource"] = dict(DATASOURCE)
    return out


def _field_config(config: Mapping[str, object], kind: object) -> dict[str, object]:
    given = _object(config.get("defaults", {}))
    defaults = {k: v for k, v in given.items() if v is not None}
    given = _object(defaults.pop("custom", {}))
    custom = {k: v for k, v in given.items() if v is not None}
    if custom:
        defaults["custom"] = custom
    thresholds = dict(_object(defaults.get("thresholds") or {"mode": "absolute"}))
    steps = thresholds.get("steps")
    if not isinstance(steps, list) or not steps:
        steps = [_BASE_STEP]
    thresholds["steps"] = [_step(_object(step)) for step in steps]
    defaults["thresholds"] = thresholds
    if kind == "stat":
        defaults.setdefault("color", {"mode": "thresholds"})
    return {"defaults": defaults, "overrides": _array(config.get("overrides", []))}


def _step(step: Mapping[str, object]) -> dict[str, object]:
    """A threshold step as the schema has it: a colour from a value (null: -Infinity;
    grafanalib's legacy steps also carry graph-panel fields, and "null" as a string)."""
    value = step.get("value")
    return {"color": step["color"], "value": None if value == "null" else value}


def _timeseries_options(options: dict[str, object]) -> dict[str, object]:
    legend = dict(_object(options.get("legend", {})))
    legend.setdefault("calcs", [])
    legend.setdefault("placement", "bottom")
    if "showLegend" not in legend:
        legend["showLegend"] = legend.get("displayMode") != "hidden"
        if not legend["showLegend"]:
            legend["displayMode"] = "list"
    options["legend"] = legend
    options.setdefault("tooltip", {"mode": "single", "sort": "none"})
    return options


def _stat_options(options: dict[str, object]) -> dict[str, object]:
    options.setdefault("percentChangeColorMode", "standard")
    options.setdefault("showPercentChange", False)
    options.setdefault("wideLayout", True)
    return options


def _heatmap(panel: Mapping[str, object]) -> dict[str, object]:
    """grafanalib's legacy heatmap as Grafana's current heatmap panel."""
    y = _object(panel.get("yAxis", {}))
    color = _object(panel.get("color", {}))
    cards = _object(panel.get("cards", {}))
    legacy_scale = color.get("colorScale", "sqrt")
    scale = "exponential" if legacy_scale == "sqrt" else "linear"
    y_axis = {
        "axisPlacement": "left" if y.get("show", True) else "hidden",
        "reverse": bool(panel.get("reverseYBuckets", False)),
        **_present(y, ("decimals", "min", "max")),
    }
    if y.get("format"):
        y_axis["unit"] = y["format"]
    scheme = str(color.get("colorScheme", "interpolateOranges"))
    options: dict[str, object] = {
        # tsbuckets: the query returns the buckets; Grafana does not bucket again.
        "calculate": panel.get("dataFormat") != "tsbuckets",
        "cellGap": cards.get("cardPadding") or 2,
        "color": {
            "mode": "opacity" if color.get("mode") == "opacity" else "scheme",
            "scheme": scheme.removeprefix("interpolate"),
            "fill": color.get("cardColor", "#b4ff00"),
            "scale": scale,
            "exponent": color.get("exponent", 0.5),
            "steps": 128,
            "reverse": False,
            **_present(color, ("min", "max")),
        },
        "exemplars": {"color": "rgba(255,0,255,0.7)"},
        "legend": {"show": bool(_object(panel.get("legend", {})).get("show", False))},
        "rowsFrame": {"layout": "auto"},
        "showValue": "never",
        "tooltip": {"mode": "single", "yHistogram": False},
        "yAxis": y_axis,
    }
    if cards.get("cardRound"):
        options["cellRadius"] = cards["cardRound"]
    if panel.get("hideZeroBuckets"):
        options["filterValues"] = {"le": 1e-9}
    log = y.get("logBase", 1)
    distribution = {"type": "log", "log": log} if log != 1 else {"type": "linear"}
    custom = {
        "hideFrom": {"legend": False, "tooltip": False, "viz": False},
        "scaleDistribution": distribution,
    }
    legacy = {k: v for k, v in panel.items() if k in _PANEL_KEYS or k == "targets"}
    legacy["options"] = options
    legacy["fieldConfig"] = {"defaults": {"custom": custom}, "overrides": []}
    return legacy


def _variable(variable: Mapping[str, object]) -> dict[str, object]:
    out = _present(variable, sorted(_VARIABLE_KEYS & variable.keys()))
    if "current" in out:
        out["current"] = _present(
            _object(out["current"]), ("selected", "text", "value")
        )
    if out["type"] == "query":
        out["datasource"] = dict(DATASOURCE)
    return out


def _annotation(annotation: Mapping[str, object]) -> dict[str, object]:
    out = {k: v for k, v in annotation.items() if v is not None}
    if isinstance(out.get("datasource"), str):
        out["datasource"] = dict(DATASOURCE)
    return out
