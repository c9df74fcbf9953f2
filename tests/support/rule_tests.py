"""promtool unit tests for the generated rules: every alert firing and staying silent.

:func:`promtool_tests` builds a ``promtool test rules`` file for one SLO config. Its
input series are servemon's own series (names from :mod:`servemon.core.names`), labelled
as the exporter and the load generator label them. For every SLO:

- a breach (every request bad) fires the page and the ticket alert;
- a constant burn between each pair of neighbouring burn factors fires exactly the
  severities that have a smaller factor (so the 6x pair pages alone at 10x);
- a burn below the smallest factor, no traffic at all (flat counters: 0/0), and a
  breach below ``min_request_rate`` stay silent;
- a breach that stopped stops alerting once the short windows are clean, although
  the long windows still remember it;
- for a client availability SLO, the bad requests are spread over every failed
  outcome of :mod:`servemon.core.outcomes`, and requests that are not judged (cancelled)
  are not errors; for an engine one, over the finish reasons abort and error and
  the admission rejections, and a target that refuses every request (nothing ever
  finishes) breaches too.

Every saturation and health alert fires when its condition holds past ``for``, is
only pending before that, and stays silent on healthy series. Expected annotations
are the generated templates rendered the way Prometheus renders them (the few
template forms :mod:`servemon.dashboards.rules` uses).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from servemon.core import names
from servemon.core.outcomes import FAILED, NOT_JUDGED
from servemon.core.promql import duration, number
from servemon.dashboards import rules as r
from servemon.dashboards.sli import REQUESTS
from servemon.dashboards.slos import SEVERITIES, LatencySlo, Severity, Slo, SloConfig

__all__ = ["promtool_tests", "render_template"]

TARGET, MODEL = "demo", "demo-model"
_CLIENT = {"target": TARGET, "model": MODEL, "stage": "0"}
_ENGINE = {"target": TARGET, "model": MODEL, "engine": "vllm", "rank": "0"}
_GPU = {"gpu": "0", "uuid": "GPU-0", "name": "NVIDIA H200"}

_TOKEN = re.compile(r"\{\{ (.*?) \}\}")
_PRINTF = re.compile(r'printf "(%\.\d+f)" \$value')


def render_template(text: str, labels: Mapping[str, str], value: float) -> str:
    """``text`` as Prometheus renders it, for the template forms the rules use."""

    def one(match: re.Match[str]) -> str:
        expr = match.group(1)
        if expr.startswith("$labels."):
            return labels.get(expr.removeprefix("$labels."), "")
        if printf := _PRINTF.fullmatch(expr):
            return printf.group(1) % value
        if expr == "$value | humanizePercentage":
            return f"{value * 100:.4g}%"
        raise ValueError(f"no rendering for {match.group(0)}")

    return _TOKEN.sub(one, text)


def _sel(name: str, labels: Mapping[str, str]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def _counter(segments: Iterable[tuple[float, int]]) -> str:
    """Expanding notation: 0, then ``count`` steps of ``inc`` per segment."""
    parts, value = [], 0.0
    for index, (inc, count) in enumerate(segments):
        if index == 0:
            parts.append(f"{number(value)}+{number(inc)}x{count}")
        else:
            parts.append(f"{number(value + inc)}+{number(inc)}x{count - 1}")
        value += inc * count
    return " ".join(parts)


def _gauge(value: float, steps: int) -> str:
    return f"{number(value)}x{steps}"


def _step(config: SloConfig) -> int:
    """The sample and evaluation interval: at most 1m, five samples per rate window."""
    windows = [*config.windows]
    if config.saturation.preemptions is not None:
        windows.append(config.saturation.preemptions.window)
    if config.health.client_stalled is not None:
        windows.append(config.health.client_stalled.for_)
    return max(1, min(60, min(windows) // 5))


def _test(
    name: str, step: int, series: Mapping[str, str], evals: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "name": name,
        "interval": duration(step),
        "input_series": [{"series": s, "values": v} for s, v in series.items()],
        "alert_rule_test": evals,
    }


def _eval(at: int, alert: str, expected: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "eval_time": duration(at),
        "alertname": alert,
        "exp_alerts": expected,
    }


def _expected(
    rule: Mapping[str, Any], labels: Mapping[str, str], value: float
) -> dict[str, Any]:
    full = {**labels, **rule["labels"]}
    return {
        "exp_labels": dict(sorted(full.items())),
        "exp_annotations": {
            k: render_template(v, full, value) for k, v in rule["annotations"].items()
        },
    }


def _alert_rules(config: SloConfig) -> dict[tuple[str, str, str], dict[str, Any]]:
    found = {}
    for group in r.generate_rules(config)["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                key = (rule["alert"], rule["labels"].get("slo", ""))
                found[(*key, rule["labels"]["severity"])] = rule
    return found


# -- SLOs -------------------------------------------------------------------------


def _same_inputs(a: Slo, b: Slo) -> bool:
    if isinstance(a, LatencySlo) and isinstance(b, LatencySlo):
        return (a.source, a.figure, a.threshold) == (b.source, b.figure, b.threshold)
    return type(a) is type(b) and a.source == b.source


def _slo_series(
    slo: Slo, target: str, rate: float, step: int, phases: list[tuple[float, int]]
) -> dict[str, str]:
    """``rate`` requests/s on ``target``, at a constant error ratio per phase."""
    n = rate * step
    base = _CLIENT if slo.source == "client" else _ENGINE
    labels = {**base, "target": target}
    requests = REQUESTS[slo.source].name
    ok = {"outcome": "ok"} if slo.source == "client" else {"reason": "stop"}
    if isinstance(slo, LatencySlo):
        name = slo.histogram.series.name
        edge = slo.threshold
        le = f"{int(edge)}.0" if edge == int(edge) else repr(edge)
        return {
            _sel(f"{name}_count", labels): _counter((n, k) for _, k in phases),
            _sel(f"{name}_bucket", {**labels, "le": le}): _counter(
                (n * (1 - ratio), k) for ratio, k in phases
            ),
            _sel(requests, {**labels, **ok}): _counter((n, k) for _, k in phases),
        }
    bad = (
        [(requests, {"outcome": o.value}) for o in sorted(FAILED)]
        if slo.source == "client"
        else [
            (requests, {"reason": "abort"}),
            (requests, {"reason": "error"}),
            _REFUSED,
        ]
    )
    series = {
        _sel(requests, {**labels, **ok}): _counter(
            (n * (1 - ratio), k) for ratio, k in phases
        )
    }
    for name, failure in bad:
        where = labels if name == requests else _per_model(labels)
        series[_sel(name, {**where, **failure})] = _counter(
            (n * ratio / len(bad), k) for ratio, k in phases
        )
    return series


#: The engine's refused requests (vLLM's admission rejections): errors that never
#: finish, counted per model (no rank).
_REFUSED = (
    names.ENGINE_ADMISSION_REJECTIONS.name,
    {"reason": "max_num_queued_reqs"},
)


def _per_model(labels: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in labels.items() if k != "rank"}


def _refused_only(target: str, rate: float, step: int) -> dict[str, str]:
    """Every request refused at admission: no finished request at all."""
    labels = _per_model({**_ENGINE, "target": target})
    name, reason = _REFUSED
    return {_sel(name, {**labels, **reason}): _counter([(rate * step, SETTLE + 1)])}


@dataclasses.dataclass(frozen=True, slots=True)
class _Scenario:
    """One target's traffic for one SLO, and what its burn alerts do."""

    slo: Slo
    target: str
    series: dict[str, str]
    ratio: float  # the constant error ratio before ``heals_at`` (0 after it)
    rate: float
    heals_at: int | None = None  # seconds; from then on no request is bad


