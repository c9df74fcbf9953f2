"""Prometheus and Alertmanager in end-to-end tests: their config files, a webhook
that records what Alertmanager posts, and Prometheus' HTTP API."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web

__all__ = [
    "PrometheusApi",
    "PrometheusError",
    "Webhook",
    "alertmanager_file",
    "prometheus_argv",
    "prometheus_file",
    "tsdb_path",
]


@dataclass
class Webhook:
    """Records every notification Alertmanager posts."""

    received: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""
    _runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/alerts", self._post)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}/alerts"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _post(self, request: web.Request) -> web.Response:
        self.received.append(await request.json())
        return web.Response(text="ok")

    def alerts(self) -> list[dict[str, Any]]:
        """Every alert of every notification, in order."""
        return [a for payload in self.received for a in payload.get("alerts", [])]


def alertmanager_file(path: Path, webhook: str) -> Path:
    """Every alert to ``webhook`` at once (1 s group wait and interval)."""
    config = {
        "route": {
            "receiver": "webhook",
            "group_by": ["alertname", "slo", "severity"],
            "group_wait": "1s",
            "group_interval": "1s",
            "repeat_interval": "1h",
        },
        "receivers": [
            {
                "name": "webhook",
                "webhook_configs": [{"url": webhook, "send_resolved": False}],
            }
        ],
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def prometheus_file(
    path: Path,
    *,
    rules: Sequence[Path] = (),
    jobs: Mapping[str, Sequence[str]],
    file_jobs: Mapping[str, Path] | None = None,
    alertmanager: str | None = None,
) -> Path:
    """Scrapes (``jobs``: job name -> host:port targets; ``file_jobs``: job name ->
    a file_sd JSON file, read again whenever it is replaced) and rule evaluation
    every second, alerts to ``alertmanager`` (host:port) where there is one."""
    config: dict[str, Any] = {
        "global": {
            "scrape_interval": "1s",
            "scrape_timeout": "1s",
            "evaluation_interval": "1s",
        },
        "rule_files": [str(p) for p in rules],
        "scrape_configs": [
            *(
                {"job_name": job, "static_configs": [{"targets": list(targets)}]}
                for job, targets in jobs.items()
            ),
            *(
                {"job_name": job, "file_sd_configs": [{"files": [str(sd)]}]}
                for job, sd in (file_jobs or {}).items()
            ),
        ],
    }
    if alertmanager is not None:
        config["alerting"] = {
            "alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]
        }
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


class PrometheusError(Exception):
    """Prometheus answered a query with an error."""


@dataclass(frozen=True, slots=True)
class PrometheusApi:
    """Prometheus' HTTP API at ``url``."""

    http: aiohttp.ClientSession
    url: str

    async def api(self, path: str, **params: str) -> Any:
        """``data`` of a Prometheus API answer; PrometheusError on an error."""
        async with self.http.get(f"{self.url}{path}", params=params) as resp:
            body = await resp.json()
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body}")
        return body["data"]

    async def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query's series."""
        result: list[dict[str, Any]] = (await self.api("/api/v1/query", query=promql))[
            "result"
        ]
        return result

    async def alerts(self) -> list[dict[str, Any]]:
        """The alerts pending or firing now."""
        found: list[dict[str, Any]] = (await self.api("/api/v1/alerts"))["alerts"]
        return found

    async def ready(self) -> bool:
        """``/-/ready`` answers 200 (Alertmanager has it too)."""
        async with self.http.get(f"{self.url}/-/ready") as resp:
            return resp.status == 200


def prometheus_argv(
    binary: str,
    config: Path,
    folder: Path,
    port: int,
    *,
    host: str = "127.0.0.1",
    tsdb: str = "tsdb",
) -> list[str]:
    """Prometheus as the tests run it: ``config``, a fresh TSDB (:func:`tsdb_path`
    of ``folder`` and ``tsdb``), on ``host``:``port``, warnings only."""
    return [
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={tsdb_path(folder, tsdb)}",
        f"--web.listen-address={host}:{port}",
        "--log.level=warn",
    ]


#: Where the tests' Prometheus keep their TSDB when the machine has room there: a
#: tmpfs. On the 2-core machine's virtual disk one test's Prometheus froze for 24 s
#: (no scrape, no answer) while the disk was the suspect (docs/testing.md).
MEMORY = Path("/dev/shm")
#: What a TSDB in memory may need at most, and what :data:`MEMORY` must have free.
MEMORY_FREE = 2**30
_in_memory: list[Path] = []


def tsdb_path(folder: Path, name: str = "tsdb") -> Path:
    """A fresh TSDB folder for a Prometheus of ``folder``'s test: in
    :data:`MEMORY` where that is a writable folder with room (``folder / name``
    links to it; the folder is removed when this process exits, the link left
    dangling), else ``folder / name``."""
    link = folder / name
    if not (MEMORY.is_dir() and os.access(MEMORY, os.W_OK)):
        return link
    if shutil.disk_usage(MEMORY).free < MEMORY_FREE:
        return link
    if not _in_memory:
        atexit.register(_remove_in_memory)
    made = Path(tempfile.mkdtemp(prefix="servemon-tsdb-", dir=MEMORY))
    _in_memory.append(made)
    link.symlink_to(made, target_is_directory=True)
    return made


def _remove_in_memory() -> None:
    for made in _in_memory:
        shutil.rmtree(made, ignore_errors=True)
