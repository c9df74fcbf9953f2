"""How many streamed requests per second the simulator sustains on one core.

The simulator (``tiny`` profile) runs pinned to CPU 0 and this client to CPU 1; the
client keeps ``--concurrency`` streamed chat requests of 16 output tokens in flight
until ``--number`` have finished. Printed: completed requests per second, output
tokens per second, the simulator's CPU use over the run (from its own
``process_cpu_seconds_total``), and the client's latency percentiles.

    .venv/bin/python benchmarks/sim_throughput.py [--number 6000] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import aiohttp
from _common import pin_self, sim_process
from prometheus_client.parser import text_string_to_metric_families

from servemon.loadgen.record.summary import summarize
from servemon.loadgen.send.client import ClientSettings, make_session
from servemon.loadgen.send.closedloop import run_closed_loop
from servemon.loadgen.workloads.workload import chat_body


async def cpu_seconds(session: aiohttp.ClientSession, url: str) -> float:
    async with session.get(url + "/metrics") as resp:
        text = await resp.text()
    for family in text_string_to_metric_families(text):
        if family.name == "process_cpu_seconds":
            return float(family.samples[0].value)
    raise RuntimeError("no process_cpu_seconds_total in /metrics")


async def run(url: str, number: int, concurrency: int, tokens: int) -> None:
    prompt = " ".join(["word"] * 16)
    async with make_session(ClientSettings()) as session:
        cpu0, wall0 = await cpu_seconds(session, url), time.monotonic()
        timings = await run_closed_loop(
            session,
            url + "/v1/chat/completions",
            lambda i: chat_body("sim-tiny", prompt, tokens, ignore_eos=True),
            concurrency=concurrency,
            number=number,
            warmup=concurrency,
            id_prefix="t",
        )
        cpu1, wall1 = await cpu_seconds(session, url), time.monotonic()
    s = summarize(timings)
    ttft, e2e = s.figure("ttft"), s.figure("e2e")
    if ttft is None or e2e is None:
        raise SystemExit(f"no successful requests: {s.outcomes}")
    print(f"requests: {s.requests} ({s.outcomes}), concurrency {concurrency}")
    print(
        f"completed: {s.request_throughput:.0f} req/s, {s.output_throughput:.0f} tok/s"
    )
    print(f"simulator CPU: {(cpu1 - cpu0) / (wall1 - wall0) * 100:.0f} % of one core")
    print(
        f"client TTFT p50 {ttft.p50 * 1000:.1f} ms, p99 {ttft.p99 * 1000:.1f} ms; "
        f"E2E p50 {e2e.p50 * 1000:.1f} ms, p99 {e2e.p99 * 1000:.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=6000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=16)
    args = parser.parse_args()
    pin_self(1)
    with sim_process("--profile", "tiny", cpu=0) as url:
        asyncio.run(run(url, args.number, args.concurrency, args.tokens))


if __name__ == "__main__":
    main()