def _burn_expected(
    config: SloConfig, scenario: _Scenario, at: int
) -> list[dict[str, Any]]:
    """The burn alerts of every SLO reading ``scenario``'s series at time ``at``."""
    if scenario.rate <= config.min_request_rate:
        return []
    if scenario.heals_at is not None and at > scenario.heals_at:
        return []  # every short window is clean by the time it is evaluated
    alerts = _alert_rules(config)
    labels = {"target": scenario.target, "model": MODEL}
    expected = []
    for slo in config.slos:
        if not _same_inputs(scenario.slo, slo):
            continue
        burn = scenario.ratio / round(1 - slo.objective, 12)
        for severity in SEVERITIES:
            if any(burn > p.factor for p in config.pairs(severity)):
                rule = alerts[r.ALERT_BURN, slo.name, severity]
                expected.append(_expected(rule, labels, burn))
    return expected


def _between(low: float, high: float) -> float:
    """A burn rate between two factors whose one-decimal rendering is not a tie."""
    nice = round((low + high) / 2, 1) + 0.02
    return nice if low < nice < high else (low + high) / 2


#: Steps of constant traffic before the burn alerts are evaluated.
SETTLE = 10


def _traffic(config: SloConfig, step: int) -> float:
    """A request rate whose rate over every short window clears the guard at SETTLE.

    A window longer than the series so far sees its requests spread over the whole
    window (``rate`` divides by the window), so the rate is raised to match.
    """
    partial = max(config.guard_windows) / (SETTLE * step)
    return max(1.0, 10 * config.min_request_rate * max(1.0, partial))


