"""A real Prometheus (Debian's ``prometheus``) scrapes ``servemon exporter`` run as a
user runs it, in front of a simulator; ``promtool`` lints what the exporter serves.

Every process is started on a free loopback port, waited for by polling with a
deadline, and stopped at the end (terminate, wait, kill).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.alerting import prometheus_argv

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        PROMETHEUS is None or PROMTOOL is None,
        reason="needs Debian's prometheus and promtool",
    ),
]

READY = re.compile(rb"servemon exporter: serving (http://127\.0\.0\.1:\d+)/metrics")


def free_port() -> int:
    """A port nothing listens on now (bound to port 0, then closed)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def stop(proc: asyncio.subprocess.Process) -> None:
    """Terminate, wait a little, then kill."""
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    try:
        await asyncio.wait_for(proc.wait(), timeout=10)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


@contextlib.asynccontextmanager
async def servemon_exporter(
    tmp_path: Path, *args: str
) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    """``python -m servemon exporter ARGS --listen 127.0.0.1:0``; yields its URL once
    it prints its ready line."""
    stderr = (tmp_path / "exporter.stderr").open("wb")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "servemon",
        "exporter",
        *args,
        "--listen",
        "127.0.0.1:0",
        "--no-gpu",
        stdout=asyncio.subprocess.PIPE,
        stderr=stderr,
        stdin=asyncio.subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), timeout=30)
        except TimeoutError:
            pytest.fail("servemon exporter printed no ready line in 30 s")
        match = READY.search(line)
        assert match, (line, (tmp_path / "exporter.stderr").read_text())
        yield proc, match.group(1).decode()
    finally:
        await stop(proc)
        stderr.close()


@contextlib.asynccontextmanager
async def prometheus(
    tmp_path: Path, target: str
) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    """Prometheus scraping ``target`` (host:port) every second; yields its URL."""
    assert PROMETHEUS is not None
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n"
        "  scrape_interval: 1s\n"
        "  scrape_timeout: 1s\n"
        "  evaluation_interval: 1s\n"
        "scrape_configs:\n"
        "  - job_name: servemon\n"
        "    static_configs:\n"
        f"      - targets: ['{target}']\n"
    )
    log_path = tmp_path / "prometheus.log"
    log = log_path.open("wb")
    proc = await asyncio.create_subprocess_exec(
        *prometheus_argv(PROMETHEUS, config, tmp_path, port),
        stdout=log,
        stderr=log,
        stdin=asyncio.subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        yield proc, f"http://127.0.0.1:{port}"
    finally:
        await stop(proc)
        log.close()
        if proc.returncode not in (0, -15):
            print(log_path.read_text(errors="replace")[-3000:])  # noqa: T201


async def until(
    check: Callable[[], Awaitable[Any]],
    timeout: float,  # noqa: ASYNC109 (a deadline that fails the test with a message)
    what: str,
) -> Any:
    """Poll ``check`` until it returns something truthy, or fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = await check()
        except (aiohttp.ClientError, OSError) as exc:
            last = exc
        if last and not isinstance(last, BaseException):
            return last
        await asyncio.sleep(0.1)
    pytest.fail(f"{what} not reached in {timeout} s (last: {last!r})")


async def query(http: aiohttp.ClientSession, base: str, promql: str) -> list[Any]:
    """The result vector of an instant query."""
    async with http.get(f"{base}/api/v1/query", params={"query": promql}) as resp:
        body = await resp.json()
    assert body["status"] == "success", body
    result: list[Any] = body["data"]["result"]
    return result


async def send_repeated_prompts(http: aiohttp.ClientSession, url: str) -> None:
    """The same long prompt again and again until cancelled (prefix-cache hits)."""
    prompt = " ".join(f"w{i}" for i in range(256))
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 4,
        "stream": True,
    }
    while True:
        async with http.post(f"{url}/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
            await resp.read()
        await asyncio.sleep(0.05)


def promtool_check(text: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.mark.asyncio
@pytest.mark.timeout(90)
async def test_prometheus_sees_prefix_cache_hits_through_the_exporter(
    tmp_path: Path, start_sim: Any, http: aiohttp.ClientSession
) -> None:
    async with (
        start_sim() as sim,
        servemon_exporter(tmp_path, "--target", f"sim={sim.url}") as (_, exporter),
    ):
        load = asyncio.create_task(send_repeated_prompts(http, sim.url))
        try:
            target = exporter.removeprefix("http://")
            async with prometheus(tmp_path, target) as (prom, base):

                async def hits_rate() -> list[Any]:
                    assert prom.returncode is None, "prometheus exited"
                    promql = "rate(servemon_engine_prefix_cache_hits_total[15s]) > 0"
                    return await query(http, base, promql)

                rates = await until(hits_rate, 45, "a prefix-cache hit rate")
                assert rates[0]["metric"]["target"] == "sim"
                assert rates[0]["metric"]["model"] == "sim-tiny"
                assert float(rates[0]["value"][1]) > 0

                ups = await until(
                    lambda: query(http, base, "servemon_target_up == 1"),
                    15,
                    "servemon_target_up == 1",
                )
                assert [u["metric"]["target"] for u in ups] == ["sim"]
                # Prometheus's own view of the scrape: it worked, in time.
                scrapes = await query(http, base, 'up{job="servemon"}')
                assert [s["value"][1] for s in scrapes] == ["1"]
                durations = await query(
                    http, base, 'scrape_duration_seconds{job="servemon"}'
                )
                assert float(durations[0]["value"][1]) < 1.0
        finally:
            load.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await load

        # promtool accepts what the exporter serves.
        async with http.get(f"{exporter}/metrics") as resp:
            assert resp.status == 200
            text = await resp.text()
        assert "servemon_engine_prefix_cache_hits_total" in text
        done = promtool_check(text)
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout + done.stderr == ""
