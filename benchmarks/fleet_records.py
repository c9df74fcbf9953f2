"""How many records a second one coordinator core takes from its workers.

The coordinator is a real ``servemon ramp --stages RATE:SECS --fleet-listen
127.0.0.1:0 --fleet-workers K`` (its own process, as a user runs it: the seeded
schedule, the run directory, the live ``/metrics``); its target, ``servemon sim
--profile tiny``, never gets a request (only the sampler reads its ``/metrics``).
The workers are fakes written here, K WebSocket clients in one process of their
own speaking ``loadgen/fleet/wire.py``: ``hello``, a ``pong`` with their monotonic
time for every ``ping``, and every credit answered at its due time with a
synthetic ``requests.jsonl`` line (a request of 16 prompt tokens and 8 content
chunks, 2 ms to its first token and 1 ms a token), in ``rec`` batches of up to
512. A fake's line costs it a dict copy, so what is measured is the coordinator's
own work: drawing the schedule and the bodies, sending the credits, and taking
every record into the run (the file, the summaries, the live metrics).

A fake line's ``sent_s`` is the credit's due time, or the time the credit came
when it came late, so the run's dispatch lag is how late the coordinator's
credits were. Per rate: the coordinator's CPU share over the stage (from
``/proc/PID/stat``, the stage's first and last half second left out), its CPU
per record, the rest of the machine's CPU (cores busy with other work: the
machine may be shared), the records per second taken, the dispatch lag (p50, p99, max),
the least time any credit came ahead of its due time, and how long after its last
scheduled send the coordinator took to end. A rate is kept up with when the lag p99
stays under 5 ms, every credit came ahead and the coordinator's CPU stays below
95 % of one core.

    PYTHONPATH=$PWD:$PWD/benchmarks .venv/bin/python benchmarks/fleet_records.py \\
        [--rates 5000,10000,20000] [--secs 8] [--workers 8] [--profile OUT.prof]

``--profile`` runs the coordinator under cProfile (which slows it down: the
figures of such a run are not the coordinator's) and prints where its time went.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pstats
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from _common import SERVEMON, sim_process

from servemon.core.fields import Secret
from servemon.loadgen.fleet.wire import PATH, bearer, decode, encode, recs_message
from servemon.loadgen.fleet.worker import LINES_S
from servemon.loadgen.record.line import request_line
from servemon.loadgen.send.timing import Outcome, RequestTiming

TOKEN = "fleet-benchmark-token-0123456789"
COORDINATOR = re.compile(r"workers to join at (https?://\S+)")
BATCH = 512

TIMES: tuple[str, ...] = ("scheduled_s", "sent_s", "headers_s", "first_chunk_s")
TIMES += ("first_content_s", "end_s", "first_answer_s")

# --- the fake workers ----------------------------------------------------------


def template() -> dict[str, Any]:
    """A ``requests.jsonl`` line sent at 0: 16 prompt tokens, 8 chunks."""
    content = tuple(0.002 + 0.001 * i for i in range(8))
    timing = RequestTiming(
        request_id="",
        scheduled_s=0.0,
        sent_s=0.0,
        headers_s=0.001,
        first_chunk_s=content[0],
        content_s=content,
        end_s=content[-1] + 0.0005,
        outcome=Outcome.OK,
        status=200,
        prompt_tokens=16,
        output_tokens=8,
        finish_reason="length",
        done_sentinel=True,
    )
    return request_line(timing)


class FakeWorker:
    """One fake worker's connection: answers every credit at its time."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, line: dict[str, Any]):
        self.ws = ws
        self.line = line
        self.times = [k for k in TIMES if isinstance(line.get(k), float)]
        self.credits: deque[tuple[float, float, str, int, float]] = deque()
        self.index: int | None = None
        self.sent_at = 0.0
        self.wake = asyncio.Event()
        self.stopping = False
        self.least_ahead_s = float("inf")
        self.late = 0
        self.answered = 0

    async def receive(self) -> None:
        async for msg in self.ws:
            if msg.type != aiohttp.WSMsgType.BINARY:
                continue
            message = decode(msg.data)
            kind = message["k"]
            if kind == "ping":
                pong = {"k": "pong", "n": message.get("n"), "t": time.monotonic()}
                await self.ws.send_bytes(encode(pong))
            elif kind == "plan":
                self.index = message.get("index")
            elif kind == "due":
                now = time.monotonic()
                shift = float(message["d"])
                for request_id, stage, at, _body, _options in message["c"]:
                    due = float(at)
                    self.least_ahead_s = min(self.least_ahead_s, due - now)
                    self.late += due < now
                    sent = max(due, now)
                    self.credits.append((due, sent, request_id, stage, shift))
                self.wake.set()
            elif kind == "stop":
                self.stopping = True
                self.wake.set()
                return

    async def answer(self) -> None:
        while True:
            front = self.credits[0][1] if self.credits else None
            now = time.monotonic()
            if self.stopping and not self.credits:
                break
            ready = self.sent_at + LINES_S  # batched as a worker batches
            if front is None or max(front, ready) > now:
                self.wake.clear()
                wait = 0.05 if front is None else max(front, ready) - now
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), wait)
                continue
            lines = bytearray()
            count = 0
            while self.credits and self.credits[0][1] <= now and count < BATCH:
                due, sent, request_id, stage, shift = self.credits.popleft()
                line = dict(self.line)
                line["id"], line["stage"] = request_id, stage
                for key in self.times:
                    line[key] += sent + shift
                line["scheduled_s"] = due + shift
                line["dispatch_lag_s"] = sent - due
                line["worker"] = self.index
                lines += orjson.dumps(line) + b"\n"
                count += 1
            self.sent_at = now
            await self.ws.send_bytes(recs_message(count, bytes(lines)))
            self.answered += count
        await self.ws.send_bytes(
            encode({"k": "bye", "sent": self.answered, "recorded": self.answered})
        )


