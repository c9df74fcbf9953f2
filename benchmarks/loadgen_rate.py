"""The highest open-loop rate servemon's load generator sustains, next to its peers.

A minimal streaming server (``_stream_server.py``: every answer at once, ``--chunks``
content chunks in vLLM's shape, each written on its own) runs pinned to CPU 0; the
client under test runs pinned to CPU 1. The clients, side by side in the same run:

- ``bare``: an open loop of this script's own (one process, uvloop where installed,
  one aiohttp session with a large connection limit and ``trust_env`` off) that
  starts each request as a task at its absolute monotonic time and reads the stream
  to ``[DONE]``, parsing every event; it sends ``vllm bench serve``'s schedule;
- ``vllm`` (``--peer vllm``): ``vllm bench serve`` 0.33, the tool a user would pick
  instead, from a virtual environment of its own made on first use
  (``_vllm_peer.py`` says how its send lag is rebuilt from its seed);
- ``servemon``: ``servemon ramp --stages R:D --arrival poisson|constant`` against the
  same server, recording everything and serving its live ``/metrics`` (scraped every
  ``--scrape-live`` seconds) as in real use; figures read back from its
  ``requests.jsonl``. ``servemon-wN`` runs it with ``--workers N`` (all on CPU 1);
  ``--variant NAME=DIR`` adds servemon from another checkout (a before/after).

Every client sends ``--prompt-tokens`` (128) prompts, Poisson arrivals by default
(``--arrival constant`` for fixed gaps); run ``r`` of every client uses seed
1000 + r. A step passes when p99 dispatch lag (actual minus scheduled send) is at
most ``--max-lag-ms`` and no request failed on the client's side (timeout, connect
or stream error; requests the client cancelled itself are counted and shown, and do
not fail a step). ``--rates`` runs the listed rates ``--repeats`` times per client,
interleaved, and a rate passes for a client when its median run passes; without it
a search per client and run finds the highest passing rate (geometric rise from
``--start``, then bisection), and the median of the runs is reported. The machine is
shared and noisy, so each step first waits for both cores to be quiet. Then the
clients run at ``--ttft-rate`` (60 rps) and their TTFT p50 are compared: the server
answers at once, so TTFT there is client and loopback overhead. Each row also shows
the CPU used by the client and the server over the step (from /proc) and the
client's CPU per request it completed, so that a server near 100 % would show it was
the limit.

    .venv/bin/python benchmarks/loadgen_rate.py [--chunks 64|8] [--duration 10]
        [--arrival poisson|constant] [--clients bare,servemon] [--peer vllm]
        [--rates 500,600] [--repeats 3] [--variant before=../old] [--rt 10]

On a shared machine, ``--rt 10`` (root) runs the server and the clients under
SCHED_FIFO so that other processes' CPU use cannot delay them (not what a user
gets: benchmarks/results/loadgen-rate.md reports the default conditions first).
Exit status is non-zero only when the setup is broken (server or client did not
start, no run record).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import _vllm_peer

HERE = Path(__file__).resolve().parent
SERVEMON = Path(sys.executable).parent / "servemon"
SERVER_CPU = 0
CLIENT_CPU = 1
CLIENT_ERRORS = ("timeout", "connect_error", "stream_error")
#: Seeds of the steps: run r of every client at every rate uses SEED + r, so that
#: the bare loop and ``vllm bench serve`` send the same schedule.
SEED = 1000
#: A step during which other work took this share of the client's core (or the
#: host stole half of it) is "disturbed": if it fails it is run again, up to
#: DISTURBED_RERUNS times, before its failure counts.
DISTURBED_SHARE = 0.10
DISTURBED_RERUNS = 2


class SetupError(RuntimeError):
    """The benchmark itself could not run (not a finding about a client)."""


class ClientKilled(SetupError):
    """The client process was killed by a signal from outside (run it again)."""


# --- the bare open loop (runs as its own process: ``--bare-worker``) ----------


async def _bare_request(
    session: Any,
    url: str,
    body: dict[str, Any],
    scheduled: float,
    out: list[dict[str, Any]],
) -> None:
    import aiohttp

    sent = time.monotonic()
    headers: float | None = None
    first: float | None = None
    outcome = "stream_error"
    error: str | None = "stream ended before data: [DONE]"
    try:
        async with session.post(url, json=body) as resp:
            headers = time.monotonic()
            if resp.status != 200:
                await resp.read()
                outcome, error = "http_error", f"HTTP {resp.status}"
            else:
                # Read to the end of the body, as vllm bench serve does: leaving
                # at [DONE] before the chunked body's last chunk arrived would
                # make aiohttp close the connection instead of reusing it.
                async for line in resp.content:
                    now = time.monotonic()
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        outcome, error = "ok", None
                        continue
                    event = json.loads(data)
                    if first is None:
                        for choice in event.get("choices") or ():
                            if (choice.get("delta") or {}).get("content"):
                                first = now
    except aiohttp.ClientConnectorError as exc:
        outcome, error = "connect_error", str(exc)
    except TimeoutError as exc:
        outcome, error = "timeout", f"{type(exc).__name__}: {exc}"
    except (aiohttp.ClientError, ConnectionError, ValueError) as exc:
        outcome, error = "stream_error", f"{type(exc).__name__}: {exc}"
    out.append(
        {
            "outcome": outcome,
            "scheduled_s": scheduled,
            "sent_s": sent,
            "headers_s": headers,
            "first_content_s": first,
            "end_s": time.monotonic(),
            "error": error,
        }
    )


def prompt_text(tokens: int) -> str:
    """A prompt of about ``tokens`` tokens (one word each)."""
    return " ".join(f"w{i % 2000}" for i in range(tokens))


async def bare_loop(
    url: str,
    rate: float,
    duration: float,
    *,
    chunks: int,
    prompt_tokens: int,
    burstiness: float,
    seed: int,
) -> list[dict[str, Any]]:
    """Open loop for ``duration`` seconds at ``vllm bench serve``'s schedule for
    this rate, burstiness and seed; one record per request."""
    import aiohttp

    connector = aiohttp.TCPConnector(limit=10_000, limit_per_host=10_000)
    timeout = aiohttp.ClientTimeout(total=None, connect=10, sock_read=30)
    body = {
        "model": "bench-stream",
        "messages": [{"role": "user", "content": prompt_text(prompt_tokens)}],
        "max_tokens": chunks,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    records: list[dict[str, Any]] = []
    tasks: set[asyncio.Task[None]] = set()
    endpoint = url + "/v1/chat/completions"
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, trust_env=False
    ) as session:
        async with session.get(url + "/v1/models") as resp:
            await resp.read()
        count = max(1, round(rate * duration))
        offsets = _vllm_peer.intended_offsets(count, rate, burstiness, seed)
        start = time.monotonic() + 0.05
        for i in range(count):
            at = start + offsets[i]
            delay = at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(
                _bare_request(session, endpoint, dict(body), at, records)
            )
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        while tasks:
            await asyncio.wait(set(tasks))
    return records


def bare_worker(options: dict[str, Any], out: Path) -> None:
    """Entry point of the bare-loop process: write its records to ``out``."""
    coro = bare_loop(**options)
    try:
        import uvloop
    except ImportError:
        records = asyncio.run(coro)
    else:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            records = runner.run(coro)
    with out.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")


# --- CPU use of a process, from /proc -----------------------------------------


class CpuWatch:
    """Samples CPU time every ``interval`` seconds: of some processes
    (/proc/PID/stat) and of each core, busy and stolen (/proc/stat)."""

    def __init__(self, interval: float = 0.1) -> None:
        self._tick = os.sysconf("SC_CLK_TCK")
        self._interval = interval
        self._pids: set[int] = set()
        self._samples: dict[str, list[tuple[float, float]]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> CpuWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def watch(self, pid: int) -> None:
        with self._lock:
            self._pids.add(pid)
            self._samples[f"pid{pid}"] = []

    def _process_seconds(self, pid: int) -> float | None:
        try:
            text = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        fields = text.rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / self._tick

    def _core_seconds(self) -> dict[str, float]:
        out: dict[str, float] = {}
        try:
            lines = Path("/proc/stat").read_text().splitlines()
        except OSError:
            return out
        for line in lines:
            name, *values = line.split()
            if not name.startswith("cpu") or name == "cpu":
                continue
            v = [int(x) for x in values[:8]]
            # user nice system idle iowait irq softirq steal
            out[f"busy{name[3:]}"] = (v[0] + v[1] + v[2] + v[5] + v[6]) / self._tick
            out[f"steal{name[3:]}"] = v[7] / self._tick
        return out

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            now = time.monotonic()
            found = {key: value for key, value in self._core_seconds().items()}
            with self._lock:
                pids = list(self._pids)
            for pid in pids:
                cpu = self._process_seconds(pid)
                if cpu is None:
                    with self._lock:
                        self._pids.discard(pid)
                else:
                    found[f"pid{pid}"] = cpu
            with self._lock:
                for key, value in found.items():
                    self._samples.setdefault(key, []).append((now, value))

    def busiest_core(self, seconds: float) -> float:
        """The highest busy share of any core over the last ``seconds``."""
        now = time.monotonic()
        shares = [self.share(f"busy{cpu}", now - seconds, now) for cpu in (0, 1)]
        return max((x for x in shares if x is not None), default=1.0)

    def wait_quiet(
        self, limit: float, seconds: float = 2.0, timeout: float = 120.0
    ) -> float:
        """Wait (up to ``timeout``) until no core was busier than ``limit`` over
        the last ``seconds``; return how long it waited (``-1``: never quiet)."""
        started = time.monotonic()
        time.sleep(seconds + 2 * self._interval)
        while self.busiest_core(seconds) > limit:
            if time.monotonic() - started > timeout:
                return -1.0
            time.sleep(0.5)
        return time.monotonic() - started - seconds - 2 * self._interval

    def share(self, key: str | int, start: float, end: float) -> float | None:
        """The fraction of one core used between two monotonic times by a process
        (its pid) or a core (``busy1``, ``steal1``)."""
        name = f"pid{key}" if isinstance(key, int) else key
        with self._lock:
            samples = list(self._samples.get(name, ()))
        inside = [s for s in samples if start <= s[0] <= end]
        if len(inside) < 2 or inside[-1][0] - inside[0][0] < 0.5:
            return None
        (t0, c0), (t1, c1) = inside[0], inside[-1]
        return (c1 - c0) / (t1 - t0)


# --- the server ---------------------------------------------------------------


@contextlib.contextmanager
def stream_server(
    chunks: int, token_sleep: float | None, prefix: tuple[str, ...] = ()
) -> Iterator[tuple[str, int]]:
    """Start ``_stream_server.py`` pinned to CPU 0; yield (base URL, pid)."""
    command = [
        sys.executable,
        str(HERE / "_stream_server.py"),
        "--port",
        "0",
        "--chunks",
        str(chunks),
        "--cpu",
        str(SERVER_CPU),
    ]
    if token_sleep is not None:
        command += ["--token-sleep", str(token_sleep)]
    proc = subprocess.Popen([*prefix, *command], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r"http://[\d.]+:\d+", line)
        if not match:
            raise SetupError(f"the stream server did not start: {line!r}")
        yield match.group(0), proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


# --- one step: one client at one rate -----------------------------------------


@dataclass
class Step:
    """What one client did at one rate."""

    client: str
    rate: float
    duration: float
    sent: int = 0
    ok: int = 0
    client_errors: int = 0
    cancelled: int = 0
    other_errors: int = 0
    held_back: int = 0
    achieved: float = 0.0
    lag_p50: float | None = None
    lag_p99: float | None = None
    lag_max: float | None = None
    ttft_p50: float | None = None
    ttft_p99: float | None = None
    headers_p50: float | None = None
    client_cpu: float | None = None
    server_cpu: float | None = None
    client_core: float | None = None
    steal: float | None = None
    error_sample: str | None = None
    max_lag_s: float = 0.005
    show_disturbed: bool = True
    notes: list[str] = field(default_factory=list)

    @property
    def cpu_per_request(self) -> float | None:
        """The client's CPU seconds per request it completed."""
        if self.client_cpu is None or not self.achieved:
            return None
        return self.client_cpu / self.achieved

    @property
    def disturbed(self) -> bool:
        """Something else used the client's core, or the host stole time."""
        other = None
        if self.client_core is not None and self.client_cpu is not None:
            other = self.client_core - self.client_cpu
        return (other is not None and other >= DISTURBED_SHARE) or (
            self.steal is not None and self.steal >= DISTURBED_SHARE / 2
        )

    @property
    def marginal(self) -> bool:
        """Failed, but by little: no errors and p99 lag within 10 times the limit."""
        return (
            self.client_errors == 0
            and self.held_back == 0
            and self.lag_p99 is not None
            and self.lag_p99 <= 10 * self.max_lag_s
        )

    @property
    def passed(self) -> bool:
        return (
            self.sent > 0
            and self.client_errors == 0
            and self.held_back == 0
            and self.lag_p99 is not None
            and self.lag_p99 <= self.max_lag_s
        )


