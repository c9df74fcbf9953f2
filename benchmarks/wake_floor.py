"""The machine's own floor under the dispatch lag: how late a bare timer wakes an
idle event loop, with nothing else in the process.

A Poisson schedule of waits on servemon's kernel timer (:class:`KernelTimer`, as
the dispatcher waits) on uvloop, pinned to CPU 1, each wake's lateness recorded;
then the same with a PM QoS request of 0 µs held (``--cpu-dma-latency 0``: idle
CPUs poll) where this machine lets ``/dev/cpu_dma_latency`` be written. Whatever
this prints, no client on this machine sends more precisely.

    .venv/bin/python benchmarks/wake_floor.py [--count 2000] [--rate 66] [--repeats 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import time

import uvloop
from _common import pin_self

from servemon.loadgen.send.cpulatency import PM_QOS_PATH, hold_cpu_latency
from servemon.loadgen.send.dispatch import KernelTimer


async def lateness(count: int, rate: float, seed: int) -> list[float]:
    timer = KernelTimer(asyncio.get_running_loop())
    rng = random.Random(seed)
    at = time.monotonic() + 0.05
    late = []
    try:
        for _ in range(count):
            at += rng.expovariate(rate)
            await timer.sleep_until(at)
            late.append(time.monotonic() - at)
    finally:
        timer.close()
    return late


def row(name: str, late: list[float]) -> str:
    q = statistics.quantiles(late, n=100, method="inclusive")
    return (
        f"{name:<24} {len(late):>6} {q[49] * 1e3:>8.3f} {q[98] * 1e3:>8.3f} "
        f"{max(late) * 1e3:>8.2f} {sum(x > 0.001 for x in late):>6}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=66.0)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    pin_self(1)
    conditions: dict[str, int | None] = {"default": None}
    if PM_QOS_PATH.exists() and os.access(PM_QOS_PATH, os.W_OK):
        conditions["--cpu-dma-latency 0"] = 0
    print(
        f"wake_floor: {args.count} Poisson waits at {args.rate:g}/s on a kernel "
        "timer, uvloop, CPU 1, nothing else in the process; lateness in ms"
    )
    print(
        f"{'condition':<24} {'wakes':>6} {'p50':>8} {'p99':>8} {'max':>8} {'>1 ms':>6}"
    )
    for repeat in range(args.repeats):
        for name, bound in conditions.items():
            with hold_cpu_latency(bound):
                late = uvloop.run(lateness(args.count, args.rate, repeat))
            print(row(name, late), flush=True)


if __name__ == "__main__":
    main()
