"""The load generator's own ``/metrics``: what the client measures, while it runs.

Series and names come from :mod:`monitor.names`. Histogram bucket edges always
include every SLO threshold given for that figure, so that burn-rate rules computed
from the buckets are exact at the threshold.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from aiohttp import web
from prometheus_client import (
    CollectorRegistry,
    Histogram,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from loadgen.slo import SloTerm
from loadgen.timing import RequestTiming
from monitor import names
from monitor.buckets import LATENCY_BUCKETS
from monitor.names import Series

__all__ = ["LiveMetrics"]


def _edges(figure: str, slo: Sequence[SloTerm]) -> list[float]:
    edges = set(LATENCY_BUCKETS[figure])
    edges.update(t.threshold for t in slo if t.figure == figure and t.threshold > 0)
    return sorted(edges)


class LiveMetrics:
    """Client series on a registry of their own, and an HTTP server for them."""

    def __init__(self, target: str, model: str, slo: Sequence[SloTerm] = ()) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._base = (target, model)
        r = self.registry

        def histogram(series: Series, figure: str) -> Histogram:
            return series.histogram(r, _edges(figure, slo))

        self.requests = names.CLIENT_REQUESTS.counter(r)
        self.ttft = histogram(names.CLIENT_TTFT, "ttft")
        self.ttfc = histogram(names.CLIENT_TTFC, "ttfc")
        self.itl = histogram(names.CLIENT_ITL, "itl")
        self.tpot = histogram(names.CLIENT_TPOT, "tpot")
        self.e2e = histogram(names.CLIENT_E2E, "e2e")
        self.lag = histogram(names.CLIENT_DISPATCH_LAG, "dispatch_lag")
        self.output_tokens = names.CLIENT_OUTPUT_TOKENS.counter(r)
        self.prompt_tokens = names.CLIENT_PROMPT_TOKENS.counter(r)
        self.held_back = names.CLIENT_HELD_BACK.counter(r)
        self.skipped = names.CLIENT_SKIPPED.counter(r)
        self.reconnects = names.CLIENT_RECONNECTS.counter(r)
        self.server_queue = histogram(names.CLIENT_SERVER_QUEUE, "server_queue")
        self.ttft_gap = histogram(names.CLIENT_TTFT_GAP, "ttft_gap")
        self.target_rate = names.CLIENT_TARGET_RATE.gauge(r).labels(*self._base)
        self.in_flight = names.CLIENT_IN_FLIGHT.gauge(r).labels(*self._base)
        self.current_stage = names.CLIENT_CURRENT_STAGE.gauge(r).labels(*self._base)
        self.current_stage.set(-1)
        self._runner: web.AppRunner | None = None
        self.url = ""

    def stage(self, index: int, rate: float) -> None:
        """A stage (or level) begins; ``rate`` 0 for closed loops."""
        self.current_stage.set(index)
        self.target_rate.set(rate)
        if index >= 0:
            # Counters that may stay at 0 still show up, so queries on them have data.
            labels = (*self._base, str(index))
            self.held_back.labels(*labels)
            self.skipped.labels(*labels, "late")
            self.reconnects.labels(*labels)

    def observe(self, timing: RequestTiming) -> None:
        """Count one finished request."""
        labels = (*self._base, str(timing.stage))
        self.requests.labels(*labels, str(timing.outcome)).inc()
        self.lag.labels(*labels).observe(max(0.0, timing.dispatch_lag))
        if timing.reconnects:
            self.reconnects.labels(*labels).inc(timing.reconnects)
        if timing.outcome != "ok":
            return
        if timing.server_queue_s is not None:
            self.server_queue.labels(*labels).observe(timing.server_queue_s)
        gap = timing.ttft_gap
        if gap is not None:
            self.ttft_gap.labels(*labels).observe(max(0.0, gap))
        self._observe_many(self.itl.labels(*labels), timing.itl)
        for hist, value in (
            (self.ttft, timing.ttft),
            (self.ttfc, timing.time_to_first_chunk),
            (self.tpot, timing.tpot),
            (self.e2e, timing.e2e),
        ):
            if value is not None:
                hist.labels(*labels).observe(value)
        self.output_tokens.labels(*labels).inc(timing.output_tokens)
        if timing.prompt_tokens:
            self.prompt_tokens.labels(*labels).inc(timing.prompt_tokens)

    @staticmethod
    def _observe_many(child: Histogram, values: Iterable[float]) -> None:
        for value in values:
            child.observe(value)

    async def serve(self, host: str, port: int) -> str:
        """Serve ``/metrics`` on ``host:port`` (0: a free port); return the URL."""
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        bound_host, bound_port = self._runner.addresses[0][:2]
        self.url = f"http://{bound_host}:{bound_port}/metrics"
        return self.url

    async def stop(self) -> None:
        """Stop serving."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(self.registry),
            headers={"Content-Type": CONTENT_TYPE_LATEST},
        )