def _pct(values: list[float], q: int) -> float | None:
    """Inclusive percentile, as servemon's summary computes it."""
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def measure(step: Step, records: list[dict[str, Any]]) -> None:
    """Fill ``step`` from per-request records (requests.jsonl fields)."""
    step.sent = len(records)
    if not records:
        return
    outcomes = [r["outcome"] for r in records]
    step.ok = outcomes.count("ok")
    step.client_errors = sum(outcomes.count(o) for o in CLIENT_ERRORS)
    step.cancelled = outcomes.count("cancelled")
    step.other_errors = step.sent - step.ok - step.client_errors - step.cancelled
    errors = [r.get("error") for r in records if r["outcome"] != "ok"]
    step.error_sample = next((e for e in errors if e), None)
    lags = [r["sent_s"] - r["scheduled_s"] for r in records]
    step.lag_p50, step.lag_p99 = _pct(lags, 50), _pct(lags, 99)
    step.lag_max = max(lags)
    ttfts = [
        r["first_content_s"] - r["sent_s"]
        for r in records
        if r["outcome"] == "ok" and r.get("first_content_s") is not None
    ]
    step.ttft_p50, step.ttft_p99 = _pct(ttfts, 50), _pct(ttfts, 99)
    step.headers_p50 = _pct(
        [
            r["headers_s"] - r["sent_s"]
            for r in records
            if r["outcome"] == "ok" and r.get("headers_s") is not None
        ],
        50,
    )
    first = min(r["scheduled_s"] for r in records)
    last = max(r["end_s"] for r in records)
    step.achieved = step.ok / (last - first) if last > first else 0.0


