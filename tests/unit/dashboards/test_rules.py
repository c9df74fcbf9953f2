"""The SLO file's validation and the structure of the rules generated from it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from servemon.core import names
from servemon.core.errors import ConfigError
from servemon.core.outcomes import (
    FAILED,
    FAILED_MATCHER,
    JUDGED_MATCHER,
    NOT_JUDGED,
    Outcome,
    failed,
    judged,
)
from servemon.core.promql import le_matcher
from servemon.dashboards.energy import ENERGY_GROUP
from servemon.dashboards.rule_names import ENERGY_RULES
from servemon.dashboards.rules import (
    ALERT_BURN,
    RULES_FILE,
    alert_names,
    generate_rules,
    load_slo_config,
    render_rules,
    write_rules,
)
from servemon.dashboards.sli import ENGINE_ERROR_REASONS, HISTOGRAMS
from servemon.dashboards.slos import SloConfig
from tests.support.rule_tests import promtool_tests, render_template

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = Path("deploy/slos.example.yaml")
COMMITTED = Path("deploy/rules") / RULES_FILE

MINIMAL = """
slos:
  - {name: ttft, type: latency, figure: ttft, threshold: 0.5, objective: 0.99}
  - {name: ok, type: availability, objective: 0.999}
"""


def config_from(tmp_path: Path, text: str) -> SloConfig:
    path = tmp_path / "slos.yaml"
    path.write_text(text)
    return load_slo_config(path)


def rules_of(config: SloConfig) -> Iterator[dict[str, Any]]:
    """The SLO, saturation and health rules (the energy rules: test_energy_rules)."""
    for group in generate_rules(config)["groups"]:
        if group["name"] != ENERGY_GROUP:
            yield from group["rules"]


def burn_alerts(config: SloConfig) -> list[dict[str, Any]]:
    return [r for r in rules_of(config) if r.get("alert") == ALERT_BURN]


def pairs_of(expr: str) -> list[tuple[str, str, str, str]]:
    """(long, short, factor, guard window) of every or-ed block of a burn alert."""
    found = []
    for block in expr.split("\nor\n"):
        burns = re.findall(r":burn_rate(\w+)\{slo=\"[^\"]+\"\} > ([\d.]+)", block)
        guard = re.findall(r":rate(\w+) > ([\d.]+)", block)
        assert len(burns) == 2, block
        assert len(guard) == 1, block
        (long, f1), (short, f2) = burns
        assert f1 == f2
        found.append((long, short, f1, guard[0][0]))
    return found


# -- validation ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "fields"),
    [
        (
            "slos: [{name: t, type: latency, figure: ttft, threshold: 0.35, "
            "objective: 0.99}]",
            ("slos.0.threshold", "'t'", "nearest edges: 0.3, 0.4", "loadgen_slo"),
        ),
        (
            "slos: [{name: t, type: latency, figure: ttft, source: engine, "
            "threshold: 0.3, objective: 0.99}]",
            ("slos.0.threshold", "servemon_engine_ttft_seconds", "0.25, 0.5"),
        ),
        (
            "slos: [{name: t, type: latency, figure: e2e, source: engine, "
            "threshold: 0.2, objective: 0.99}]",
            ("slos.0.threshold", "nearest edges: 0.3"),
        ),
        (
            "slos: [{name: t, type: latency, figure: ttft, threshold: 0.5, "
            "objective: 1}]",
            ("slos.0.latency.objective", "less than 1"),
        ),
        (
            "slos: [{name: a, type: availability, objective: 0.9}]",
            ("slos.0.objective", "14.4x", "above 1"),
        ),
        (
            "slos: [{name: a, type: availability, objective: 0.99, colour: red}]",
            ("slos.0.availability.colour",),
        ),
        ("slos: [{name: a, objective: 0.99}]", ("slos.0", "'type'")),
        (
            "slos: [{name: A b, type: availability, objective: 0.99}]",
            ("slos.0.availability.name",),
        ),
        (
            "slos: [{name: a, type: availability, objective: 0.99}, "
            "{name: a, type: availability, objective: 0.999}]",
            ("slos.1.name", "used twice"),
        ),
        ("window: 7d\nslos: []", ("window", "'28d' or '30d'")),
        ("min_request_rate: -1\nslos: []", ("min_request_rate",)),
        ("{}", ("slos", "required")),
        ("source: x\nslos: []", ("source", "unknown field")),
        ("burn_windows: {scale: 0}\nslos: []", ("burn_windows.scale",)),
        (
            "burn_windows: {scale: 0.0001}\nslos: []",
            ("burn_windows.scale", "shorter than 1s"),
        ),
        (
            "burn_windows: {page: [{long: 5m, short: 1h, factor: 2}]}\nslos: []",
            ("burn_windows.page.0.short", "shorter than the long window 5m"),
        ),
        ("burn_windows: {ticket: []}\nslos: []", ("burn_windows.ticket",)),
        (
            "burn_windows: {page: [{long: 1 hour, short: 5m, factor: 2}]}\nslos: []",
            ("burn_windows.page.0.long", "duration"),
        ),
        (
            "saturation: {kv_cache_usage: {above: 0.9, for: 600}}\nslos: []",
            ("saturation.kv_cache_usage.for", "duration"),
        ),
        (
            "health: {target_down: {for: 1m, severity: sms}}\nslos: []",
            ("health.target_down.severity", "'page' or 'ticket'"),
        ),
        ('loadgen_slo: "ttft<=0.3"\nslos: []', ("loadgen_slo", "ttft<=0.3")),
        ("- a\n- b\n", ("mapping",)),
    ],
)
def test_a_bad_slo_file_is_one_line_naming_file_and_field(
    tmp_path: Path, text: str, fields: tuple[str, ...]
) -> None:
    with pytest.raises(ConfigError) as info:
        config_from(tmp_path, text)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(str(tmp_path / "slos.yaml"))
    for field in fields:
        assert field in message


def test_loadgen_slo_thresholds_are_client_edges_too(tmp_path: Path) -> None:
    text = (
        'loadgen_slo: "ttft_p99<=0.35"\n'
        "slos: [{name: t, type: latency, figure: ttft, threshold: 0.35, "
        "objective: 0.99}]"
    )
    config = config_from(tmp_path, text)
    assert 'le="0.35"' in str(generate_rules(config))
    engine = text.replace("figure: ttft,", "figure: ttft, source: engine,")
    with pytest.raises(ConfigError, match="not a bucket edge"):
        config_from(tmp_path, engine)


def test_defaults_are_the_workbook_windows(tmp_path: Path) -> None:
    config = config_from(tmp_path, MINIMAL)
    assert config.window == "30d"
    assert config.period == 30 * 86400
    assert config.min_request_rate == 0.1
    assert [(p.long, p.short, p.factor) for p in config.pairs("page")] == [
        (3600, 300, 14.4),
        (21600, 1800, 6.0),
    ]
    assert [(p.long, p.short, p.factor) for p in config.pairs("ticket")] == [
        (86400, 7200, 3.0),
        (259200, 21600, 1.0),
    ]


def test_edges_of_the_example_comments_are_the_real_ones() -> None:
    text = (ROOT / EXAMPLE).read_text()
    listed: dict[str, list[float]] = {}
    key = ""
    for line in text.splitlines():
        match = re.match(
            r"#\s+(client|engine) ([a-z0-9, ]+):\s+(?:vLLM's )?(.*)$", line
        )
        if match:
            source, figures, rest = match.groups()
            key = f"{source} {figures}"
            listed[key] = []
        elif key and re.match(r"#\s+[0-9]", line):
            rest = line.lstrip("# ")
        else:
            key = ""
            continue
        listed[key] += [float(x) for x in re.findall(r"\d+(?:\.\d+)?", rest)]
    for names_key, edges in listed.items():
        source, figures = names_key.split(" ", 1)
        for figure in figures.split(", "):
            hist = HISTOGRAMS[source, figure]  # type: ignore[index]
            assert tuple(edges) == hist.edges, (source, figure)
    assert len(listed) == 6


def test_the_example_names_the_errors_of_each_source() -> None:
    text = (ROOT / EXAMPLE).read_text()
    block = text[text.index("# type: availability") :].split("\n#\n")[0]
    client, engine = block.split("#           engine --")
    listed = re.search(r"are errors \(([^)]*)\)", client)
    assert listed, client
    words = re.sub(r"\s*#\s*", " ", listed.group(1))
    assert words.split(", ") == [o.value for o in Outcome if o in FAILED]
    for outcome in NOT_JUDGED:
        assert f"{outcome.value} requests" in client
    assert "finish reasons " + " and ".join(ENGINE_ERROR_REASONS) in engine


# -- structure ---------------------------------------------------------------------


def test_recording_rules_are_level_metric_operations(tmp_path: Path) -> None:
    config = config_from(tmp_path, MINIMAL)
    records = [r["record"] for r in rules_of(config) if "record" in r]
    assert records
    known = {s.base for s in names.SCHEMA} | {s.name for s in names.SCHEMA}
    for record in records:
        level, metric, operations = record.split(":")
        assert level == "target_model"
        assert metric in known
        assert re.fullmatch(r"(error_ratio_rate|burn_rate|rate)\d+[smhd]", operations)
    assert "target_model:servemon_client_ttft_seconds:error_ratio_rate5m" in records
    assert "target_model:servemon_client_requests:burn_rate30d" in records
    assert "target_model:servemon_client_requests:rate6h" in records


def test_every_rule_window_the_slos_need_is_recorded(tmp_path: Path) -> None:
    config = config_from(tmp_path, MINIMAL)
    records = {r["record"] for r in rules_of(config) if "record" in r}
    for metric in ("servemon_client_ttft_seconds", "servemon_client_requests"):
        for window in ("5m", "30m", "1h", "2h", "6h", "1d", "3d", "30d"):
            assert f"target_model:{metric}:error_ratio_rate{window}" in records
            assert f"target_model:{metric}:burn_rate{window}" in records
    guards = {r for r in records if r.split(":")[2].startswith("rate")}
    assert guards == {
        f"target_model:servemon_client_requests:rate{w}"
        for w in ("5m", "30m", "2h", "6h")
    }


def test_every_alert_has_a_severity_and_annotations(tmp_path: Path) -> None:
    config = config_from(tmp_path, MINIMAL)
    alerts = [r for r in rules_of(config) if "alert" in r]
    assert len(alerts) == 2 * 2 + 4 + 4
    for alert in alerts:
        assert alert["labels"]["severity"] in ("page", "ticket")
        assert {"summary", "description"} <= set(alert["annotations"])
        assert "Runbook: " in alert["annotations"]["description"]
        if alert["alert"] != ALERT_BURN:
            assert "for" in alert


def test_burn_alerts_are_the_workbook_pairs_with_a_traffic_guard(
    tmp_path: Path,
) -> None:
    config = config_from(tmp_path, MINIMAL)
    alerts = burn_alerts(config)
    assert {(a["labels"]["slo"], a["labels"]["severity"]) for a in alerts} == {
        ("ttft", "page"),
        ("ttft", "ticket"),
        ("ok", "page"),
        ("ok", "ticket"),
    }
    for alert in alerts:
        assert "for" not in alert
        pairs = pairs_of(alert["expr"])
        if alert["labels"]["severity"] == "page":
            assert pairs == [("1h", "5m", "14.4", "5m"), ("6h", "30m", "6", "30m")]
        else:
            assert pairs == [("1d", "2h", "3", "2h"), ("3d", "6h", "1", "6h")]
        assert alert["expr"].count("and on (target, model)") == 4
        assert alert["expr"].count("servemon_client_requests:rate") == 2
        assert "> 0.1\n" in alert["expr"]
        assert "$value }}x too fast" in alert["annotations"]["summary"]


def test_burn_rate_divides_the_error_ratio_by_the_budget(tmp_path: Path) -> None:
    config = config_from(tmp_path, MINIMAL)
    rules = {
        (r.get("record"), r.get("labels", {}).get("slo")): r for r in rules_of(config)
    }
    ttft = rules["target_model:servemon_client_ttft_seconds:burn_rate1h", "ttft"]
    assert ttft["expr"] == (
        'target_model:servemon_client_ttft_seconds:error_ratio_rate1h{slo="ttft"} '
        "/ 0.01"
    )
    ok = rules["target_model:servemon_client_requests:burn_rate1h", "ok"]
    assert ok["expr"].endswith("/ 0.001")


def test_latency_ratio_counts_events_above_the_bucket_edge(tmp_path: Path) -> None:
    config = config_from(tmp_path, MINIMAL)
    expr = next(
        r["expr"]
        for r in rules_of(config)
        if r.get("record") == "target_model:servemon_client_ttft_seconds:"
        "error_ratio_rate5m"
    )
    count = "sum by (target, model) (rate(servemon_client_ttft_seconds_count[5m]))"
    good = (
        "sum by (target, model) "
        '(rate(servemon_client_ttft_seconds_bucket{le="0.5"}[5m]))'
    )
    assert expr == f"(\n  {count}\n  -\n  {good}\n)\n/\n{count}\n"


def test_le_matches_both_spellings_of_a_whole_number() -> None:
    assert le_matcher(0.5) == 'le="0.5"'
    assert le_matcher(0.0025) == 'le="0.0025"'
    assert le_matcher(1.0) == 'le=~"1(\\\\.0)?"'
    assert le_matcher(2560.0) == 'le=~"2560(\\\\.0)?"'


def test_availability_errors_per_source(tmp_path: Path) -> None:
    text = (
        "slos: [{name: c, type: availability, objective: 0.99}, "
        "{name: e, type: availability, source: engine, objective: 0.99}]"
    )
    config = config_from(tmp_path, text)
    exprs = {
        r["labels"]["slo"]: r["expr"]
        for r in rules_of(config)
        if str(r.get("record", "")).endswith("error_ratio_rate5m")
    }
    assert f"servemon_client_requests_total{{{FAILED_MATCHER}}}[5m]" in exprs["c"]
    assert f"servemon_client_requests_total{{{JUDGED_MATCHER}}}[5m]" in exprs["c"]
    assert "or\n  0 * sum" in exprs["c"]
    assert (
        'servemon_engine_requests_finished_total{reason=~"abort|error"}' in (exprs["e"])
    )
    guard = "target_model:servemon_engine_requests_finished:rate5m > 0.1"
    e_page = next(
        a
        for a in burn_alerts(config)
        if a["labels"] == {"severity": "page", "slo": "e"}
    )
    assert guard in e_page["expr"]


_MATCHER = re.compile(r'(\w+)(=~|!~|!=|=)"((?:[^"\\]|\\.)*)"')


def _selects(matchers: list[str], value: str) -> bool:
    """Whether label matchers on ``outcome`` select ``value``, as Prometheus does
    (regular expressions anchored at both ends)."""
    for label, op, pattern in matchers:
        assert label == "outcome"
        hit = (
            re.fullmatch(pattern, value) is not None if "~" in op else value == pattern
        )
        if hit == op.startswith("!"):
            return False
    return True


def test_the_client_error_ratio_counts_exactly_the_failed_outcomes(
    tmp_path: Path,
) -> None:
    """Read back from the generated rule, so an outcome added to
    :mod:`servemon.core.outcomes` (or a rule spelling its own) shows here."""
    config = config_from(tmp_path, MINIMAL)
    expr = next(
        r["expr"]
        for r in rules_of(config)
        if r.get("record") == "target_model:servemon_client_requests:error_ratio_rate5m"
    )
    selectors = re.findall(r"servemon_client_requests_total\{([^}]*)\}", expr)
    errors, *totals = (_MATCHER.findall(s) for s in selectors)
    assert len(totals) == 2
    assert totals[0] == totals[1]
    for outcome in Outcome:
        assert _selects(errors, outcome.value) == failed(outcome), outcome
        assert _selects(totals[0], outcome.value) == judged(outcome), outcome
    # An outcome a newer load generator sends and this servemon does not know.
    assert _selects(errors, "some_new_error")
    assert _selects(totals[0], "some_new_error")


def test_scale_shrinks_every_window_and_the_period(tmp_path: Path) -> None:
    config = config_from(tmp_path, "burn_windows: {scale: 0.0166667}\n" + MINIMAL)
    assert config.period == 12 * 3600
    page, ticket = (
        pairs_of(a["expr"]) for a in burn_alerts(config) if a["labels"]["slo"] == "ttft"
    )
    assert page == [("1m", "5s", "14.4", "5s"), ("6m", "30s", "6", "30s")]
    assert ticket == [("24m", "2m", "3", "2m"), ("1h12m", "6m", "1", "6m")]
    records = {r["record"] for r in rules_of(config) if "record" in r}
    assert "target_model:servemon_client_requests:burn_rate12h" in records


def test_explicit_windows_replace_the_workbook_ones(tmp_path: Path) -> None:
    text = (
        "window: 28d\nmin_request_rate: 0\n"
        "burn_windows:\n"
        "  page: [{long: 10m, short: 1m, factor: 10}]\n"
        "  ticket: [{long: 1h30m, short: 10m, factor: 2}]\n" + MINIMAL
    )
    config = config_from(tmp_path, text)
    pairs = {a["labels"]["severity"]: pairs_of(a["expr"]) for a in burn_alerts(config)}
    assert pairs == {
        "page": [("10m", "1m", "10", "1m")],
        "ticket": [("1h30m", "10m", "2", "10m")],
    }
    assert "> 0\n" in burn_alerts(config)[0]["expr"]
    records = {r["record"] for r in rules_of(config) if "record" in r}
    assert "target_model:servemon_client_ttft_seconds:error_ratio_rate28d" in records


def test_every_metric_name_comes_from_the_table(tmp_path: Path) -> None:
    config = load_slo_config(ROOT / EXAMPLE)
    allowed = set()
    for series in names.SCHEMA:
        allowed |= {series.name, series.base}
        if series.kind == "histogram":
            allowed |= {series.name + s for s in ("_bucket", "_count", "_sum")}
    text = str(generate_rules(config, gpu_hour_cost=2.5))
    allowed |= {metric for _, metric, _ in ENERGY_RULES}  # rule names, not series
    used = set(re.findall(r"servemon_[a-z0-9_]+", text))
    assert used
    assert used <= allowed, used - allowed


def test_saturation_and_health_alerts_can_be_dropped(tmp_path: Path) -> None:
    text = (
        "saturation: {kv_cache_usage: null, preemptions: null}\n"
        "health: {exporter_absent: null, client_stalled: null}\n" + MINIMAL
    )
    config = config_from(tmp_path, text)
    assert alert_names(generate_rules(config)) == [
        ALERT_BURN,
        "ServemonQueueBacklog",
        "ServemonGpuMemoryHigh",
        "ServemonTargetDown",
        "ServemonEngineMetricsAbsent",
    ]


def test_saturation_and_health_expressions(tmp_path: Path) -> None:
    config = config_from(tmp_path, MINIMAL)
    alerts = {r["alert"]: r for r in rules_of(config) if "alert" in r}
    assert alerts["ServemonQueueBacklog"]["expr"] == (
        "servemon_engine_requests_waiting > 10"
    )
    assert alerts["ServemonQueueBacklog"]["for"] == "5m"
    assert alerts["ServemonKvCacheHigh"]["expr"] == (
        "servemon_engine_kv_cache_usage_ratio > 0.95"
    )
    assert alerts["ServemonPreemptions"]["expr"] == (
        "rate(servemon_engine_preemptions_total[5m]) > 0"
    )
    assert alerts["ServemonGpuMemoryHigh"]["expr"] == (
        "servemon_gpu_memory_used_bytes / (servemon_gpu_memory_total_bytes > 0) > 0.97"
    )
    assert alerts["ServemonTargetDown"]["expr"] == "servemon_target_up == 0"
    assert alerts["ServemonTargetDown"]["labels"]["severity"] == "page"
    assert alerts["ServemonExporterAbsent"]["expr"] == "absent(servemon_target_up)"
    stalled = alerts["ServemonClientStalled"]["expr"]
    assert "servemon_client_target_requests_per_second) > 0\nunless" in stalled


def test_runbook_url_is_an_annotation(tmp_path: Path) -> None:
    config = config_from(tmp_path, "runbook_url: https://wiki/rb\n" + MINIMAL)
    for rule in rules_of(config):
        if "alert" in rule:
            url = rule["annotations"]["runbook_url"]
            assert url == f"https://wiki/rb#{rule['alert'].lower()}"


def test_output_is_deterministic_with_a_header(tmp_path: Path) -> None:
    config = config_from(tmp_path, MINIMAL)
    first = render_rules(config, Path("out"))
    assert first == render_rules(config_from(tmp_path, MINIMAL), Path("out"))
    assert first.startswith("# Generated by servemon; do not edit.")
    assert f"servemon rules --slo-config {tmp_path / 'slos.yaml'} --out out" in first
    assert "&id" not in first  # no YAML anchors
    written = write_rules(config, tmp_path / "rules")
    assert written == [tmp_path / "rules" / RULES_FILE]
    assert written[0].read_text() == render_rules(config, tmp_path / "rules")


def test_committed_rules_are_a_fresh_generation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(ROOT)
    fresh = render_rules(load_slo_config(EXAMPLE), COMMITTED.parent)
    assert COMMITTED.read_text() == fresh, (
        f"run: servemon rules --slo-config {EXAMPLE} --out {COMMITTED.parent} "
        f"(or python -m servemon.dashboards.rules {EXAMPLE} {COMMITTED.parent})"
    )


# -- the promtool tests ------------------------------------------------------------


def test_render_template_as_prometheus_does() -> None:
    text = (
        'a {{ printf "%.1f" $value }}x on {{ $labels.target }} '
        "{{ $value | humanizePercentage }}"
    )
    assert render_template(text, {"target": "t"}, 0.975) == "a 1.0x on t 97.5%"
    with pytest.raises(ValueError, match="no rendering"):
        render_template("{{ $value }}", {}, 1)


def test_promtool_tests_cover_every_alert_firing_and_silent() -> None:
    config = load_slo_config(ROOT / EXAMPLE)
    tests = promtool_tests(config, ["rules.yaml"])
    assert tests["rule_files"] == ["rules.yaml"]
    fired: set[tuple[str, str, str]] = set()
    silent: set[str] = set()
    targets: set[str] = set()
    for group in tests["tests"]:
        for series in group["input_series"]:
            targets |= set(re.findall(r'target="([^"]+)"', series["series"]))
        for check in group["alert_rule_test"]:
            if not check["exp_alerts"]:
                silent.add(check["alertname"])
            for alert in check["exp_alerts"]:
                labels = alert["exp_labels"]
                fired.add(
                    (check["alertname"], labels.get("slo", ""), labels["severity"])
                )
    generated = {
        (r["alert"], r["labels"].get("slo", ""), r["labels"]["severity"])
        for r in rules_of(config)
        if "alert" in r
    }
    assert fired == generated
    assert silent == {name for name, _, _ in generated}
    burned = {
        a["exp_labels"]["target"]
        for g in tests["tests"]
        for c in g["alert_rule_test"]
        for a in c["exp_alerts"]
        if c["alertname"] == ALERT_BURN
    }
    for slo in config.slos:
        assert f"{slo.name}/all-bad" in burned
        for quiet in ("no-traffic", "burn-0.5x", "all-bad-below-min-rate"):
            assert f"{slo.name}/{quiet}" in targets
            assert f"{slo.name}/{quiet}" not in burned
