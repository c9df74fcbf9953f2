"""How long one scrape of ``servemon exporter`` takes over many full vLLM targets.

``--targets`` fake vLLM servers (``_vllm_exposition.py``: every family a vLLM V1
deployment shows, histograms with their real buckets, ``--ranks`` data-parallel
ranks, values that move between answers) run in one process pinned to CPU 0;
``servemon exporter --no-gpu`` runs pinned to CPU 1 (``taskset``) with one
``--target`` per server. This process (on CPU 0) first fetches the targets directly
(all at once, ``--direct`` rounds: the floor that the targets and loopback set), then
scrapes the exporter's ``/metrics`` ``--scrapes`` times in sequence after
``--warmup`` scrapes, asking as Prometheus 3 asks (OpenMetrics first, with
``X-Prometheus-Scrape-Timeout-Seconds: 10``; ``--format text`` asks for the text
format). Each scrape is timed from sending the request to the last byte read
(monotonic clock), and checked: ``servemon_target_up`` 1 for every target and the
number of ``servemon_engine_*`` samples that the name table and the targets'
families give. The exporter's CPU time (user + system, /proc/PID/stat) is read
before and after the measured scrapes.

Printed: each target's exposition (bytes, lines, samples), the direct fetch's
latency, the scrape latency p50/p90/p99/max, the exporter's CPU seconds per scrape,
the slowest target's fetch-and-parse time as the exporter reports it
(``servemon_target_scrape_duration_seconds``), the exporter's answer size, and how
busy CPU 1 was with other processes (the machine is shared). Exit status is
non-zero only when the setup broke: a process did not start, a target was down or
an answer lacked series.

    .venv/bin/python benchmarks/exporter_scrape.py [--targets 8] [--ranks 4]
        [--scrapes 200] [--warmup 10] [--direct 50] [--format openmetrics|text]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from _common import ROOT, SERVEMON, pin_self
from _vllm_exposition import FAMILIES
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from servemon.core import names

GOAL_P99_S = 0.050
ACCEPT = {
    # Prometheus 3's default scrape_protocols, in its own words.
    "openmetrics": "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;"
    "q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,text/plain;"
    "version=1.0.0;escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,"
    "*/*;q=0.1",
    "text": "text/plain;version=0.0.4;q=1,*/*;q=0.1",
}
SCRAPE_HEADERS = {"X-Prometheus-Scrape-Timeout-Seconds": "10"}
TICK = os.sysconf("SC_CLK_TCK")
_UP = re.compile(r'^servemon_target_up\{target="([^"]*)"\} (\S+)$', re.M)
_TOOK = re.compile(
    r'^servemon_target_scrape_duration_seconds\{target="[^"]*"\} (\S+)$', re.M
)


class SetupBroken(Exception):
    """A process did not start, a target was down or an answer lacked series."""


# --- processes ------------------------------------------------------------------


def _pinned(command: list[str], cpu: int) -> list[str]:
    if shutil.which("taskset") and (os.cpu_count() or 1) > cpu:
        return ["taskset", "-c", str(cpu), *command]
    return command


@contextlib.contextmanager
def _process(
    command: list[str], ready: str, timeout: float
) -> Iterator[tuple[str, int]]:
    """Start ``command``; yield (its first line containing ``ready``, pid)."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + timeout
        line = ""
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if ready in line or not line:
                break
        if ready not in line:
            raise SetupBroken(f"{Path(command[-1]).name}: did not start: {line!r}")
        yield line, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def vllm_targets(targets: int, ranks: int) -> Iterator[tuple[list[str], int]]:
    """The fake vLLM servers, pinned to CPU 0; yield (base URLs, pid)."""
    script = Path(__file__).with_name("_vllm_exposition.py")
    command = [sys.executable, str(script), "--targets", str(targets)]
    command += ["--ranks", str(ranks), "--cpu", "0"]
    with _process(command, "serving ", timeout=120) as (line, pid):
        yield line.split()[1:], pid