def _window(records: list[dict[str, Any]]) -> tuple[float, float]:
    return (
        min(r["scheduled_s"] for r in records) + 0.2,
        max(r["sent_s"] for r in records),
    )


@dataclass
class Bench:
    """The fixed parts of every step."""

    url: str
    server_pid: int
    chunks: int
    cpu: CpuWatch
    max_lag_s: float
    workdir: Path
    log: Callable[[str], None]
    quiet: float = 0.15
    scrape_s: float = 0.0
    prefix: tuple[str, ...] = ()
    prompt_tokens: int = 128
    #: 1: Poisson arrivals; inf: constant (vllm bench serve's --burstiness).
    burstiness: float = 1.0
    peer_venv: Path | None = None
    tokenizer: Path | None = None
    #: Client name -> a checkout of servemon to run instead of the installed one.
    variants: dict[str, Path] = field(default_factory=dict)

    def run(self, client: str, rate: float, duration: float, seed: int = SEED) -> Step:
        step = Step(client, rate, duration, max_lag_s=self.max_lag_s)
        step.show_disturbed = "chrt" not in self.prefix
        if self.quiet < 1:
            waited = self.cpu.wait_quiet(self.quiet)
            if waited < 0:
                step.notes.append("the machine was never quiet")
            elif waited >= 1:
                step.notes.append(f"waited {waited:.0f} s for a quiet machine")
        for attempt in (1, 2):
            out = Path(tempfile.mkdtemp(prefix=f"{client}-{rate:g}-", dir=self.workdir))
            try:
                if client == "bare":
                    records, pid = self._bare(rate, duration, out, seed)
                elif client == "vllm":
                    records, pid = self._vllm(rate, duration, out, seed, step)
                else:
                    records, pid = self._servemon(
                        rate,
                        duration,
                        out,
                        step,
                        seed,
                        workers_of(client),
                        self.variants.get(client),
                    )
                break
            except ClientKilled as exc:
                if attempt == 2:
                    raise
                self.log(f"{client} at {rate:g} rps: {exc}; running the step again")
        measure(step, records)
        if records:
            start, end = _window(records)
            step.client_cpu = self.cpu.share(pid, start, end)
            step.server_cpu = self.cpu.share(self.server_pid, start, end)
            step.client_core = self.cpu.share(f"busy{CLIENT_CPU}", start, end)
            if workers_of(client) > 1:  # the workers are the parent's children
                step.client_cpu = step.client_core
                step.notes.append("client CPU: all of core 1 (the workers')")
            steal = [self.cpu.share(f"steal{c}", start, end) for c in (0, 1)]
            step.steal = sum(x for x in steal if x is not None)
        if step.server_cpu is not None and step.server_cpu > 0.9:
            step.notes.append("server CPU > 90 %: the server may be the limit")
        self.log(row(step))
        return step

    def _spawn(
        self, command: list[str], log: Path, source: Path | None = None
    ) -> tuple[int, int]:
        env = None
        if source is not None:  # another checkout's modules win over ours
            env = {**os.environ, "PYTHONPATH": str(source)}
        with log.open("w", encoding="utf-8") as handle:
            proc = subprocess.Popen(
                [*self.prefix, "taskset", "-c", str(CLIENT_CPU), *command],
                stdout=handle,
                stderr=subprocess.STDOUT,
                env=env,
            )
            self.cpu.watch(proc.pid)
            return proc.pid, proc.wait()

    def _bare(
        self, rate: float, duration: float, out: Path, seed: int
    ) -> tuple[list[dict[str, Any]], int]:
        result = out / "requests.jsonl"
        options = {
            "url": self.url,
            "rate": rate,
            "duration": duration,
            "chunks": self.chunks,
            "prompt_tokens": self.prompt_tokens,
            "burstiness": self.burstiness,
            "seed": seed,
        }
        command = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--bare-worker",
            json.dumps(options),
            str(result),
        ]
        pid, rc = self._spawn(command, out / "log.txt")
        if rc < 0:
            raise ClientKilled(f"the bare loop was killed by signal {-rc}")
        if rc != 0 or not result.exists():
            raise SetupError(
                f"the bare loop failed (exit {rc}): "
                + (out / "log.txt").read_text()[-2000:]
            )
        return _read_jsonl(result), pid

    def _vllm(
        self, rate: float, duration: float, out: Path, seed: int, step: Step
    ) -> tuple[list[dict[str, Any]], int]:
        assert self.peer_venv is not None
        assert self.tokenizer is not None
        count = max(1, round(rate * duration))
        command = _vllm_peer.command(
            self.peer_venv,
            self.url,
            self.tokenizer,
            rate=rate,
            count=count,
            burstiness=self.burstiness,
            seed=seed,
            prompt_tokens=self.prompt_tokens,
            output_tokens=self.chunks,
            result_dir=out,
        )
        pid, rc = self._spawn(command, out / "log.txt")
        if rc < 0:
            raise ClientKilled(f"vllm bench serve was killed by signal {-rc}")
        result = out / "result.json"
        if rc != 0 or not result.exists():
            raise SetupError(
                f"vllm bench serve failed (exit {rc}): "
                + (out / "log.txt").read_text()[-2000:]
            )
        records = _vllm_peer.records(result, rate, self.burstiness, seed)
        note = _vllm_peer.rebuild_check(
            [r["sent_s"] - r["scheduled_s"] for r in records], rate
        )
        if note:
            step.notes.append(note)
        return records, pid

    def _servemon(
        self,
        rate: float,
        duration: float,
        out: Path,
        step: Step,
        seed: int,
        workers: int,
        source: Path | None = None,
    ) -> tuple[list[dict[str, Any]], int]:
        command = [
            str(SERVEMON) if source is None else sys.executable,
            *(() if source is None else ("-m", "servemon")),
            "ramp",
            "--target",
            self.url,
            "--stages",
            f"{rate:g}:{duration:g}",
            "--arrival",
            "constant" if math.isinf(self.burstiness) else "poisson",
            "--seed",
            str(seed),
            "--workers",
            str(workers),
            "--workload",
            f"random:prompt={self.prompt_tokens},output={self.chunks}",
            "--metrics-port",
            "0",
            "--out",
            str(out),
            "--max-inflight",
            "100000",
            "--timeout",
            "30",
        ]
        done = threading.Event()
        scrapes: list[int] = []
        scraper = threading.Thread(
            target=_scrape_live, args=(out, self.scrape_s, done, scrapes), daemon=True
        )
        if self.scrape_s > 0:
            scraper.start()
        try:
            pid, rc = self._spawn(command, out / "log.txt", source)
        finally:
            done.set()
            if scraper.is_alive():
                scraper.join()
        if self.scrape_s > 0:
            step.notes.append(f"live /metrics scraped {len(scrapes)} times")
        if rc < 0:
            raise ClientKilled(f"servemon ramp was killed by signal {-rc}")
        # --workers N merges its shards into a run directory of kind "merged"
        runs = sorted(
            [*out.glob("*-ramp*/summary.json"), *out.glob("*-merged*/summary.json")]
        )
        if not runs:
            raise SetupError(
                f"servemon ramp left no summary (exit {rc}): "
                + (out / "log.txt").read_text()[-2000:]
            )
        rundir = runs[-1].parent
        summary = json.loads(runs[-1].read_text())
        if summary.get("status") != "completed":
            step.notes.append(f"servemon status {summary.get('status')}")
        stage = summary["stages"][0]
        step.held_back = int(stage.get("held_back") or 0) + int(
            stage.get("skipped") or 0
        )
        records = _read_jsonl(rundir / "requests.jsonl")
        lag = (stage["summary"].get("dispatch_lag") or {}).get("p99")
        mine = _pct([r["sent_s"] - r["scheduled_s"] for r in records], 99)
        if lag is not None and mine is not None and abs(lag - mine) > 1e-6:
            step.notes.append(f"summary.json lag p99 {lag * 1000:.2f} ms")
        if rc != 0:
            step.notes.append(f"servemon exited {rc}")
        return records, pid


