"""The autoscaler files: one series per workload, read the same by KEDA and the HPA
(schemas and promtool: tests/e2e/test_autoscale_configs.py)."""

from __future__ import annotations

import yaml

from servemon.dashboards.autoscale import (
    FORMATS,
    Autoscaler,
    ScaleTarget,
    adapter_rules,
    horizontal_pod_autoscaler,
    record_name,
    render,
    rule_expr,
    scaled_object,
)

TARGET = ScaleTarget("Deployment", "vllm", "llm")


def scaler(**fields: object) -> Autoscaler:
    base: dict[str, object] = {
        "target": TARGET,
        "signal": "queue",
        "threshold": 0.6667,
        "min_replicas": 1,
        "max_replicas": 4,
        "matchers": ('namespace="llm"', 'pod=~"vllm-.*"'),
    }
    return Autoscaler(**{**base, **fields})  # type: ignore[arg-type]


def test_the_rule_is_per_replica_over_servemon_names() -> None:
    a = scaler()
    assert record_name(a) == (
        "namespace_workload:servemon_engine_requests_waiting:per_pod_avg1m"
    )
    assert rule_expr(a) == (
        "avg (sum by (pod) (avg_over_time(servemon_engine_requests_waiting"
        '{namespace="llm",pod=~"vllm-.*"}[1m])))'
    )


def test_kv_cache_takes_a_pods_fullest_engine_and_vllm_names_read_vllm() -> None:
    a = scaler(signal="kv_cache", vllm_names=True, pod_label="instance", window_s=30)
    assert record_name(a) == (
        "namespace_workload:vllm_kv_cache_usage_perc:per_pod_avg30s"
    )
    assert rule_expr(a).startswith(
        "avg (max by (instance) (avg_over_time(vllm:kv_cache_usage_perc{"
    )


def test_keda_and_the_hpa_read_the_recorded_series_against_one_threshold() -> None:
    a = scaler()
    (trigger,) = scaled_object(a)["spec"]["triggers"]
    assert trigger["metricType"] == "Value"
    assert trigger["metadata"]["query"] == (
        f'{record_name(a)}{{namespace="llm",workload="vllm"}}'
    )
    assert trigger["metadata"]["threshold"] == "0.667"
    (metric,) = horizontal_pod_autoscaler(a)["spec"]["metrics"]
    assert metric["external"]["target"] == {"type": "Value", "value": "0.667"}
    (rule,) = adapter_rules(a)["externalRules"]
    assert record_name(a) in rule["seriesQuery"]
    assert rule["name"]["as"] == metric["external"]["metric"]["name"]


def test_each_file_says_how_its_threshold_was_derived() -> None:
    a = scaler(why=("threshold = 0.8333 x (1 - 0.2) = 0.667",))
    for fmt in FORMATS:
        text = render(a, fmt, "servemon autoscale RUN")
        assert "# threshold = 0.8333 x (1 - 0.2) = 0.667\n" in text
        assert yaml.safe_load(text)
