"""Autoscaler settings for a Kubernetes workload that serves a model, on one server
signal per replica: the waiting queue or KV-cache usage.

``servemon autoscale`` reads the threshold from a capacity run
(:mod:`servemon.loadgen.record.saturation`) and this module writes what a cluster
applies:

- ``rules``: the Prometheus recording rule
  ``namespace_workload:<metric>:per_pod_avg<W>``
  (:mod:`servemon.dashboards.rule_names`): per pod the engines' queue summed (KV usage:
  the fullest engine), each averaged over W, then averaged over the workload's pods,
  with ``namespace`` and ``workload`` set on it, so that one series answers for one
  workload;
- ``keda``: a KEDA ``ScaledObject`` (``keda.sh/v1alpha1``) whose ``prometheus``
  trigger reads that series with ``metricType: Value``: the series is already per
  replica, and the HPA KEDA makes computes ``ceil(ready pods x value / threshold)``;
- ``hpa``: the same as an ``autoscaling/v2`` HorizontalPodAutoscaler on an
  ``External`` metric of target type ``Value``, served by prometheus-adapter;
- ``adapter``: the prometheus-adapter ``externalRules`` entry that serves it.

Both scalers scale up at once and down only after ``scale_down_window_s`` of lower
recommendations (the HPA's stabilization window). A workload with no pod has no
queue to read, so the least replica count is 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import yaml

from servemon.core import names, promql
from servemon.core.names import Series
from servemon.dashboards.rule_names import autoscale_record_name

__all__ = [
    "FILES",
    "FORMATS",
    "Autoscaler",
    "Format",
    "ScaleTarget",
    "adapter_rules",
    "api_metric_name",
    "horizontal_pod_autoscaler",
    "record_name",
    "recording_rules",
    "render",
    "rule_expr",
    "scaled_object",
    "signal_series",
]

Format = Literal["keda", "hpa", "adapter", "rules"]
FORMATS: tuple[Format, ...] = ("keda", "hpa", "adapter", "rules")
#: The file each format is written to under ``--out``.
FILES: dict[Format, str] = {
    "keda": "keda-scaledobject.yaml",
    "hpa": "hpa.yaml",
    "adapter": "prometheus-adapter-rules.yaml",
    "rules": "autoscale-rules.yaml",
}
#: The series of each signal, and how one pod's engines (ranks) combine.
_SIGNALS: dict[str, tuple[Series, str]] = {
    "queue": (names.ENGINE_REQUESTS_WAITING, "sum"),
    "kv_cache": (names.ENGINE_KV_CACHE_USAGE, "max"),
}
#: What the HPA's API calls each signal (prometheus-adapter serves it by this).
_API_NAMES = {
    "queue": "servemon_requests_waiting_per_replica",
    "kv_cache": "servemon_kv_cache_usage_per_replica",
}


@dataclass(frozen=True, slots=True)
class ScaleTarget:
    """The workload scaled: ``deployment/vllm`` in a namespace."""

    kind: str
    name: str
    namespace: str
    api_version: str = "apps/v1"

    def ref(self) -> dict[str, str]:
        """The ``scaleTargetRef`` of both scalers."""
        return {"apiVersion": self.api_version, "kind": self.kind, "name": self.name}


@dataclass(frozen=True, slots=True)
class Autoscaler:
    """What the generated files say; ``why`` is the derivation, put on top of them
    as comments."""

    target: ScaleTarget
    #: ``queue`` or ``kv_cache``.
    signal: str
    #: The per-replica level to hold each replica under.
    threshold: float
    min_replicas: int
    max_replicas: int
    #: The label matchers that pick the workload's engine series.
    matchers: tuple[str, ...]
    #: Read vLLM's own names (Prometheus scrapes vLLM) instead of servemon's.
    vllm_names: bool = False
    #: The label that tells one replica's series from another's.
    pod_label: str = "pod"
    window_s: int = 60
    prometheus: str = "http://prometheus-operated.monitoring.svc:9090"
    polling_s: int = 15
    scale_down_window_s: int = 300
    why: tuple[str, ...] = ()


def signal_series(signal: str, vllm_names: bool) -> tuple[str, str]:
    """The metric name a signal is read from, and how a pod's engines combine."""
    series, combine = _SIGNALS[signal]
    if not vllm_names:
        return series.name, combine
    own = next(s.name for s in series.sources if s.engine == "vllm")
    return own, combine


def record_name(a: Autoscaler) -> str:
    """The recording rule's name."""
    return autoscale_record_name(signal_series(a.signal, a.vllm_names)[0], a.window_s)