def workers_of(client: str) -> int:
    """``servemon`` → 1, ``servemon-w2`` → 2."""
    _, _, n = client.partition("-w")
    return int(n) if n else 1


def _scrape_live(
    out: Path, every_s: float, done: threading.Event, ok: list[int]
) -> None:
    """Scrape servemon's live ``/metrics`` (its URL from run.json) as Prometheus
    would, every ``every_s`` seconds until ``done``; append to ``ok`` per scrape."""
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    url = None
    while url is None and not done.wait(0.05):
        for run_json in [
            *out.glob("*-ramp*/run.json"),
            *out.glob(".workers-*/*/run.json"),
        ]:
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                url = json.loads(run_json.read_text())["client"]["live_metrics"]
    while url and not done.wait(every_s):
        with contextlib.suppress(OSError), opener.open(url, timeout=2) as resp:
            resp.read()
            ok.append(1)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


# --- output -------------------------------------------------------------------

HEADER = (
    f"{'client':<9} {'rate':>6} {'sent':>6} {'ok':>6} {'c.err':>5} {'achieved':>8} "
    f"{'lag p50':>7} {'lag p99':>7} {'lag max':>7} {'TTFT p50':>8} {'TTFT p99':>8} "
    f"{'client':>6} {'core1':>6} {'server':>6} {'us/req':>6}  pass"
)


