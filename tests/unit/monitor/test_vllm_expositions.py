"""Expositions made by vLLM's own code in, servemon's schema out.

``tests/data/vllm/`` holds what vLLM 0.25.1, 0.33.0 and 0.34.0's metrics code wrote
after one engine step (``make_expositions.py`` there says how, and regenerates them)
and what a live vLLM 0.32.0 CPU server answered after one request. Nothing in them is
written by hand, so the names, types, labels and bucket edges are the releases' own.
The values servemon publishes are checked against the step the generator fed in, and
for the live server against prometheus_client's parse of the same text.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from servemon.core import names as N
from servemon.monitor.normalize import Normalized, normalize

DATA = Path(__file__).resolve().parents[2] / "data" / "vllm"
GENERATED = ("0.25.1", "0.33.0", "0.34.0")
LIVE = "vllm-0.32.0-live.txt"
MODEL = "tiny-llama"  # the generator's served model name
LIVE_MODEL = "/tmp/vm/hf"

#: vLLM families servemon leaves unmapped, on purpose: sampling parameters, the
#: request's run time (prefill plus decode, both mapped), the largest max_tokens,
#: and the front end's HTTP, process and Python families.
UNMAPPED = {
    "vllm:request_params_n",
    "vllm:request_params_max_tokens",
    "vllm:request_max_num_generation_tokens",
    "vllm:request_inference_time_seconds",
}


@cache
def text(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


def generated(version: str) -> str:
    return text(f"vllm-{version}.txt")


def samples(n: Normalized) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for family in n.families:
        for s in family.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in out, f"published twice: {key}"
            out[key] = s.value
    return out


def get(n: Normalized, name: str, **labels: str) -> float:
    found = samples(n)
    key = (name, frozenset(labels.items()))
    assert key in found, f"{name}{labels} missing; have {sorted({k[0] for k in found})}"
    return found[key]


def engine_labels(model: str = MODEL, **extra: str) -> dict[str, str]:
    return {"target": "t", "model": model, "engine": "vllm", "rank": "0", **extra}


def per_model(model: str = MODEL, **extra: str) -> dict[str, str]:
    return {"target": "t", "model": model, "engine": "vllm", **extra}


def library(source: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """The exposition as prometheus_client's parser reads it (the oracle)."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(source)
        for s in family.samples
    }


def vllm_families(source: str) -> set[str]:
    return {
        f.name
        for f in text_string_to_metric_families(source)
        if f.name.startswith("vllm:") and not f.name.endswith("_created")
    }


def read_sources(n: Normalized, source: str) -> set[str]:
    """The vLLM families the published series were read from."""
    published = {f.name for f in n.families}
    present = vllm_families(source)
    out = set()
    for series in N.ENGINE_SERIES:
        if series.base not in published:
            continue
        for src in series.sources:
            if src.engine != "vllm":
                continue
            for name in (src.name, src.name.removesuffix("_total")):
                if name in present:
                    out.add(name)
                    break
            else:
                continue
            break
    return out | ({"vllm:cache_config_info"} & present)


@pytest.mark.parametrize("version", GENERATED)
def test_every_vllm_family_is_read_or_left_out_on_purpose(version: str) -> None:
    source = generated(version)
    n = normalize(source, target="t")
    assert (n.engine, n.dialect, n.models) == ("vllm", "vllm", {MODEL})
    assert vllm_families(source) - read_sources(n, source) == UNMAPPED


def test_the_live_server_every_family_is_read_or_left_out_on_purpose() -> None:
    source = text(LIVE)
    n = normalize(source, target="t")
    assert (n.engine, n.dialect, n.models) == ("vllm", "vllm", {LIVE_MODEL})
    assert vllm_families(source) - read_sources(n, source) == UNMAPPED


