"""The alerting rules' shape, and the saturation and health alerts.

Every alert carries ``severity`` = page | ticket, a summary and a description ending
in a runbook hint, and, where the SLO file sets ``runbook_url``, a link to
``<url>#<alertname in lower case>``. The annotation templates use only the few
forms below (the promtool tests in ``tests/support`` render them too).

- Saturation, with ``for``: ``ServemonQueueBacklog`` (waiting requests),
  ``ServemonKvCacheHigh``, ``ServemonPreemptions`` (preemption rate above 0) and
  ``ServemonGpuMemoryHigh`` (used / total).
- Health, with ``for``: ``ServemonTargetDown`` (``servemon_target_up == 0``),
  ``ServemonExporterAbsent`` (``absent(servemon_target_up)``: no exporter is scraped),
  ``ServemonEngineMetricsAbsent`` (a target scrapes fine but no engine series comes out:
  an engine renamed its metrics) and ``ServemonClientStalled``. Client series exist
  only while a load test runs, so ``absent()`` on them would fire whenever none runs;
  the client alert instead needs the load generator to be scheduling
  (``servemon_client_target_requests_per_second > 0``) while no request finishes.
"""

from __future__ import annotations

from servemon.core import names
from servemon.core.promql import (
    aggregate,
    duration,
    increase,
    number,
    on,
    rate,
    selector,
)
from servemon.dashboards.rule_names import (
    ALERT_CLIENT_STALLED,
    ALERT_ENGINE_ABSENT,
    ALERT_EXPORTER_ABSENT,
    ALERT_GPU_MEMORY,
    ALERT_KV_CACHE,
    ALERT_PREEMPTIONS,
    ALERT_QUEUE,
    ALERT_TARGET_DOWN,
    LEVEL_LABELS,
    Rule,
    RuleGroup,
)
from servemon.dashboards.slos import Severity, SloConfig

__all__ = [
    "VALUE_0F",
    "VALUE_1F",
    "VALUE_2F",
    "VALUE_PCT",
    "alert",
    "health_group",
    "label",
    "saturation_group",
]

VALUE_1F = '{{ printf "%.1f" $value }}'
VALUE_2F = '{{ printf "%.2f" $value }}'
VALUE_0F = '{{ printf "%.0f" $value }}'
VALUE_PCT = "{{ $value | humanizePercentage }}"


def label(name: str) -> str:
    """The template of one label's value."""
    return "{{ $labels." + name + " }}"


def alert(
    config: SloConfig,
    name: str,
    expr: str,
    severity: Severity,
    for_: int | None,
    labels: dict[str, str],
    annotations: dict[str, str],
) -> Rule:
    """One alerting rule; ``for_`` of None leaves ``for`` out."""
    if config.runbook_url:
        annotations = {
            **annotations,
            "runbook_url": f"{config.runbook_url}#{name.lower()}",
        }
    rule: Rule = {"alert": name, "expr": expr}
    if for_ is not None:
        rule["for"] = duration(for_)
    rule["labels"] = dict(sorted({**labels, "severity": severity}.items()))
    rule["annotations"] = dict(sorted(annotations.items()))
    return rule