def _ms(value: float | None, width: int = 7) -> str:
    return f"{'-':>{width}}" if value is None else f"{value * 1000:>{width}.2f}"


def _pc(value: float | None) -> str:
    return f"{'-':>6}" if value is None else f"{value * 100:>5.0f}%"


def _us(value: float | None) -> str:
    return f"{'-':>6}" if value is None else f"{value * 1e6:>6.0f}"


def row(s: Step) -> str:
    text = (
        f"{s.client:<9} {s.rate:>6g} {s.sent:>6} {s.ok:>6} {s.client_errors:>5} "
        f"{s.achieved:>8.1f} {_ms(s.lag_p50)} {_ms(s.lag_p99)} {_ms(s.lag_max)} "
        f"{_ms(s.ttft_p50, 8)} {_ms(s.ttft_p99, 8)} {_pc(s.client_cpu)} "
        f"{_pc(s.client_core)} {_pc(s.server_cpu)} {_us(s.cpu_per_request)}  "
        f"{'yes' if s.passed else 'no'}"
    )
    extra = list(s.notes)
    if (
        s.show_disturbed
        and s.disturbed
        and s.client_core is not None
        and s.client_cpu is not None
    ):
        other = max(0.0, s.client_core - s.client_cpu)
        extra.append(f"disturbed: {other * 100:.0f} % of core 1 used by others")
    if s.steal is not None and s.steal >= 0.02:
        extra.append(f"{s.steal * 100:.0f} % of a core stolen by the host")
    if s.cancelled:
        extra.append(f"{s.cancelled} cancelled by the client itself")
    if s.held_back:
        extra.append(f"{s.held_back} held back or skipped")
    if s.other_errors:
        extra.append(f"{s.other_errors} server errors")
    if s.error_sample:
        extra.append(f"e.g. {s.error_sample[:100]}")
    return text + ("  (" + "; ".join(extra) + ")" if extra else "")


