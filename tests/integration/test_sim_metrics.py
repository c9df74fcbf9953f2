"""``/metrics`` in every dialect parses with prometheus_client and is named as that
engine version names it."""

from __future__ import annotations

import math
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from servemon.core import buckets
from servemon.simulator.config import DIALECTS
from servemon.simulator.stats import E2E_BUCKETS, ITL_BUCKETS, TTFT_BUCKETS

pytestmark = pytest.mark.integration

# vLLM V1's bucket edges (vllm/v1/metrics/loggers.py), written out independently.
VLLM_TTFT = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
    7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
]  # fmt: skip
VLLM_ITL = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0,
]  # fmt: skip
VLLM_E2E = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
]  # fmt: skip

V1_HISTOGRAMS = {
    "vllm:time_to_first_token_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
    "vllm:request_prompt_tokens",
    "vllm:request_generation_tokens",
}
VLLM_COMMON = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:num_preemptions": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter",
    "vllm:cache_config_info": "gauge",
    **dict.fromkeys(V1_HISTOGRAMS, "histogram"),
}
NEW_NAMES = {
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:inter_token_latency_seconds": "histogram",
}
OLD_NAMES = {
    "vllm:gpu_cache_usage_perc": "gauge",
    "vllm:time_per_output_token_seconds": "histogram",
}
OLD_PREFIX_COUNTERS = {
    "vllm:gpu_prefix_cache_queries": "counter",
    "vllm:gpu_prefix_cache_hits": "counter",
}
V0_GAUGES = {
    "vllm:gpu_prefix_cache_hit_rate": "gauge",
    "vllm:num_requests_swapped": "gauge",
}
#: What vLLM 0.25 and 0.32-0.34 added that the simulated engine has.
SINCE_025 = {
    "vllm:num_requests_waiting_by_reason": "gauge",
    "vllm:prompt_tokens_by_source": "counter",
    "vllm:prompt_tokens_cached": "counter",
    "vllm:request_prefill_kv_computed_tokens": "histogram",
    "vllm:estimated_flops_per_gpu": "counter",
    "vllm:estimated_read_bytes_per_gpu": "counter",
    "vllm:estimated_write_bytes_per_gpu": "counter",
}
SINCE_032 = {
    "vllm:admission_rejections": "counter",
    "vllm:prompt_tokens_cached_by_source": "counter",
    "vllm:request_num_preemptions": "histogram",
}
SGLANG = {
    "sglang:num_running_reqs": "gauge",
    "sglang:num_queue_reqs": "gauge",
    "sglang:token_usage": "gauge",
    "sglang:cache_hit_rate": "gauge",
    "sglang:num_used_tokens": "gauge",
    "sglang:prompt_tokens": "counter",
    "sglang:generation_tokens": "counter",
    "sglang:time_to_first_token_seconds": "histogram",
    "sglang:inter_token_latency_seconds": "histogram",
    "sglang:e2e_request_latency_seconds": "histogram",
}

# dialect: (families that must be there with their types, names that must not,
#           the label names every engine sample carries)
EXPECTED: dict[str, tuple[dict[str, str], set[str], set[str]]] = {
    "vllm": (
        {**VLLM_COMMON, **NEW_NAMES},
        {*OLD_NAMES, *OLD_PREFIX_COUNTERS, *V0_GAUGES, *SINCE_025, *SINCE_032},
        {"model_name", "engine"},
    ),
    "vllm-0.25": (
        {**VLLM_COMMON, **NEW_NAMES, **SINCE_025},
        {*OLD_NAMES, *OLD_PREFIX_COUNTERS, *V0_GAUGES, *SINCE_032},
        {"model_name", "engine"},
    ),
    "vllm-0.34": (
        {**VLLM_COMMON, **NEW_NAMES, **SINCE_025, **SINCE_032},
        {*OLD_NAMES, *OLD_PREFIX_COUNTERS, *V0_GAUGES},
        {"model_name", "engine"},
    ),
    "vllm-0.10": (
        {**VLLM_COMMON, **NEW_NAMES, **OLD_NAMES, **OLD_PREFIX_COUNTERS},
        set(V0_GAUGES),
        {"model_name", "engine"},
    ),
    "vllm-0.8": (
        {**VLLM_COMMON, **OLD_NAMES, **OLD_PREFIX_COUNTERS},
        {*NEW_NAMES, *V0_GAUGES},
        {"model_name"},
    ),
    "vllm-v0": (
        {**VLLM_COMMON, **OLD_NAMES, **V0_GAUGES},
        {*NEW_NAMES, *OLD_PREFIX_COUNTERS},
        {"model_name"},
    ),
    "sglang": (
        SGLANG,
        set(VLLM_COMMON),
        {"model_name", "engine_type", "tp_rank", "pp_rank"},
    ),
    # llama-server's --metrics, as its server code registers them: no labels.
    "llamacpp": (
        {
            "llamacpp:prompt_tokens": "counter",
            "llamacpp:prompt_tokens_cached": "counter",
            "llamacpp:prompt_seconds": "counter",
            "llamacpp:tokens_predicted": "counter",
            "llamacpp:tokens_predicted_seconds": "counter",
            "llamacpp:requests_processing": "gauge",
            "llamacpp:requests_deferred": "gauge",
            "llamacpp:n_tokens_max": "gauge",
        },
        set(VLLM_COMMON),
        set(),
    ),
}

