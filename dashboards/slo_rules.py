"""The SLO rules: recording rules for error ratios and burn rates, and burn alerts.

Named as :mod:`servemon.dashboards.rule_names` says. Per SLO, at every window it needs:

- the error ratio, the share of bad events over the window: for a latency SLO
  ``(_count - _bucket{le="<threshold>"}) / _count``, for an availability SLO the
  errors :data:`servemon.dashboards.sli.ERRORS` defines over the requests it judges (for
  the engine, admission rejections are both requests and errors). The
  client's latency histograms hold successful requests only (failures count against
  availability); an ITL SLO counts gaps between tokens, not requests;
- the burn rate, that ratio over the error budget (1 - objective). 1 spends the
  budget exactly in the period; ``burn_rate30d`` is the share of the period's budget
  spent, so 1 minus it is the budget left.

And per source, the finished requests per second at each short window: the traffic
guard.

``ServemonErrorBudgetBurn{slo, severity}`` is the SRE workbook's multi-window,
multi-burn-rate alert. Page: 1h and 5m above 14.4x, or 6h and 30m above 6x; ticket:
1d and 2h above 3x, or 3d and 6h above 1x (windows scaled and pairs replaced by
``burn_windows``). Each pair also needs the request rate over its short window above
``min_request_rate``, so a quiet service (no load test, the night) never pages on a
handful of requests, and 0/0 is never a burn. No ``for``: the short window is what
makes it fire fast and stop soon after the burn stops. The value is the burn rate of
the long window.
"""

from __future__ import annotations

from servemon.core import names
from servemon.core.promql import (
    aggregate,
    braces,
    duration,
    le_matcher,
    number,
    on,
    rate,
    selector,
)
from servemon.dashboards.alerts import VALUE_1F, alert, label
from servemon.dashboards.rule_names import (
    ALERT_BURN,
    LEVEL_LABELS,
    Rule,
    RuleGroup,
    burn_rate_name,
    error_ratio_name,
    traffic_name,
)
from servemon.dashboards.sli import ERRORS, REQUESTS, SourceName
from servemon.dashboards.slos import SEVERITIES, LatencySlo, Severity, Slo, SloConfig

__all__ = ["slo_groups"]


def _sum_rate(samples: str, window: int) -> str:
    return aggregate("sum", rate(samples, duration(window)), LEVEL_LABELS)


def _error_ratio(slo: Slo, window: int) -> str:
    if isinstance(slo, LatencySlo):
        series = slo.histogram.series
        total = _sum_rate(selector(series, part="count"), window)
        good = _sum_rate(
            selector(series, le_matcher(slo.threshold), part="bucket"), window
        )
        return f"(\n  {total}\n  -\n  {good}\n)\n/\n{total}\n"
    series, errors = REQUESTS[slo.source], ERRORS[slo.source]
    failed = _sum_rate(selector(series, errors.failed), window)
    total = _sum_rate(selector(series, *errors.judged), window)
    if errors.refused is None:
        # No error series at all (a counter's children appear with their first
        # increment) must read as 0 errors, not as no data.
        return f"(\n  {failed}\n  or\n  0 * {total}\n)\n/\n{total}\n"
    # Refused requests never finish: they are requests and errors both. Either
    # side may be missing (nothing refused yet; or everything refused, nothing
    # finished), and reads as 0 where the other has samples.
    refused = _sum_rate(selector(errors.refused), window)
    some = f"{refused} or 0 * {total}"
    finished = f"{total} or 0 * {refused}"
    return (
        f"(\n  ({failed}\n  or\n  0 * {total}\n  or\n  0 * {refused})\n"
        f"  +\n  ({some})\n)\n/\n(\n  ({finished})\n  +\n  ({some})\n)\n"
    )


def _requests(source: SourceName, window: int) -> str:
    """Requests per second of ``source`` at ``window``: finished ones, and refused
    ones where the source counts them (a service refusing everything has traffic)."""
    total = _sum_rate(selector(REQUESTS[source]), window)
    refused_series = ERRORS[source].refused
    if refused_series is None:
        return total
    refused = _sum_rate(selector(refused_series), window)
    return f"({total} or 0 * {refused})\n+\n({refused} or 0 * {total})\n"


def _traffic_group(config: SloConfig) -> RuleGroup:
    sources = sorted({slo.source for slo in config.slos})
    rules: list[Rule] = [
        {
            "record": traffic_name(source, window),
            "expr": _requests(source, window),
        }
        for source in sources
        for window in config.guard_windows
    ]
    return {"name": "servemon-slo-traffic", "rules": rules}


def _of(slo: Slo) -> str:
    return braces(f'slo="{slo.name}"')


def _slo_group(config: SloConfig, slo: Slo) -> RuleGroup:
    rules: list[Rule] = []
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
        ratio = error_ratio_name(slo, window) + _of(slo)
        rules.append(
            {
                "record": burn_rate_name(slo, window),
                "expr": f"{ratio} / {number(1 - slo.objective)}",
                "labels": tag,
            }
        )
    rules.extend(_burn_alert(config, slo, severity) for severity in SEVERITIES)
    return {"name": f"servemon-slo-{slo.name}", "rules": rules}


def _burn_alert(config: SloConfig, slo: Slo, severity: Severity) -> Rule:
    pairs = config.pairs(severity)
    tag = {"slo": slo.name}
    same = on(LEVEL_LABELS)
    minimum = number(config.min_request_rate)
    parts = []
    for pair in pairs:
        factor = number(pair.factor)
        long = f"{burn_rate_name(slo, pair.long)}{_of(slo)} > {factor}"
        short = f"{burn_rate_name(slo, pair.short)}{_of(slo)} > {factor}"
        guard = f"{traffic_name(slo.source, pair.short)} > {minimum}"
        parts.append(
            f"(\n  {long}\n  and {same}\n  {short}\n  and {same}\n  {guard}\n)"
        )
    when = " or ".join(
        f"{number(p.factor)}x over {duration(p.long)} and {duration(p.short)}"
        for p in pairs
    )
    spent = " or ".join(
        f"{100 * p.factor * p.long / config.period:.3g}%" for p in pairs
    )
    annotations = {
        "summary": f"SLO {slo.name}: error budget burning {VALUE_1F}x too fast on "
        f"{label('target')} ({label('model')})",
        "description": f"{_describe(slo)}, over {duration(config.period)}. This "
        f"{severity} fires on a burn rate above {when} (which spends {spent} of the "
        f"budget) with more than {minimum} requests/s. Runbook: {_hint(slo)}",
    }
    expr = "\nor\n".join(parts) + "\n"
    return alert(config, ALERT_BURN, expr, severity, None, tag, annotations)


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
    f"(engine), {names.TARGET_UP.name} and the server's log.",
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
    errors = ERRORS[slo.source].words
    return f"{share} of requests finish without an error ({errors})"


def _hint(slo: Slo) -> str:
    return _HINTS[slo.figure if isinstance(slo, LatencySlo) else "availability"]


def slo_groups(config: SloConfig) -> list[RuleGroup]:
    """The traffic group and one group per SLO (none without SLOs)."""
    if not config.slos:
        return []
    return [_traffic_group(config), *(_slo_group(config, slo) for slo in config.slos)]
