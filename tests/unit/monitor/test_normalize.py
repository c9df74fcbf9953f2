"""Hand-written expositions of every engine and version in, servemon's schema out.

Each exposition follows what ``shared/reference/engine-metrics.md`` says that engine
and version publishes (names, types, labels, units, deprecated spellings), written
here by hand so that the expectations do not come from the code under test.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric

from servemon.core import names
from servemon.monitor.normalize import Normalized, Normalizer, detect_engine, normalize

Key = tuple[str, frozenset[tuple[str, str]]]


def hist_samples(
    name: str, labels: str, buckets: Iterable[tuple[str, float]], total: float
) -> str:
    """A histogram's sample lines (``labels`` without braces, may be empty),
    cumulative ``buckets`` ending with ``+Inf``."""
    sep = "," if labels else ""
    pairs = list(buckets)
    lines = [f'{name}_bucket{{{labels}{sep}le="{le}"}} {value}' for le, value in pairs]
    braces = f"{{{labels}}}" if labels else ""
    lines += [f"{name}_count{braces} {pairs[-1][1]}", f"{name}_sum{braces} {total}"]
    return "\n".join(lines) + "\n"


def hist(
    name: str, labels: str, buckets: Iterable[tuple[str, float]], total: float
) -> str:
    """A histogram family as prometheus_client writes it."""
    header = f"# HELP {name} Histogram of {name}.\n# TYPE {name} histogram\n"
    return header + hist_samples(name, labels, buckets, total)


TTFT_BUCKETS = [
    ("0.001", 0.0),
    ("0.01", 2.0),
    ("0.1", 9.0),
    ("1.0", 10.0),
    ("+Inf", 11.0),
]
ITL_BUCKETS = [("0.01", 100.0), ("0.025", 700.0), ("0.05", 790.0), ("+Inf", 800.0)]
E2E_BUCKETS = [("0.3", 1.0), ("1.0", 8.0), ("5.0", 11.0), ("+Inf", 11.0)]
QUEUE_BUCKETS = [("0.3", 10.0), ("1.0", 11.0), ("+Inf", 11.0)]
OTHER_BUCKETS = [("0.5", 3.0), ("+Inf", 5.0)]


def values(n: Normalized) -> dict[Key, float]:
    out: dict[Key, float] = {}
    for family in n.families:
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            assert key not in out, f"sample published twice: {key}"
            out[key] = sample.value
    return out


def get(n: Normalized, name: str, **labels: str) -> float:
    """The one sample ``name`` with exactly these labels."""
    key = (name, frozenset(labels.items()))
    found = values(n)
    assert key in found, f"{name}{labels} missing; have {sorted(k[0] for k in found)}"
    return found[key]


def family_names(n: Normalized) -> set[str]:
    return {f.name for f in n.families}


def assert_schema(n: Normalized) -> None:
    """Every family is a servemon engine series with its kind and exact labels."""
    by_base = {s.base: s for s in names.ENGINE_SERIES}
    for family in n.families:
        series = by_base[family.name]
        assert family.type == series.kind, family.name
        assert family.samples, family.name
        for sample in family.samples:
            assert set(sample.labels) - {"le"} == set(series.labels), sample


def assert_histogram(
    n: Normalized,
    series: names.Series,
    buckets: list[tuple[str, float]],
    total: float,
    **labels: str,
) -> None:
    for le, value in buckets:  # the source's own le strings are kept
        assert get(n, f"{series.name}_bucket", **labels, le=le) == value, le
    assert get(n, f"{series.name}_count", **labels) == buckets[-1][1]
    assert get(n, f"{series.name}_sum", **labels) == total
    found = [
        k
        for k in values(n)
        if k[0] == f"{series.name}_bucket" and set(labels.items()) <= k[1]
    ]
    assert len(found) == len(buckets), "no bucket added or lost"


PROCESS = (
    "# HELP python_gc_objects_collected_total Objects collected during gc\n"
    "# TYPE python_gc_objects_collected_total counter\n"
    'python_gc_objects_collected_total{generation="0"} 321.0\n'
    "# HELP python_info Python platform information\n"
    "# TYPE python_info gauge\n"
    'python_info{implementation="CPython",major="3",minor="12",version="3.12.3"} 1.0\n'
    "# HELP process_cpu_seconds_total Total user and system CPU time.\n"
    "# TYPE process_cpu_seconds_total counter\n"
    "process_cpu_seconds_total 12.5\n"
    "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
    "# TYPE process_resident_memory_bytes gauge\n"
    "process_resident_memory_bytes 1.2e9\n"
)


def vllm_counter(name: str, doc: str, labels: str, value: float) -> str:
    """A V1 counter as prometheus_client writes it: ``_total`` plus a ``_created``
    gauge family."""
    return (
        f"# HELP {name}_total {doc}\n# TYPE {name}_total counter\n"
        f"{name}_total{{{labels}}} {value}\n"
        f"# HELP {name}_created {doc}\n# TYPE {name}_created gauge\n"
        f"{name}_created{{{labels}}} 1.7e9\n"
    )


def gauge(name: str, labels: str, value: float, doc: str = "A gauge.") -> str:
    braces = f"{{{labels}}}" if labels else ""
    return f"# HELP {name} {doc}\n# TYPE {name} gauge\n{name}{braces} {value}\n"


def cache_config(extra: str = "") -> str:
    return gauge(
        "vllm:cache_config_info",
        f'block_size="16",cache_dtype="auto",enable_prefix_caching="True",{extra}'
        'gpu_memory_utilization="0.9",num_gpu_blocks="5000",'
        'num_gpu_blocks_override="None",sliding_window="None"',
        1.0,
        "Information of the LLMEngine CacheConfig",
    )


def vllm_v1(labels: str, *, rank_values: int = 1) -> str:
    """vLLM V1 (0.11+) with the given common labels; values scale with
    ``rank_values`` so that data-parallel ranks differ."""
    k = rank_values
    success = (
        "# HELP vllm:request_success_total Count of successfully processed requests.\n"
        "# TYPE vllm:request_success_total counter\n"
        + "".join(
            f'vllm:request_success_total{{{labels},finished_reason="{r}"}} {v * k}\n'
            for r, v in (("stop", 7.0), ("length", 3.0), ("abort", 1.0))
        )
    )
    return (
        gauge("vllm:num_requests_running", labels, 3.0 * k)
        + gauge("vllm:num_requests_waiting", labels, 2.0 * k)
        + gauge(
            "vllm:num_requests_waiting_by_reason",
            labels + ',reason="capacity"',
            2.0 * k,
        )
        + gauge("vllm:engine_sleep_state", labels + ',sleep_state="awake"', 1.0)
        + gauge("vllm:kv_cache_usage_perc", labels, k / 4)
        + vllm_counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            labels,
            1000.0 * k,
        )
        + vllm_counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            labels,
            640.0 * k,
        )
        + vllm_counter("vllm:num_preemptions", "Preemptions.", labels, 4.0 * k)
        + vllm_counter("vllm:prompt_tokens", "Prefill tokens.", labels, 1200.0 * k)
        + vllm_counter(
            "vllm:generation_tokens", "Generation tokens.", labels, 800.0 * k
        )
        + success
        + hist("vllm:time_to_first_token_seconds", labels, TTFT_BUCKETS, 0.5 * k)
        + gauge("vllm:time_to_first_token_seconds_created", labels, 1.7e9)
        + hist("vllm:inter_token_latency_seconds", labels, ITL_BUCKETS, 16.0 * k)
        + hist("vllm:request_time_per_output_token_seconds", labels, OTHER_BUCKETS, 0.1)
        + hist("vllm:e2e_request_latency_seconds", labels, E2E_BUCKETS, 9.5 * k)
        + hist("vllm:request_queue_time_seconds", labels, QUEUE_BUCKETS, 0.75 * k)
        + hist("vllm:request_prefill_time_seconds", labels, OTHER_BUCKETS, 0.2)
        + hist("vllm:request_decode_time_seconds", labels, OTHER_BUCKETS, 0.3)
        + hist("vllm:iteration_tokens_total", labels, OTHER_BUCKETS, 99.0)
        + "# HELP vllm:lora_requests_info Running stats on lora requests.\n"
        "# TYPE vllm:lora_requests_info gauge\n"
    )


V1_LABELS = 'engine="0",model_name="m"'
VLLM_V1 = PROCESS + vllm_v1(V1_LABELS) + cache_config('engine="0",')

#: 0.10.x: the deprecated spellings beside the new ones, with different values here so
#: that a test can tell which one was read.
VLLM_010 = (
    VLLM_V1
    + gauge(
        "vllm:gpu_cache_usage_perc",
        V1_LABELS,
        0.99,
        "GPU KV-cache usage. DEPRECATED: Use vllm:kv_cache_usage_perc instead.",
    )
    + vllm_counter(
        "vllm:gpu_prefix_cache_queries",
        "GPU prefix cache queries. DEPRECATED: Use vllm:prefix_cache_queries instead.",
        V1_LABELS,
        99999.0,
    )
    + vllm_counter(
        "vllm:gpu_prefix_cache_hits",
        "GPU prefix cache hits. DEPRECATED: Use vllm:prefix_cache_hits instead.",
        V1_LABELS,
        88888.0,
    )
    + hist(
        "vllm:time_per_output_token_seconds",
        V1_LABELS,
        [("0.01", 1.0), ("+Inf", 2.0)],
        123.0,
    )
)

V08_LABELS = 'model_name="m"'
#: Early V1 (0.8.x): old names only, prefix cache in blocks, no engine label.
VLLM_08 = (
    PROCESS
    + gauge("vllm:num_requests_running", V08_LABELS, 3.0)
    + gauge("vllm:num_requests_waiting", V08_LABELS, 2.0)
    + gauge("vllm:gpu_cache_usage_perc", V08_LABELS, 0.5, "GPU KV-cache usage.")
    + vllm_counter(
        "vllm:gpu_prefix_cache_queries",
        "GPU prefix cache queries, in terms of number of queried blocks.",
        V08_LABELS,
        60.0,
    )
    + vllm_counter(
        "vllm:gpu_prefix_cache_hits",
        "GPU prefix cache hits, in terms of number of cached blocks.",
        V08_LABELS,
        40.0,
    )
    + vllm_counter("vllm:num_preemptions", "Preemptions.", V08_LABELS, 4.0)
    + vllm_counter("vllm:prompt_tokens", "Prefill tokens.", V08_LABELS, 1200.0)
    + vllm_counter("vllm:generation_tokens", "Generation tokens.", V08_LABELS, 800.0)
    + "# TYPE vllm:request_success_total counter\n"
    'vllm:request_success_total{model_name="m",finished_reason="stop"} 5.0\n'
    'vllm:request_success_total{model_name="m",finished_reason="length"} 6.0\n'
    + hist("vllm:time_to_first_token_seconds", V08_LABELS, TTFT_BUCKETS, 0.5)
    + hist("vllm:time_per_output_token_seconds", V08_LABELS, ITL_BUCKETS, 16.0)
    + hist("vllm:e2e_request_latency_seconds", V08_LABELS, E2E_BUCKETS, 9.5)
    + hist("vllm:request_queue_time_seconds", V08_LABELS, QUEUE_BUCKETS, 0.75)
    + cache_config()
)

#: The V0 engine: hit-rate gauges, swapped requests, counters declared ``_total``.
VLLM_V0 = (
    PROCESS
    + gauge("vllm:num_requests_running", V08_LABELS, 3.0)
    + gauge("vllm:num_requests_swapped", V08_LABELS, 0.0)
    + gauge("vllm:num_requests_waiting", V08_LABELS, 2.0)
    + gauge("vllm:gpu_cache_usage_perc", V08_LABELS, 0.3)
    + gauge("vllm:cpu_cache_usage_perc", V08_LABELS, 0.0)
    + gauge("vllm:gpu_prefix_cache_hit_rate", V08_LABELS, 0.42)
    + gauge("vllm:cpu_prefix_cache_hit_rate", V08_LABELS, -1.0)
    + gauge("vllm:avg_prompt_throughput_toks_per_s", V08_LABELS, 55.5)
    + "# HELP vllm:num_preemptions_total Cumulative number of preemption.\n"
    "# TYPE vllm:num_preemptions_total counter\n"
    'vllm:num_preemptions_total{model_name="m"} 4.0\n'
    "# TYPE vllm:prompt_tokens_total counter\n"
    'vllm:prompt_tokens_total{model_name="m"} 1200.0\n'
    "# TYPE vllm:generation_tokens_total counter\n"
    'vllm:generation_tokens_total{model_name="m"} 800.0\n'
    "# TYPE vllm:request_success_total counter\n"
    'vllm:request_success_total{finished_reason="stop",model_name="m"} 9.0\n'
    'vllm:request_success_total{finished_reason="length",model_name="m"} 2.0\n'
    + hist("vllm:time_to_first_token_seconds", V08_LABELS, TTFT_BUCKETS, 0.5)
    + hist("vllm:time_per_output_token_seconds", V08_LABELS, ITL_BUCKETS, 16.0)
    + hist("vllm:e2e_request_latency_seconds", V08_LABELS, E2E_BUCKETS, 9.5)
    + hist("vllm:request_queue_time_seconds", V08_LABELS, QUEUE_BUCKETS, 0.75)
    + hist("vllm:request_params_best_of", V08_LABELS, OTHER_BUCKETS, 5.0)
    + cache_config()
)


SGLANG_SCALARS = (
    # name, kind, value(offset of the DP rank, 0 or 1 for the TP rank)
    ("sglang:num_running_reqs", "gauge", lambda off, tp: 4.0 + off),
    ("sglang:num_queue_reqs", "gauge", lambda off, tp: 1.0 + off + 2 * tp),
    ("sglang:token_usage", "gauge", lambda off, tp: 0.25 + 0.25 * tp),
    ("sglang:cache_hit_rate", "gauge", lambda off, tp: 0.5 + 0.25 * tp),
    ("sglang:num_used_tokens", "gauge", lambda off, tp: 100.0),
    ("sglang:max_total_num_tokens", "gauge", lambda off, tp: 400.0),
    ("sglang:gen_throughput", "gauge", lambda off, tp: 55.0),
    ("sglang:prompt_tokens_total", "counter", lambda off, tp: 1000.0 + off - 10 * tp),
    ("sglang:generation_tokens_total", "counter", lambda off, tp: 500.0 + off + tp),
    ("sglang:cached_tokens_total", "counter", lambda off, tp: 300.0 + off),
    ("sglang:num_retracted_reqs_total", "counter", lambda off, tp: 2.0 + off),
    ("sglang:num_requests_total", "counter", lambda off, tp: 11.0 + off),
)
SGLANG_HISTOGRAMS = (
    ("sglang:time_to_first_token_seconds", TTFT_BUCKETS, 0.5),
    ("sglang:inter_token_latency_seconds", ITL_BUCKETS, 16.0),
    ("sglang:e2e_request_latency_seconds", E2E_BUCKETS, 9.5),
    ("sglang:queue_time_seconds", QUEUE_BUCKETS, 0.75),
)


def sglang(dp_ranks: tuple[str | None, ...] = (None,)) -> str:
    """SGLang with two TP ranks for each of ``dp_ranks``: per-rank copies of every
    series that disagree a little (TP rank 1's histograms count twice as much); DP
    rank r's values are offset by 10 * r."""
    ranks: list[tuple[str, float, int]] = []
    for dp in dp_ranks:
        for tp in (0, 1):
            labels = f'model_name="m",engine_type="unified",tp_rank="{tp}",pp_rank="0"'
            if dp is not None:
                labels += f',dp_rank="{dp}"'
            ranks.append((labels, 10.0 * int(dp or 0), tp))
    text = PROCESS
    for name, kind, value in SGLANG_SCALARS:
        text += f"# HELP {name} {name}.\n# TYPE {name} {kind}\n"
        text += "".join(f"{name}{{{lb}}} {value(off, tp)}\n" for lb, off, tp in ranks)
    for name, buckets, total in SGLANG_HISTOGRAMS:
        text += f"# HELP {name} {name}.\n# TYPE {name} histogram\n"
        for lb, _, tp in ranks:
            scaled = [(le, v * (1 + tp)) for le, v in buckets]
            text += hist_samples(name, lb, scaled, total * (1 + tp))
    return text


TGI = (
    "# TYPE tgi_batch_current_size gauge\ntgi_batch_current_size 3\n"
    "# TYPE tgi_queue_size gauge\ntgi_queue_size 1\n"
    "# TYPE tgi_batch_current_max_tokens gauge\ntgi_batch_current_max_tokens 4096\n"
    "# TYPE tgi_request_count counter\ntgi_request_count 12\n"
    "# TYPE tgi_request_success counter\ntgi_request_success 10\n"
    '# TYPE tgi_request_failure counter\ntgi_request_failure{err="validation"} 2\n'
    "# TYPE tgi_batch_inference_count counter\n"
    'tgi_batch_inference_count{method="prefill"} 9\n'
    + hist("tgi_request_duration", "", E2E_BUCKETS, 9.5)
    + hist("tgi_request_queue_duration", "", QUEUE_BUCKETS, 0.75)
    + hist("tgi_request_mean_time_per_token_duration", "", ITL_BUCKETS, 16.0)
    + hist("tgi_request_input_length", "", OTHER_BUCKETS, 120.0)
    + hist("tgi_batch_forward_duration", 'method="decode"', OTHER_BUCKETS, 1.0)
)

LLAMACPP = (
    "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.\n"
    "# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 1500\n"
    "# HELP llamacpp:prompt_seconds_total Prompt process time\n"
    "# TYPE llamacpp:prompt_seconds_total counter\nllamacpp:prompt_seconds_total 2.5\n"
    "# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.\n"
    "# TYPE llamacpp:tokens_predicted_total counter\n"
    "llamacpp:tokens_predicted_total 700\n"
    "# TYPE llamacpp:tokens_predicted_seconds_total counter\n"
    "llamacpp:tokens_predicted_seconds_total 14\n"
    "# TYPE llamacpp:n_decode_total counter\nllamacpp:n_decode_total 700\n"
    "# TYPE llamacpp:n_busy_slots_per_decode counter\n"
    "llamacpp:n_busy_slots_per_decode 1.2\n"
    "# TYPE llamacpp:prompt_tokens_seconds gauge\nllamacpp:prompt_tokens_seconds 600\n"
    "# TYPE llamacpp:predicted_tokens_seconds gauge\n"
    "llamacpp:predicted_tokens_seconds 50\n"
    "# TYPE llamacpp:kv_cache_usage_ratio gauge\nllamacpp:kv_cache_usage_ratio 0.125\n"
    "# TYPE llamacpp:kv_cache_tokens gauge\nllamacpp:kv_cache_tokens 512\n"
    "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 2\n"
    "# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred 1\n"
)

N = names


def labels_for(engine: str, rank: str = "0", model: str = "m") -> dict[str, str]:
    return {"target": "t", "model": model, "engine": engine, "rank": rank}


# -- vLLM ------------------------------------------------------------------------------


def assert_vllm_core(n: Normalized, *, itl_total: float = 16.0) -> None:
    """The series every vLLM dialect has, with the values the texts above carry."""
    base = labels_for("vllm")
    assert get(n, N.ENGINE_REQUESTS_RUNNING.name, **base) == 3.0
    assert get(n, N.ENGINE_REQUESTS_WAITING.name, **base) == 2.0
    assert get(n, N.ENGINE_PREEMPTIONS.name, **base) == 4.0
    assert get(n, N.ENGINE_PROMPT_TOKENS.name, **base) == 1200.0
    assert get(n, N.ENGINE_GENERATION_TOKENS.name, **base) == 800.0
    assert_histogram(n, N.ENGINE_TTFT, TTFT_BUCKETS, 0.5, **base)
    assert_histogram(n, N.ENGINE_ITL, ITL_BUCKETS, itl_total, **base)
    assert_histogram(n, N.ENGINE_E2E, E2E_BUCKETS, 9.5, **base)
    assert_histogram(n, N.ENGINE_QUEUE, QUEUE_BUCKETS, 0.75, **base)
    assert_schema(n)


def test_vllm_v1_current() -> None:
    n = normalize(VLLM_V1, target="t")
    assert (n.engine, n.dialect) == ("vllm", "vllm")
    assert n.models == {"m"}
    base = labels_for("vllm")
    assert_vllm_core(n)
    assert get(n, N.ENGINE_KV_CACHE_USAGE.name, **base) == 0.25
    assert get(n, N.ENGINE_PREFIX_QUERIES.name, **base) == 1000.0
    assert get(n, N.ENGINE_PREFIX_HITS.name, **base) == 640.0
    finished = {
        reason: get(n, N.ENGINE_REQUESTS_FINISHED.name, **base, reason=reason)
        for reason in ("stop", "length", "abort")
    }
    assert finished == {"stop": 7.0, "length": 3.0, "abort": 1.0}
    assert_histogram(n, N.ENGINE_TPOT, OTHER_BUCKETS, 0.1, **base)
    assert N.ENGINE_PREFIX_HIT_RATIO.base not in family_names(n)  # counters exist
    assert n.info["block_size"] == "16"
    assert n.info["num_gpu_blocks"] == "5000"
    assert n.info["prefix_caching"] == "True"
    assert n.info["prefix_cache_unit"] == "tokens"
    # Unknown families (process_*, python_*) are dropped; nothing but servemon
    # engine series comes out.
    assert all(name.startswith("servemon_engine_") for name in family_names(n))


def test_vllm_010_reads_the_new_name_once() -> None:
    n = normalize(VLLM_010, target="t")
    assert (n.engine, n.dialect) == ("vllm", "vllm-0.10")
    base = labels_for("vllm")
    assert_vllm_core(n)  # ITL from inter_token_latency, not the deprecated TPOT
    assert get(n, N.ENGINE_KV_CACHE_USAGE.name, **base) == 0.25
    assert get(n, N.ENGINE_PREFIX_QUERIES.name, **base) == 1000.0
    assert get(n, N.ENGINE_PREFIX_HITS.name, **base) == 640.0
    assert n.info["prefix_cache_unit"] == "tokens"
    # Read once: one family per series, one sample per label set (values() checks).
    listed = [f.name for f in n.families]
    assert len(listed) == len(set(listed))


def test_vllm_08_old_names_blocks_and_no_engine_label() -> None:
    n = normalize(VLLM_08, target="t")
    assert (n.engine, n.dialect) == ("vllm", "vllm-0.8")
    base = labels_for("vllm")
    assert_vllm_core(n)
    assert get(n, N.ENGINE_KV_CACHE_USAGE.name, **base) == 0.5
    assert get(n, N.ENGINE_PREFIX_QUERIES.name, **base) == 60.0
    assert get(n, N.ENGINE_PREFIX_HITS.name, **base) == 40.0
    assert n.info["prefix_cache_unit"] == "blocks"
    assert get(n, N.ENGINE_REQUESTS_FINISHED.name, **base, reason="length") == 6.0
    assert N.ENGINE_TPOT.base not in family_names(n)


def test_vllm_v0_hit_rate_gauge() -> None:
    n = normalize(VLLM_V0, target="t")
    assert (n.engine, n.dialect) == ("vllm", "vllm-v0")
    base = labels_for("vllm")
    assert_vllm_core(n)
    assert get(n, N.ENGINE_KV_CACHE_USAGE.name, **base) == 0.3
    assert get(n, N.ENGINE_PREFIX_HIT_RATIO.name, **base) == 0.42
    assert N.ENGINE_PREFIX_QUERIES.base not in family_names(n)
    assert N.ENGINE_PREFIX_HITS.base not in family_names(n)
    assert get(n, N.ENGINE_REQUESTS_FINISHED.name, **base, reason="stop") == 9.0
    assert n.info["num_gpu_blocks"] == "5000"


def test_vllm_four_data_parallel_ranks() -> None:
    text = PROCESS + "".join(
        vllm_v1(f'engine="{r}",model_name="m"', rank_values=r + 1) for r in range(4)
    )
    # prometheus_client writes one block per family with every rank's samples in it.
    n = normalize(_regroup(text), target="t")
    for r in range(4):
        k = r + 1
        base = labels_for("vllm", rank=str(r))
        assert get(n, N.ENGINE_REQUESTS_RUNNING.name, **base) == 3.0 * k
        assert get(n, N.ENGINE_REQUESTS_WAITING.name, **base) == 2.0 * k
        assert get(n, N.ENGINE_KV_CACHE_USAGE.name, **base) == k / 4
        assert get(n, N.ENGINE_PREFIX_QUERIES.name, **base) == 1000.0 * k
        assert get(n, N.ENGINE_PREFIX_HITS.name, **base) == 640.0 * k
        assert get(n, N.ENGINE_PROMPT_TOKENS.name, **base) == 1200.0 * k
        assert get(n, N.ENGINE_GENERATION_TOKENS.name, **base) == 800.0 * k
        assert get(n, N.ENGINE_PREEMPTIONS.name, **base) == 4.0 * k
        assert get(n, N.ENGINE_REQUESTS_FINISHED.name, **base, reason="stop") == 7.0 * k
        assert_histogram(n, N.ENGINE_TTFT, TTFT_BUCKETS, 0.5 * k, **base)
        assert_histogram(n, N.ENGINE_E2E, E2E_BUCKETS, 9.5 * k, **base)
    ranks = {dict(k[1])["rank"] for k in values(n)}
    assert ranks == {"0", "1", "2", "3"}
    assert_schema(n)


def test_vllm_why_requests_wait_and_sleep_state_keep_their_labels() -> None:
    n = normalize(VLLM_V1, target="t")
    base = labels_for("vllm")
    waiting = N.ENGINE_REQUESTS_WAITING_BY_REASON.base
    assert get(n, waiting, **base, reason="capacity") == 2.0
    assert get(n, N.ENGINE_SLEEP_STATE.base, **base, state="awake") == 1.0
    assert_histogram(n, N.ENGINE_ITERATION_TOKENS, OTHER_BUCKETS, 99.0, **base)
    assert_schema(n)


def offload(new: bool, legacy: bool) -> str:
    """vLLM's OffloadingConnector families: the flat names (``new``) and the
    deprecated ones that ``transfer_type`` splits (``legacy``), with different
    values so that a test can tell which one was read."""
    text = VLLM_V1
    if new:
        for name, value in (
            ("vllm:kv_offload_load_bytes", 1000.0),
            ("vllm:kv_offload_store_bytes", 3000.0),
            ("vllm:kv_offload_load_time", 0.5),
            ("vllm:kv_offload_store_time", 1.5),
        ):
            text += vllm_counter(name, "Offload.", V1_LABELS, value)
    if legacy:
        for name, load, store in (
            ("vllm:kv_offload_total_bytes", 11.0, 33.0),
            ("vllm:kv_offload_total_time", 0.011, 0.033),
        ):
            text += f"# HELP {name}_total Offload.\n# TYPE {name}_total counter\n"
            for kind, value in (("CPU_to_GPU", load), ("GPU_to_CPU", store)):
                labels = f'{V1_LABELS},transfer_type="{kind}"'
                text += f"{name}_total{{{labels}}} {value}\n"
    return text


@pytest.mark.parametrize(
    ("new", "legacy", "want"),
    [
        (True, True, (1000.0, 3000.0, 0.5, 1.5)),
        (True, False, (1000.0, 3000.0, 0.5, 1.5)),
        (False, True, (11.0, 33.0, 0.011, 0.033)),
    ],
    ids=["both", "new-only", "deprecated-only"],
)
def test_kv_offload_reads_the_new_names_else_the_deprecated_split_never_both(
    new: bool, legacy: bool, want: tuple[float, float, float, float]
) -> None:
    n = normalize(offload(new, legacy), target="t")
    base = labels_for("vllm")
    got = tuple(
        get(n, series.name, **base)
        for series in (
            N.ENGINE_KV_OFFLOAD_LOAD_BYTES,
            N.ENGINE_KV_OFFLOAD_STORE_BYTES,
            N.ENGINE_KV_OFFLOAD_LOAD_SECONDS,
            N.ENGINE_KV_OFFLOAD_STORE_SECONDS,
        )
    )
    assert got == want
    assert_schema(n)


def test_no_offload_connector_no_offload_series() -> None:
    published = family_names(normalize(VLLM_V1, target="t"))
    assert N.ENGINE_KV_OFFLOAD_LOAD_BYTES.base not in published
    assert N.ENGINE_SPEC_DRAFTS.base not in published


def test_spec_decode_counters() -> None:
    text = VLLM_V1
    for name, value in (
        ("vllm:spec_decode_num_drafts", 100.0),
        ("vllm:spec_decode_num_draft_tokens", 300.0),
        ("vllm:spec_decode_num_accepted_tokens", 210.0),
    ):
        text += vllm_counter(name, "Spec decode.", V1_LABELS, value)
    text += "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter\n"
    text += (
        f"vllm:spec_decode_num_accepted_tokens_per_pos_total{{{V1_LABELS},"
        'position="0"} 90.0\n'
    )
    n = normalize(text, target="t")
    base = labels_for("vllm")
    assert get(n, N.ENGINE_SPEC_DRAFTS.name, **base) == 100.0
    assert get(n, N.ENGINE_SPEC_DRAFT_TOKENS.name, **base) == 300.0
    assert get(n, N.ENGINE_SPEC_ACCEPTED_TOKENS.name, **base) == 210.0
    assert_schema(n)


def _regroup(text: str) -> str:
    """One block per family (as prometheus_client writes every rank's samples)."""
    headers: dict[str, list[str]] = {}
    samples: dict[str, list[str]] = {}
    current = ""
    for line in text.splitlines():
        if line.startswith("# "):
            current = line.split()[2]
            lines = headers.setdefault(current, [])
            samples.setdefault(current, [])
            if line not in lines:
                lines.append(line)
        else:
            samples[current].append(line)
    return "".join("\n".join(headers[n] + samples[n]) + "\n" for n in headers)


# -- SGLang, TGI, llama.cpp ------------------------------------------------------------


def test_sglang_folds_tp_rank_copies() -> None:
    n = normalize(sglang(), target="t")
    assert (n.engine, n.dialect) == ("sglang", "sglang")
    base = labels_for("sglang")
    assert get(n, N.ENGINE_REQUESTS_RUNNING.name, **base) == 4.0
    # Gauges averaged over TP ranks, counters take the largest, histograms the first.
    assert get(n, N.ENGINE_REQUESTS_WAITING.name, **base) == 2.0
    assert get(n, N.ENGINE_KV_CACHE_USAGE.name, **base) == 0.375
    assert get(n, N.ENGINE_PREFIX_HIT_RATIO.name, **base) == 0.625
    assert get(n, N.ENGINE_PROMPT_TOKENS.name, **base) == 1000.0
    assert get(n, N.ENGINE_GENERATION_TOKENS.name, **base) == 501.0
    assert get(n, N.ENGINE_PREFIX_HITS.name, **base) == 300.0
    assert get(n, N.ENGINE_PROMPT_TOKENS_CACHED.name, **base) == 300.0
    assert get(n, N.ENGINE_PREEMPTIONS.name, **base) == 2.0
    assert_histogram(n, N.ENGINE_TTFT, TTFT_BUCKETS, 0.5, **base)
    assert_histogram(n, N.ENGINE_ITL, ITL_BUCKETS, 16.0, **base)
    assert_histogram(n, N.ENGINE_E2E, E2E_BUCKETS, 9.5, **base)
    assert_histogram(n, N.ENGINE_QUEUE, QUEUE_BUCKETS, 0.75, **base)
    assert N.ENGINE_PREFIX_QUERIES.base not in family_names(n)  # SGLang has none
    assert n.info["prefix_cache_unit"] == "tokens"
    assert_schema(n)


def test_sglang_dp_rank_becomes_rank() -> None:
    n = normalize(sglang(("0", "1")), target="t")
    for dp in ("0", "1"):
        off = 10.0 * int(dp)
        base = labels_for("sglang", rank=dp)
        assert get(n, N.ENGINE_REQUESTS_RUNNING.name, **base) == 4.0 + off
        assert get(n, N.ENGINE_PROMPT_TOKENS.name, **base) == 1000.0 + off
        assert get(n, N.ENGINE_PREFIX_HITS.name, **base) == 300.0 + off
        assert_histogram(n, N.ENGINE_TTFT, TTFT_BUCKETS, 0.5, **base)
    assert_schema(n)


def test_tgi() -> None:
    n = normalize(TGI, target="t", model="bigscience/bloom")
    assert (n.engine, n.dialect) == ("tgi", "tgi")
    base = labels_for("tgi", model="bigscience/bloom")
    assert get(n, N.ENGINE_REQUESTS_RUNNING.name, **base) == 3.0
    assert get(n, N.ENGINE_REQUESTS_WAITING.name, **base) == 1.0
    assert get(n, N.ENGINE_REQUESTS_FINISHED.name, **base, reason="stop") == 10.0
    assert_histogram(n, N.ENGINE_E2E, E2E_BUCKETS, 9.5, **base)
    assert_histogram(n, N.ENGINE_QUEUE, QUEUE_BUCKETS, 0.75, **base)
    assert_histogram(n, N.ENGINE_TPOT, ITL_BUCKETS, 16.0, **base)
    assert_histogram(n, N.ENGINE_PROMPT_LENGTH, OTHER_BUCKETS, 120.0, **base)
    # TGI has no KV usage and no TTFT.
    assert N.ENGINE_KV_CACHE_USAGE.base not in family_names(n)
    assert N.ENGINE_TTFT.base not in family_names(n)
    assert_schema(n)


def test_llamacpp() -> None:
    n = normalize(LLAMACPP, target="t")
    assert (n.engine, n.dialect) == ("llamacpp", "llamacpp")
    base = labels_for("llamacpp", model="unknown")  # no labels, no model given
    assert get(n, N.ENGINE_REQUESTS_RUNNING.name, **base) == 2.0
    assert get(n, N.ENGINE_REQUESTS_WAITING.name, **base) == 1.0
    assert get(n, N.ENGINE_KV_CACHE_USAGE.name, **base) == 0.125
    assert get(n, N.ENGINE_PROMPT_TOKENS.name, **base) == 1500.0
    assert get(n, N.ENGINE_GENERATION_TOKENS.name, **base) == 700.0
    assert N.ENGINE_PROMPT_TOKENS_CACHED.name not in family_names(n)  # older build
    assert_schema(n)


def test_llamacpp_cached_prompt_tokens_in_recent_builds() -> None:
    cached = (
        "# HELP llamacpp:prompt_tokens_cached_total Prompt tokens from the cache.\n"
        "# TYPE llamacpp:prompt_tokens_cached_total counter\n"
        "llamacpp:prompt_tokens_cached_total 640\n"
    )
    n = normalize(LLAMACPP + cached, target="t")
    base = labels_for("llamacpp", model="unknown")
    assert get(n, N.ENGINE_PROMPT_TOKENS_CACHED.name, **base) == 640.0
    assert get(n, N.ENGINE_PREFIX_HITS.name, **base) == 640.0
    assert_schema(n)


@pytest.mark.parametrize(
    ("text", "engine"),
    [
        (VLLM_V1, "vllm"),
        (VLLM_V0, "vllm"),
        (sglang(), "sglang"),
        (TGI, "tgi"),
        (LLAMACPP, "llamacpp"),
        (PROCESS, "unknown"),
    ],
    ids=["vllm", "vllm-v0", "sglang", "tgi", "llamacpp", "process-only"],
)
def test_detect_engine(text: str, engine: str) -> None:
    assert detect_engine(text) == engine


def test_engine_hint_wins_over_detection() -> None:
    n = normalize(VLLM_V1, target="t", engine="sglang")
    assert n.engine == "sglang"
    assert n.families == []


# -- passthrough, garbage, odd expositions ---------------------------------------------


#: Families servemon does not map (async KV fetch stages, sampling parameters).
UNMAPPED = gauge(
    "vllm:num_requests_kv_fetch_by_stage", V1_LABELS + ',stage="in_progress"', 1.0
) + hist("vllm:request_params_n", V1_LABELS, OTHER_BUCKETS, 5.0)


def test_unknown_families_dropped_unless_passthrough() -> None:
    text = VLLM_V1 + UNMAPPED
    dropped = normalize(text, target="t")
    assert all(name.startswith("servemon_engine_") for name in family_names(dropped))
    n = normalize(text, target="t", passthrough=True)
    passed: dict[str, Metric] = {
        f.name: f for f in n.families if not f.name.startswith("servemon_")
    }
    for name in (
        "vllm:num_requests_kv_fetch_by_stage",
        "vllm:request_params_n",
        "python_gc_objects_collected",
    ):
        assert name in passed, name
        assert passed[name].samples, name
        for sample in passed[name].samples:
            assert sample.labels["target"] == "t"
    fetch = passed["vllm:num_requests_kv_fetch_by_stage"].samples[0]
    assert fetch.labels == {
        "engine": "0",
        "model_name": "m",
        "stage": "in_progress",
        "target": "t",
    }
    assert fetch.value == 1.0
    # The exporter publishes its own process_* families: the target's would clash.
    assert not [name for name in passed if name.startswith("process_")]
    # What a servemon series already took is not passed through again.
    assert "vllm:num_requests_running" not in passed
    assert "vllm:engine_sleep_state" not in passed
    assert "vllm:iteration_tokens_total" not in passed
    assert "vllm:time_to_first_token_seconds" not in passed
    # The servemon series are the same with or without passthrough.
    assert {
        k: v for k, v in values(n).items() if k[0].startswith("servemon_")
    } == values(dropped)


@pytest.mark.parametrize(
    "text",
    [
        "<html>502 Bad Gateway</html>\nvllm:num_requests_running{{{ 1\n",
        "Internal Server Error\n",
        'vllm:num_requests_running{model_name="m" 3\n',
        "vllm:num_requests_running three\n",
    ],
    ids=["html", "words", "unclosed", "not_a_number"],
)
def test_garbage_raises_value_error(text: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 (the contract names ValueError)
        normalize(text, target="t")


def test_process_created_and_empty_families_are_tolerated() -> None:
    text = (
        PROCESS + "# HELP vllm:num_requests_running Running.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        "# HELP vllm:prompt_tokens_total Prefill tokens.\n"
        "# TYPE vllm:prompt_tokens_total counter\n"
        + vllm_counter("vllm:generation_tokens", "Generation tokens.", V1_LABELS, 8.0)
        + "# TYPE vllm:time_to_first_token_seconds histogram\n"
        + gauge("vllm:time_to_first_token_seconds_created", V1_LABELS, 1.7e9)
    )
    n = normalize(text, target="t")
    assert n.engine == "vllm"
    assert family_names(n) == {N.ENGINE_GENERATION_TOKENS.base}
    assert get(n, N.ENGINE_GENERATION_TOKENS.name, **labels_for("vllm")) == 8.0
    assert normalize(PROCESS, target="t").families == []
    assert normalize("", target="t").families == []


def test_families_without_type_are_read() -> None:
    text = (
        'vllm:num_requests_running{engine="0",model_name="m"} 5\n'
        'vllm:prompt_tokens_total{engine="0",model_name="m"} 10\n'
        "# HELP vllm:num_requests_waiting Waiting, with HELP and no TYPE.\n"
        'vllm:num_requests_waiting{engine="0",model_name="m"} 6\n'
    )
    n = normalize(text, target="t")
    base = labels_for("vllm")
    assert get(n, N.ENGINE_REQUESTS_RUNNING.name, **base) == 5.0
    assert get(n, N.ENGINE_REQUESTS_WAITING.name, **base) == 6.0
    assert get(n, N.ENGINE_PROMPT_TOKENS.name, **base) == 10.0
    assert_schema(n)


def test_model_label_falls_back_to_the_given_model() -> None:
    text = 'vllm:num_requests_running{engine="0"} 5\n'
    n = normalize(text, target="t", model="served")
    assert (
        get(n, N.ENGINE_REQUESTS_RUNNING.name, **labels_for("vllm", model="served"))
        == 5
    )
    assert n.models == {"served"}


def test_the_same_normalizer_gives_the_same_result_twice() -> None:
    normalizer = Normalizer()
    first = values(normalizer.normalize(VLLM_010, target="t"))
    second = values(normalizer.normalize(VLLM_010, target="t"))
    assert normalizer.compiles == 1  # the second from the plan
    assert first == second
    assert first == values(normalize(VLLM_010, target="t"))


def test_a_changing_label_value_leaves_no_lines_behind() -> None:
    # A new model name on every exposition (redeploys, a label that churns): what
    # one target's normalizer remembers (line keys, written line starts) stays one
    # shape's worth. The exporter soak (benchmarks/exporter_soak.py) found 1.6 MiB
    # kept per shape of a full vLLM exposition, up to caps of 50,000 lines each.
    normalizer = Normalizer()
    encoder, content_type = choose_encoder("application/openmetrics-text")
    lines_per_shape = 0
    for k in range(30):
        text = PROCESS + vllm_v1(f'engine="0",model_name="m{k}"')
        normalizer.normalize(text, target="t").chunks(encoder, content_type)
        lines_per_shape = max(lines_per_shape, text.count("\n"))
        remembered = len(normalizer._parser._keys)
        starts = sum(len(known) for known in normalizer._known.values())
        assert remembered <= lines_per_shape, (k, remembered)
        assert starts <= lines_per_shape, (k, starts)
    assert normalizer.compiles == 30


# -- vLLM's lora_requests_info: read from its newest sample ---------------------------

LORA_HEAD = (
    "# HELP vllm:lora_requests_info Running stats on lora requests.\n"
    "# TYPE vllm:lora_requests_info gauge\n"
)


def lora_info(*states: tuple[str, str, float], max_lora: str = "1") -> str:
    """``lora_requests_info`` as vLLM writes it: one sample per state it ever
    recorded, ``(running, waiting, wall-clock stamp)``, in first-seen order."""
    lines = [
        f'vllm:lora_requests_info{{max_lora="{max_lora}",'
        f'waiting_lora_adapters="{waiting}",running_lora_adapters="{running}"}} '
        f"{stamp!r}"
        for running, waiting, stamp in states
    ]
    return LORA_HEAD + "\n".join(lines) + "\n"


def test_lora_state_comes_from_the_newest_sample() -> None:
    text = lora_info(
        ("", "", 1.7395575657e9),
        ("sql", "chat", 1.7395575723e9),  # the newest
        ("sql", "", 1.7395575717e9),
    )
    n = normalize(text, target="t", model="base")
    common = {"target": "t", "model": "base", "engine": "vllm", "rank": "0"}
    assert get(n, "servemon_engine_lora_adapters_running", **common) == 1.0
    assert get(n, "servemon_engine_lora_adapters_waiting", **common) == 1.0
    assert get(n, "servemon_engine_lora_adapters_max", **common) == 1.0
    active = "servemon_engine_lora_adapter_active"
    assert get(n, active, **common, adapter="sql", state="running") == 1.0
    assert get(n, active, **common, adapter="chat", state="waiting") == 1.0
    assert sorted(
        (dict(k[1])["adapter"], dict(k[1])["state"])
        for k in values(n)
        if k[0] == active
    ) == [("chat", "waiting"), ("sql", "running")]  # only what a sample lists


def test_lora_state_follows_the_stamps_from_one_plan() -> None:
    normalizer = Normalizer()
    states = [("a,b", "c", 10.0), ("", "", 20.0), ("c", "", 5.0)]
    first = normalizer.normalize(lora_info(*states, max_lora="2"), target="t")
    common = {"target": "t", "model": "unknown", "engine": "vllm", "rank": "0"}
    assert get(first, "servemon_engine_lora_adapters_running", **common) == 0.0
    assert get(first, "servemon_engine_lora_adapters_max", **common) == 2.0
    # Only the stamps move: the same plan, another newest sample.
    states = [("a,b", "c", 30.0), ("", "", 20.0), ("c", "", 5.0)]
    again = normalizer.normalize(lora_info(*states, max_lora="2"), target="t")
    assert normalizer.compiles == 1
    assert get(again, "servemon_engine_lora_adapters_running", **common) == 2.0
    assert get(again, "servemon_engine_lora_adapters_waiting", **common) == 1.0
    active = "servemon_engine_lora_adapter_active"
    assert get(again, active, **common, adapter="b", state="running") == 1.0
    assert get(again, active, **common, adapter="c", state="running") == 0.0


def test_an_empty_lora_family_publishes_nothing() -> None:
    n = normalize(LORA_HEAD, target="t")
    assert not {f.name for f in n.families} & {
        "servemon_engine_lora_adapters_running",
        "servemon_engine_lora_adapter_active",
    }