async def fake_workers(url: str, count: int) -> dict[str, Any]:
    line = template()
    ws_url = url.rstrip("/").replace("http", "ws", 1) + PATH
    timeout = aiohttp.ClientTimeout(total=None, connect=10)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        workers = []
        for i in range(count):
            ws = await session.ws_connect(
                ws_url, headers=bearer(Secret(TOKEN)), max_msg_size=64 * 1024 * 1024
            )
            await ws.send_bytes(
                encode(
                    {
                        "k": "hello",
                        "name": f"fake{i}",
                        "host": "localhost",
                        "pid": os.getpid(),
                        "anchor_s": time.time() - time.monotonic(),
                    }
                )
            )
            workers.append(FakeWorker(ws, line))

        async def one(w: FakeWorker) -> None:
            await asyncio.gather(w.receive(), w.answer())
            await w.ws.close()

        await asyncio.gather(*(one(w) for w in workers))
    return {
        "answered": sum(w.answered for w in workers),
        "late": sum(w.late for w in workers),
        "least_ahead_s": min(w.least_ahead_s for w in workers),
    }


# --- the coordinator and its CPU -----------------------------------------------


class CpuSamples:
    """A process's CPU seconds (``/proc/PID/stat``; None: the whole machine's busy
    seconds, ``/proc/stat``) every 0.1 s, with the time."""

    def __init__(self, pid: int | None) -> None:
        self._pid = pid
        self._path = Path(f"/proc/{pid}/stat" if pid else "/proc/stat")
        self._tick = os.sysconf("SC_CLK_TCK")
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            try:
                text = self._path.read_text()
            except OSError:
                return
            if self._pid is None:
                v = [int(x) for x in text.split("\n", 1)[0].split()[1:9]]
                # user nice system idle iowait irq softirq steal
                cpu = (v[0] + v[1] + v[2] + v[5] + v[6]) / self._tick
            else:
                fields = text.rpartition(")")[2].split()
                cpu = (int(fields[11]) + int(fields[12])) / self._tick
            self.samples.append((time.monotonic(), cpu))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def over(self, start: float, end: float) -> tuple[float, float]:
        """CPU seconds used and seconds passed between two monotonic times."""
        inside = [s for s in self.samples if start <= s[0] <= end]
        (t0, c0), (t1, c1) = inside[0], inside[-1]
        return c1 - c0, t1 - t0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def one_rate(
    args: argparse.Namespace, target: str, rate: float, out: Path
) -> dict[str, Any]:
    profile = ["-m", "cProfile", "-o", str(args.profile), "-m", "servemon"]
    command = [
        *([sys.executable, *profile] if args.profile else [str(SERVEMON)]),
        "ramp",
        "--target",
        target,
        "--stages",
        f"{rate:g}:{args.secs:g}",
        "--seed",
        "7",
        "--workload",
        args.workload,
        "--energy",
        "off",
        "--metrics-port",
        "0",
        "--max-inflight",
        "1000000",
        "--fleet-listen",
        "127.0.0.1:0",
        "--fleet-workers",
        str(args.workers),
        "--out",
        str(out),
    ]
    env = {**os.environ, "SERVEMON_FLEET_TOKEN": TOKEN}
    coordinator = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    cpu = CpuSamples(coordinator.pid)
    machine = CpuSamples(None)
    assert coordinator.stdout is not None
    url = None
    for text in coordinator.stdout:
        found = COORDINATOR.search(text)
        if found:
            url = found.group(1)
            break
    if url is None:
        raise RuntimeError("the coordinator printed no URL")
    fakes = subprocess.Popen(
        [sys.executable, __file__, "--fake", url, "--workers", str(args.workers)],
        stdout=subprocess.PIPE,
        text=True,
    )
    fake_cpu = CpuSamples(fakes.pid)
    coordinator.communicate(timeout=args.secs + 300)
    ended = time.monotonic()
    fake_out, _ = fakes.communicate(timeout=30)
    for samples in (cpu, fake_cpu, machine):
        samples.stop()
    if coordinator.returncode != 0:
        raise RuntimeError(f"the coordinator exited {coordinator.returncode}")
    fake = json.loads(fake_out.strip().splitlines()[-1])
    (run,) = (p for p in out.iterdir() if p.is_dir())
    info = json.loads((run / "run.json").read_text(encoding="utf-8"))
    origin = info["clock_origin"]["monotonic_s"]
    stage = info["stages"][0]
    start, end = origin + stage["start_s"], origin + stage["end_s"]
    used, passed = cpu.over(start + 0.5, end - 0.5)
    fake_used, fake_passed = fake_cpu.over(start + 0.5, end - 0.5)
    busy, busy_passed = machine.over(start + 0.5, end - 0.5)
    with (run / "requests.jsonl").open(encoding="utf-8") as f:
        lines = [orjson.loads(x) for x in f]
    inside = [x for x in lines if start + 0.5 <= x["end_s"] <= end - 0.5]
    lags = [x["dispatch_lag_s"] for x in lines if x["outcome"] == "ok"]
    last_due = max(x["scheduled_s"] for x in lines)
    return {
        "rate": rate,
        "records": len(lines),
        "ok": len(lags),
        "records_per_s": len(inside) / (end - start - 1.0),
        "cpu_share": used / passed,
        "cpu_us_per_record": used / len(inside) * 1e6 if inside else None,
        "fake_cpu_share": fake_used / fake_passed,
        "others": busy / busy_passed - used / passed - fake_used / fake_passed,
        "lag_p50_ms": percentile(lags, 50) * 1e3,
        "lag_p99_ms": percentile(lags, 99) * 1e3,
        "lag_max_ms": max(lags) * 1e3,
        "least_ahead_ms": fake["least_ahead_s"] * 1e3,
        "late": fake["late"],
        "tail_s": ended - last_due,
    }