def saturation_group(config: SloConfig) -> RuleGroup:
    """The ``servemon-saturation`` group: engine and GPU pressure."""
    sat = config.saturation
    where = f"{label('target')} ({label('model')}, rank {label('rank')})"
    rules = []
    if (waiting := sat.waiting_requests) is not None:
        rules.append(
            alert(
                config,
                ALERT_QUEUE,
                f"{names.ENGINE_REQUESTS_WAITING.name} > {number(waiting.above)}",
                waiting.severity,
                waiting.for_,
                {},
                {
                    "summary": f"{VALUE_0F} requests waiting on {where}",
                    "description": f"More than {number(waiting.above)} requests have "
                    f"waited in the engine's queue for {duration(waiting.for_)}: the "
                    "engine is at capacity and TTFT rises next. Runbook: compare "
                    "the request rate with the capacity a ramp test found; add "
                    "replicas or shed load.",
                },
            )
        )
    if (kv := sat.kv_cache_usage) is not None:
        rules.append(
            alert(
                config,
                ALERT_KV_CACHE,
                f"{names.ENGINE_KV_CACHE_USAGE.name} > {number(kv.above)}",
                kv.severity,
                kv.for_,
                {},
                {
                    "summary": f"KV cache {VALUE_PCT} full on {where}",
                    "description": f"KV cache usage has been above "
                    f"{number(kv.above)} for {duration(kv.for_)}: new requests wait "
                    "for blocks and running ones get preempted. Runbook: check "
                    "preemptions and waiting requests; give the KV cache more memory "
                    "(gpu_memory_utilization), shorten max_model_len or add "
                    "capacity.",
                },
            )
        )
    if (pre := sat.preemptions) is not None:
        preempting = rate(selector(names.ENGINE_PREEMPTIONS), duration(pre.window))
        rules.append(
            alert(
                config,
                ALERT_PREEMPTIONS,
                f"{preempting} > 0",
                pre.severity,
                pre.for_,
                {},
                {
                    "summary": f"{VALUE_2F} preemptions/s on {where}",
                    "description": "The engine has been preempting requests for "
                    f"{duration(pre.for_)} (rate over {duration(pre.window)} above "
                    "0): the KV cache is too small for the batch and preempted "
                    "requests are recomputed. Runbook: look at KV cache usage and the "
                    "running batch; lower max_num_seqs or give the KV cache more "
                    "memory.",
                },
            )
        )
    if (gpu := sat.gpu_memory) is not None:
        used, total = names.GPU_MEMORY_USED.name, names.GPU_MEMORY_TOTAL.name
        rules.append(
            alert(
                config,
                ALERT_GPU_MEMORY,
                f"{used} / ({total} > 0) > {number(gpu.above)}",
                gpu.severity,
                gpu.for_,
                {},
                {
                    "summary": f"GPU {label('gpu')} ({label('name')}) memory "
                    f"{VALUE_PCT} used",
                    "description": f"GPU memory used over total has been above "
                    f"{number(gpu.above)} for {duration(gpu.for_)}. vLLM takes "
                    "gpu_memory_utilization of the memory up front, so keep this "
                    "threshold above it. Runbook: list the processes on the GPU "
                    f"({names.GPU_PROCESS_MEMORY.name}); a second process "
                    "can starve the engine.",
                },
            )
        )
    return {"name": "servemon-saturation", "rules": rules}


def health_group(config: SloConfig) -> RuleGroup:
    """The ``servemon-health`` group: servemon's own view of its targets."""
    health = config.health
    up = names.TARGET_UP.name
    rules = []
    if (down := health.target_down) is not None:
        rules.append(
            alert(
                config,
                ALERT_TARGET_DOWN,
                f"{up} == 0",
                down.severity,
                down.for_,
                {},
                {
                    "summary": f"servemon cannot scrape {label('target')}",
                    "description": f"{up} has been 0 for {duration(down.for_)}: the "
                    "engine's /metrics does not answer. Runbook: is the server up? "
                    f"{names.TARGET_SCRAPE_ERRORS.name} says why the scrapes fail "
                    "(connect, timeout, http, parse).",
                },
            )
        )
    if (absent := health.exporter_absent) is not None:
        rules.append(
            alert(
                config,
                ALERT_EXPORTER_ABSENT,
                f"absent({up})",
                absent.severity,
                absent.for_,
                {},
                {
                    "summary": "No servemon exporter reports to Prometheus",
                    "description": f"{up} has been absent for {duration(absent.for_)}: "
                    "Prometheus scrapes no servemon exporter, so every servemon "
                    "alert is blind. Runbook: check the exporter process and "
                    "Prometheus' targets page.",
                },
            )
        )
    if (engine := health.engine_metrics_absent) is not None:
        running = names.ENGINE_REQUESTS_RUNNING.name
        rules.append(
            alert(
                config,
                ALERT_ENGINE_ABSENT,
                f"{up} == 1 unless {on(('target',))} {running}",
                engine.severity,
                engine.for_,
                {},
                {
                    "summary": f"{label('target')} answers but gives no engine metrics",
                    "description": f"For {duration(engine.for_)} the target's /metrics "
                    f"was scraped but no {running} came out of it: the engine "
                    "renamed its metrics or is not one servemon knows. Runbook: "
                    "compare the target's /metrics with docs/metrics.md.",
                },
            )
        )
    if (stalled := health.client_stalled) is not None:
        target_rate = names.CLIENT_TARGET_RATE.name
        requests = names.CLIENT_REQUESTS.name
        window = duration(stalled.for_)
        rules.append(
            alert(
                config,
                ALERT_CLIENT_STALLED,
                f"{aggregate('max', target_rate, LEVEL_LABELS)} > 0\n"
                f"unless {on(LEVEL_LABELS)}\n"
                f"{aggregate('sum', increase(requests, window), LEVEL_LABELS)} > 0\n",
                stalled.severity,
                stalled.for_,
                {},
                {
                    "summary": f"Load test on {label('target')} "
                    f"({label('model')}): no request finishes",
                    "description": "The load generator has been sending requests "
                    f"for {window} and none finished in that time: they hang. "
                    "Runbook: look at in-flight requests and the target's waiting "
                    "queue.",
                },
            )
        )
    return {"name": "servemon-health", "rules": rules}
