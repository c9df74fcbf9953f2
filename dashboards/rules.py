"""Prometheus recording and alerting rules generated from an SLO file.

``servemon rules --slo-config slos.yaml --out DIR`` writes ``DIR/servemon-rules.yaml``
(:func:`write_rules`); the file's schema is in :mod:`dashboards.slos`. Every metric
name comes from :mod:`monitor.names`.

Recording rules are named ``level:metric:operations``. The level is ``target_model``:
every SLO rule sums ``by (target, model)``, dropping the load stage, the engine's
data-parallel rank and the scrape's instance. The metric is the servemon series the
rule reads (a counter without ``_total``), the operations say what was done to it,
newest first, with the window last:

- ``target_model:servemon_client_requests:rate5m`` (and the engine's
  ``servemon_engine_requests_finished``): finished requests per second, at each short
  window; the traffic guard of the burn alerts.
- ``target_model:<metric>:error_ratio_rate<W>{slo="<name>"}``: the share of bad events
  over W: for a latency SLO ``(_count - _bucket{le="<threshold>"}) / _count``, for an
  availability SLO errors over finished requests. W is every window of the burn pairs
  and the SLO period itself (``rate30d``). The client's latency histograms hold
  successful requests only (failures count against availability); an ITL SLO counts
  gaps between tokens, not requests.
- ``target_model:<metric>:burn_rate<W>{slo="<name>"}``: that ratio over the error
  budget (1 - objective). 1 spends the budget exactly in the period;
  ``burn_rate30d`` is the share of the period's budget spent, so 1 minus it is the
  budget left.

Alerts (every one has ``severity`` = page | ticket):

- ``ServemonErrorBudgetBurn{slo, severity}``: the SRE workbook's multi-window,
  multi-burn-rate alert. Page: 1h and 5m above 14.4x, or 6h and 30m above 6x; ticket:
  1d and 2h above 3x, or 3d and 6h above 1x (windows scaled and pairs replaced by
  ``burn_windows``). Each pair also needs the request rate over its short window above
  ``min_request_rate``, so a quiet service (no load test, the night) never pages on
  a handful of requests, and 0/0 is never a burn. No ``for``: the short window is
  what makes it fire fast and stop soon after the burn stops. The value is the burn
  rate of the long window.
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

import sys
from pathlib import Path
from typing import Any

import yaml

from dashboards.slos import (
    REQUESTS,
    SEVERITIES,
    LatencySlo,
    Severity,
    Slo,
    SloConfig,
    SourceName,
    format_duration,
    load_slo_config,
)
from monitor import names
from monitor.names import Series

__all__ = [
    "ALERT_BURN",
    "ALERT_CLIENT_STALLED",
    "ALERT_ENGINE_ABSENT",
    "ALERT_EXPORTER_ABSENT",
    "ALERT_GPU_MEMORY",
    "ALERT_KV_CACHE",
    "ALERT_PREEMPTIONS",
    "ALERT_QUEUE",
    "ALERT_TARGET_DOWN",
    "RULES_FILE",
    "SloConfig",
    "alert_names",
    "burn_rate_name",
    "error_ratio_name",
    "generate_rules",
    "le_matcher",
    "load_slo_config",
    "metric_of",
    "render_rules",
    "traffic_name",
    "write_rules",
]

RULES_FILE = "servemon-rules.yaml"

ALERT_BURN = "ServemonErrorBudgetBurn"
ALERT_QUEUE = "ServemonQueueBacklog"
ALERT_KV_CACHE = "ServemonKvCacheHigh"
ALERT_PREEMPTIONS = "ServemonPreemptions"
ALERT_GPU_MEMORY = "ServemonGpuMemoryHigh"
ALERT_TARGET_DOWN = "ServemonTargetDown"
ALERT_EXPORTER_ABSENT = "ServemonExporterAbsent"
ALERT_ENGINE_ABSENT = "ServemonEngineMetricsAbsent"
ALERT_CLIENT_STALLED = "ServemonClientStalled"

LEVEL = "target_model"
BY = "by (target, model)"
ON = "on (target, model)"

#: Template pieces of annotations (the promtool tests in ``tests/support`` render them
#: too).
VALUE_1F = '{{ printf "%.1f" $value }}'
VALUE_2F = '{{ printf "%.2f" $value }}'
VALUE_0F = '{{ printf "%.0f" $value }}'
VALUE_PCT = "{{ $value | humanizePercentage }}"


def label(name: str) -> str:
    """The template of one label's value."""
    return "{{ $labels." + name + " }}"


