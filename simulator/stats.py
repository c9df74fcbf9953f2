"""What the engine counts: plain counters and histograms that a dialect renders.

The engine updates one :class:`EngineStats`; :mod:`servemon.simulator.metrics` turns it
into metric families named as the chosen engine and version would name them. Bucket
edges are vLLM's (V1, ``vllm/v1/metrics/loggers.py``) so that the exposition matches a
real server. They are the simulator's own copy, not imported from ``monitor``: the
simulator stands in for vLLM, and the exporter's and the SLO rules' edges are checked
against it, not against themselves.
"""

from __future__ import annotations

import bisect
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

# fmt: off
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
    7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0,
)
E2E_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)
# fmt: on

__all__ = [
    "ADMISSION_REASONS",
    "E2E_BUCKETS",
    "ITL_BUCKETS",
    "TTFT_BUCKETS",
    "EngineStats",
    "Histogram",
    "token_buckets",
]

ITERATION_TOKEN_BUCKETS = (
    1.0,
    8.0,
    16.0,
    32.0,
    64.0,
    128.0,
    256.0,
    512.0,
    1024.0,
    2048.0,
    4096.0,
    8192.0,
    16384.0,
)
N_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0)
#: ``request_num_preemptions`` (vLLM 0.32+).
PREEMPTION_BUCKETS = (1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0)
#: The queue limits a request can be refused for (vLLM's ``admission_rejections``).
ADMISSION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")


def token_buckets(limit: int) -> tuple[float, ...]:
    """vLLM's 1-2-5 buckets up to ``limit`` (``build_1_2_5_buckets``)."""
    edges: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > limit:
                return tuple(edges)
            edges.append(float(value))
        exponent += 1


class Histogram:
    """Bucket counts (not cumulative) and a sum; +Inf is the last count."""

    __slots__ = ("counts", "edges", "total")

    def __init__(self, edges: tuple[float, ...]) -> None:
        self.edges = edges
        self.counts = [0] * (len(edges) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        """Count one observation."""
        self.counts[bisect.bisect_left(self.edges, value)] += 1
        self.total += value

    @property
    def count(self) -> int:
        """Number of observations."""
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, float]]:
        """``(le, cumulative count)`` pairs ending with ``+Inf``."""
        pairs: list[tuple[str, float]] = []
        running = 0
        for edge, count in zip(self.edges, self.counts, strict=False):
            running += count
            pairs.append((_edge(edge), float(running)))
        pairs.append(("+Inf", float(running + self.counts[-1])))
        return pairs


def _edge(value: float) -> str:
    return repr(float(value))


@dataclass(slots=True)
class EngineStats:
    """Counters and histograms since the engine started."""

    max_model_len: int
    prompt_tokens: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    prefix_query_blocks: int = 0
    prefix_hit_blocks: int = 0
    requests_received: int = 0
    finished: Counter[str] = field(default_factory=Counter)
    #: Requests refused at the door by a queue limit, by limit.
    admission_rejections: Counter[str] = field(default_factory=Counter)
    #: Prompt tokens of requests past their prefill (counted with
    #: ``prompt_tokens``) whose KV came from the prefix cache at first admission.
    prompt_tokens_cached: int = 0
    #: What the steps cost, as the profile's cost model prices them (vLLM's
    #: ``--enable-mfu-metrics`` estimates; only counted with that flag).
    estimated_flops: float = 0.0
    estimated_read_bytes: float = 0.0
    estimated_write_bytes: float = 0.0
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    tpot: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))
    queue: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))
    inference: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))
    prefill: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))
    decode: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))
    iteration_tokens: Histogram = field(
        default_factory=lambda: Histogram(ITERATION_TOKEN_BUCKETS)
    )
    params_n: Histogram = field(default_factory=lambda: Histogram(N_BUCKETS))
    request_preemptions: Histogram = field(
        default_factory=lambda: Histogram(PREEMPTION_BUCKETS)
    )
    request_prompt_tokens: Histogram = field(init=False)
    request_generation_tokens: Histogram = field(init=False)
    params_max_tokens: Histogram = field(init=False)
    #: Prompt tokens per finished request whose KV was computed, not cached.
    prefill_kv_computed: Histogram = field(init=False)
    #: vLLM's ``lora_requests_info``: per (running, waiting) adapter lists, as
    #: comma-joined names, the wall-clock time that state was last recorded. Every
    #: state ever seen stays, as prometheus_client keeps a gauge's label sets.
    lora_info: dict[tuple[str, str], float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        edges = token_buckets(self.max_model_len)
        self.request_prompt_tokens = Histogram(edges)
        self.request_generation_tokens = Histogram(edges)
        self.params_max_tokens = Histogram(edges)
        self.prefill_kv_computed = Histogram(edges)

    def record_lora(self, running: Sequence[str], waiting: Sequence[str]) -> None:
        """Stamp the adapters' state now (vLLM does it once per engine step)."""
        self.lora_info[(",".join(running), ",".join(waiting))] = time.time()