# --- the search ---------------------------------------------------------------


@dataclass
class Found:
    """The outcome of one client's search."""

    client: str
    best: Step | None
    failed_above: float | None
    steps: list[Step]


def search(
    bench: Bench,
    client: str,
    *,
    start: float,
    factor: float,
    ceiling: float,
    bisections: int,
    tolerance: float,
    duration: float,
    retries: int,
    rerun_disturbed: bool = True,
    seed: int = SEED,
) -> Found:
    """Highest passing rate: geometric rise, then bisection (geometric midpoints)."""
    steps: list[Step] = []

    def attempt(rate: float) -> Step:
        tries, extra = 0, 0
        while True:
            step = bench.run(client, rate, duration, seed)
            steps.append(step)
            if step.passed:
                return step
            if rerun_disturbed and step.disturbed and extra < DISTURBED_RERUNS:
                extra += 1
                bench.log(f"{'':<9} {rate:>6g} failed while disturbed; again")
                continue
            tries += 1
            if tries > retries or not step.marginal:
                return step
            bench.log(f"{'':<9} {rate:>6g} failed narrowly; once more")

    best: Step | None = None
    failed: float | None = None
    rate = start
    while rate <= ceiling:
        step = attempt(rate)
        if not step.passed:
            failed = rate
            break
        best = step
        rate = round(rate * factor)
    if best is not None and failed is not None:
        for _ in range(bisections):
            if failed / best.rate <= 1 + tolerance:
                break
            mid = round(math.sqrt(best.rate * failed))
            if mid in (best.rate, failed):
                break
            step = attempt(mid)
            if step.passed:
                best = step
            else:
                failed = mid
    return Found(client, best, failed, steps)


