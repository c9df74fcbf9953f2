"""The server signals a load run steers by, as PromQL over servemon's schema.

A capacity search, the guard rails and ``servemon control`` read the same few
signals: the waiting and running requests, KV-cache usage, preemptions, the
server's TTFT p95, the error rate, GPU utilization and the error-budget burn. Read
from one target's ``/metrics`` they are sums over its ranks; read from Prometheus
(``--prometheus``) they are these queries, aggregated over every series a selector
picks (a whole fleet behind a gateway). The queries are spelled by
:mod:`servemon.core.promql`, like the dashboards' and the rules', and each comes with a
freshness query: the age of the newest sample the signal rests on, so a series that
stopped being scraped is known to be stale rather than read as what it last said
(or as zero).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from servemon.core import names, promql
from servemon.core.errors import ConfigError
from servemon.core.names import Series
from servemon.core.outcomes import FAILED_MATCHER, JUDGED_MATCHER

__all__ = [
    "BURN_RATE_RECORDS",
    "SIGNALS",
    "SignalQuery",
    "freshness",
    "parse_selector",
    "queries",
]

#: The burn-rate recording rules ``servemon rules`` writes, at every window of its
#: burn pairs (``target_model:<metric>:burn_rate<W>{slo=...}``; dashboards.rule_names
#: spells them, and a test holds the two together). The signal is the highest of
#: them: the fastest burn, which the short windows show first.
BURN_RATE_RECORDS = "target_model:.+:burn_rate[0-9dhms]+"
#: A label matcher, as PromQL writes them: ``name="v"``, ``name!="v"``, ``=~``, ``!~``.
_MATCHER = re.compile(
    r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*")\s*'
)


@dataclass(frozen=True, slots=True)
class SignalQuery:
    """One signal's query and its freshness query (seconds since its newest
    sample), both over a selector's matchers."""

    name: str
    doc: str
    value: str
    age: str


def freshness(samples: str) -> str:
    """Seconds since the newest sample of ``samples`` (a signal's freshness
    query; a sampler of its own, the energy meter's, reads it too)."""
    return f"time() - {promql.aggregate('max', f'timestamp({samples})')}"


def _gauge(series: Series, agg: str, matchers: tuple[str, ...]) -> tuple[str, str]:
    samples = promql.selector(series, *matchers)
    return promql.aggregate(agg, samples), freshness(samples)


def _queries(matchers: tuple[str, ...], window: str) -> list[SignalQuery]:
    waiting = _gauge(names.ENGINE_REQUESTS_WAITING, "sum", matchers)
    running = _gauge(names.ENGINE_REQUESTS_RUNNING, "sum", matchers)
    kv = _gauge(names.ENGINE_KV_CACHE_USAGE, "max", matchers)
    preempted = _gauge(names.ENGINE_PREEMPTIONS, "sum", matchers)
    gpu = _gauge(names.GPU_UTILIZATION, "avg", matchers)
    ttft = promql.quantile(names.ENGINE_TTFT, 0.95, window, *matchers)
    ttft_count = promql.selector(names.ENGINE_TTFT, *matchers, part="count")
    requests = names.CLIENT_REQUESTS
    failed = promql.rate(promql.selector(requests, *matchers, FAILED_MATCHER), window)
    judged = promql.rate(promql.selector(requests, *matchers, JUDGED_MATCHER), window)
    burn = promql.braces(f'__name__=~"{BURN_RATE_RECORDS}"', *matchers)
    # timestamp() drops the name: the rule's windows would collide without it.
    named_burn = f'label_replace({burn}, "rule", "$1", "__name__", "(.+)")'
    return [
        SignalQuery("waiting", "requests waiting, summed", *waiting),
        SignalQuery("running", "requests running, summed", *running),
        SignalQuery("kv_cache_usage", "KV-cache usage of the fullest engine", *kv),
        SignalQuery(
            "preemptions", "preemptions so far, summed (a counter)", *preempted
        ),
        SignalQuery(
            "ttft_p95",
            f"the servers' TTFT p95 over {window}",
            ttft,
            freshness(ttft_count),
        ),
        SignalQuery(
            "error_rate",
            f"the load generators' failed share over {window}",
            # No failed series is no failure (the load generator makes an
            # outcome's series at its first request): 0, not missing.
            f"({promql.aggregate('sum', failed)} or vector(0)) / "
            f"{promql.aggregate('sum', judged)}",
            freshness(promql.selector(requests, *matchers)),
        ),
        SignalQuery("gpu_utilization", "GPU utilization, averaged", *gpu),
        SignalQuery(
            "burn_rate",
            "the highest error-budget burn of the generated SLO rules",
            promql.aggregate("max", burn),
            freshness(named_burn),
        ),
    ]


#: Every signal's name, in the order run records list them.
SIGNALS: tuple[str, ...] = tuple(q.name for q in _queries((), "1m"))


def parse_selector(text: str | None) -> tuple[str, ...]:
    """``--select 'model="qwen",target=~"pool-a.*"'`` as label matchers; a one-line
    error naming what is not a matcher."""
    if text is None or not text.strip():
        return ()
    body = text.strip()
    if body.startswith("{") and body.endswith("}"):
        body = body[1:-1]
    matchers: list[str] = []
    at = 0
    while at < len(body):
        found = _MATCHER.match(body, at)
        if found is None:
            raise ConfigError(
                f"--select: not a label matcher at {body[at:][:40]!r} "
                '(expected e.g. model="qwen",target=~"pool-a.*")'
            )
        matchers.append("".join(found.groups()))
        at = found.end()
        if at < len(body):
            if body[at] != ",":
                raise ConfigError(
                    f"--select: expected ',' between matchers at {body[at:][:40]!r}"
                )
            at += 1
    return tuple(matchers)


def queries(selector: tuple[str, ...], window_s: int) -> dict[str, SignalQuery]:
    """Each signal's queries over ``selector``, rates over ``window_s`` seconds."""
    window = promql.duration(window_s)
    return {q.name: q for q in _queries(selector, window)}
