"""Server signals from Prometheus instead of the target's ``/metrics``
(``--prometheus URL``).

Behind a gateway no single ``/metrics`` tells the truth about a fleet, but the
Prometheus that scrapes every replica's exporter does. Every ``interval_s``,
:class:`PrometheusSampler` runs each signal's query of :mod:`servemon.core.signals`
(over the ``--select`` matchers) and its freshness query, concurrently, through
Prometheus' HTTP API (``/api/v1/query``), and appends one line to
``server_metrics.jsonl`` in the direct sampler's shape (``samples`` under
servemon's names, so the capacity search, the guard rails and the report read it
as they read a scrape) plus what only Prometheus says::

    {"mono_s": 12.3, "source": "prometheus",
     "signals": {"waiting": 7.0, "kv_cache_usage": 0.61, "ttft_p95": null, ...},
     "missing": {"ttft_p95": "no data", "gpu_utilization": "stale: 41 s old"},
     "samples": [["servemon_engine_requests_waiting", {}, 7.0], ...]}

A signal is missing, never zero, when its query returns nothing, when its newest
sample is older than ``stale_after_s`` (two scrape intervals by default), or when
its value is not a finite number. Prometheus down, slow (over ``timeout_s``) or
answering an error makes the whole line ``{"mono_s", "error"}``: the run is blind
until it answers again. Credentials (``--prometheus-auth-file``) go in the request
headers and nowhere else.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import aiohttp

from servemon.core import names
from servemon.core.signals import SignalQuery
from servemon.core.wire.limits import ResponseTooLarge, read_body
from servemon.loadgen.run.firstread import FirstRead
from servemon.monitor.config import Auth

__all__ = ["PrometheusSampler", "auth_header"]

#: Signals that go into ``samples`` too, under the servemon series they sum.
_AS_SAMPLES = {
    "waiting": names.ENGINE_REQUESTS_WAITING.name,
    "running": names.ENGINE_REQUESTS_RUNNING.name,
    "kv_cache_usage": names.ENGINE_KV_CACHE_USAGE.name,
    "preemptions": names.ENGINE_PREEMPTIONS.name,
}


def auth_header(auth: Auth | None) -> dict[str, str]:
    """The ``Authorization`` header of ``--prometheus-auth-file``'s credentials."""
    if auth is None:
        return {}
    if auth.bearer_token is not None:
        return {"Authorization": f"Bearer {auth.bearer_token.reveal()}"}
    assert auth.username is not None
    assert auth.password is not None
    pair = f"{auth.username}:{auth.password.reveal()}".encode()
    return {"Authorization": f"Basic {base64.b64encode(pair).decode()}"}


class QueryFailed(Exception):
    """Prometheus did not answer (down, slow, or failing): every signal is missing."""


class QueryRefused(Exception):
    """Prometheus answered that one query is bad (HTTP 400/422): that signal alone
    is missing."""


@dataclass(frozen=True, slots=True)
class _Answer:
    value: float | None
    missing: str | None