# --- main ---------------------------------------------------------------------


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--bare-worker":
        bare_worker(json.loads(sys.argv[2]), Path(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--chunks", type=int, choices=(64, 8), default=64)
    parser.add_argument(
        "--arrival",
        choices=("poisson", "constant"),
        default="poisson",
        help="arrival process of every client [%(default)s]",
    )
    parser.add_argument(
        "--prompt-tokens", type=int, default=128, help="prompt size [%(default)s]"
    )
    parser.add_argument(
        "--peer",
        choices=("vllm",),
        action="append",
        default=[],
        help="also run this peer tool as a client (vllm: vllm bench serve, from a "
        "virtual environment made on first use)",
    )
    parser.add_argument(
        "--peer-venv", type=Path, default=None, help="the peer's virtual environment"
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="also run servemon from the checkout DIR (e.g. an older commit, from "
        "git worktree add) as the client NAME: before/after in the same run",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="runs of each search (or of each --rates step) per client; figures "
        "are their medians [%(default)s]",
    )
    parser.add_argument(
        "--duration", type=float, default=10.0, help="seconds per search step"
    )
    parser.add_argument(
        "--quick", action="store_true", help="5 s steps, fewer bisections, no retries"
    )
    parser.add_argument(
        "--clients", default="bare,servemon", help="which to run [%(default)s]"
    )
    parser.add_argument(
        "--start", type=float, default=75.0, help="first rate [%(default)s]"
    )
    parser.add_argument(
        "--factor", type=float, default=2.0, help="rate factor [%(default)s]"
    )
    parser.add_argument(
        "--ceiling", type=float, default=5000.0, help="highest rate [%(default)s]"
    )
    parser.add_argument(
        "--bisections", type=int, default=4, help="at most [%(default)s]"
    )
    parser.add_argument(
        "--retries",
        type=int,
        default=1,
        help="runs more of a narrowly failed step [%(default)s]",
    )
    parser.add_argument(
        "--max-lag-ms", type=float, default=5.0, help="pass: p99 lag [%(default)s]"
    )
    parser.add_argument(
        "--rates", help="comma-separated rates to run once each, instead of a search"
    )
    parser.add_argument("--ttft-rate", type=float, default=60.0)
    parser.add_argument(
        "--ttft-duration", type=float, default=20.0, help="seconds per TTFT run"
    )
    parser.add_argument(
        "--ttft-repeats", type=int, default=2, help="interleaved TTFT runs per client"
    )
    parser.add_argument(
        "--token-sleep",
        type=float,
        help="the server sleeps this long after each chunk (0: yields); without "
        "it, each answer is written back to back",
    )
    parser.add_argument("--keep", action="store_true", help="keep the run records")
    parser.add_argument(
        "--nice",
        type=int,
        default=0,
        help="run the server and the clients at this nice value (e.g. -10, as "
        "root: other processes on a shared machine then disturb them less)",
    )
    parser.add_argument(
        "--rt",
        type=int,
        default=0,
        metavar="PRIORITY",
        help="run the server and the clients under SCHED_FIFO at this priority "
        "(chrt -f; root): CPU hogs on a shared machine then cannot delay them",
    )
    parser.add_argument(
        "--scrape-live",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="scrape servemon's live /metrics this often during its steps "
        "(0: never; Prometheus's default is 15)",
    )
    parser.add_argument(
        "--quiet-below",
        type=float,
        help="before each step, wait (up to 2 min) until no core was busier than "
        "this share for 2 s (1: do not wait) [default: 0.15, or 1 with --rt]",
    )
    args = parser.parse_args()
    if args.quick:
        args.duration = min(args.duration, 5.0)
        args.ttft_duration = min(args.ttft_duration, 10.0)
        args.bisections = min(args.bisections, 2)
        args.retries = 0
        args.ttft_repeats = 1
    if args.quiet_below is None:
        args.quiet_below = 1.0 if args.rt else 0.15
    clients = [c.strip() for c in args.clients.split(",") if c.strip()]
    clients += [p for p in args.peer if p not in clients]
    variants: dict[str, Path] = {}
    for item in args.variant:
        name, _, where = item.partition("=")
        if not name or not where or not Path(where, "servemon").is_dir():
            parser.error(f"--variant {item}: NAME=DIR, DIR a servemon checkout")
        variants[name] = Path(where).resolve()
        clients.append(name)
    args.variants = variants
    known = {"bare", "servemon", "vllm"}
    if not clients or not all(
        c in known or c in variants or re.fullmatch(r"servemon-w\d+", c)
        for c in clients
    ):
        parser.error("--clients: bare, vllm, servemon, servemon-wN (N workers)")
    if (os.cpu_count() or 1) < 2:
        print("note: one CPU only: the server and the client share it")
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > SERVER_CPU:
        os.sched_setaffinity(0, {SERVER_CPU})  # this script mostly waits
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # clean up children
    try:
        run(args, clients)
    except SetupError as exc:
        print(f"loadgen_rate: setup failed: {exc}", file=sys.stderr)
        sys.exit(2)


def run(args: argparse.Namespace, clients: list[str]) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="loadgen-rate-"))
    prefix: tuple[str, ...] = ()
    if args.nice:
        prefix += ("nice", "-n", str(args.nice))
    if args.rt:
        prefix += ("chrt", "-f", str(args.rt))
    peer_venv: Path | None = None
    tokenizer: Path | None = None
    if "vllm" in clients:
        peer_venv = args.peer_venv or _vllm_peer.VENV
        try:
            _vllm_peer.ensure(peer_venv)
            tokenizer = _vllm_peer.make_tokenizer(workdir / "tokenizer", peer_venv)
        except (_vllm_peer.PeerError, subprocess.CalledProcessError) as exc:
            raise SetupError(f"the vllm peer: {exc}") from exc
        print(f"peer: vllm bench serve {_vllm_peer.version(peer_venv)} ({peer_venv})")
    print(
        f"loadgen_rate {date.today().isoformat()}: {args.chunks} chunks per response; "
        f"{args.prompt_tokens}-token prompts; {args.arrival} arrivals; "
        f"server on CPU {SERVER_CPU}, client on CPU {CLIENT_CPU}; "
        f"pass = p99 dispatch lag <= {args.max_lag_ms:g} ms, no client errors; "
        f"{args.duration:g} s steps; {args.repeats} runs each, medians"
        + (f"; server and clients at nice {args.nice}" if args.nice else "")
        + (f"; server and clients SCHED_FIFO {args.rt}" if args.rt else "")
    )
    print(
        "columns: rate and achieved in requests/s (achieved = ok / (last end - "
        "first scheduled)); latencies in ms; CPU in % of one core over the step: "
        "client and server processes, core1 = all busy time on the client's core"
    )
    found: dict[str, list[Found]] = {c: [] for c in clients}
    by_rate: dict[tuple[str, float], list[Step]] = {}
    with (
        CpuWatch() as cpu,
        stream_server(args.chunks, args.token_sleep, prefix) as (url, pid),
    ):
        cpu.watch(pid)
        bench = Bench(
            url,
            pid,
            args.chunks,
            cpu,
            args.max_lag_ms / 1000,
            workdir,
            print,
            quiet=args.quiet_below,
            scrape_s=args.scrape_live,
            prefix=prefix,
            prompt_tokens=args.prompt_tokens,
            burstiness=math.inf if args.arrival == "constant" else 1.0,
            peer_venv=peer_venv,
            tokenizer=tokenizer,
            variants=args.variants,
        )
        print(f"server {url} (pid {pid})\n")
        print(HEADER)
        for repeat in range(args.repeats):
            seed = SEED + repeat
            if args.rates:
                for rate in (float(r) for r in args.rates.split(",")):
                    for client in clients:
                        step = bench.run(client, rate, args.duration, seed)
                        by_rate.setdefault((client, rate), []).append(step)
                continue
            for client in clients:
                found[client].append(
                    search(
                        bench,
                        client,
                        start=args.start,
                        factor=args.factor,
                        ceiling=args.ceiling,
                        bisections=args.bisections,
                        tolerance=0.05,
                        duration=args.duration,
                        retries=args.retries,
                        rerun_disturbed=not args.rt,
                        seed=seed,
                    )
                )
        ttft: dict[str, list[Step]] = {c: [] for c in clients}
        if args.ttft_rate > 0:
            print(f"\nTTFT at {args.ttft_rate:g} requests/s ({args.ttft_duration:g} s)")
            print(HEADER)
            for repeat in range(args.ttft_repeats):
                for client in clients:
                    ttft[client].append(
                        bench.run(
                            client, args.ttft_rate, args.ttft_duration, SEED + repeat
                        )
                    )
    if args.rates:
        report_rates(args, clients, by_rate)
    else:
        report(args, found)
    report_ttft(args, ttft)
    if args.keep:
        print(f"\nrun records kept in {workdir}")
    else:
        subprocess.run(["rm", "-rf", str(workdir)], check=False)