def kept_up(r: dict[str, Any]) -> bool:
    return bool(
        r["lag_p99_ms"] < 5.0
        and r["late"] == 0
        and r["cpu_share"] < 0.95
        and r["ok"] == r["records"]
    )


def show(r: dict[str, Any]) -> str:
    return (
        f"{r['rate']:>7g}{r['records']:>9}{r['records_per_s']:>10.0f}"
        f"{r['cpu_share'] * 100:>7.0f}%{r['cpu_us_per_record']:>8.1f}"
        f"{r['fake_cpu_share'] * 100:>7.0f}%{r['others']:>7.2f}"
        f"{r['lag_p50_ms']:>8.2f}{r['lag_p99_ms']:>8.2f}{r['lag_max_ms']:>9.1f}"
        f"{r['least_ahead_ms']:>9.1f}{r['late']:>7}{r['tail_s']:>7.1f}"
        f"  {'yes' if kept_up(r) else 'no'}"
    )


HEADER = (
    f"{'rate':>7}{'records':>9}{'taken/s':>10}{'coord':>8}{'us/rec':>8}{'fakes':>8}{'others':>7}"
    f"{'lag p50':>8}{'p99':>8}{'max':>9}{'ahead':>9}{'late':>7}{'tail':>7}  kept up"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="2000,5000,10000,15000,20000")
    parser.add_argument("--secs", type=float, default=8.0)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--workload", default="random:prompt=16,output=8")
    parser.add_argument(
        "--profile", type=Path, help="run the coordinator under cProfile into this file"
    )
    parser.add_argument("--fake", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.fake:
        print(json.dumps(asyncio.run(fake_workers(args.fake, args.workers))))
        return
    print(
        f"coordinator: servemon ramp, {args.workers} fake workers, {args.secs:g} s "
        f"a rate, Poisson, {args.workload}"
    )
    print(
        "coord: the coordinator's CPU (share of one core); fakes: the fake "
        "workers' process; others: the rest of the machine (cores); lag and "
        "ahead in ms; tail: s from the last due send to the coordinator's exit"
    )
    print(HEADER, flush=True)
    with tempfile.TemporaryDirectory() as tmp, sim_process("--profile", "tiny") as url:
        for rate in (float(x) for x in args.rates.split(",")):
            result = one_rate(args, url, rate, Path(tmp) / f"{rate:g}")
            print(show(result), flush=True)
    if args.profile:
        stats = pstats.Stats(str(args.profile))
        stats.sort_stats("tottime").print_stats(25)
        stats.sort_stats("cumulative").print_stats(40)


if __name__ == "__main__":
    main()
