"""Where a run reads the server: its signals (the target's ``/metrics``, or
Prometheus' queries over ``--select``), Prometheus' scrape interval, its
credentials, and what the run record says of them (with when each was first
read: a source missing at the start is tried again every round)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import aiohttp

from servemon.core.signals import SignalQuery, queries
from servemon.loadgen.record.sections import (
    PromSource,
    QueryRecord,
    ServerMetricsRecord,
    SignalsRead,
)
from servemon.loadgen.run.config import LoadConfig
from servemon.loadgen.run.progress import Progress
from servemon.loadgen.run.promsource import PrometheusSampler, auth_header
from servemon.loadgen.run.promtargets import (
    DEFAULT_S,
    ScrapeInterval,
    find_scrape_interval,
)
from servemon.loadgen.run.sampler import ServerSampler
from servemon.monitor.config import load_auth

__all__ = [
    "make_sampler",
    "prom_headers",
    "scrape_interval_of",
    "server_metrics_record",
    "signal_queries",
]


async def scrape_interval_of(
    session: aiohttp.ClientSession, config: LoadConfig, progress: Progress
) -> ScrapeInterval | None:
    """Prometheus' scrape interval behind ``--select`` (None without
    ``--prometheus``): the flag's, else asked of Prometheus, else the default,
    said once."""
    if config.prometheus is None:
        return None
    if config.scrape_interval is not None:
        return ScrapeInterval(config.scrape_interval, "flag")
    found = await find_scrape_interval(
        session, config.prometheus, config.select, prom_headers(config)
    )
    progress.console.print(found.said(), soft_wrap=True)
    return found


def make_sampler(
    c: LoadConfig,
    session: aiohttp.ClientSession,
    base: str,
    sink: Callable[[Mapping[str, object]], None],
    headers: Mapping[str, str] | None = None,
) -> ServerSampler | PrometheusSampler:
    """What reads the server's signals: the target's ``/metrics`` (the default,
    sent the run's request ``headers``), or Prometheus' queries over ``--select``
    (``--prometheus``, with Prometheus' own headers)."""
    if c.prometheus is None:
        return ServerSampler(
            session,
            base + "/metrics",
            sink,
            interval_s=c.sample_interval,
            headers=headers,
        )
    return PrometheusSampler(
        session,
        c.prometheus,
        signal_queries(c),
        sink,
        interval_s=c.sample_interval,
        stale_after_s=2 * (c.scrape_interval or DEFAULT_S),
        headers=prom_headers(c),
    )


def prom_headers(config: LoadConfig) -> dict[str, str]:
    """The header ``--prometheus-auth-file`` asks for on every Prometheus read."""
    path = config.prometheus_auth_file
    return auth_header(load_auth(Path(path)) if path else None)


def signal_queries(config: LoadConfig) -> dict[str, SignalQuery]:
    """The PromQL a ``--prometheus`` run reads its signals with."""
    return queries(config.select, round(config.signal_window))


def server_metrics_record(
    config: LoadConfig,
    sampler: ServerSampler | PrometheusSampler,
    scrape: ScrapeInterval | None,
    origin_s: float,
) -> ServerMetricsRecord:
    """``run.json``'s ``server_metrics``: the sampler's scrapes and failures, the
    engine's description, where the signals came from (Prometheus: the queries),
    when they were first read (:mod:`servemon.loadgen.run.firstread`; Prometheus: each
    signal too), and the scrape interval gone by."""
    return ServerMetricsRecord(
        scrapes=sampler.scrapes,
        errors=sampler.errors,
        engine_info=sampler.engine_info or None,
        source="target /metrics" if config.prometheus is None else "prometheus",
        prom_source=_prom_source(config),
        first_read_s=sampler.first.first_read_s(origin_s),
        tries=sampler.first.tries,
        signals=_signals_read(sampler, origin_s),
        scrape_interval=None if scrape is None else scrape.record(),
    )


def _prom_source(config: LoadConfig) -> PromSource | None:
    if config.prometheus is None:
        return None
    return PromSource(
        prometheus=config.prometheus,
        select=",".join(config.select) or None,
        stale_after_s=2 * (config.scrape_interval or DEFAULT_S),
        queries={
            name: QueryRecord(q.value, q.age)
            for name, q in signal_queries(config).items()
        },
    )


def _signals_read(
    sampler: ServerSampler | PrometheusSampler, origin_s: float
) -> SignalsRead | None:
    if not isinstance(sampler, PrometheusSampler):
        return None
    seen = sampler.first_seen
    return SignalsRead(
        {
            name: round(seen[name] - origin_s, 3) if name in seen else None
            for name in sampler.queries
        }
    )