def _median_passing(found: list[Found]) -> float | None:
    rates = [f.best.rate if f.best is not None else 0.0 for f in found]
    return statistics.median(rates) if rates else None


def _ratios(passing: dict[str, float | None]) -> None:
    mine = {c: v for c, v in passing.items() if c.startswith("servemon") and v}
    for peer in ("vllm", "bare"):
        theirs = passing.get(peer)
        if not theirs:
            continue
        for client, value in mine.items():
            print(f"{client} / {peer}: {value / theirs:.2f}x")


def report(args: argparse.Namespace, found: dict[str, list[Found]]) -> None:
    print(f"\nsummary ({args.chunks} chunks per response, {args.arrival} arrivals)")
    print(
        f"{'client':<12} {'median highest passing rps':>26}  runs (highest passing; "
        "lag p99 ms, client CPU there)"
    )
    passing: dict[str, float | None] = {}
    for client, runs in found.items():
        passing[client] = _median_passing(runs)
        each = ", ".join(
            "< start"
            if f.best is None
            else f"{f.best.rate:g} ({_ms(f.best.lag_p99, 0).strip()}, "
            f"{_pc(f.best.client_cpu).strip()})"
            for f in runs
        )
        value = passing[client]
        shown = "-" if value is None else f"{value:g}"
        print(f"{client:<12} {shown:>26}  {each}")
    _ratios(passing)


def report_rates(
    args: argparse.Namespace,
    clients: list[str],
    by_rate: dict[tuple[str, float], list[Step]],
) -> None:
    rates = sorted({rate for _, rate in by_rate})
    print(
        f"\nsummary ({args.chunks} chunks per response, {args.arrival} arrivals): "
        f"median p99 dispatch lag in ms over {args.repeats} runs; * = the median "
        "run failed (lag over the bound or client errors)"
    )
    print(f"{'offered rps':>11} " + " ".join(f"{c:>12}" for c in clients))
    passing: dict[str, float | None] = dict.fromkeys(clients, 0.0)
    for rate in rates:
        cells = []
        for client in clients:
            steps = by_rate.get((client, rate), [])
            lags = [s.lag_p99 if s.lag_p99 is not None else math.inf for s in steps]
            if not lags:
                cells.append(f"{'-':>12}")
                continue
            lag = statistics.median(lags)
            ok = sum(s.passed for s in steps) * 2 > len(steps)
            if ok and passing[client] is not None:
                passing[client] = rate
            elif not ok:
                passing[client] = passing[client] if passing[client] else None
            cells.append(f"{_ms(lag, 11)}{'' if ok else '*'}")
        print(f"{rate:>11g} " + " ".join(f"{c:>12}" for c in cells))
    print(
        "highest passing rate (median run passes at it): "
        + ", ".join(f"{c} {v or 0:g}" for c, v in passing.items())
    )
    _ratios(passing)


def report_ttft(args: argparse.Namespace, ttft: dict[str, list[Step]]) -> None:
    medians: dict[str, float] = {}
    for client, steps in ttft.items():
        values = [s.ttft_p50 for s in steps if s.ttft_p50 is not None]
        heads = [s.headers_p50 for s in steps if s.headers_p50 is not None]
        if values:
            medians[client] = statistics.median(values)
            each = ", ".join(f"{v * 1000:.2f}" for v in values)
            head = f"{statistics.median(heads) * 1000:.2f}" if heads else "-"
            print(
                f"TTFT p50 at {args.ttft_rate:g} rps, {client}: "
                f"{medians[client] * 1000:.2f} ms (runs: {each}; "
                f"send to headers p50 {head} ms)"
            )
    for client in medians:
        if client.startswith("servemon") and "bare" in medians:
            extra = (medians[client] - medians["bare"]) * 1000
            print(f"{client} minus bare: {extra:+.2f} ms")


if __name__ == "__main__":
    main()