@contextlib.contextmanager
def exporter(urls: list[str]) -> Iterator[tuple[str, int]]:
    """``servemon exporter --no-gpu`` pinned to CPU 1; yield (/metrics URL, pid)."""
    command = [str(SERVEMON), "exporter", "--no-gpu", "--listen", "127.0.0.1:0"]
    for i, url in enumerate(urls):
        command += ["--target", f"t{i}={url}"]
    with _process(_pinned(command, 1), "serving ", timeout=60) as (line, pid):
        match = re.search(r"serving (http://\S+/metrics)", line)
        if match is None:
            raise SetupBroken(f"servemon exporter: no URL in {line!r}")
        yield match.group(1), pid


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def core_busy(cpu: int) -> float:
    """Seconds core ``cpu`` has been busy (user, nice, system, irq, softirq, steal)."""
    for line in Path("/proc/stat").read_text().splitlines():
        name, *values = line.split()
        if name == f"cpu{cpu}":
            v = [int(x) for x in values[:8]]
            return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / TICK
    return 0.0


# --- expectations -----------------------------------------------------------------


def expected_engine_samples(targets: int, ranks: int) -> int:
    """``servemon_engine_*`` samples in one scrape: from the name table and the
    families the targets expose (first vLLM source present wins, as in the table)."""
    present = {f.name + ("_total" if f.kind == "counter" else ""): f for f in FAMILIES}
    per_rank = 0
    for series in names.ENGINE_SERIES:
        source = next(
            (s for s in series.sources if s.engine == "vllm" and s.name in present),
            None,
        )
        if source is None:
            continue
        family = present[source.name]
        if series.kind == "histogram":
            per_rank += len(family.buckets) + 3  # + the +Inf bucket, _count, _sum
        else:
            per_rank += len(family.values) or 1
    return targets * (ranks * per_rank + 1)  # + servemon_engine_info per target


def check(text: str, targets: int, engine_samples: int) -> list[float]:
    """Problems raise SetupBroken; returns the targets' scrape durations."""
    up = dict(_UP.findall(text))
    down = [f"t{i}" for i in range(targets) if float(up.get(f"t{i}", "0")) != 1.0]
    if down:
        raise SetupBroken(f"servemon_target_up is not 1 for {', '.join(down)}")
    count = sum(
        1
        for line in text.split("\n")
        if line.startswith("servemon_engine_") and not line.startswith("#")
    )
    if count != engine_samples:
        raise SetupBroken(
            f"{count} servemon_engine_* samples, expected {engine_samples}"
        )
    return [float(x) for x in _TOOK.findall(text)]


# --- measuring ------------------------------------------------------------------


@dataclass(slots=True)
class Result:
    exposition: list[tuple[int, int, int]] = field(default_factory=list)
    direct: list[float] = field(default_factory=list)
    latency: list[float] = field(default_factory=list)
    slowest_target: list[float] = field(default_factory=list)
    cpu_s: float = 0.0
    wall_s: float = 0.0
    other_on_cpu1_s: float = 0.0
    answer_bytes: int = 0
    answer_lines: int = 0
    answer_samples: int = 0


async def _get(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str] | None = None
) -> bytes:
    async with session.get(url, headers=headers) as resp:
        if resp.status != 200:
            raise SetupBroken(f"{url}: HTTP {resp.status}")
        return await resp.read()