#: Labels a family has beside the engine's own.
OWN_LABELS = {"finished_reason", "reason", "source"}
PER_MODEL = ("vllm:admission_rejections",)

PROMPT = " ".join(f"w{i}" for i in range(100))  # 6 full blocks hit on a repeat


def test_every_dialect_has_expectations() -> None:
    assert set(EXPECTED) == set(DIALECTS)


def test_the_simulators_buckets_are_vllms() -> None:
    assert list(TTFT_BUCKETS) == VLLM_TTFT
    assert list(ITL_BUCKETS) == VLLM_ITL
    assert list(E2E_BUCKETS) == VLLM_E2E


def test_the_edges_slo_rules_assume_are_the_engines() -> None:
    # monitor's copy (SLO rules on the engine's histograms) and the simulator's own
    # (standing in for vLLM) are kept apart on purpose, and must agree.
    assert buckets.TTFT_BUCKETS == TTFT_BUCKETS
    assert buckets.ITL_BUCKETS == ITL_BUCKETS
    assert buckets.E2E_BUCKETS == E2E_BUCKETS


async def traffic(http: aiohttp.ClientSession, url: str) -> None:
    for _ in range(2):
        async with http.post(
            f"{url}/v1/completions",
            json={"prompt": PROMPT, "max_tokens": 5, "ignore_eos": True},
        ) as resp:
            assert resp.status == 200


@pytest.mark.asyncio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_every_dialect_parses_with_its_names_types_and_labels(
    dialect: str, start_sim: Any, http: aiohttp.ClientSession
) -> None:
    async with start_sim(metrics_dialect=dialect) as server:
        await traffic(http, server.url)
        async with http.get(f"{server.url}/metrics") as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/plain")
            text = await resp.text()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    present, absent, labels = EXPECTED[dialect]
    for name, kind in present.items():
        assert name in families, f"{dialect}: {name} missing"
        assert families[name].type == kind, f"{dialect}: {name}"
    assert not absent & set(families), dialect
    if dialect == "llamacpp":
        for name in present:
            for sample in families[name].samples:
                assert sample.labels == {}, sample
        return
    prefix, other = (
        ("sglang:", "vllm:") if dialect == "sglang" else ("vllm:", "sglang:")
    )
    assert not [name for name in families if name.startswith(other)]
    engine_families = [f for n, f in families.items() if n.startswith(prefix)]
    for family in engine_families:
        if family.name == "vllm:cache_config_info":
            continue
        # Counted in vLLM's front end, per model: no engine label.
        per_model = family.name.startswith(PER_MODEL)  # its _created too
        want = labels - {"engine"} if per_model else labels
        for sample in family.samples:
            assert set(sample.labels) - {"le", *OWN_LABELS} == want, sample
            assert sample.labels["model_name"] == "sim-tiny"
            if "engine" in want:
                assert sample.labels["engine"] == "0"
    if dialect != "sglang":
        successes = {
            s.labels["finished_reason"]: s.value
            for s in families["vllm:request_success"].samples
            if s.name == "vllm:request_success_total"
        }
        assert successes == {"stop": 0.0, "length": 2.0, "abort": 0.0}


def sample_value(text: str, name: str) -> float:
    values = [
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == name
    ]
    assert len(values) == 1, (name, values)
    return values[0]


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("dialect", "name", "expected"),
    [
        # 2 x 100 tokens queried, 96 hit on the repeat.
        ("vllm", "vllm:prefix_cache_queries_total", 200.0),
        ("vllm", "vllm:prefix_cache_hits_total", 96.0),
        ("vllm-0.10", "vllm:gpu_prefix_cache_hits_total", 96.0),
        ("vllm-0.10", "vllm:prefix_cache_hits_total", 96.0),
        # Early V1 counted blocks: 2 x 6 full blocks queried, 6 hit.
        ("vllm-0.8", "vllm:gpu_prefix_cache_queries_total", 12.0),
        ("vllm-0.8", "vllm:gpu_prefix_cache_hits_total", 6.0),
        ("vllm-v0", "vllm:gpu_prefix_cache_hit_rate", 0.5),
        ("sglang", "sglang:cache_hit_rate", 96 / 200),
        ("sglang", "sglang:cached_tokens_total", 96.0),
    ],
)
async def test_prefix_cache_figures_per_dialect(
    dialect: str,
    name: str,
    expected: float,
    start_sim: Any,
    http: aiohttp.ClientSession,
) -> None:
    async with start_sim(metrics_dialect=dialect) as server:
        await traffic(http, server.url)
        async with http.get(f"{server.url}/metrics") as resp:
            text = await resp.text()
    assert sample_value(text, name) == pytest.approx(expected)


