"""What a run keeps of each sample of the target's metrics for its drivers."""

from __future__ import annotations

from servemon.core import names
from servemon.loadgen.run.context import HISTORY_SERIES, history_samples
from servemon.loadgen.run.sampler import parse_engine_samples


def family(kind: str, name: str, values: list[float]) -> str:
    """One family, a sample per data-parallel rank."""
    suffix = "_total" if kind == "counter" else ""
    return f"# HELP {name} x\n# TYPE {name} {kind}\n" + "".join(
        f'{name}{suffix}{{model_name="m",engine="{rank}"}} {value}\n'
        for rank, value in enumerate(values)
    )


def test_the_history_keeps_only_the_series_the_drivers_read() -> None:
    # A whole sample is about 15 kB in memory; keeping an hour of them at one a
    # second grew the load generator by 54 MB over benchmarks/loadgen_soak.py.
    text = (
        family("gauge", "vllm:num_requests_running", [3.0, 3.0])
        + family("gauge", "vllm:num_requests_waiting", [2.0, 3.0])
        + family("gauge", "vllm:kv_cache_usage_perc", [0.5, 0.5])
        + family("counter", "vllm:num_preemptions", [1.0, 1.0])
        + family("counter", "vllm:prefix_cache_hits", [30.0, 30.0])
        + family("counter", "vllm:prefix_cache_queries", [90.0, 90.0])
        + family("counter", "vllm:prompt_tokens", [100.0, 100.0])
        + family("counter", "vllm:generation_tokens", [50.0, 50.0])
    )
    samples, _info = parse_engine_samples(text)
    kept = history_samples(samples)

    assert {name for name, _labels, _value in samples} > HISTORY_SERIES
    assert {name for name, _labels, _value in kept} == HISTORY_SERIES
    assert len(kept) == 2 * len(HISTORY_SERIES)
    waiting = names.ENGINE_REQUESTS_WAITING.name
    assert sum(v for n, _l, v in kept if n == waiting) == 5.0