async def measure(
    urls: list[str], metrics_url: str, pid: int, args: argparse.Namespace
) -> Result:
    r = Result()
    engine_samples = expected_engine_samples(len(urls), args.ranks)
    headers = {"Accept": ACCEPT[args.format], **SCRAPE_HEADERS}
    connector = aiohttp.TCPConnector(limit=64)
    timeout = aiohttp.ClientTimeout(total=30, connect=5)
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, trust_env=False
    ) as session:
        for url in urls:
            body = (await _get(session, url + "/metrics")).decode()
            samples = sum(len(f.samples) for f in text_string_to_metric_families(body))
            r.exposition.append((len(body.encode()), body.count("\n"), samples))
        for _ in range(args.direct):
            start = time.monotonic()
            await asyncio.gather(*(_get(session, u + "/metrics") for u in urls))
            r.direct.append(time.monotonic() - start)
        for _ in range(args.warmup):
            text = (await _get(session, metrics_url, headers=headers)).decode()
            check(text, len(urls), engine_samples)
        if args.format == "openmetrics":
            families = list(openmetrics_families(text))
        else:
            families = list(text_string_to_metric_families(text))
        r.answer_bytes, r.answer_lines = len(text.encode()), text.count("\n")
        r.answer_samples = sum(len(f.samples) for f in families)
        cpu0, busy0, wall0 = cpu_seconds(pid), core_busy(1), time.monotonic()
        for _ in range(args.scrapes):
            start = time.monotonic()
            body = await _get(session, metrics_url, headers=headers)
            r.latency.append(time.monotonic() - start)
            r.slowest_target.append(
                max(check(body.decode(), len(urls), engine_samples))
            )
        r.wall_s = time.monotonic() - wall0
        r.cpu_s = cpu_seconds(pid) - cpu0
        r.other_on_cpu1_s = max(0.0, core_busy(1) - busy0 - r.cpu_s)
    return r


# --- report ---------------------------------------------------------------------


def pct(values: list[float], q: int) -> float:
    """Inclusive percentile, as servemon's summary computes it."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def report(r: Result, args: argparse.Namespace) -> None:
    sizes = sorted(r.exposition)
    b, lines, samples = sizes[len(sizes) // 2]
    print(
        f"targets: {args.targets} x vLLM, {args.ranks} ranks each; exposition per "
        f"target {b / 1024:.0f} KiB, {lines} lines, {samples} samples "
        f"(range {sizes[0][0] / 1024:.0f}-{sizes[-1][0] / 1024:.0f} KiB)"
    )
    if r.direct:
        print(
            f"direct fetch of all {args.targets} targets at once ({len(r.direct)} "
            f"rounds): p50 {ms(pct(r.direct, 50))}, p99 {ms(pct(r.direct, 99))}"
        )
    lat = r.latency
    p99 = pct(lat, 99)
    print(
        f"exporter scrape ({args.format}, {len(lat)} after {args.warmup} warm-up): "
        f"p50 {ms(pct(lat, 50))}, p90 {ms(pct(lat, 90))}, p99 {ms(p99)}, "
        f"max {ms(max(lat))}"
    )
    print(
        f"exporter CPU: {r.cpu_s / len(lat) * 1000:.1f} ms per scrape "
        f"({r.cpu_s:.2f} s over {r.wall_s:.1f} s, "
        f"{r.cpu_s / r.wall_s * 100:.0f} % of its core)"
    )
    print(
        "slowest target's fetch + parse (servemon_target_scrape_duration_seconds): "
        f"p50 {ms(pct(r.slowest_target, 50))}, p99 {ms(pct(r.slowest_target, 99))}"
    )
    print(
        f"exporter answer: {r.answer_bytes / 1024:.0f} KiB, {r.answer_lines} lines, "
        f"{r.answer_samples} samples"
    )
    print(
        f"other processes on CPU 1 (the exporter's core): "
        f"{r.other_on_cpu1_s / r.wall_s * 100:.0f} % of it; "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    verdict = "met" if p99 <= GOAL_P99_S else "NOT met"
    print(f"goal p99 <= {ms(GOAL_P99_S)}: {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, default=8)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--direct", type=int, default=50)
    parser.add_argument("--format", choices=sorted(ACCEPT), default="openmetrics")
    args = parser.parse_args()
    if args.scrapes < 1 or args.warmup < 1 or args.targets < 1:
        parser.error("--scrapes, --warmup and --targets must be at least 1")
    pin_self(0)
    try:
        with (
            vllm_targets(args.targets, args.ranks) as (urls, _),
            exporter(urls) as (metrics_url, pid),
        ):
            result = asyncio.run(measure(urls, metrics_url, pid, args))
    except (SetupBroken, aiohttp.ClientError, OSError) as exc:
        print(f"exporter_scrape: setup broken: {exc}", file=sys.stderr)
        sys.exit(1)
    report(result, args)


if __name__ == "__main__":
    main()
