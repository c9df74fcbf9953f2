"""The generated dashboards: committed JSON is current, and every panel is sound."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from servemon.core import names
from servemon.core.outcomes import FAILED_MATCHER, JUDGED_MATCHER
from servemon.dashboards.build import DASHBOARDS, dashboard_json
from servemon.dashboards.overview import GOODPUT_TTFT
from servemon.dashboards.panels import PEAK_DEFAULTS
from servemon.dashboards.rule_names import burn_rate_name
from servemon.dashboards.rules import generate_rules, load_slo_config
from servemon.dashboards.sli import HISTOGRAMS

JSON_DIR = Path(__file__).resolve().parents[3] / "dashboards" / "json"
COUNTERS = [s.name for s in names.SCHEMA if s.kind == "counter"]
#: A selector by recording-rule name (checked against the rules generator below).
RULE_NAMES = re.compile(r'__name__=~"([^"]*)"')


def panels(name: str) -> list[dict[str, Any]]:
    data: dict[str, Any] = json.loads(dashboard_json(name))
    return list(data["panels"])


def exprs(name: str) -> Iterator[tuple[str, str]]:
    for panel in panels(name):
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]


@pytest.mark.parametrize("name", DASHBOARDS)
def test_committed_json_is_a_fresh_generation(name: str) -> None:
    committed = (JSON_DIR / f"{name}.json").read_text()
    assert committed == dashboard_json(name), (
        "run: python -m servemon.dashboards.build dashboards/json"
    )


@pytest.mark.parametrize("name", DASHBOARDS)
def test_panels_have_unique_ids_a_query_and_a_unit(name: str) -> None:
    seen = set()
    for panel in panels(name):
        assert panel["id"] not in seen, panel["title"]
        seen.add(panel["id"])
        if panel["type"] == "row":
            continue
        targets = panel.get("targets", [])
        assert targets, f"{panel['title']}: no query"
        assert all(t["expr"].strip() for t in targets), panel["title"]
        unit = panel["fieldConfig"]["defaults"].get("unit") or (
            # A heatmap's unit is its buckets': on the y axis.
            panel["options"].get("yAxis", {}).get("unit")
        )
        assert unit, f"{panel['title']}: no unit"


@pytest.mark.parametrize("name", DASHBOARDS)
def test_counters_and_buckets_only_under_rate_or_increase(name: str) -> None:
    for title, expr in exprs(name):
        for counter in COUNTERS:
            for match in re.finditer(re.escape(counter) + r"\b", expr):
                before = expr[: match.start()]
                assert re.search(r"(rate|increase)\($", before), (title, expr)
        for match in re.finditer(r"_bucket\b", expr):
            before = expr[: match.start()]
            assert re.search(r"(rate|increase)\([a-z0-9_:]*$", before), (title, expr)
        if "rate(" in expr or "increase(" in expr:
            assert "[$__rate_interval]" in expr, (title, expr)


@pytest.mark.parametrize("name", DASHBOARDS)
def test_queries_name_only_servemon_series(name: str) -> None:
    known = {s.name for s in names.SCHEMA}
    for title, expr in exprs(name):
        expr = RULE_NAMES.sub("", expr)
        for metric in re.findall(r"\b(servemon_[a-z0-9_]+)", expr):
            base = re.sub(r"_(bucket|count|sum)$", "", metric)
            assert metric in known or base in known, (title, metric)


def test_template_variables() -> None:
    for name in DASHBOARDS:
        data = json.loads(dashboard_json(name))
        variables = {v["name"] for v in data["templating"]["list"]}
        assert {"datasource", "target", "model"} <= variables


def panel_exprs(dashboard: str, title: str) -> list[str]:
    (panel,) = [p for p in panels(dashboard) if p["title"] == title]
    return [t["expr"] for t in panel["targets"]]


#: An SLO on every histogram an SLO can read, and availability on both sources.
EVERY_SLO = (
    "slos:\n"
    + "".join(
        f"  - {{name: {source}-{figure}, type: latency, figure: {figure}, "
        f"source: {source}, threshold: {hist.edges[-2]}, objective: 0.99}}\n"
        for (source, figure), hist in HISTOGRAMS.items()
    )
    + "".join(
        f"  - {{name: {source}-ok, type: availability, source: {source}, "
        "objective: 0.99}\n"
        for source in ("client", "engine")
    )
)


def test_the_burn_rate_panel_selects_exactly_the_burn_rate_rules(
    tmp_path: Path,
) -> None:
    path = tmp_path / "slos.yaml"
    path.write_text(EVERY_SLO)
    config = load_slo_config(path)
    records = {
        rule["record"]
        for group in generate_rules(config)["groups"]
        for rule in group["rules"]
        if "record" in rule
    }
    burn_rates = {
        burn_rate_name(slo, window) for slo in config.slos for window in config.windows
    }
    assert burn_rates < records
    (expr,) = panel_exprs("servemon-overview", "SLO burn rate (from servemon rules)")
    (pattern,) = RULE_NAMES.findall(expr)
    # Prometheus anchors a regular expression at both ends.
    assert {r for r in records if re.fullmatch(pattern, r)} == burn_rates


def test_the_client_error_ratio_counts_failed_over_judged_outcomes() -> None:
    (expr,) = panel_exprs("servemon-overview", "Client error ratio")
    errors, judged = re.findall(r"servemon_client_requests_total\{([^}]*)\}", expr)
    assert errors.endswith("," + FAILED_MATCHER)
    assert judged.endswith("," + JUDGED_MATCHER)


def test_goodput_counts_at_a_client_ttft_bucket_edge() -> None:
    assert GOODPUT_TTFT in HISTOGRAMS["client", "ttft"].edges


def test_the_lora_panel_puts_adapters_against_max_loras() -> None:
    (panel,) = (p for p in panels("servemon-overview") if p["title"] == "LoRA adapters")
    exprs = [t["expr"] for t in panel["targets"]]
    assert exprs == [
        'sum by (target) (servemon_engine_lora_adapters_running{target=~"$target",'
        'model=~"$model"})',
        'sum by (target) (servemon_engine_lora_adapters_waiting{target=~"$target",'
        'model=~"$model"})',
        'max by (target) (servemon_engine_lora_adapters_max{target=~"$target",'
        'model=~"$model"})',
    ]
    # In the Queueing row, beside running vs waiting requests.
    titles = [p["title"] for p in panels("servemon-overview")]
    queueing = titles.index("Queueing")
    assert titles.index("LoRA adapters") < titles.index("Cache")
    assert titles.index("LoRA adapters") > queueing


def test_the_new_vllm_panels_read_their_series() -> None:
    want = {
        "Why requests wait": names.ENGINE_REQUESTS_WAITING_BY_REASON,
        "Admission rejections": names.ENGINE_ADMISSION_REJECTIONS,
        "Preemptions per request": names.ENGINE_REQUEST_PREEMPTIONS,
        "Prompt tokens by source (what the cache saved)": (
            names.ENGINE_PROMPT_TOKENS_BY_SOURCE
        ),
        "Batch fullness: tokens per engine step": names.ENGINE_ITERATION_TOKENS,
    }
    for title, series in want.items():
        exprs = panel_exprs("servemon-overview", title)
        assert exprs, title
        assert all(series.name in expr for expr in exprs), title
    # Why requests wait is a split of the queue: never added to the queue itself.
    (split,) = panel_exprs("servemon-overview", "Why requests wait")
    assert names.ENGINE_REQUESTS_WAITING.name + "{" not in split


def test_utilization_divides_the_engine_estimates_by_the_peak_variables() -> None:
    mfu, bandwidth = panel_exprs(
        "servemon-overview", "MFU and memory-bandwidth utilization (engine estimates)"
    )
    assert names.ENGINE_ESTIMATED_FLOPS.name in mfu
    assert "/ ($peak_tflops * 1e12)" in mfu
    assert names.ENGINE_ESTIMATED_READ_BYTES.name in bandwidth
    assert names.ENGINE_ESTIMATED_WRITE_BYTES.name in bandwidth
    # NVML's peak where the exporter reads one, else the variable.
    peak = names.GPU_MEMORY_BANDWIDTH_PEAK.name
    assert f'/ on() group_left() (max ({peak}{{gpu=~"$gpu"}})' in bandwidth
    assert "or vector($peak_bandwidth_gbps * 1e9))" in bandwidth
    data = json.loads(dashboard_json("servemon-overview"))
    variables = {v["name"]: v for v in data["templating"]["list"]}
    for name, default in PEAK_DEFAULTS.items():
        assert variables[name]["type"] == "textbox"
        assert variables[name]["query"] == default