def metric_of(slo: Slo) -> Series:
    """The series an SLO reads: its histogram, or its requests counter."""
    return slo.histogram.series if isinstance(slo, LatencySlo) else REQUESTS[slo.source]


def _metric(series: Series) -> str:
    return series.base if series.kind == "counter" else series.name


def error_ratio_name(slo: Slo, window: int) -> str:
    """``target_model:<metric>:error_ratio_rate<W>``."""
    return f"{LEVEL}:{_metric(metric_of(slo))}:error_ratio_rate{_w(window)}"


def burn_rate_name(slo: Slo, window: int) -> str:
    """``target_model:<metric>:burn_rate<W>``."""
    return f"{LEVEL}:{_metric(metric_of(slo))}:burn_rate{_w(window)}"


def traffic_name(source: SourceName, window: int) -> str:
    """``target_model:<requests counter>:rate<W>``: the traffic guard."""
    return f"{LEVEL}:{_metric(REQUESTS[source])}:rate{_w(window)}"


def _w(seconds: int) -> str:
    return format_duration(seconds)


def _num(value: float) -> str:
    """A float as PromQL and humans read it: no binary noise, no ``.0``."""
    text = repr(round(value, 12))
    return text.removesuffix(".0")


def le_matcher(edge: float) -> str:
    """The ``le`` matcher of a bucket edge; ``1`` matches ``le="1"`` and ``"1.0"``.

    Prometheus 2 keeps ``le`` as exposed: Python clients write ``1.0``, Go and Rust
    clients ``1``, and the exporter passes the engine's spelling through.
    """
    if edge == int(edge):
        return f'le=~"{int(edge)}(\\\\.0)?"'
    return f'le="{edge!r}"'


def _sum_rate(selector: str, window: int) -> str:
    return f"sum {BY} (rate({selector}[{_w(window)}]))"


def _error_ratio(slo: Slo, window: int) -> str:
    if isinstance(slo, LatencySlo):
        name = slo.histogram.series.name
        total = _sum_rate(f"{name}_count", window)
        good = _sum_rate(f"{name}_bucket{{{le_matcher(slo.threshold)}}}", window)
        return f"(\n  {total}\n  -\n  {good}\n)\n/\n{total}\n"
    series = REQUESTS[slo.source]
    if slo.source == "client":
        bad, counted = 'outcome!~"ok|cancelled"', 'outcome!="cancelled"'
    else:
        bad, counted = 'reason=~"abort|error"', ""
    errors = _sum_rate(f"{series.name}{{{bad}}}", window)
    total = _sum_rate(f"{series.name}{{{counted}}}" if counted else series.name, window)
    # No error series at all (a counter's children appear with their first
    # increment) must read as 0 errors, not as no data.
    return f"(\n  {errors}\n  or\n  0 * {total}\n)\n/\n{total}\n"


def _budget(slo: Slo) -> float:
    return 1 - slo.objective


def _traffic_group(config: SloConfig) -> dict[str, Any]:
    sources = sorted({slo.source for slo in config.slos})
    rules = [
        {
            "record": traffic_name(source, window),
            "expr": _sum_rate(REQUESTS[source].name, window),
        }
        for source in sources
        for window in config.guard_windows
    ]
    return {"name": "servemon-slo-traffic", "rules": rules}


