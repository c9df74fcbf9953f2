"""Does ``servemon exporter`` stay flat over an hour of scrapes, restarts and flaps?

One ``servemon exporter --no-gpu`` (pinned to CPU 1) watches ``--targets`` fake
vLLM servers of ``--ranks`` data-parallel ranks each (``_soak_targets.py``, one
process pinned to CPU 0: full vLLM expositions whose values move between answers).
This process (CPU 0) scrapes the exporter's ``/metrics`` once a second for
``--minutes``, as Prometheus 3 asks (OpenMetrics, ``X-Prometheus-Scrape-Timeout-
Seconds: 10``, a 10 s client timeout: Prometheus' default ``scrape_timeout``), and
every ``--event-every`` seconds something happens to one target, in turn:

- restart: the target's sockets close (kept-alive connections reset), it refuses
  connections for 2 s, then comes back on the same port with every counter at 0;
- shape: a new model name (every series a new ``model_name``), or one more or one
  fewer data-parallel rank (a new ``engine`` value);
- flap 503: ``/metrics`` answers 503 with an HTML page for 4 s;
- flap hang: ``/metrics`` accepts and answers nothing for 4 s (the exporter's own
  ``--scrape-timeout``, 2.5 s by default, gives up on it).

Every answer is checked: it parses with prometheus_client's OpenMetrics parser,
has ``servemon_target_up`` for every target, engine series for every target that
is up and none for one that is down (nothing stale is served); a target down
outside the window of an event done to it counts as unexpected. Per minute: the
exporter's RSS (``/proc/PID/status`` VmRSS) and CPU time (user + system,
``/proc/PID/stat``) per scrape, and the scrape latency. At the end: the RSS slope
and the CPU-per-scrape slope (least squares over the minutes after ``--settle``),
then, with no more events, an HA pair (two scrape loops at 1 s at once, for
``--ha-seconds``) and ``--bursts`` bursts of ``--burst`` concurrent scrapes, every
answer checked the same way and timed against the 10 s timeout.

    .venv/bin/python benchmarks/exporter_soak.py [--minutes 60] [--targets 8]
        [--ranks 4] [--event-every 60] [--ha-seconds 120] [--burst 100]
        [--bursts 3] [--json PATH]

``--minutes 0`` runs only the HA pair and the bursts. Exit status is non-zero when
the setup broke or any answer was wrong or late.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import statistics
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp
from _common import SERVEMON, pin_self
from exporter_scrape import (
    ACCEPT,
    SetupBroken,
    _pinned,
    _process,
    core_busy,
    cpu_seconds,
    pct,
)
from prometheus_client.openmetrics.parser import text_string_to_metric_families

SCRAPE_TIMEOUT_S = 10.0  # Prometheus' default scrape_timeout
HEADERS = {
    "Accept": ACCEPT["openmetrics"],
    "X-Prometheus-Scrape-Timeout-Seconds": str(int(SCRAPE_TIMEOUT_S)),
}
EVENTS = ("restart", "shape", "flap-503", "flap-hang")
RESTART_DOWN_S = 2.0
FLAP_S = 4.0
_TARGET = re.compile(r'target="([^"]*)"')


# --- processes ----------------------------------------------------------------


@contextlib.contextmanager
def soak_targets(targets: int, ranks: int) -> Iterator[tuple[str, list[str]]]:
    """The fake targets, pinned to CPU 0; yield (control URL, base URLs)."""
    script = Path(__file__).with_name("_soak_targets.py")
    command = [sys.executable, str(script), "--targets", str(targets)]
    command += ["--ranks", str(ranks), "--cpu", "0"]
    with _process(command, "serving ", timeout=120) as (line, _):
        control, *urls = line.split()[1:]
        yield control, urls


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


def rss_mib(pid: int) -> float:
    text = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^VmRSS:\s+(\d+) kB", text, re.M)
    return int(match.group(1)) / 1024 if match else float("nan")


# --- checking -------------------------------------------------------------------


def check(text: str, targets: int) -> tuple[set[str], list[str]]:
    """Parse the answer as Prometheus would; return (targets down, problems)."""
    problems: list[str] = []
    up: dict[str, float] = {}
    engine: set[str] = set()
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "servemon_target_up":
                    up[sample.labels.get("target", "")] = sample.value
                elif sample.name.startswith("servemon_engine_"):
                    engine.add(sample.labels.get("target", ""))
    except ValueError as exc:
        return set(), [f"does not parse: {exc}"]
    down = set()
    for i in range(targets):
        name = f"t{i}"
        if name not in up:
            problems.append(f"no servemon_target_up for {name}")
        elif up[name] == 1.0:
            if name not in engine:
                problems.append(f"{name} up but without engine series")
        else:
            down.add(name)
            if name in engine:
                problems.append(f"{name} down but with engine series (stale)")
    return down, problems


@dataclass(slots=True)
class Answer:
    at: float  # monotonic, when sent
    latency: float  # to the last byte read
    down: set[str] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)
    checked: asyncio.Future[None] | None = None  # done once down/problems are set


#: Answers are checked in another process (pinned with this one, to CPU 0), and
#: not awaited by the scrape: parsing one answer (about half a second with the
#: library's parser) never holds up reading another or the next tick. Made by
#: main() before the event loop starts.
CHECKER: list[ProcessPoolExecutor] = []


async def scrape(session: aiohttp.ClientSession, url: str, targets: int) -> Answer:
    """One scrape, timed to the last byte; its check runs on (``checked``)."""
    loop = asyncio.get_running_loop()
    start = time.monotonic()
    try:
        async with session.get(url, headers=HEADERS) as resp:
            body = await resp.read()
            status = resp.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        answer = Answer(start, time.monotonic() - start)
        answer.problems.append(f"{type(exc).__name__}: {exc}")
        answer.checked = loop.create_future()
        answer.checked.set_result(None)
        return answer
    answer = Answer(start, time.monotonic() - start)
    if answer.latency > SCRAPE_TIMEOUT_S:
        answer.problems.append(f"took {answer.latency:.1f} s")
    if status != 200:
        answer.problems.append(f"HTTP {status}")
        answer.checked = loop.create_future()
        answer.checked.set_result(None)
        return answer

    async def checking() -> None:
        down, problems = await loop.run_in_executor(
            CHECKER[0], check, body.decode(), targets
        )
        answer.down = down
        answer.problems += problems

    answer.checked = asyncio.ensure_future(checking())
    return answer


async def checked(answers: list[Answer]) -> None:
    await asyncio.gather(*(a.checked for a in answers if a.checked is not None))


# --- the soak ---------------------------------------------------------------------


@dataclass(slots=True)
class Minute:
    minute: int
    scrapes: int
    rss_mib: float
    cpu_ms_per_scrape: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    events: list[str]
    other_on_cpu1: float
    down_answers: int = 0
    unexpected_down: int = 0
    problems: int = 0


@dataclass(slots=True)
class Result:
    minutes: list[Minute] = field(default_factory=list)
    start_rss_mib: float = 0.0
    end_rss_mib: float = 0.0
    rss_slope_mib_per_hour: float = 0.0
    rss_slope_all_mib_per_hour: float = 0.0
    cpu_ms_per_scrape_start: float = 0.0
    cpu_ms_per_scrape_end: float = 0.0
    cpu_slope_ms_per_hour: float = 0.0
    scrapes: int = 0
    wrong: list[str] = field(default_factory=list)
    events: int = 0
    ha: dict[str, object] = field(default_factory=dict)
    bursts: list[dict[str, object]] = field(default_factory=list)


def slope_per_hour(xs_min: list[float], ys: list[float]) -> float:
    if len(xs_min) < 2:
        return 0.0
    return statistics.linear_regression(xs_min, ys).slope * 60


async def soak(
    urls: list[str], control: str, metrics_url: str, pid: int, args: argparse.Namespace
) -> Result:
    r = Result()
    targets = len(urls)
    timeout = aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S)
    async with (
        aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=200), timeout=timeout, trust_env=False
        ) as session,
        aiohttp.ClientSession(trust_env=False) as ctl,
    ):
        for _ in range(10):  # warm-up: every target's first plan
            await scrape(session, metrics_url, targets)
        windows: list[tuple[str, float, float]] = []
        if args.minutes > 0:
            await _soak(session, ctl, control, metrics_url, pid, args, r, windows)
        await _ha(session, metrics_url, targets, args, r)
        for _ in range(args.bursts):
            await _burst(session, metrics_url, targets, args, r)
    return r


async def finish_row(
    row: Minute,
    answers: list[Answer],
    windows: list[tuple[str, float, float]],
    r: Result,
    start: float,
) -> None:
    """A minute's row, once its answers are checked (rows finish in order: the
    checks run one at a time, in the order they were sent)."""
    await checked(answers)
    for a in answers:
        for problem in a.problems:
            r.wrong.append(f"{a.at - start:.0f}s: {problem}")
        for name in a.down:
            if not any(n == name and s <= a.at <= e for n, s, e in windows):
                row.unexpected_down += 1
    row.down_answers = sum(len(a.down) for a in answers)
    row.problems = sum(len(a.problems) for a in answers)
    r.minutes.append(row)
    print(
        f"{row.minute:>6} {row.scrapes:>7} {row.rss_mib:>7.1f} "
        f"{row.cpu_ms_per_scrape:>13.1f} {row.p50_ms:>6.1f} "
        f"{row.p99_ms:>6.1f} {row.max_ms:>6.1f} {row.down_answers:>4} "
        f"{row.unexpected_down:>10} {row.problems:>5} "
        f"{row.other_on_cpu1 * 100:>9.0f}% {'; '.join(row.events)}",
        flush=True,
    )


async def _soak(
    session: aiohttp.ClientSession,
    ctl: aiohttp.ClientSession,
    control: str,
    metrics_url: str,
    pid: int,
    args: argparse.Namespace,
    r: Result,
    windows: list[tuple[str, float, float]],
) -> None:
    targets = args.targets
    start = time.monotonic()
    end = start + args.minutes * 60
    minute_answers: list[Answer] = []
    minute_events: list[str] = []
    finishing: list[asyncio.Future[None]] = []
    cpu0, busy0, at0 = cpu_seconds(pid), core_busy(1), start
    r.start_rss_mib = rss_mib(pid)
    next_event = start + args.event_every / 2
    event = 0
    tick = 0
    minute = 0
    print(
        "minute scrapes rss_MiB cpu_ms/scrape p50_ms p99_ms max_ms down "
        "unexpected wrong other_cpu1 events",
        flush=True,
    )
    while True:
        now = time.monotonic()
        if now >= next_event and now < end - args.event_every / 2:
            kind = EVENTS[event % len(EVENTS)]
            index = event % targets
            name = f"t{index}"
            if kind == "restart":
                url, length = f"{control}/restart/{index}?down={RESTART_DOWN_S}", 2.0
            elif kind == "shape":
                url, length = f"{control}/shape/{index}", 0.0
            else:
                mode = kind.split("-")[1]
                url = f"{control}/flap/{index}?mode={mode}&seconds={FLAP_S}"
                length = FLAP_S
            async with ctl.post(url) as resp:
                detail = await resp.json()
            # A restarted target may take a scrape to come back; a flap's last
            # answer may come at the end of the exporter's own timeout.
            windows.append((name, now, now + length + 2 * 2.5 + 1.0))
            minute_events.append(f"{kind} {name} {detail.get('shape', '')}".strip())
            r.events += 1
            event += 1
            next_event += args.event_every
        answer = await scrape(session, metrics_url, targets)
        minute_answers.append(answer)
        r.scrapes += 1
        tick += 1
        wake = start + tick * args.interval
        if time.monotonic() >= start + (minute + 1) * 60 or time.monotonic() >= end:
            cpu1, busy1, at1 = cpu_seconds(pid), core_busy(1), time.monotonic()
            lat = [x.latency for x in minute_answers]
            row = Minute(
                minute=minute,
                scrapes=len(minute_answers),
                rss_mib=rss_mib(pid),
                cpu_ms_per_scrape=(cpu1 - cpu0) / max(1, len(minute_answers)) * 1000,
                p50_ms=pct(lat, 50) * 1000,
                p99_ms=pct(lat, 99) * 1000,
                max_ms=max(lat) * 1000,
                events=minute_events,
                other_on_cpu1=max(0.0, busy1 - busy0 - (cpu1 - cpu0)) / (at1 - at0),
            )
            finishing.append(
                asyncio.ensure_future(
                    finish_row(row, minute_answers, windows, r, start)
                )
            )
            minute += 1
            minute_answers, minute_events = [], []
            cpu0, busy0, at0 = cpu1, busy1, at1
        if time.monotonic() >= end:
            break
        delay = wake - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        else:  # late: take the next tick, as Prometheus does
            tick = int((time.monotonic() - start) / args.interval) + 1
            await asyncio.sleep(start + tick * args.interval - time.monotonic())
    await asyncio.gather(*finishing)
    r.end_rss_mib = r.minutes[-1].rss_mib
    settled = [m for m in r.minutes if m.minute >= args.settle] or r.minutes
    xs = [float(m.minute) for m in settled]
    r.rss_slope_mib_per_hour = slope_per_hour(xs, [m.rss_mib for m in settled])
    r.rss_slope_all_mib_per_hour = slope_per_hour(
        [float(m.minute) for m in r.minutes], [m.rss_mib for m in r.minutes]
    )
    r.cpu_slope_ms_per_hour = slope_per_hour(xs, [m.cpu_ms_per_scrape for m in settled])
    # Every minute but the last has an event (one a minute by default): the
    # medians of the first and the last five settled minutes, events and all.
    r.cpu_ms_per_scrape_start = statistics.median(
        m.cpu_ms_per_scrape for m in settled[:5]
    )
    r.cpu_ms_per_scrape_end = statistics.median(
        m.cpu_ms_per_scrape for m in settled[-5:]
    )


async def _ha(
    session: aiohttp.ClientSession,
    metrics_url: str,
    targets: int,
    args: argparse.Namespace,
    r: Result,
) -> None:
    """Two Prometheus replicas: two loops at the same interval, at once."""
    answers: list[Answer] = []

    async def loop() -> None:
        start = time.monotonic()
        for tick in range(int(args.ha_seconds / args.interval)):
            answers.append(await scrape(session, metrics_url, targets))
            delay = start + (tick + 1) * args.interval - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)

    await asyncio.gather(loop(), loop())
    await checked(answers)
    lat = [a.latency for a in answers]
    wrong = [p for a in answers for p in a.problems]
    down = sum(len(a.down) for a in answers)
    r.ha = {
        "scrapes": len(answers),
        "p50_ms": pct(lat, 50) * 1000,
        "p99_ms": pct(lat, 99) * 1000,
        "max_ms": max(lat) * 1000,
        "wrong": len(wrong),
        "targets_down": down,
    }
    r.wrong += [f"ha: {p}" for p in wrong]
    r.wrong += [f"ha: {n} targets down" for n in [down] if n]
    print(
        f"HA pair ({len(answers)} scrapes, two loops at {args.interval:g} s at once): "
        f"p50 {r.ha['p50_ms']:.1f} ms, p99 {r.ha['p99_ms']:.1f} ms, "
        f"max {r.ha['max_ms']:.1f} ms; wrong {len(wrong)}, targets down {down}",
        flush=True,
    )


async def _burst(
    session: aiohttp.ClientSession,
    metrics_url: str,
    targets: int,
    args: argparse.Namespace,
    r: Result,
) -> None:
    start = time.monotonic()
    answers = await asyncio.gather(
        *(scrape(session, metrics_url, targets) for _ in range(args.burst))
    )
    wall = max(a.at + a.latency for a in answers) - start  # to the last byte read
    await checked(list(answers))
    lat = [a.latency for a in answers]
    wrong = [p for a in answers for p in a.problems]
    down = sum(len(a.down) for a in answers)
    row: dict[str, object] = {
        "scrapes": len(answers),
        "p50_ms": pct(lat, 50) * 1000,
        "max_ms": max(lat) * 1000,
        "wall_ms": wall * 1000,
        "wrong": len(wrong),
        "targets_down": down,
    }
    r.bursts.append(row)
    r.wrong += [f"burst: {p}" for p in wrong]
    r.wrong += [f"burst: {n} targets down" for n in [down] if n]
    print(
        f"burst of {args.burst} concurrent scrapes: p50 {row['p50_ms']:.0f} ms, "
        f"max {row['max_ms']:.0f} ms (timeout {SCRAPE_TIMEOUT_S:.0f} s), the last "
        f"answered {row['wall_ms']:.0f} ms after the first was sent; "
        f"wrong {len(wrong)}, targets down {down}",
        flush=True,
    )


def report(r: Result, args: argparse.Namespace) -> None:
    if r.minutes:
        print(
            f"RSS: {r.start_rss_mib:.1f} MiB at start (after 10 warm-up scrapes), "
            f"{r.end_rss_mib:.1f} MiB at the end; slope {r.rss_slope_mib_per_hour:+.2f}"
            f" MiB/hour over minutes {args.settle}-{r.minutes[-1].minute} "
            f"({r.rss_slope_all_mib_per_hour:+.2f} over all)"
        )
        print(
            f"CPU per scrape (median of the first and last 5 minutes from minute "
            f"{args.settle}): {r.cpu_ms_per_scrape_start:.1f} ms -> "
            f"{r.cpu_ms_per_scrape_end:.1f} ms; slope "
            f"{r.cpu_slope_ms_per_hour:+.2f} ms/hour"
        )
        print(
            f"{r.scrapes} scrapes, {r.events} events, "
            f"{sum(m.unexpected_down for m in r.minutes)} unexpected target-downs; "
            f"load average {os.getloadavg()[0]:.2f}"
        )
    print(f"wrong or late answers: {len(r.wrong)}")
    for line in r.wrong[:20]:
        print(f"  {line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--targets", type=int, default=8)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--event-every", type=float, default=60)
    parser.add_argument("--settle", type=int, default=5, help="minutes left out")
    parser.add_argument("--ha-seconds", type=float, default=120)
    parser.add_argument("--burst", type=int, default=100)
    parser.add_argument("--bursts", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    pin_self(0)
    CHECKER.append(ProcessPoolExecutor(max_workers=1))
    try:
        with (
            soak_targets(args.targets, args.ranks) as (control, urls),
            exporter(urls) as (metrics_url, pid),
        ):
            result = asyncio.run(soak(urls, control, metrics_url, pid, args))
    except (SetupBroken, aiohttp.ClientError, OSError) as exc:
        print(f"exporter_soak: setup broken: {exc}", file=sys.stderr)
        sys.exit(1)
    finally:
        CHECKER[0].shutdown(cancel_futures=True)
    report(result, args)
    if args.json:
        args.json.write_text(json.dumps(asdict(result), indent=1))
    sys.exit(1 if result.wrong else 0)


if __name__ == "__main__":
    main()
