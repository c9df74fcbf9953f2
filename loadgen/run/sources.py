"""Where a run reads the server: its signals (the target's ``/metrics``, or
Prometheus' queries over ``--select``), Prometheus' scrape interval, its
credentials, and what the run record says of them (with when each was first
read: a source missing at the start is tried again every round)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp

from servemon.core.signals import SignalQuery, queries
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
    "read_record",
    "scrape_interval_of",
    "signal_queries",
    "source_record",
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
    sink: Callable[[Mapping[str, Any]], None],
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


def source_record(config: LoadConfig) -> dict[str, Any]:
    """Where the server's signals came from, and (Prometheus) the queries."""
    if config.prometheus is None:
        return {"source": "target /metrics"}
    return {
        "source": "prometheus",
        "prometheus": config.prometheus,
        "select": ",".join(config.select) or None,
        "stale_after_s": 2 * (config.scrape_interval or DEFAULT_S),
        "queries": {
            name: {"value": q.value, "age": q.age}
            for name, q in signal_queries(config).items()
        },
    }


def read_record(
    sampler: ServerSampler | PrometheusSampler, origin_s: float
) -> dict[str, Any]:
    """When the server's signals were first read, after how many tries
    (:mod:`servemon.loadgen.run.firstread`), and (Prometheus) when each signal first had
    a value (None: never)."""
    data = sampler.first.record(origin_s)
    if isinstance(sampler, PrometheusSampler):
        seen = sampler.first_seen
        data["signals_first_read_s"] = {
            name: round(seen[name] - origin_s, 3) if name in seen else None
            for name in sampler.queries
        }
    return data
