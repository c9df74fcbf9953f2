"""``servemon exporter``: the HTTP face of the engine, GPU and probe collectors.

``GET /metrics`` scrapes every target now
(:class:`~servemon.monitor.engine.EngineCollector`), adds the GPU snapshot
(:class:`~servemon.monitor.gpu.GpuCollector`), the canary probe's series
(:class:`~servemon.monitor.probe.Prober`) and the exporter's own process metrics, and
answers in the text format or OpenMetrics, as the scraper's ``Accept`` asks. The target
timeout is kept below the scraper's own (``X-Prometheus-Scrape-Timeout-Seconds``), so
every scrape is answered in time. ``GET /healthz`` answers 200 while the exporter runs.
With an auth file, ``/metrics`` wants the bearer token or basic credentials; with a web
config file (:mod:`servemon.core.wire.webconfig`) the exporter serves TLS, and every
path but ``/healthz`` wants one of the file's basic auth users.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import logging
import os
from collections.abc import Iterable
from pathlib import Path

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from servemon.core.errors import ConfigError
from servemon.core.wire.http import PoolConnector
from servemon.core.wire.limits import session_options
from servemon.core.wire.webconfig import (
    WebConfig,
    load_web_config,
    site_url,
    web_middleware,
)
from servemon.monitor.config import Auth, ExporterConfig, load_auth, parse_listen
from servemon.monitor.engine import EngineCollector, Target
from servemon.monitor.gpu import GpuCollector, GpuReader
from servemon.monitor.nvml import NvmlReader
from servemon.monitor.probe import Prober

__all__ = ["Exporter"]

log = logging.getLogger("servemon.exporter")


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


class Exporter:
    """Runs the collectors and serves them; an async context manager."""

    def __init__(
        self,
        config: ExporterConfig,
        *,
        gpu_reader: GpuReader | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.config = config
        self.host, self.port = parse_listen(config.listen)
        self.auth: Auth | None = (
            load_auth(Path(config.auth_file)) if config.auth_file else None
        )
        self.web: WebConfig | None = (
            load_web_config(Path(config.web_config_file))
            if config.web_config_file
            else None
        )
        if self.auth is not None and self.web is not None and self.web.users:
            raise ConfigError(
                f"--auth-file and basic_auth_users in --web-config-file "
                f"{config.web_config_file}: give one (a scrape carries one "
                "Authorization header)"
            )
        self.targets = [
            Target(url=t.url, name=t.label, engine=t.engine, model=t.model)
            for t in config.targets
        ]
        reader = gpu_reader if gpu_reader is not None else NvmlReader()
        self.gpu = GpuCollector(
            reader if config.gpu else None, interval_s=config.gpu_interval, log=log
        )
        self._process = ProcessCollector(registry=None)
        self._env = env if env is not None else dict(os.environ)
        self._session: aiohttp.ClientSession | None = None
        self.engine: EngineCollector | None = None
        self.prober: Prober | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> str:
        """Start collectors and bind; returns ``http://host:port``."""
        connector = PoolConnector(limit=256)
        self._session = aiohttp.ClientSession(
            connector=connector,
            trust_env=False,
            timeout=aiohttp.ClientTimeout(total=None, connect=5),
            **session_options(),
        )
        c = self.config
        self.engine = EngineCollector(
            self.targets,
            self._session,
            timeout_s=c.scrape_timeout,
            max_bytes=c.max_body_bytes,
            passthrough=c.passthrough,
        )
        self._tasks.append(asyncio.create_task(self.gpu.run(), name="gpu"))
        if c.probe_interval is not None and self.targets:
            key = self._env.get("SERVEMON_API_KEY")
            self.prober = Prober(
                self.targets,
                self._session,
                self.engine.model_of,
                interval_s=c.probe_interval,
                prompt=c.probe_prompt,
                max_tokens=c.probe_max_tokens,
                timeout_s=c.probe_timeout,
                headers={"Authorization": f"Bearer {key}"} if key else None,
            )
            self._tasks.append(asyncio.create_task(self.prober.run(), name="probe"))
        web_config = self.web
        middlewares = (
            [web_middleware(web_config, open_paths=("/healthz",))]
            if web_config is not None
            else []
        )
        app = web.Application(middlewares=middlewares)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        ssl_context = web_config.ssl_context if web_config is not None else None
        site = web.TCPSite(self._runner, self.host, self.port, ssl_context=ssl_context)
        await site.start()
        if web_config is not None:
            for note in web_config.notes:
                log.warning("%s: %s", web_config.source, note)
        self.url = site_url(self._runner.addresses[0], web_config)
        return self.url

    async def stop(self) -> None:
        """Stop serving and every task."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self.engine is not None:
            await self.engine.close()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> Exporter:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _metrics(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return web.Response(
                status=401,
                text="unauthorized\n",
                headers={
                    "WWW-Authenticate": 'Bearer realm="servemon"'
                    if self.auth and self.auth.bearer_token
                    else 'Basic realm="servemon"'
                },
            )
        assert self.engine is not None
        scrape = await self.engine.collect(_scrape_budget(request))
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self.gpu)
        registry.register(self._process)
        if self.prober is not None:
            registry.register(_Families(list(self.prober.registry.collect())))
        # The engine collector writes the answer: its own part mostly from text it
        # keeps per target, the other collectors' through prometheus_client.
        body = self.engine.encode(scrape, encoder, content_type, then=registry)
        return web.Response(body=body, headers={"Content-Type": content_type})

    def _authorized(self, request: web.Request) -> bool:
        auth = self.auth
        if auth is None:
            return True
        given = request.headers.get("Authorization", "")
        if auth.bearer_token is not None:
            expected = f"Bearer {auth.bearer_token.reveal()}"
            return hmac.compare_digest(given.encode(), expected.encode())
        password = auth.password.reveal() if auth.password is not None else ""
        pair = f"{auth.username}:{password}".encode()
        expected = "Basic " + base64.b64encode(pair).decode()
        return hmac.compare_digest(given.encode(), expected.encode())


def _scrape_budget(request: web.Request) -> float | None:
    """Most of the scraper's own timeout, leaving room to answer."""
    header = request.headers.get("X-Prometheus-Scrape-Timeout-Seconds")
    try:
        timeout = float(header) if header else None
    except ValueError:
        return None
    return None if timeout is None else max(0.1, timeout * 0.8 - 0.1)