@pytest.mark.parametrize("version", GENERATED)
def test_the_step_the_generator_fed_in(version: str) -> None:
    n = normalize(generated(version), target="t")
    base = engine_labels()
    # Why requests wait: a split of the queue, published beside it, never added.
    assert get(n, N.ENGINE_REQUESTS_WAITING.name, **base) == 2.0
    for reason in ("capacity", "deferred"):
        by_reason = N.ENGINE_REQUESTS_WAITING_BY_REASON.base
        assert get(n, by_reason, **base, reason=reason) == 1.0
    # Prompt tokens by where their KV came from, and what the cache saved.
    assert get(n, N.ENGINE_PROMPT_TOKENS.name, **base) == 96.0
    by_source = {
        source: get(n, N.ENGINE_PROMPT_TOKENS_BY_SOURCE.name, **base, source=source)
        for source in ("local_compute", "local_cache_hit", "external_kv_transfer")
    }
    assert by_source == {
        "local_compute": 64.0,
        "local_cache_hit": 32.0,
        "external_kv_transfer": 0.0,
    }
    assert get(n, N.ENGINE_PROMPT_TOKENS_CACHED.name, **base) == 32.0
    assert get(n, N.ENGINE_PREFIX_HITS.name, **base) == 32.0
    assert get(n, N.ENGINE_EXTERNAL_PREFIX_QUERIES.name, **base) == 0.0
    assert get(n, N.ENGINE_EXTERNAL_PREFIX_HITS.name, **base) == 0.0
    assert get(n, N.ENGINE_MM_CACHE_QUERIES.name, **base) == 0.0
    assert get(n, N.ENGINE_MM_CACHE_HITS.name, **base) == 0.0
    # Batch fullness: one step of 64 prefilled and 8 generated tokens.
    tokens = N.ENGINE_ITERATION_TOKENS.name
    assert get(n, tokens + "_count", **base) == 1.0
    assert get(n, tokens + "_sum", **base) == 72.0
    kv_computed = N.ENGINE_PREFILL_KV_COMPUTED.name
    assert get(n, kv_computed + "_sum", **base) == 64.0
    # The basis of MFU and bandwidth utilization.
    assert get(n, N.ENGINE_ESTIMATED_FLOPS.name, **base) == 4e6
    assert get(n, N.ENGINE_ESTIMATED_READ_BYTES.name, **base) == 6e5
    assert get(n, N.ENGINE_ESTIMATED_WRITE_BYTES.name, **base) == 2e4
    state = N.ENGINE_SLEEP_STATE.base
    assert get(n, state, **base, state="awake") == 1.0
    assert get(n, state, **base, state="discard_all") == 0.0
    assert get(n, N.ENGINE_REQUESTS_FINISHED.name, **base, reason="length") == 1.0
    assert n.info["num_gpu_blocks"] == "512"


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_what_033_added(version: str) -> None:
    n = normalize(generated(version), target="t")
    base = engine_labels()
    # No engine label at the source: counted per model, with no rank.
    rejections = N.ENGINE_ADMISSION_REJECTIONS.name
    assert get(n, rejections, **per_model(reason="max_num_queued_reqs")) == 1.0
    assert get(n, rejections, **per_model(reason="max_num_queued_tokens")) == 0.0
    cached = N.ENGINE_PROMPT_TOKENS_CACHED_BY_SOURCE.name
    assert get(n, cached, **base, source="device") == 32.0
    assert get(n, cached, **base, source="disk") == 0.0
    preemptions = N.ENGINE_REQUEST_PREEMPTIONS.name
    assert get(n, preemptions + "_count", **base) == 1.0
    assert get(n, preemptions + "_sum", **base) == 1.0
    assert get(n, preemptions + "_bucket", **base, le="1.0") == 1.0


def test_0251_has_none_of_what_033_added() -> None:
    published = {f.name for f in normalize(generated("0.25.1"), target="t").families}
    for series in (
        N.ENGINE_ADMISSION_REJECTIONS,
        N.ENGINE_PROMPT_TOKENS_CACHED_BY_SOURCE,
        N.ENGINE_REQUEST_PREEMPTIONS,
        N.ENGINE_RENDER,
    ):
        assert series.base not in published