def _slo_group(config: SloConfig, slo: Slo) -> dict[str, Any]:
    rules: list[dict[str, Any]] = []
    tag = {"slo": slo.name}
    for window in config.windows:
        rules.append(
            {
                "record": error_ratio_name(slo, window),
                "expr": _error_ratio(slo, window),
                "labels": tag,
            }
        )
    for window in config.windows:
        ratio = f'{error_ratio_name(slo, window)}{{slo="{slo.name}"}}'
        rules.append(
            {
                "record": burn_rate_name(slo, window),
                "expr": f"{ratio} / {_num(_budget(slo))}",
                "labels": tag,
            }
        )
    rules.extend(_burn_alert(config, slo, severity) for severity in SEVERITIES)
    return {"name": f"servemon-slo-{slo.name}", "rules": rules}


def _burn_alert(config: SloConfig, slo: Slo, severity: Severity) -> dict[str, Any]:
    pairs = config.pairs(severity)
    tag = {"slo": slo.name}
    parts = []
    for pair in pairs:
        factor = _num(pair.factor)
        long = f'{burn_rate_name(slo, pair.long)}{{slo="{slo.name}"}} > {factor}'
        short = f'{burn_rate_name(slo, pair.short)}{{slo="{slo.name}"}} > {factor}'
        guard = (
            f"{traffic_name(slo.source, pair.short)} > {_num(config.min_request_rate)}"
        )
        parts.append(f"(\n  {long}\n  and {ON}\n  {short}\n  and {ON}\n  {guard}\n)")
    when = " or ".join(
        f"{_num(p.factor)}x over {_w(p.long)} and {_w(p.short)}" for p in pairs
    )
    spent = " or ".join(
        f"{100 * p.factor * p.long / config.period:.3g}%" for p in pairs
    )
    annotations = {
        "summary": f"SLO {slo.name}: error budget burning {VALUE_1F}x too fast on "
        f"{label('target')} ({label('model')})",
        "description": f"{_describe(slo)}, over {_w(config.period)}. This "
        f"{severity} fires on a burn rate above {when} (which spends {spent} of the "
        f"budget) with more than {_num(config.min_request_rate)} requests/s. "
        f"Runbook: {_hint(slo)}",
    }
    expr = "\nor\n".join(parts) + "\n"
    return _alert(config, ALERT_BURN, expr, severity, None, tag, annotations)


_WHAT = {
    "ttft": "get their first token within",
    "itl": "of the gaps between tokens are within",
    "tpot": "have a time per output token within",
    "e2e": "complete within",
}
_HINTS = {
    "ttft": "compare client and engine TTFT with queue time and waiting requests on "
    "the serving overview; a rising queue means too little capacity, a gap between "
    "client and engine TTFT points at the network or a proxy.",
    "itl": "look at the running batch, preemptions and KV cache usage; decoding "
    "slows when the batch grows or requests are preempted and recomputed.",
    "e2e": "split E2E into TTFT and inter-token latency and check output lengths; "
    "longer answers raise E2E without any fault.",
    "availability": "look at completions by outcome (client) and finish reasons "
    "(engine), servemon_target_up and the server's log.",
}
_HINTS["tpot"] = _HINTS["itl"]


def _describe(slo: Slo) -> str:
    if slo.description:
        return slo.description.rstrip(".")
    share = f"{slo.objective * 100:.6g}%"
    if isinstance(slo, LatencySlo):
        events = "" if slo.figure == "itl" else " of requests"
        return (
            f"{share}{events} {_WHAT[slo.figure]} {slo.threshold:g} s "
            f"({slo.source} {slo.figure.upper()})"
        )
    errors = (
        "outcomes other than ok and cancelled"
        if slo.source == "client"
        else "engine finish reasons abort and error"
    )
    return f"{share} of requests finish without an error ({errors})"


def _hint(slo: Slo) -> str:
    return _HINTS[slo.figure if isinstance(slo, LatencySlo) else "availability"]