class PrometheusSampler:
    """Reads the signals from Prometheus every ``interval_s`` and hands each line
    to ``sink`` (the interface of
    :class:`servemon.loadgen.run.sampler.ServerSampler`)."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        url: str,
        queries: Mapping[str, SignalQuery],
        sink: Callable[[Mapping[str, object]], None],
        *,
        interval_s: float = 1.0,
        stale_after_s: float = 30.0,
        timeout_s: float = 2.0,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self._session = session
        self._url = url.rstrip("/") + "/api/v1/query"
        self._queries = dict(queries)
        self._sink = sink
        self._interval = interval_s
        self._stale = stale_after_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._headers = dict(headers or {})
        self.scrapes = 0
        self.errors = 0
        self.engine_info: dict[str, str] = {}
        #: The newest line's signals (None where missing), and when it was taken.
        self.signals: dict[str, float | None] = {}
        self.at: float | None = None
        #: When a round first had a signal (a fresh Prometheus answers with no
        #: data until it has scraped), and when each signal first had a value.
        self.first = FirstRead()
        self.first_seen: dict[str, float] = {}

    async def sample_once(self) -> dict[str, float | None] | None:
        """One round of queries; the signals, or None after an error line."""
        now = time.monotonic()
        try:
            answers = await asyncio.gather(
                *(self._signal(q) for q in self._queries.values())
            )
        except QueryFailed as exc:
            self.errors += 1
            self.first.tried(now, ok=False)
            self.signals = {}
            self._sink({"mono_s": now, "source": "prometheus", "error": str(exc)})
            return None
        signals = {n: a.value for n, a in zip(self._queries, answers, strict=True)}
        missing = {
            n: a.missing
            for n, a in zip(self._queries, answers, strict=True)
            if a.missing is not None
        }
        samples: list[list[object]] = [
            [series, {}, signals[name]]
            for name, series in _AS_SAMPLES.items()
            if signals.get(name) is not None
        ]
        self.scrapes += 1
        self.signals, self.at = signals, now
        for name, value in signals.items():
            if value is not None:
                self.first_seen.setdefault(name, now)
        self.first.tried(now, ok=bool(self.first_seen))
        self._sink(
            {
                "mono_s": now,
                "source": "prometheus",
                "signals": signals,
                "missing": missing,
                "samples": samples,
            }
        )
        return signals

    @property
    def queries(self) -> tuple[str, ...]:
        """The names of the signals it reads."""
        return tuple(self._queries)

    async def run(self) -> None:
        """Query until cancelled, on a fixed cadence (missed rounds skipped)."""
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            await self.sample_once()
            next_at = max(next_at + self._interval, loop.time())
            await asyncio.sleep(next_at - loop.time())

    async def _signal(self, query: SignalQuery) -> _Answer:
        try:
            value, age = await asyncio.gather(
                self._scalar(query.value), self._scalar(query.age)
            )
        except QueryRefused as exc:
            return _Answer(None, f"query refused: {exc}"[:200])
        if value is None:
            return _Answer(None, "no data")
        if age is not None and age > self._stale:
            return _Answer(None, f"stale: {age:.0f} s old")
        if not math.isfinite(value):
            return _Answer(None, f"not a number ({value})")
        return _Answer(value, None)

    async def _scalar(self, promql: str) -> float | None:
        """The one value of an instant query; None when it returns no series."""
        try:
            async with self._session.get(
                self._url,
                params={"query": promql},
                headers=self._headers,
                timeout=self._timeout,
            ) as resp:
                raw = await read_body(resp)
                status = resp.status
        except TimeoutError:
            raise QueryFailed(
                f"Prometheus did not answer within {self._timeout.total:g} s"
            ) from None
        except ResponseTooLarge as exc:
            raise QueryFailed(f"Prometheus: {exc}") from None
        except aiohttp.ClientError as exc:
            raise QueryFailed(f"Prometheus: {type(exc).__name__}: {exc}") from None
        try:
            body = json.loads(raw)
        except ValueError:  # a starting Prometheus' 503 is plain text
            body = None
        if not isinstance(body, dict) or body.get("status") != "success":
            why = body.get("error") if isinstance(body, dict) else None
            if why is None and body is None:
                why = " ".join(raw[:100].decode("utf-8", "replace").split())
            if status in (400, 422):
                raise QueryRefused(f"HTTP {status}: {why or 'bad query'}")
            raise QueryFailed(f"Prometheus: HTTP {status}: {why or 'not an answer'}")
        data = body.get("data")
        result = data.get("result") if isinstance(data, dict) else None
        if not isinstance(result, list) or not result:
            return None
        values = []
        for item in result:
            pair = item.get("value") if isinstance(item, dict) else None
            if isinstance(pair, list) and len(pair) == 2:
                try:
                    values.append(float(pair[1]))
                except (TypeError, ValueError):
                    continue
        return max(values) if values else None
