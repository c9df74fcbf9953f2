"""What one request costs the load generator, and how many workers a rate needs.

``servemon ramp --workers auto`` sends from as many processes as the offered load
needs: the highest stage rate times the CPU one request costs, over the share of a
core one event loop can use and still send on time. The cost model is linear in the
number of streamed chunks (one per token for vLLM and llama.cpp): a fixed part per
request (HTTP, the record, the summaries) and a part per chunk (a read, an SSE
event, its JSON). Its constants were measured with ``benchmarks/loadgen_rate.py``
(the ``us/req`` column) on the 2-core VM of
``benchmarks/results/loadgen-rate.md``; a faster machine needs fewer workers than
this picks, a slower one more — the figures behind
the choice are printed and recorded, and ``--workers N`` overrides it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

__all__ = ["CORE_BUDGET", "WorkerChoice", "request_cpu_s", "workers_for"]

#: CPU seconds per request, fixed part and per streamed chunk (measured, see above).
BASE_S = 0.00060
PER_CHUNK_S = 0.000008
#: The share of one core a worker's event loop may use: above it the p99 dispatch
#: lag passed 5 ms in the benchmark.
CORE_BUDGET = 0.6
MAX_WORKERS = 64


def request_cpu_s(chunks: int) -> float:
    """The client's CPU seconds for one request streaming ``chunks`` chunks."""
    return BASE_S + PER_CHUNK_S * max(1, chunks)


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@dataclass(frozen=True, slots=True)
class WorkerChoice:
    """How many workers, and why (printed, and kept in ``run.json``'s config)."""

    workers: int
    needed: int
    cpus: int
    cpu_per_request_s: float
    peak_rate: float

    def explain(self) -> str:
        text = (
            f"--workers auto: {self.workers} for a peak of {self.peak_rate:g} "
            f"requests/s at about {self.cpu_per_request_s * 1e3:.2f} ms of CPU each "
            f"({CORE_BUDGET:.0%} of a core per worker)"
        )
        if self.needed > self.workers:
            text += (
                f"; {self.needed} needed but only {self.cpus} CPUs here: the client "
                "may be the limit (its warnings will say)"
            )
        return text


def workers_for(peak_rate: float, chunks: int, cpus: int | None = None) -> WorkerChoice:
    """The workers for ``peak_rate`` requests/s of ``chunks`` chunks each."""
    cpus = cpus or _cpus()
    cost = request_cpu_s(chunks)
    needed = max(1, math.ceil(peak_rate * cost / CORE_BUDGET))
    return WorkerChoice(
        workers=min(needed, cpus, MAX_WORKERS),
        needed=needed,
        cpus=cpus,
        cpu_per_request_s=cost,
        peak_rate=peak_rate,
    )