def _scenarios(config: SloConfig, slo: Slo, step: int) -> list[_Scenario]:
    budget = 1 - slo.objective
    rate = _traffic(config, step)
    total = SETTLE + 1
    out = []

    def constant(what: str, ratio: float, traffic: float = rate) -> None:
        target = f"{slo.name}/{what}"
        series = _slo_series(slo, target, traffic, step, [(ratio, total)])
        out.append(_Scenario(slo, target, series, ratio, traffic))

    constant("all-bad", 1.0)
    factors = sorted({p.factor for s in SEVERITIES for p in config.pairs(s)})
    for low, high in itertools.pairwise(factors):
        burn = _between(low, high)
        constant(f"burn-{burn:g}x", burn * budget)
    constant(f"burn-{factors[0] / 2:g}x", factors[0] / 2 * budget)
    if config.min_request_rate > 0:
        constant("all-bad-below-min-rate", 1.0, config.min_request_rate / 2)
    target = f"{slo.name}/no-traffic"
    shape = _slo_series(slo, target, 1, step, [(0, 1)])
    out.append(_Scenario(slo, target, {k: f"100x{total}" for k in shape}, 1.0, 0.0))
    if not isinstance(slo, LatencySlo) and slo.source == "engine":
        target = f"{slo.name}/refused-only"
        series = _refused_only(target, rate, step)
        out.append(_Scenario(slo, target, series, 1.0, rate))
    if not isinstance(slo, LatencySlo) and slo.source == "client":
        target = f"{slo.name}/cancelled-only"
        series = _slo_series(slo, target, rate, step, [(0.0, total)])
        for outcome in sorted(NOT_JUDGED):
            cancelled = {**_CLIENT, "target": target, "outcome": outcome.value}
            series[_sel(REQUESTS["client"].name, cancelled)] = _counter(
                [(10 * rate * step, total)]
            )
        out.append(_Scenario(slo, target, series, 0.0, rate))
    return out


def _slo_tests(config: SloConfig, step: int) -> list[dict[str, Any]]:
    """Constant burns (one target per SLO and scenario), then burns that stop.

    A burn that stops is evaluated twice: when it ends, and once every short window
    is clean again (the long windows still hold the bad requests then).
    """
    at = SETTLE * step
    scenarios = [s for slo in config.slos for s in _scenarios(config, slo, step)]
    expected = [e for s in scenarios for e in _burn_expected(config, s, at)]
    constant = _test(
        "SLO burn alerts at constant burn rates, one target per scenario",
        step,
        {k: v for s in scenarios for k, v in s.series.items()},
        [_eval(at, r.ALERT_BURN, _sorted(expected))],
    )
    heal = math.ceil(max(config.guard_windows) / step) + 2
    rate = _traffic(config, step)
    healed = []
    for slo in config.slos:
        target = f"{slo.name}/all-bad-then-healed"
        phases = [(1.0, SETTLE), (0.0, heal + 1)]
        series = _slo_series(slo, target, rate, step, phases)
        healed.append(_Scenario(slo, target, series, 1.0, rate, at))
    evals = []
    for when in (at, at + heal * step):
        expected = [e for s in healed for e in _burn_expected(config, s, when)]
        evals.append(_eval(when, r.ALERT_BURN, _sorted(expected)))
    stopped = _test(
        "SLO burn alerts stop once the short windows are clean",
        step,
        {k: v for s in healed for k, v in s.series.items()},
        evals,
    )
    return [constant, stopped]