def test_034_render_time_per_model_and_request_type() -> None:
    n = normalize(generated("0.34.0"), target="t")
    labels = per_model(request_type="chat")
    render = N.ENGINE_RENDER.name
    assert get(n, render + "_count", **labels) == 1.0
    assert get(n, render + "_sum", **labels) == 0.003
    assert get(n, render + "_bucket", **labels, le="0.005") == 1.0
    assert get(n, render + "_bucket", **labels, le="0.0025") == 0.0
    assert N.ENGINE_RENDER.base not in {
        f.name for f in normalize(generated("0.33.0"), target="t").families
    }


#: servemon's sample <- the live server's sample (labels besides model_name/engine).
LIVE_PAIRS = [
    (N.ENGINE_REQUESTS_WAITING_BY_REASON.base, {"reason": "capacity"},
     "vllm:num_requests_waiting_by_reason", {"reason": "capacity"}),
    (N.ENGINE_SLEEP_STATE.base, {"state": "awake"},
     "vllm:engine_sleep_state", {"sleep_state": "awake"}),
    (N.ENGINE_PROMPT_TOKENS_BY_SOURCE.name, {"source": "local_compute"},
     "vllm:prompt_tokens_by_source_total", {"source": "local_compute"}),
    (N.ENGINE_PROMPT_TOKENS_CACHED.name, {},
     "vllm:prompt_tokens_cached_total", {}),
    (N.ENGINE_PROMPT_TOKENS_CACHED_BY_SOURCE.name, {"source": "host"},
     "vllm:prompt_tokens_cached_by_source_total", {"source": "host"}),
    (N.ENGINE_ITERATION_TOKENS.name + "_count", {},
     "vllm:iteration_tokens_total_count", {}),
    (N.ENGINE_ITERATION_TOKENS.name + "_sum", {},
     "vllm:iteration_tokens_total_sum", {}),
    (N.ENGINE_ITERATION_TOKENS.name + "_bucket", {"le": "8.0"},
     "vllm:iteration_tokens_total_bucket", {"le": "8.0"}),
    (N.ENGINE_REQUEST_PREEMPTIONS.name + "_count", {},
     "vllm:request_num_preemptions_count", {}),
    (N.ENGINE_PREFILL_KV_COMPUTED.name + "_sum", {},
     "vllm:request_prefill_kv_computed_tokens_sum", {}),
    (N.ENGINE_ESTIMATED_FLOPS.name, {}, "vllm:estimated_flops_per_gpu_total", {}),
    (N.ENGINE_EXTERNAL_PREFIX_HITS.name, {},
     "vllm:external_prefix_cache_hits_total", {}),
    (N.ENGINE_MM_CACHE_QUERIES.name, {}, "vllm:mm_cache_queries_total", {}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("ours", "our_labels", "theirs", "their_labels"),
    LIVE_PAIRS,
    ids=[pair[0] + str(sorted(pair[1].values())) for pair in LIVE_PAIRS],
)
def test_the_live_server_values(
    ours: str, our_labels: dict[str, str], theirs: str, their_labels: dict[str, str]
) -> None:
    source = text(LIVE)
    want = library(source)[
        (
            theirs,
            frozenset(
                {"model_name": LIVE_MODEL, "engine": "0", **their_labels}.items()
            ),
        )
    ]
    n = normalize(source, target="t")
    assert get(n, ours, **engine_labels(LIVE_MODEL, **our_labels)) == want


def test_the_live_server_admission_rejections_have_no_rank() -> None:
    n = normalize(text(LIVE), target="t")
    rejections = N.ENGINE_ADMISSION_REJECTIONS.name
    for reason in ("max_num_queued_reqs", "max_num_queued_tokens"):
        assert get(n, rejections, **per_model(LIVE_MODEL, reason=reason)) == 0.0
    # The live server generated 8 tokens in 8 steps: 7 prompt tokens in the first.
    iteration = N.ENGINE_ITERATION_TOKENS.name
    assert get(n, iteration + "_sum", **engine_labels(LIVE_MODEL)) == 15.0


#: The OffloadingConnector's families servemon leaves unmapped: transfer sizes and
#: lookup delays (histograms), the CPU buffer's usage and allocations, failed
#: allocations, the static config, and the deprecated spellings (read only where the
#: flat names are absent); for a KV consumer, the stages of async KV loads; and
#: speculative decoding's acceptances per draft position.
OPTIONAL_UNMAPPED = {
    "vllm:num_requests_kv_fetch_by_stage",
    "vllm:spec_decode_num_accepted_tokens_per_pos",
    "vllm:kv_offload_size",
    "vllm:kv_offload_load_size",
    "vllm:kv_offload_store_size",
    "vllm:kv_offload_cpu_cache_usage_perc",
    "vllm:kv_offload_cpu_cache_read_usage_perc",
    "vllm:kv_offload_cpu_cache_write_usage_perc",
    "vllm:kv_offload_cpu_allocation_size",
    "vllm:kv_offload_lookup_sync_delay_seconds",
    "vllm:kv_offload_lookup_async_delay_seconds",
    "vllm:kv_offload_allocation_failure",
    "vllm:kv_offload_config_info",
    "vllm:kv_offload_total_bytes",
    "vllm:kv_offload_total_time",
}


def optional(version: str) -> str:
    """The exposition with the OffloadingConnector and n-gram spec decoding on."""
    return text(f"vllm-{version}-kv-offload-spec-decode.txt")


@pytest.mark.parametrize("version", ["0.25.1", "0.34.0"])
def test_spec_decode_counters(version: str) -> None:
    n = normalize(optional(version), target="t")
    base = engine_labels()
    assert get(n, N.ENGINE_SPEC_DRAFTS.name, **base) == 2.0
    assert get(n, N.ENGINE_SPEC_DRAFT_TOKENS.name, **base) == 6.0
    assert get(n, N.ENGINE_SPEC_ACCEPTED_TOKENS.name, **base) == 3.0


@pytest.mark.parametrize("version", ["0.25.1", "0.34.0"])
def test_kv_offload_read_once_from_the_flat_names(version: str) -> None:
    source = optional(version)
    n = normalize(source, target="t")
    base = engine_labels()
    # vLLM writes the same transfers under the deprecated names too: read once.
    got = {
        series.name: get(n, series.name, **base)
        for series in (
            N.ENGINE_KV_OFFLOAD_LOAD_BYTES,
            N.ENGINE_KV_OFFLOAD_STORE_BYTES,
            N.ENGINE_KV_OFFLOAD_LOAD_SECONDS,
            N.ENGINE_KV_OFFLOAD_STORE_SECONDS,
        )
    }
    assert got == {
        N.ENGINE_KV_OFFLOAD_LOAD_BYTES.name: 65536.0,
        N.ENGINE_KV_OFFLOAD_STORE_BYTES.name: 131072.0,
        N.ENGINE_KV_OFFLOAD_LOAD_SECONDS.name: 0.002,
        N.ENGINE_KV_OFFLOAD_STORE_SECONDS.name: 0.003,
    }
    left = vllm_families(source) - read_sources(n, source) - UNMAPPED
    assert left == {f for f in OPTIONAL_UNMAPPED if f in vllm_families(source)}


def test_kv_offload_deprecated_split_alone_is_read_per_direction() -> None:
    """The same exposition without the flat names (as a release that had only the
    deprecated ones would write it): each direction from its transfer_type."""
    flat = ("load_bytes", "store_bytes", "load_time", "store_time")
    lines = [
        line
        for line in optional("0.34.0").splitlines(keepends=True)
        if not any(f"vllm:kv_offload_{name}_" in line for name in flat)
    ]
    n = normalize("".join(lines), target="t")
    base = engine_labels()
    assert get(n, N.ENGINE_KV_OFFLOAD_LOAD_BYTES.name, **base) == 65536.0
    assert get(n, N.ENGINE_KV_OFFLOAD_STORE_BYTES.name, **base) == 131072.0
    assert get(n, N.ENGINE_KV_OFFLOAD_STORE_SECONDS.name, **base) == 0.003
