"""The series vLLM added in 0.25 and 0.32-0.34 that the simulated engine has the
state for (the ``vllm-0.25`` and ``vllm-0.34`` dialects of :mod:`.metrics`): every
label set there from the start, at 0, as vLLM registers them."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from servemon.simulator.engine import Engine
from servemon.simulator.stats import ADMISSION_REASONS

__all__ = ["CACHE_TIERS", "PROMPT_SOURCES", "since_025", "since_032"]

#: vLLM's sources of prompt tokens and tiers of cached ones, in its order.
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
CACHE_TIERS = ("device", "host", "p2p", "disk", "external_unspecified")


def since_025(
    engine: Engine, created: float, keys: list[str], vals: list[str]
) -> Iterator[Metric]:
    """What vLLM 0.25 added that the simulated engine has: every label set
    there from the start, at 0, as vLLM registers them."""
    eng, st = engine, engine.stats
    waiting = GaugeMetricFamily(
        "vllm:num_requests_waiting_by_reason",
        "Number of waiting requests by reason: capacity (no room to schedule "
        "them yet) or deferred (held back by a transient constraint such as the "
        "LoRA budget). The reasons sum to vllm:num_requests_waiting.",
        labels=[*keys, "reason"],
    )
    for reason, count in eng.waiting_by_reason().items():
        waiting.add_metric([*vals, reason], count)
    yield waiting
    sources = {
        "local_compute": st.prompt_tokens - st.prompt_tokens_cached,
        "local_cache_hit": st.prompt_tokens_cached,
        "external_kv_transfer": 0,
    }
    by_source = CounterMetricFamily(
        "vllm:prompt_tokens_by_source",
        "Number of prompt tokens by where their KV came from.",
        labels=[*keys, "source"],
    )
    for source in PROMPT_SOURCES:
        by_source.add_metric([*vals, source], sources[source], created=created)
    yield by_source
    cached = CounterMetricFamily(
        "vllm:prompt_tokens_cached",
        "Number of prompt tokens whose KV was cached (local and external).",
        labels=keys,
    )
    cached.add_metric(vals, st.prompt_tokens_cached, created=created)
    yield cached
    computed = HistogramMetricFamily(
        "vllm:request_prefill_kv_computed_tokens",
        "Histogram of prompt tokens per request whose KV was computed in "
        "prefill (cached tokens excluded).",
        labels=keys,
    )
    h = st.prefill_kv_computed
    computed.add_metric(vals, h.cumulative(), sum_value=h.total)
    yield computed
    estimates = (
        ("flops", "floating point operations", st.estimated_flops),
        ("read_bytes", "bytes read from memory", st.estimated_read_bytes),
        ("write_bytes", "bytes written to memory", st.estimated_write_bytes),
    )
    for what, doc, value in estimates:
        fam = CounterMetricFamily(
            f"vllm:estimated_{what}_per_gpu",
            f"Estimated number of {doc} per GPU (for Model Flops Utilization "
            "calculations).",
            labels=keys,
        )
        fam.add_metric(vals, value, created=created)
        yield fam


def since_032(
    engine: Engine, model: str, created: float, keys: list[str], vals: list[str]
) -> Iterator[Metric]:
    """What vLLM 0.32-0.34 added that the simulated engine has."""
    st = engine.stats
    rejections = CounterMetricFamily(
        "vllm:admission_rejections",
        "Number of requests refused at admission by a queue limit, by reason.",
        labels=["model_name", "reason"],
    )
    for reason in ADMISSION_REASONS:
        rejections.add_metric(
            [model, reason],
            st.admission_rejections[reason],
            created=created,
        )
    yield rejections
    tiers = CounterMetricFamily(
        "vllm:prompt_tokens_cached_by_source",
        "Prefix-cache hit tokens by the cache tier that held them, counted at "
        "admission; they sum to the prefix cache hits.",
        labels=[*keys, "source"],
    )
    for tier in CACHE_TIERS:
        value = st.prefix_hits if tier == "device" else 0
        tiers.add_metric([*vals, tier], value, created=created)
    yield tiers
    preemptions = HistogramMetricFamily(
        "vllm:request_num_preemptions",
        "Histogram of the number of times a request was preempted.",
        labels=keys,
    )
    h = st.request_preemptions
    preemptions.add_metric(vals, h.cumulative(), sum_value=h.total)
    yield preemptions