def api_metric_name(a: Autoscaler) -> str:
    """The external metric's name in the HPA and the adapter."""
    return _API_NAMES[a.signal]


def rule_expr(a: Autoscaler) -> str:
    """The per-replica value: per pod the engines combined, each averaged over the
    window, then averaged over the pods."""
    metric, combine = signal_series(a.signal, a.vllm_names)
    samples = metric + promql.braces(*a.matchers) if a.matchers else metric
    smoothed = promql.over_time("avg", samples, promql.duration(a.window_s))
    per_pod = promql.aggregate(combine, smoothed, (a.pod_label,))
    return promql.aggregate("avg", per_pod)


def _labels(a: Autoscaler) -> dict[str, str]:
    return {"namespace": a.target.namespace, "workload": a.target.name}


def recording_rules(a: Autoscaler) -> dict[str, Any]:
    """The Prometheus rule file: one group, one rule."""
    rule = {"record": record_name(a), "expr": rule_expr(a), "labels": _labels(a)}
    return {"groups": [{"name": "servemon-autoscale", "rules": [rule]}]}


def _threshold(a: Autoscaler) -> str:
    return promql.number(float(f"{a.threshold:.3g}"))


def _behavior(a: Autoscaler) -> dict[str, Any]:
    return {
        "scaleUp": {"stabilizationWindowSeconds": 0},
        "scaleDown": {"stabilizationWindowSeconds": a.scale_down_window_s},
    }


def _query(a: Autoscaler) -> str:
    matchers = [f'{k}="{v}"' for k, v in _labels(a).items()]
    return record_name(a) + promql.braces(*matchers)


def _metadata(a: Autoscaler) -> dict[str, Any]:
    return {
        "name": a.target.name,
        "namespace": a.target.namespace,
        "labels": {"app.kubernetes.io/managed-by": "servemon"},
    }


def scaled_object(a: Autoscaler) -> dict[str, Any]:
    """The KEDA ScaledObject."""
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": _metadata(a),
        "spec": {
            "scaleTargetRef": a.target.ref(),
            "pollingInterval": a.polling_s,
            "minReplicaCount": a.min_replicas,
            "maxReplicaCount": a.max_replicas,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": _behavior(a)}},
            "triggers": [
                {
                    "type": "prometheus",
                    "metricType": "Value",
                    "metadata": {
                        "serverAddress": a.prometheus,
                        "query": _query(a),
                        "threshold": _threshold(a),
                        # A lost series is an error, never a zero (DESIGN.md).
                        "ignoreNullValues": "false",
                    },
                }
            ],
        },
    }


def horizontal_pod_autoscaler(a: Autoscaler) -> dict[str, Any]:
    """The autoscaling/v2 HorizontalPodAutoscaler on the external metric."""
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": _metadata(a),
        "spec": {
            "scaleTargetRef": a.target.ref(),
            "minReplicas": a.min_replicas,
            "maxReplicas": a.max_replicas,
            "metrics": [
                {
                    "type": "External",
                    "external": {
                        "metric": {
                            "name": api_metric_name(a),
                            "selector": {"matchLabels": {"workload": a.target.name}},
                        },
                        "target": {"type": "Value", "value": _threshold(a)},
                    },
                }
            ],
            "behavior": _behavior(a),
        },
    }


def adapter_rules(a: Autoscaler) -> dict[str, Any]:
    """prometheus-adapter's ``externalRules`` entry (its config file, or the Helm
    chart's ``rules.external``); the adapter adds the HPA's namespace itself."""
    return {
        "externalRules": [
            {
                "seriesQuery": f'{{__name__="{record_name(a)}",workload!=""}}',
                "resources": {"overrides": {"namespace": {"resource": "namespace"}}},
                "name": {"matches": "^.*$", "as": api_metric_name(a)},
                "metricsQuery": "max(<<.Series>>{<<.LabelMatchers>>})",
            }
        ]
    }


_BUILD = {
    "keda": scaled_object,
    "hpa": horizontal_pod_autoscaler,
    "adapter": adapter_rules,
    "rules": recording_rules,
}


def render(a: Autoscaler, fmt: Format, command: str) -> str:
    """One format's file: the derivation as comments, then the YAML."""
    header = [
        "# Generated by servemon autoscale; do not edit. Regenerate with:",
        f"#   {command}",
        *(f"# {line}" for line in a.why),
    ]
    body = yaml.safe_dump(_BUILD[fmt](a), sort_keys=False, width=100_000)
    return "\n".join(header) + "\n" + body