def _alert(
    config: SloConfig,
    name: str,
    expr: str,
    severity: Severity,
    for_: int | None,
    labels: dict[str, str],
    annotations: dict[str, str],
) -> dict[str, Any]:
    if config.runbook_url:
        annotations = {
            **annotations,
            "runbook_url": f"{config.runbook_url}#{name.lower()}",
        }
    rule: dict[str, Any] = {"alert": name, "expr": expr}
    if for_ is not None:
        rule["for"] = _w(for_)
    rule["labels"] = dict(sorted({**labels, "severity": severity}.items()))
    rule["annotations"] = dict(sorted(annotations.items()))
    return rule


def _saturation_group(config: SloConfig) -> dict[str, Any]:
    sat = config.saturation
    where = f"{label('target')} ({label('model')}, rank {label('rank')})"
    rules = []
    if (waiting := sat.waiting_requests) is not None:
        rules.append(
            _alert(
                config,
                ALERT_QUEUE,
                f"{names.ENGINE_REQUESTS_WAITING.name} > {_num(waiting.above)}",
                waiting.severity,
                waiting.for_,
                {},
                {
                    "summary": f"{VALUE_0F} requests waiting on {where}",
                    "description": f"More than {_num(waiting.above)} requests have "
                    f"waited in the engine's queue for {_w(waiting.for_)}: the "
                    "engine is at capacity and TTFT rises next. Runbook: compare "
                    "the request rate with the capacity a ramp test found; add "
                    "replicas or shed load.",
                },
            )
        )
    if (kv := sat.kv_cache_usage) is not None:
        rules.append(
            _alert(
                config,
                ALERT_KV_CACHE,
                f"{names.ENGINE_KV_CACHE_USAGE.name} > {_num(kv.above)}",
                kv.severity,
                kv.for_,
                {},
                {
                    "summary": f"KV cache {VALUE_PCT} full on {where}",
                    "description": f"KV cache usage has been above {_num(kv.above)} "
                    f"for {_w(kv.for_)}: new requests wait for blocks and running "
                    "ones get preempted. Runbook: check preemptions and waiting "
                    "requests; give the KV cache more memory "
                    "(gpu_memory_utilization), shorten max_model_len or add "
                    "capacity.",
                },
            )
        )
    if (pre := sat.preemptions) is not None:
        rate = f"rate({names.ENGINE_PREEMPTIONS.name}[{_w(pre.window)}])"
        rules.append(
            _alert(
                config,
                ALERT_PREEMPTIONS,
                f"{rate} > 0",
                pre.severity,
                pre.for_,
                {},
                {
                    "summary": f"{VALUE_2F} preemptions/s on {where}",
                    "description": "The engine has been preempting requests for "
                    f"{_w(pre.for_)} (rate over {_w(pre.window)} above 0): the KV "
                    "cache is too small for the batch and preempted requests are "
                    "recomputed. Runbook: look at KV cache usage and the running "
                    "batch; lower max_num_seqs or give the KV cache more memory.",
                },
            )
        )
    if (gpu := sat.gpu_memory) is not None:
        used, total = names.GPU_MEMORY_USED.name, names.GPU_MEMORY_TOTAL.name
        rules.append(
            _alert(
                config,
                ALERT_GPU_MEMORY,
                f"{used} / ({total} > 0) > {_num(gpu.above)}",
                gpu.severity,
                gpu.for_,
                {},
                {
                    "summary": f"GPU {label('gpu')} ({label('name')}) memory "
                    f"{VALUE_PCT} used",
                    "description": f"GPU memory used over total has been above "
                    f"{_num(gpu.above)} for {_w(gpu.for_)}. vLLM takes "
                    "gpu_memory_utilization of the memory up front, so keep this "
                    "threshold above it. Runbook: list the processes on the GPU "
                    "(servemon_gpu_process_memory_used_bytes); a second process "
                    "can starve the engine.",
                },
            )
        )
    return {"name": "servemon-saturation", "rules": rules}