def _sorted(expected: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(expected, key=lambda e: sorted(e["exp_labels"].items()))


# -- saturation and health ---------------------------------------------------------


def _threshold_tests(
    config: SloConfig,
    step: int,
    alert: str,
    series_name: str,
    labels: Mapping[str, str],
    high: float,
    low: float,
    for_: int,
    severity: Severity,
) -> dict[str, Any]:
    rule = _alert_rules(config)[alert, "", severity]
    steps = math.ceil(for_ / step)
    busy, calm = {**labels, "target": "busy"}, {**labels, "target": "calm"}
    series = {
        _sel(series_name, busy): _gauge(high, steps + 3),
        _sel(series_name, calm): _gauge(low, steps + 3),
    }
    return _test(
        f"{alert}: fires past for, silent when calm",
        step,
        series,
        [
            _eval((steps - 1) * step, alert, []),
            _eval((steps + 2) * step, alert, [_expected(rule, busy, high)]),
        ],
    )


def _saturation_tests(config: SloConfig, step: int) -> list[dict[str, Any]]:
    sat = config.saturation
    tests = []
    if (w := sat.waiting_requests) is not None:
        tests.append(
            _threshold_tests(
                config,
                step,
                r.ALERT_QUEUE,
                names.ENGINE_REQUESTS_WAITING.name,
                _ENGINE,
                math.floor(w.above) + 2,
                w.above / 2,
                w.for_,
                w.severity,
            )
        )
    if (kv := sat.kv_cache_usage) is not None:
        tests.append(
            _threshold_tests(
                config,
                step,
                r.ALERT_KV_CACHE,
                names.ENGINE_KV_CACHE_USAGE.name,
                _ENGINE,
                round(kv.above * 1.02 + 0.01, 6),
                kv.above / 2,
                kv.for_,
                kv.severity,
            )
        )
    if (gpu := sat.gpu_memory) is not None:
        total = 141e9
        high = round(gpu.above * 1.02 + 0.01, 6)
        rule = _alert_rules(config)[r.ALERT_GPU_MEMORY, "", gpu.severity]
        steps = math.ceil(gpu.for_ / step)
        full, spare = _GPU, {**_GPU, "gpu": "1", "uuid": "GPU-1"}
        series = {
            _sel(names.GPU_MEMORY_TOTAL.name, full): _gauge(total, steps + 3),
            _sel(names.GPU_MEMORY_USED.name, full): _gauge(total * high, steps + 3),
            _sel(names.GPU_MEMORY_TOTAL.name, spare): _gauge(total, steps + 3),
            _sel(names.GPU_MEMORY_USED.name, spare): _gauge(total / 2, steps + 3),
        }
        value = (total * high) / total
        tests.append(
            _test(
                f"{r.ALERT_GPU_MEMORY}: fires past for, silent when calm",
                step,
                series,
                [
                    _eval((steps - 1) * step, r.ALERT_GPU_MEMORY, []),
                    _eval(
                        (steps + 2) * step,
                        r.ALERT_GPU_MEMORY,
                        [_expected(rule, full, value)],
                    ),
                ],
            )
        )
    if (pre := sat.preemptions) is not None:
        rule = _alert_rules(config)[r.ALERT_PREEMPTIONS, "", pre.severity]
        steps = math.ceil((pre.for_ + pre.window) / step)
        busy, calm = {**_ENGINE, "target": "busy"}, {**_ENGINE, "target": "calm"}
        name = names.ENGINE_PREEMPTIONS.name
        series = {
            _sel(name, busy): _counter([(float(step), steps + 3)]),
            _sel(name, calm): _gauge(7, steps + 3),
        }
        pending = math.ceil(pre.for_ / step)
        tests.append(
            _test(
                f"{r.ALERT_PREEMPTIONS}: fires past for, silent when flat",
                step,
                series,
                [
                    _eval(pending * step, r.ALERT_PREEMPTIONS, []),
                    _eval(
                        (steps + 2) * step,
                        r.ALERT_PREEMPTIONS,
                        [_expected(rule, busy, 1.0)],
                    ),
                ],
            )
        )
    return tests


def _health_tests(config: SloConfig, step: int) -> list[dict[str, Any]]:
    health = config.health
    alerts = _alert_rules(config)
    up = names.TARGET_UP.name
    tests = []
    if (down := health.target_down) is not None:
        rule = alerts[r.ALERT_TARGET_DOWN, "", down.severity]
        steps = math.ceil(down.for_ / step)
        series = {
            _sel(up, {"target": "down"}): _gauge(0, steps + 3),
            _sel(up, {"target": "fine"}): _gauge(1, steps + 3),
        }
        tests.append(
            _test(
                f"{r.ALERT_TARGET_DOWN}: fires past for, silent when up",
                step,
                series,
                [
                    _eval((steps - 1) * step, r.ALERT_TARGET_DOWN, []),
                    _eval(
                        (steps + 2) * step,
                        r.ALERT_TARGET_DOWN,
                        [_expected(rule, {"target": "down"}, 0)],
                    ),
                ],
            )
        )
    if (absent := health.exporter_absent) is not None:
        rule = alerts[r.ALERT_EXPORTER_ABSENT, "", absent.severity]
        steps = math.ceil(absent.for_ / step)
        tests.append(
            _test(
                f"{r.ALERT_EXPORTER_ABSENT}: fires when no exporter reports",
                step,
                {_sel(names.GPU_UP.name, {}): _gauge(1, steps + 3)},
                [
                    _eval((steps - 1) * step, r.ALERT_EXPORTER_ABSENT, []),
                    _eval(
                        (steps + 2) * step,
                        r.ALERT_EXPORTER_ABSENT,
                        [_expected(rule, {}, 1)],
                    ),
                ],
            )
        )
        tests.append(
            _test(
                f"{r.ALERT_EXPORTER_ABSENT}: silent while one reports",
                step,
                {_sel(up, {"target": "fine"}): _gauge(1, steps + 3)},
                [_eval((steps + 2) * step, r.ALERT_EXPORTER_ABSENT, [])],
            )
        )
    if (engine := health.engine_metrics_absent) is not None:
        rule = alerts[r.ALERT_ENGINE_ABSENT, "", engine.severity]
        steps = math.ceil(engine.for_ / step)
        running = names.ENGINE_REQUESTS_RUNNING.name
        series = {
            _sel(up, {"target": "blind"}): _gauge(1, steps + 3),
            _sel(up, {"target": "fine"}): _gauge(1, steps + 3),
            _sel(up, {"target": "down"}): _gauge(0, steps + 3),
            _sel(running, {**_ENGINE, "target": "fine"}): _gauge(3, steps + 3),
        }
        tests.append(
            _test(
                f"{r.ALERT_ENGINE_ABSENT}: fires for a target without engine series",
                step,
                series,
                [
                    _eval((steps - 1) * step, r.ALERT_ENGINE_ABSENT, []),
                    _eval(
                        (steps + 2) * step,
                        r.ALERT_ENGINE_ABSENT,
                        [_expected(rule, {"target": "blind"}, 1)],
                    ),
                ],
            )
        )
    if (stalled := health.client_stalled) is not None:
        rule = alerts[r.ALERT_CLIENT_STALLED, "", stalled.severity]
        steps = math.ceil(stalled.for_ / step)
        rate = names.CLIENT_TARGET_RATE.name
        stuck, flowing, closed = (
            {"target": t, "model": MODEL} for t in ("stuck", "flowing", "closed")
        )
        requests = {**flowing, "stage": "0", "outcome": "ok"}
        series = {
            _sel(rate, stuck): _gauge(5, steps + 3),
            _sel(rate, flowing): _gauge(5, steps + 3),
            _sel(rate, closed): _gauge(0, steps + 3),
            _sel(names.CLIENT_REQUESTS.name, requests): _counter(
                [(5.0 * step, steps + 3)]
            ),
        }
        tests.append(
            _test(
                f"{r.ALERT_CLIENT_STALLED}: fires while nothing finishes",
                step,
                series,
                [
                    _eval((steps - 1) * step, r.ALERT_CLIENT_STALLED, []),
                    _eval(
                        (steps + 2) * step,
                        r.ALERT_CLIENT_STALLED,
                        [_expected(rule, stuck, 5)],
                    ),
                ],
            )
        )
    return tests


def promtool_tests(config: SloConfig, rule_files: list[str]) -> dict[str, Any]:
    """A ``promtool test rules`` file for the rules ``config`` generates."""
    step = _step(config)
    tests = []
    if config.slos:
        tests.extend(_slo_tests(config, step))
    tests.extend(_saturation_tests(config, step))
    tests.extend(_health_tests(config, step))
    return {
        "rule_files": list(rule_files),
        "evaluation_interval": duration(step),
        "tests": tests,
    }