@pytest.mark.asyncio
async def test_histogram_buckets_are_vllms(
    start_sim: Any, http: aiohttp.ClientSession, scrape: Any
) -> None:
    async with start_sim() as server:
        await traffic(http, server.url)
        metrics = await scrape(http, server.url)
    for name, edges in [
        ("vllm:time_to_first_token_seconds", VLLM_TTFT),
        ("vllm:inter_token_latency_seconds", VLLM_ITL),
        ("vllm:e2e_request_latency_seconds", VLLM_E2E),
        ("vllm:request_queue_time_seconds", VLLM_E2E),
    ]:
        les = [float(labels["le"]) for labels in metrics.labels_of(f"{name}_bucket")]
        assert les == [*edges, math.inf], name
        counts = [metrics.get(f"{name}_bucket", le=repr(le)) for le in edges]
        assert counts == sorted(counts), f"{name}: buckets are not cumulative"
    assert metrics.get("vllm:time_to_first_token_seconds_count") == 2
    assert metrics.get("vllm:time_to_first_token_seconds_bucket", le="+Inf") == 2
    # Two requests of five tokens: four gaps each.
    assert metrics.get("vllm:inter_token_latency_seconds_count") == 8
    # Token histograms use vLLM's 1-2-5 buckets up to max_model_len (4096).
    les = [
        labels["le"]
        for labels in metrics.labels_of("vllm:request_prompt_tokens_bucket")
    ]
    assert les[:4] == ["1.0", "2.0", "5.0", "10.0"]
    assert les[-2:] == ["2000.0", "+Inf"]
    assert metrics.get("vllm:request_prompt_tokens_bucket", le="100.0") == 2
    assert metrics.get("vllm:request_prompt_tokens_bucket", le="50.0") == 0


@pytest.mark.asyncio
async def test_cache_config_info_carries_the_cache_shape(
    start_sim: Any, http: aiohttp.ClientSession, scrape: Any
) -> None:
    async with start_sim(num_gpu_blocks=777, block_size=32) as server:
        metrics = await scrape(http, server.url)
    (info,) = metrics.labels_of("vllm:cache_config_info")
    assert info["block_size"] == "32"
    assert info["num_gpu_blocks"] == "777"
    assert info["enable_prefix_caching"] == "True"
    assert metrics.get("vllm:cache_config_info", block_size="32") == 1.0
    assert metrics.types["vllm:cache_config_info"] == "gauge"


@pytest.mark.asyncio
async def test_counters_and_gauges_follow_traffic(
    start_sim: Any, http: aiohttp.ClientSession, scrape: Any
) -> None:
    labels = {"model_name": "sim-tiny", "engine": "0"}
    async with start_sim() as server:
        before = await scrape(http, server.url)
        assert before.get("vllm:prompt_tokens_total", **labels) == 0
        await traffic(http, server.url)
        after = await scrape(http, server.url)
    assert after.get("vllm:prompt_tokens_total", **labels) == 200
    assert after.get("vllm:generation_tokens_total", **labels) == 10
    assert after.get("vllm:request_generation_tokens_sum", **labels) == 10
    assert after.get("vllm:num_requests_running", **labels) == 0
    assert after.get("vllm:num_preemptions_total", **labels) == 0
    assert after.types["vllm:prompt_tokens"] == "counter"


@pytest.mark.asyncio
async def test_a_request_over_the_admission_limit_gets_a_503_and_is_counted(
    start_sim: Any, http: aiohttp.ClientSession
) -> None:
    async with start_sim(metrics_dialect="vllm-0.34", max_num_queued_reqs=1) as sim:
        body = {"prompt": PROMPT, "max_tokens": 2000, "ignore_eos": True}
        async with http.post(
            f"{sim.url}/v1/completions", json={**body, "stream": True}
        ) as first:
            assert first.status == 200
            await first.content.readline()  # in the engine now
            async with http.post(f"{sim.url}/v1/completions", json=body) as second:
                assert second.status == 503
                error = (await second.json())["error"]
                assert "max_num_queued_reqs" in error["message"]
        async with http.get(f"{sim.url}/metrics") as resp:
            text = await resp.text()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    rejected = {
        s.labels["reason"]: s.value
        for s in families["vllm:admission_rejections"].samples
        if s.name.endswith("_total")
    }
    assert rejected == {"max_num_queued_reqs": 1.0, "max_num_queued_tokens": 0.0}