def _health_group(config: SloConfig) -> dict[str, Any]:
    health = config.health
    up = names.TARGET_UP.name
    rules = []
    if (down := health.target_down) is not None:
        rules.append(
            _alert(
                config,
                ALERT_TARGET_DOWN,
                f"{up} == 0",
                down.severity,
                down.for_,
                {},
                {
                    "summary": f"servemon cannot scrape {label('target')}",
                    "description": f"{up} has been 0 for {_w(down.for_)}: the "
                    "engine's /metrics does not answer. Runbook: is the server up? "
                    f"{names.TARGET_SCRAPE_ERRORS.name} says why the scrapes fail "
                    "(connect, timeout, http, parse).",
                },
            )
        )
    if (absent := health.exporter_absent) is not None:
        rules.append(
            _alert(
                config,
                ALERT_EXPORTER_ABSENT,
                f"absent({up})",
                absent.severity,
                absent.for_,
                {},
                {
                    "summary": "No servemon exporter reports to Prometheus",
                    "description": f"{up} has been absent for {_w(absent.for_)}: "
                    "Prometheus scrapes no servemon exporter, so every servemon "
                    "alert is blind. Runbook: check the exporter process and "
                    "Prometheus' targets page.",
                },
            )
        )
    if (engine := health.engine_metrics_absent) is not None:
        running = names.ENGINE_REQUESTS_RUNNING.name
        rules.append(
            _alert(
                config,
                ALERT_ENGINE_ABSENT,
                f"{up} == 1 unless on (target) {running}",
                engine.severity,
                engine.for_,
                {},
                {
                    "summary": f"{label('target')} answers but gives no engine metrics",
                    "description": f"For {_w(engine.for_)} the target's /metrics "
                    f"was scraped but no {running} came out of it: the engine "
                    "renamed its metrics or is not one servemon knows. Runbook: "
                    "compare the target's /metrics with docs/metrics.md.",
                },
            )
        )
    if (stalled := health.client_stalled) is not None:
        target_rate = names.CLIENT_TARGET_RATE.name
        requests = names.CLIENT_REQUESTS.name
        window = _w(stalled.for_)
        rules.append(
            _alert(
                config,
                ALERT_CLIENT_STALLED,
                f"max {BY} ({target_rate}) > 0\n"
                f"unless {ON}\n"
                f"sum {BY} (increase({requests}[{window}])) > 0\n",
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


def generate_rules(config: SloConfig) -> dict[str, Any]:
    """The rule file's structure: ``{"groups": [...]}``."""
    groups: list[dict[str, Any]] = []
    if config.slos:
        groups.append(_traffic_group(config))
        groups.extend(_slo_group(config, slo) for slo in config.slos)
    groups.extend((_saturation_group(config), _health_group(config)))
    return {"groups": [g for g in groups if g["rules"]]}


class _Dumper(yaml.SafeDumper):
    """Block style; multi-line strings (PromQL) as literal blocks; no aliases."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render_rules(config: SloConfig, out_dir: Path) -> str:
    """The text of the rule file, with a header naming the command that made it."""
    header = (
        "# Generated by servemon; do not edit. Regenerate with:\n"
        f"#   servemon rules --slo-config {config.source or 'SLO_FILE'} "
        f"--out {out_dir}\n"
        "# Recording rules are level:metric:operations; see dashboards/rules.py.\n"
    )
    body = yaml.dump(
        generate_rules(config),
        Dumper=_Dumper,
        sort_keys=False,
        allow_unicode=True,
        width=100_000,
    )
    return header + body


def write_rules(config: SloConfig, out_dir: Path) -> list[Path]:
    """Write ``out_dir/servemon-rules.yaml``; return the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / RULES_FILE
    path.write_text(render_rules(config, out_dir), encoding="utf-8")
    return [path]


def alert_names(rules: dict[str, Any]) -> list[str]:
    """Every alert name in a generated rule structure, in order, once."""
    seen: dict[str, None] = {}
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                seen.setdefault(rule["alert"], None)
    return list(seen)


def main(argv: list[str] | None = None) -> int:
    """``python -m dashboards.rules SLO_FILE OUT_DIR`` (as ``servemon rules``)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        sys.stderr.write("usage: python -m dashboards.rules SLO_FILE OUT_DIR\n")
        return 2
    write_rules(load_slo_config(Path(args[0])), Path(args[1]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
