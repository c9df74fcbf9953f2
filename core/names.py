"""servemon's metric vocabulary: the one table every published name comes from.

Each :class:`Series` is one metric family as servemon publishes it: its full name
(counters with ``_total``, as they appear in the exposition), type, unit, help text
and labels. Code that publishes or queries a servemon series takes it from here; no
code builds a metric name from pieces. ``docs/metrics.md`` is generated from this
table.

Engine series carry their :class:`Source` names per engine and version: the exporter
maps every known spelling to one servemon name (the first source present wins, so a
version that emits a deprecated name beside the new one is read once), and the
reference lists them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

__all__ = [
    "CLIENT_CPU",
    "CLIENT_CURRENT_STAGE",
    "CLIENT_DISPATCH_LAG",
    "CLIENT_E2E",
    "CLIENT_HELD_BACK",
    "CLIENT_IN_FLIGHT",
    "CLIENT_ITL",
    "CLIENT_LIMITED",
    "CLIENT_LOOP_DELAY",
    "CLIENT_OUTPUT_TOKENS",
    "CLIENT_PROMPT_TOKENS",
    "CLIENT_REQUESTS",
    "CLIENT_SERIES",
    "CLIENT_SKIPPED",
    "CLIENT_TARGET_RATE",
    "CLIENT_TPOT",
    "CLIENT_TTFC",
    "CLIENT_TTFT",
    "ENGINE_ADMISSION_REJECTIONS",
    "ENGINE_DECODE",
    "ENGINE_E2E",
    "ENGINE_ESTIMATED_FLOPS",
    "ENGINE_ESTIMATED_READ_BYTES",
    "ENGINE_ESTIMATED_WRITE_BYTES",
    "ENGINE_EXTERNAL_PREFIX_HITS",
    "ENGINE_EXTERNAL_PREFIX_QUERIES",
    "ENGINE_GENERATION_LENGTH",
    "ENGINE_GENERATION_TOKENS",
    "ENGINE_INFO",
    "ENGINE_ITERATION_TOKENS",
    "ENGINE_ITL",
    "ENGINE_KV_CACHE_USAGE",
    "ENGINE_KV_OFFLOAD_LOAD_BYTES",
    "ENGINE_KV_OFFLOAD_LOAD_SECONDS",
    "ENGINE_KV_OFFLOAD_STORE_BYTES",
    "ENGINE_KV_OFFLOAD_STORE_SECONDS",
    "ENGINE_LORA_ACTIVE",
    "ENGINE_LORA_MAX",
    "ENGINE_LORA_RUNNING",
    "ENGINE_LORA_WAITING",
    "ENGINE_MM_CACHE_HITS",
    "ENGINE_MM_CACHE_QUERIES",
    "ENGINE_PREEMPTIONS",
    "ENGINE_PREFILL",
    "ENGINE_PREFILL_KV_COMPUTED",
    "ENGINE_PREFIX_HITS",
    "ENGINE_PREFIX_HIT_RATIO",
    "ENGINE_PREFIX_QUERIES",
    "ENGINE_PROMPT_LENGTH",
    "ENGINE_PROMPT_TOKENS",
    "ENGINE_PROMPT_TOKENS_BY_SOURCE",
    "ENGINE_PROMPT_TOKENS_CACHED",
    "ENGINE_PROMPT_TOKENS_CACHED_BY_SOURCE",
    "ENGINE_QUEUE",
    "ENGINE_RENDER",
    "ENGINE_REQUESTS_FINISHED",
    "ENGINE_REQUESTS_RUNNING",
    "ENGINE_REQUESTS_WAITING",
    "ENGINE_REQUESTS_WAITING_BY_REASON",
    "ENGINE_REQUEST_PREEMPTIONS",
    "ENGINE_SERIES",
    "ENGINE_SLEEP_STATE",
    "ENGINE_SPEC_ACCEPTED_TOKENS",
    "ENGINE_SPEC_DRAFTS",
    "ENGINE_SPEC_DRAFT_TOKENS",
    "ENGINE_TPOT",
    "ENGINE_TTFT",
    "GPU_ECC_ERRORS",
    "GPU_ENERGY",
    "GPU_MEMORY_BANDWIDTH_PEAK",
    "GPU_MEMORY_CLOCK",
    "GPU_MEMORY_TOTAL",
    "GPU_MEMORY_USED",
    "GPU_MEMORY_UTILIZATION",
    "GPU_PCIE_RX",
    "GPU_PCIE_TX",
    "GPU_POWER",
    "GPU_POWER_LIMIT",
    "GPU_PROCESS_MEMORY",
    "GPU_SAMPLE_AGE",
    "GPU_SERIES",
    "GPU_SM_CLOCK",
    "GPU_TEMPERATURE",
    "GPU_THROTTLE",
    "GPU_UP",
    "GPU_UTILIZATION",
    "PROBE_E2E",
    "PROBE_REQUESTS",
    "PROBE_TTFT",
    "SCHEMA",
    "TARGET_SCRAPE_DURATION",
    "TARGET_SCRAPE_ERRORS",
    "TARGET_UP",
    "Series",
    "Source",
]

Kind = Literal["counter", "gauge", "histogram"]
#: How a source is read: its samples' values (``value``), or the labels of its
#: newest sample, the one with the largest value (vLLM stamps ``lora_requests_info``
#: with the wall-clock time and keeps every label set it ever had): the ``count``
#: of comma-joined names in ``label``, the ``number`` ``label`` holds, or
#: ``members``: per name any sample lists in one of the comma-separated labels of
#: ``label`` (``running_lora_adapters``: state ``running``, the label's name up to
#: its first ``_``), 1 if the newest sample lists it there, else 0.
Read = Literal["value", "count", "number", "members"]


@dataclass(frozen=True, slots=True)
class Source:
    """An engine's own name for a series, as its ``/metrics`` exposes it."""

    engine: str
    name: str
    versions: str
    note: str = ""
    read: Read = "value"
    label: str = ""
    #: The labels kept beyond the common ones (``target``, ``model``, ``engine``,
    #: ``rank``): per label of the series, ``(servemon's label, the engine's label,
    #: the value where the engine gives none)``. Every other engine label is dropped.
    keep: tuple[tuple[str, str, str], ...] = ()
    #: Only the samples whose labels hold these values: a deprecated family that one
    #: label splits, where the newer spelling has a family per value.
    where: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Series:
    """One published metric family."""

    name: str
    kind: Kind
    unit: str
    doc: str
    labels: tuple[str, ...]
    sources: tuple[Source, ...] = ()

    @property
    def base(self) -> str:
        """The name prometheus_client takes: a counter's name without ``_total``."""
        return self.name.removesuffix("_total") if self.kind == "counter" else self.name

    def family(self, rows: Iterable[tuple[Mapping[str, str], float]] = ()) -> Metric:
        """This series as a prometheus_client metric family (for a collector): a
        sample per ``(labels, value)`` row, for a gauge or a counter; a histogram's
        family comes empty (samples are added to it)."""
        if self.kind == "histogram":
            if any(True for _ in rows):
                raise ValueError(f"{self.name}: a histogram takes no rows")
            return HistogramMetricFamily(self.base, self.doc, labels=self.labels)
        family: CounterMetricFamily | GaugeMetricFamily
        if self.kind == "counter":
            family = CounterMetricFamily(self.base, self.doc, labels=self.labels)
        else:
            family = GaugeMetricFamily(self.base, self.doc, labels=self.labels)
        for labels, value in rows:
            family.add_metric([labels[k] for k in self.labels], value)
        return family

    def counter(self, registry: CollectorRegistry) -> Counter:
        """This counter series as a prometheus_client ``Counter`` on ``registry``."""
        self._expect("counter")
        return Counter(self.base, self.doc, self.labels, registry=registry)

    def gauge(self, registry: CollectorRegistry) -> Gauge:
        """This gauge series as a prometheus_client ``Gauge`` on ``registry``."""
        self._expect("gauge")
        return Gauge(self.base, self.doc, self.labels, registry=registry)

    def histogram(
        self, registry: CollectorRegistry, buckets: Sequence[float]
    ) -> Histogram:
        """This histogram series as a prometheus_client ``Histogram`` on
        ``registry``, with bucket edges ``buckets``."""
        self._expect("histogram")
        return Histogram(
            self.base, self.doc, self.labels, registry=registry, buckets=buckets
        )

    def _expect(self, kind: Kind) -> None:
        if self.kind != kind:
            raise TypeError(f"{self.name} is a {self.kind}, not a {kind}")


_CLIENT = ("target", "model", "stage")

CLIENT_REQUESTS = Series(
    "servemon_client_requests_total",
    "counter",
    "requests",
    "Finished requests by outcome (ok, http_error, timeout, connect_error, "
    "stream_error, response_too_large, cancelled).",
    (*_CLIENT, "outcome"),
)
CLIENT_TTFT = Series(
    "servemon_client_ttft_seconds",
    "histogram",
    "seconds",
    "Time to first token: first chunk with content minus actual send.",
    _CLIENT,
)
CLIENT_TTFC = Series(
    "servemon_client_ttfc_seconds",
    "histogram",
    "seconds",
    "Time to first SSE chunk of any kind (a role-only chunk counts) minus actual send.",
    _CLIENT,
)
CLIENT_ITL = Series(
    "servemon_client_itl_seconds",
    "histogram",
    "seconds",
    "Inter-token latency: each gap between consecutive content chunks.",
    _CLIENT,
)
CLIENT_TPOT = Series(
    "servemon_client_tpot_seconds",
    "histogram",
    "seconds",
    "Time per output token per request: (E2E - TTFT) / (output tokens - 1).",
    _CLIENT,
)
CLIENT_E2E = Series(
    "servemon_client_e2e_seconds",
    "histogram",
    "seconds",
    "End-to-end latency: last byte minus actual send.",
    _CLIENT,
)
CLIENT_DISPATCH_LAG = Series(
    "servemon_client_dispatch_lag_seconds",
    "histogram",
    "seconds",
    "Actual send minus scheduled send: how far the client fell behind its schedule.",
    _CLIENT,
)
CLIENT_OUTPUT_TOKENS = Series(
    "servemon_client_output_tokens_total",
    "counter",
    "tokens",
    "Output tokens of finished requests (usage, tokenizer or chunk count).",
    _CLIENT,
)
CLIENT_PROMPT_TOKENS = Series(
    "servemon_client_prompt_tokens_total",
    "counter",
    "tokens",
    "Prompt tokens of finished requests, as the server's usage reports them.",
    _CLIENT,
)
CLIENT_TARGET_RATE = Series(
    "servemon_client_target_requests_per_second",
    "gauge",
    "requests/s",
    "The schedule's target request rate now (0 between stages and for closed loops).",
    ("target", "model"),
)
CLIENT_IN_FLIGHT = Series(
    "servemon_client_in_flight_requests",
    "gauge",
    "requests",
    "Requests sent and not yet finished.",
    ("target", "model"),
)
CLIENT_CURRENT_STAGE = Series(
    "servemon_client_current_stage",
    "gauge",
    "index",
    "Index of the stage (ramp) or level (sweep) being run; -1 when none.",
    ("target", "model"),
)
CLIENT_HELD_BACK = Series(
    "servemon_client_held_back_total",
    "counter",
    "requests",
    "Requests that were due while --max-inflight requests were in flight and had to "
    "wait for a slot.",
    _CLIENT,
)
CLIENT_SKIPPED = Series(
    "servemon_client_skipped_total",
    "counter",
    "requests",
    "Requests never sent, by reason (late: past --late-tolerance with --late skip).",
    (*_CLIENT, "reason"),
)
CLIENT_RECONNECTS = Series(
    "servemon_client_reconnects_total",
    "counter",
    "requests",
    "Requests sent again at once on a new connection because the server had closed "
    "the idle pooled connection they went out on (nothing reached the server).",
    _CLIENT,
)
CLIENT_SERVER_QUEUE = Series(
    "servemon_client_server_queue_seconds",
    "histogram",
    "seconds",
    "Queue time the server reported for each ok request (vLLM's per-request "
    "metrics: scheduled minus queued).",
    _CLIENT,
)
CLIENT_TTFT_GAP = Series(
    "servemon_client_ttft_gap_seconds",
    "histogram",
    "seconds",
    "Client TTFT minus the server-reported queue and prefill time: network, HTTP "
    "and the server's front end (llama.cpp: the wait for a slot too).",
    _CLIENT,
)
CLIENT_CPU = Series(
    "servemon_client_cpu_ratio",
    "gauge",
    "cores",
    "CPU the load generator's process used over the last check (about a second), in "
    "cores; its event loop has one, so near 1 it is the limit.",
    ("target", "model"),
)
CLIENT_LOOP_DELAY = Series(
    "servemon_client_event_loop_delay_seconds",
    "gauge",
    "seconds",
    "How late the load generator's event loop woke at worst over the last check: "
    "streams read meanwhile got late timestamps.",
    ("target", "model"),
)
CLIENT_LIMITED = Series(
    "servemon_client_limited_seconds_total",
    "counter",
    "seconds",
    "Seconds during which the load generator itself was the limit, by reason: lag "
    "(behind its schedule), loop (event loop blocked), cpu (its core full).",
    (*_CLIENT, "reason"),
)


# -- engine (normalized from the target's /metrics) ---------------------------------

_ENGINE = ("target", "model", "engine", "rank")
V1 = "V1 >= 0.9"
V1_ALL = "V1"
V0 = "V0 (<= 0.10)"
OLD = "V1 0.8, deprecated in 0.9-0.10, hidden in 0.11"
#: Read from the released wheels (0.11.0, 0.25.1, the 0.32.0 CPU build, 0.33.0,
#: 0.34.0): new after 0.11 and in 0.25.1 on, new after 0.25.1 and in 0.32.0 on, new
#: in 0.34.0.
V025 = "not in 0.11, in 0.25.1 on"
V032 = "not in 0.25.1, in 0.32.0 on"
V034 = "0.34.0 on"


def _vllm(name: str, versions: str = "all", note: str = "") -> Source:
    return Source("vllm", name, versions, note)


def _keep(ours: str, theirs: str, default: str = "") -> tuple[tuple[str, str, str]]:
    return ((ours, theirs, default),)


def _lora(read: Read, label: str, note: str) -> Source:
    return Source("vllm", "vllm:lora_requests_info", "with LoRA", note, read, label)


ENGINE_REQUESTS_RUNNING = Series(
    "servemon_engine_requests_running",
    "gauge",
    "requests",
    "Requests in the engine's running batch.",
    _ENGINE,
    (
        _vllm("vllm:num_requests_running"),
        Source("sglang", "sglang:num_running_reqs", "all"),
        Source("tgi", "tgi_batch_current_size", "all"),
        Source("llamacpp", "llamacpp:requests_processing", "all"),
    ),
)
ENGINE_REQUESTS_WAITING = Series(
    "servemon_engine_requests_waiting",
    "gauge",
    "requests",
    "Requests waiting in the engine's queue.",
    _ENGINE,
    (
        _vllm("vllm:num_requests_waiting"),
        Source("sglang", "sglang:num_queue_reqs", "all"),
        Source("tgi", "tgi_queue_size", "all"),
        Source("llamacpp", "llamacpp:requests_deferred", "all"),
    ),
)
ENGINE_KV_CACHE_USAGE = Series(
    "servemon_engine_kv_cache_usage_ratio",
    "gauge",
    "ratio",
    "KV cache in use, 0-1.",
    _ENGINE,
    (
        _vllm("vllm:kv_cache_usage_perc", V1, "a fraction despite the name"),
        _vllm("vllm:gpu_cache_usage_perc", "V0, V1 0.8; deprecated 0.9-0.10"),
        Source("sglang", "sglang:token_usage", "all"),
        Source("llamacpp", "llamacpp:kv_cache_usage_ratio", "older builds"),
    ),
)
ENGINE_PREFIX_QUERIES = Series(
    "servemon_engine_prefix_cache_queries_total",
    "counter",
    "tokens (blocks: vLLM 0.8)",
    "Prefix-cache lookups, in the engine's unit (servemon_engine_info "
    "prefix_cache_unit).",
    _ENGINE,
    (
        _vllm("vllm:prefix_cache_queries_total", V1, "tokens"),
        _vllm(
            "vllm:gpu_prefix_cache_queries_total", OLD, "blocks in 0.8, tokens after"
        ),
    ),
)
ENGINE_PREFIX_HITS = Series(
    "servemon_engine_prefix_cache_hits_total",
    "counter",
    "tokens (blocks: vLLM 0.8)",
    "Prefix-cache hits, in the same unit as the queries.",
    _ENGINE,
    (
        _vllm("vllm:prefix_cache_hits_total", V1, "tokens"),
        _vllm("vllm:gpu_prefix_cache_hits_total", OLD, "blocks in 0.8, tokens after"),
        Source("sglang", "sglang:cached_tokens_total", "all", "hits only"),
        Source(
            "llamacpp",
            "llamacpp:prompt_tokens_cached_total",
            "recent builds (seen in b11434)",
            "hits only",
        ),
    ),
)
ENGINE_PREFIX_HIT_RATIO = Series(
    "servemon_engine_prefix_cache_hit_ratio",
    "gauge",
    "ratio",
    "Prefix-cache hit ratio where the engine gives only a ratio (no counters).",
    _ENGINE,
    (
        _vllm("vllm:gpu_prefix_cache_hit_rate", V0),
        Source("sglang", "sglang:cache_hit_rate", "all"),
    ),
)
ENGINE_PREEMPTIONS = Series(
    "servemon_engine_preemptions_total",
    "counter",
    "preemptions",
    "Requests preempted (evicted from the batch to free KV blocks).",
    _ENGINE,
    (
        _vllm("vllm:num_preemptions_total"),
        Source("sglang", "sglang:num_retracted_reqs_total", "newer"),
    ),
)
ENGINE_PROMPT_TOKENS = Series(
    "servemon_engine_prompt_tokens_total",
    "counter",
    "tokens",
    "Prompt (prefill) tokens processed.",
    _ENGINE,
    (
        _vllm("vllm:prompt_tokens_total"),
        Source("sglang", "sglang:prompt_tokens_total", "all"),
        Source("llamacpp", "llamacpp:prompt_tokens_total", "all"),
    ),
)
ENGINE_GENERATION_TOKENS = Series(
    "servemon_engine_generation_tokens_total",
    "counter",
    "tokens",
    "Generated tokens.",
    _ENGINE,
    (
        _vllm("vllm:generation_tokens_total"),
        Source("sglang", "sglang:generation_tokens_total", "all"),
        Source("llamacpp", "llamacpp:tokens_predicted_total", "all"),
    ),
)
ENGINE_REQUESTS_FINISHED = Series(
    "servemon_engine_requests_finished_total",
    "counter",
    "requests",
    "Finished requests by reason (stop, length, abort, ...).",
    (*_ENGINE, "reason"),
    (
        Source(
            "vllm",
            "vllm:request_success_total",
            "all",
            "finished_reason -> reason",
            keep=_keep("reason", "finished_reason", "stop"),
        ),
        Source(
            "tgi",
            "tgi_request_success_total",
            "all",
            "reason=stop",
            keep=_keep("reason", "finished_reason", "stop"),
        ),
    ),
)
ENGINE_TTFT = Series(
    "servemon_engine_ttft_seconds",
    "histogram",
    "seconds",
    "Time to first token as the server measures it.",
    _ENGINE,
    (
        _vllm("vllm:time_to_first_token_seconds"),
        Source("sglang", "sglang:time_to_first_token_seconds", "all"),
    ),
)
ENGINE_ITL = Series(
    "servemon_engine_itl_seconds",
    "histogram",
    "seconds",
    "Inter-token latency as the server measures it.",
    _ENGINE,
    (
        _vllm("vllm:inter_token_latency_seconds", "V1 >= 0.10"),
        _vllm("vllm:time_per_output_token_seconds", "<= 0.10, hidden in 0.12"),
        Source("sglang", "sglang:inter_token_latency_seconds", "newer"),
        Source("sglang", "sglang:time_per_output_token_seconds", "older"),
    ),
)
ENGINE_TPOT = Series(
    "servemon_engine_tpot_seconds",
    "histogram",
    "seconds",
    "Per-request time per output token as the server measures it.",
    _ENGINE,
    (
        _vllm("vllm:request_time_per_output_token_seconds", "V1 >= 0.10.2"),
        Source("tgi", "tgi_request_mean_time_per_token_duration", "all"),
    ),
)
ENGINE_E2E = Series(
    "servemon_engine_e2e_seconds",
    "histogram",
    "seconds",
    "End-to-end request latency as the server measures it.",
    _ENGINE,
    (
        _vllm("vllm:e2e_request_latency_seconds"),
        Source("sglang", "sglang:e2e_request_latency_seconds", "all"),
        Source("tgi", "tgi_request_duration", "all"),
    ),
)
ENGINE_QUEUE = Series(
    "servemon_engine_queue_seconds",
    "histogram",
    "seconds",
    "Time requests spent waiting in the queue.",
    _ENGINE,
    (
        _vllm("vllm:request_queue_time_seconds"),
        Source("sglang", "sglang:queue_time_seconds", "newer"),
        Source("tgi", "tgi_request_queue_duration", "all"),
    ),
)
ENGINE_PREFILL = Series(
    "servemon_engine_prefill_seconds",
    "histogram",
    "seconds",
    "Time requests spent in prefill.",
    _ENGINE,
    (_vllm("vllm:request_prefill_time_seconds"),),
)
ENGINE_DECODE = Series(
    "servemon_engine_decode_seconds",
    "histogram",
    "seconds",
    "Time requests spent in decode.",
    _ENGINE,
    (_vllm("vllm:request_decode_time_seconds"),),
)
ENGINE_PROMPT_LENGTH = Series(
    "servemon_engine_request_prompt_tokens",
    "histogram",
    "tokens",
    "Prompt length per finished request.",
    _ENGINE,
    (
        _vllm("vllm:request_prompt_tokens"),
        Source("tgi", "tgi_request_input_length", "all"),
    ),
)
ENGINE_GENERATION_LENGTH = Series(
    "servemon_engine_request_generation_tokens",
    "histogram",
    "tokens",
    "Output length per finished request.",
    _ENGINE,
    (
        _vllm("vllm:request_generation_tokens"),
        Source("tgi", "tgi_request_generated_tokens", "all"),
    ),
)
_PER_MODEL = ("target", "model", "engine")


def _vllm_keep(
    name: str, versions: str, ours: str, theirs: str, note: str = ""
) -> Source:
    return Source("vllm", name, versions, note, keep=_keep(ours, theirs))


ENGINE_REQUESTS_WAITING_BY_REASON = Series(
    "servemon_engine_requests_waiting_by_reason",
    "gauge",
    "requests",
    "Waiting requests by why they wait: capacity (no room in the running batch or "
    "the KV cache), deferred (LoRA budget, KV transfer, blocked). The reasons split "
    "servemon_engine_requests_waiting: never add the two.",
    (*_ENGINE, "reason"),
    (_vllm_keep("vllm:num_requests_waiting_by_reason", V025, "reason", "reason"),),
)
ENGINE_ADMISSION_REJECTIONS = Series(
    "servemon_engine_admission_rejections_total",
    "counter",
    "requests",
    "Requests the engine refused at admission because a queue limit was reached, "
    "by reason (max_num_queued_reqs, max_num_queued_tokens): load shed, errors to "
    "the client. Per model, not per rank (the engine counts it in its front end).",
    (*_PER_MODEL, "reason"),
    (
        _vllm_keep(
            "vllm:admission_rejections_total",
            V032,
            "reason",
            "reason",
            "no engine label",
        ),
    ),
)
ENGINE_PROMPT_TOKENS_BY_SOURCE = Series(
    "servemon_engine_prompt_tokens_by_source_total",
    "counter",
    "tokens",
    "Prompt tokens by where their KV came from: local_compute (prefilled), "
    "local_cache_hit (prefix cache), external_kv_transfer (a KV connector). A split "
    "of servemon_engine_prompt_tokens_total.",
    (*_ENGINE, "source"),
    (_vllm_keep("vllm:prompt_tokens_by_source_total", V025, "source", "source"),),
)
ENGINE_PROMPT_TOKENS_CACHED = Series(
    "servemon_engine_prompt_tokens_cached_total",
    "counter",
    "tokens",
    "Prompt tokens not prefilled because their KV was cached (local and external "
    "caches): what the cache saved.",
    _ENGINE,
    (
        _vllm("vllm:prompt_tokens_cached_total", V025),
        Source("sglang", "sglang:cached_tokens_total", "all"),
        Source(
            "llamacpp",
            "llamacpp:prompt_tokens_cached_total",
            "recent builds (seen in b11434)",
        ),
    ),
)
ENGINE_PROMPT_TOKENS_CACHED_BY_SOURCE = Series(
    "servemon_engine_prompt_tokens_cached_by_source_total",
    "counter",
    "tokens",
    "Cached prompt tokens by the tier that held them: device, host, p2p, disk, "
    "external_unspecified. A split of servemon_engine_prompt_tokens_cached_total.",
    (*_ENGINE, "source"),
    (
        _vllm_keep(
            "vllm:prompt_tokens_cached_by_source_total", V032, "source", "source"
        ),
    ),
)
ENGINE_EXTERNAL_PREFIX_QUERIES = Series(
    "servemon_engine_external_prefix_cache_queries_total",
    "counter",
    "tokens",
    "Lookups in an external KV cache (a KV connector: LMCache, NIXL, ...).",
    _ENGINE,
    (_vllm("vllm:external_prefix_cache_queries_total", V025),),
)
ENGINE_EXTERNAL_PREFIX_HITS = Series(
    "servemon_engine_external_prefix_cache_hits_total",
    "counter",
    "tokens",
    "Hits in an external KV cache, in the same unit as its queries.",
    _ENGINE,
    (_vllm("vllm:external_prefix_cache_hits_total", V025),),
)
ENGINE_MM_CACHE_QUERIES = Series(
    "servemon_engine_mm_cache_queries_total",
    "counter",
    "items",
    "Lookups in the multimodal input cache (multimodal models).",
    _ENGINE,
    (_vllm("vllm:mm_cache_queries_total", V025),),
)
ENGINE_MM_CACHE_HITS = Series(
    "servemon_engine_mm_cache_hits_total",
    "counter",
    "items",
    "Hits in the multimodal input cache.",
    _ENGINE,
    (_vllm("vllm:mm_cache_hits_total", V025),),
)
ENGINE_ITERATION_TOKENS = Series(
    "servemon_engine_iteration_tokens",
    "histogram",
    "tokens",
    "Tokens per engine step (prefill and decode together): how full each batch is "
    "against the token budget.",
    _ENGINE,
    (_vllm("vllm:iteration_tokens_total", "all", "a histogram despite the name"),),
)
ENGINE_REQUEST_PREEMPTIONS = Series(
    "servemon_engine_request_preemptions",
    "histogram",
    "preemptions",
    "Preemptions per finished request.",
    _ENGINE,
    (_vllm("vllm:request_num_preemptions", V032),),
)
ENGINE_PREFILL_KV_COMPUTED = Series(
    "servemon_engine_request_prefill_kv_computed_tokens",
    "histogram",
    "tokens",
    "Prompt tokens per request whose KV was computed in prefill (cached ones "
    "excluded).",
    _ENGINE,
    (_vllm("vllm:request_prefill_kv_computed_tokens", V025),),
)
ENGINE_ESTIMATED_FLOPS = Series(
    "servemon_engine_estimated_flops_per_gpu_total",
    "counter",
    "FLOP",
    "Floating-point operations per GPU, as the engine estimates them from the "
    "model's shape: over the GPU's peak FLOP/s, the model FLOPs utilization (MFU).",
    _ENGINE,
    (
        _vllm(
            "vllm:estimated_flops_per_gpu_total",
            V025,
            "always listed, counted with --enable-mfu-metrics",
        ),
    ),
)
ENGINE_ESTIMATED_READ_BYTES = Series(
    "servemon_engine_estimated_read_bytes_per_gpu_total",
    "counter",
    "bytes",
    "Bytes read from GPU memory per GPU, as the engine estimates them (with the "
    "bytes written, over the peak bandwidth: memory-bandwidth utilization).",
    _ENGINE,
    (_vllm("vllm:estimated_read_bytes_per_gpu_total", V025, "--enable-mfu-metrics"),),
)
ENGINE_ESTIMATED_WRITE_BYTES = Series(
    "servemon_engine_estimated_write_bytes_per_gpu_total",
    "counter",
    "bytes",
    "Bytes written to GPU memory per GPU, as the engine estimates them.",
    _ENGINE,
    (_vllm("vllm:estimated_write_bytes_per_gpu_total", V025, "--enable-mfu-metrics"),),
)
ENGINE_SLEEP_STATE = Series(
    "servemon_engine_sleep_state",
    "gauge",
    "bool",
    "1 for the engine's sleep state now (awake, weights_offloaded: sleep level 1, "
    "discard_all: sleep level 2), 0 for the others.",
    (*_ENGINE, "state"),
    (_vllm_keep("vllm:engine_sleep_state", V025, "state", "sleep_state"),),
)
ENGINE_RENDER = Series(
    "servemon_engine_render_seconds",
    "histogram",
    "seconds",
    "Time the API server spent rendering a request before the engine saw it (chat "
    "template, tokenization, multimodal preprocessing), by request type.",
    (*_PER_MODEL, "request_type"),
    (
        _vllm_keep(
            "vllm:request_render_duration_seconds",
            V034,
            "request_type",
            "request_type",
            "no engine label; listed after the first request",
        ),
    ),
)
_LOAD = (("transfer_type", "CPU_to_GPU"),)
_STORE = (("transfer_type", "GPU_to_CPU"),)
_LEGACY = "deprecated, CPU offload only"
ENGINE_KV_OFFLOAD_LOAD_BYTES = Series(
    "servemon_engine_kv_offload_load_bytes_total",
    "counter",
    "bytes",
    "KV bytes loaded from the offload medium (CPU, disk) back to the GPU "
    "(OffloadingConnector).",
    _ENGINE,
    (
        _vllm("vllm:kv_offload_load_bytes_total", V025),
        Source(
            "vllm",
            "vllm:kv_offload_total_bytes_total",
            V025,
            _LEGACY,
            where=_LOAD,
        ),
    ),
)
ENGINE_KV_OFFLOAD_STORE_BYTES = Series(
    "servemon_engine_kv_offload_store_bytes_total",
    "counter",
    "bytes",
    "KV bytes stored from the GPU to the offload medium.",
    _ENGINE,
    (
        _vllm("vllm:kv_offload_store_bytes_total", V025),
        Source(
            "vllm",
            "vllm:kv_offload_total_bytes_total",
            V025,
            _LEGACY,
            where=_STORE,
        ),
    ),
)
ENGINE_KV_OFFLOAD_LOAD_SECONDS = Series(
    "servemon_engine_kv_offload_load_seconds_total",
    "counter",
    "seconds",
    "Time spent loading KV from the offload medium to the GPU.",
    _ENGINE,
    (
        _vllm("vllm:kv_offload_load_time_total", V025),
        Source(
            "vllm",
            "vllm:kv_offload_total_time_total",
            V025,
            _LEGACY,
            where=_LOAD,
        ),
    ),
)
ENGINE_KV_OFFLOAD_STORE_SECONDS = Series(
    "servemon_engine_kv_offload_store_seconds_total",
    "counter",
    "seconds",
    "Time spent storing KV from the GPU to the offload medium.",
    _ENGINE,
    (
        _vllm("vllm:kv_offload_store_time_total", V025),
        Source(
            "vllm",
            "vllm:kv_offload_total_time_total",
            V025,
            _LEGACY,
            where=_STORE,
        ),
    ),
)
ENGINE_SPEC_DRAFTS = Series(
    "servemon_engine_spec_decode_drafts_total",
    "counter",
    "drafts",
    "Speculative decoding: draft proposals (one per request per step).",
    _ENGINE,
    (_vllm("vllm:spec_decode_num_drafts_total", V1),),
)
ENGINE_SPEC_DRAFT_TOKENS = Series(
    "servemon_engine_spec_decode_draft_tokens_total",
    "counter",
    "tokens",
    "Speculative decoding: tokens proposed by the drafter.",
    _ENGINE,
    (_vllm("vllm:spec_decode_num_draft_tokens_total", V1),),
)
ENGINE_SPEC_ACCEPTED_TOKENS = Series(
    "servemon_engine_spec_decode_accepted_tokens_total",
    "counter",
    "tokens",
    "Speculative decoding: proposed tokens the target model accepted (over the "
    "draft tokens: the acceptance rate).",
    _ENGINE,
    (_vllm("vllm:spec_decode_num_accepted_tokens_total", V1),),
)
ENGINE_LORA_RUNNING = Series(
    "servemon_engine_lora_adapters_running",
    "gauge",
    "adapters",
    "LoRA adapters with requests in the running batch now.",
    _ENGINE,
    (_lora("count", "running_lora_adapters", "newest sample's running_lora_adapters"),),
)
ENGINE_LORA_WAITING = Series(
    "servemon_engine_lora_adapters_waiting",
    "gauge",
    "adapters",
    "LoRA adapters with requests waiting now (for a batch place, or to be loaded).",
    _ENGINE,
    (_lora("count", "waiting_lora_adapters", "newest sample's waiting_lora_adapters"),),
)
ENGINE_LORA_MAX = Series(
    "servemon_engine_lora_adapters_max",
    "gauge",
    "adapters",
    "Most distinct LoRA adapters one batch may hold (vLLM's --max-loras).",
    _ENGINE,
    (_lora("number", "max_lora", "its max_lora label"),),
)
ENGINE_LORA_ACTIVE = Series(
    "servemon_engine_lora_adapter_active",
    "gauge",
    "bool",
    "1 for each LoRA adapter with requests in that state (running, waiting) now, "
    "0 for the other adapters the engine has listed.",
    (*_ENGINE, "adapter", "state"),
    (
        _lora(
            "members",
            "running_lora_adapters,waiting_lora_adapters",
            "the newest sample's lists",
        ),
    ),
)
ENGINE_INFO = Series(
    "servemon_engine_info",
    "gauge",
    "info",
    "1, with what the engine tells about itself: version, cache config "
    "(vllm:cache_config_info), max model length (/v1/models), prefix-cache unit.",
    (
        "target",
        "model",
        "engine",
        "version",
        "block_size",
        "num_gpu_blocks",
        "prefix_caching",
        "max_model_len",
        "prefix_cache_unit",
        "dialect",
    ),
    (_vllm("vllm:cache_config_info", "all", "labels"),),
)

ENGINE_SERIES: tuple[Series, ...] = (
    ENGINE_REQUESTS_RUNNING,
    ENGINE_REQUESTS_WAITING,
    ENGINE_KV_CACHE_USAGE,
    ENGINE_PREFIX_QUERIES,
    ENGINE_PREFIX_HITS,
    ENGINE_PREFIX_HIT_RATIO,
    ENGINE_PREEMPTIONS,
    ENGINE_PROMPT_TOKENS,
    ENGINE_GENERATION_TOKENS,
    ENGINE_REQUESTS_FINISHED,
    ENGINE_TTFT,
    ENGINE_ITL,
    ENGINE_TPOT,
    ENGINE_E2E,
    ENGINE_QUEUE,
    ENGINE_PREFILL,
    ENGINE_DECODE,
    ENGINE_PROMPT_LENGTH,
    ENGINE_GENERATION_LENGTH,
    ENGINE_REQUESTS_WAITING_BY_REASON,
    ENGINE_ADMISSION_REJECTIONS,
    ENGINE_PROMPT_TOKENS_BY_SOURCE,
    ENGINE_PROMPT_TOKENS_CACHED,
    ENGINE_PROMPT_TOKENS_CACHED_BY_SOURCE,
    ENGINE_EXTERNAL_PREFIX_QUERIES,
    ENGINE_EXTERNAL_PREFIX_HITS,
    ENGINE_MM_CACHE_QUERIES,
    ENGINE_MM_CACHE_HITS,
    ENGINE_ITERATION_TOKENS,
    ENGINE_REQUEST_PREEMPTIONS,
    ENGINE_PREFILL_KV_COMPUTED,
    ENGINE_ESTIMATED_FLOPS,
    ENGINE_ESTIMATED_READ_BYTES,
    ENGINE_ESTIMATED_WRITE_BYTES,
    ENGINE_SLEEP_STATE,
    ENGINE_RENDER,
    ENGINE_KV_OFFLOAD_LOAD_BYTES,
    ENGINE_KV_OFFLOAD_STORE_BYTES,
    ENGINE_KV_OFFLOAD_LOAD_SECONDS,
    ENGINE_KV_OFFLOAD_STORE_SECONDS,
    ENGINE_SPEC_DRAFTS,
    ENGINE_SPEC_DRAFT_TOKENS,
    ENGINE_SPEC_ACCEPTED_TOKENS,
    ENGINE_LORA_RUNNING,
    ENGINE_LORA_WAITING,
    ENGINE_LORA_MAX,
    ENGINE_LORA_ACTIVE,
)

# -- per target (the exporter's view of each target) -----------------------------

TARGET_UP = Series(
    "servemon_target_up",
    "gauge",
    "bool",
    "1 if the last scrape of the target's /metrics succeeded, else 0.",
    ("target",),
)
TARGET_SCRAPE_DURATION = Series(
    "servemon_target_scrape_duration_seconds",
    "gauge",
    "seconds",
    "How long the last scrape of the target took (fetch and parse).",
    ("target",),
)
TARGET_SCRAPE_ERRORS = Series(
    "servemon_target_scrape_errors_total",
    "counter",
    "scrapes",
    "Failed scrapes by reason (connect, timeout, http, too_large, parse).",
    ("target", "reason"),
)

# -- GPU (NVML) --------------------------------------------------------------------

_GPU = ("gpu", "uuid", "name")

GPU_UP = Series(
    "servemon_gpu_up",
    "gauge",
    "bool",
    "1 if NVML is readable and at least one GPU was found, else 0.",
    (),
)
GPU_SAMPLE_AGE = Series(
    "servemon_gpu_sample_age_seconds",
    "gauge",
    "seconds",
    "Age of the GPU snapshot this scrape serves.",
    (),
)
GPU_UTILIZATION = Series(
    "servemon_gpu_utilization_ratio",
    "gauge",
    "ratio",
    "Share of the last sample period in which a kernel ran (NVML), 0-1.",
    _GPU,
)
GPU_MEMORY_UTILIZATION = Series(
    "servemon_gpu_memory_utilization_ratio",
    "gauge",
    "ratio",
    "Share of the last sample period in which memory was read or written, 0-1.",
    _GPU,
)
GPU_MEMORY_USED = Series(
    "servemon_gpu_memory_used_bytes",
    "gauge",
    "bytes",
    "GPU memory in use.",
    _GPU,
)
GPU_MEMORY_TOTAL = Series(
    "servemon_gpu_memory_total_bytes",
    "gauge",
    "bytes",
    "GPU memory in all.",
    _GPU,
)
GPU_POWER = Series(
    "servemon_gpu_power_watts",
    "gauge",
    "watts",
    "Power draw.",
    _GPU,
)
GPU_ENERGY = Series(
    "servemon_gpu_energy_joules_total",
    "counter",
    "joules",
    "Energy used since the driver was last loaded (NVML's total energy counter, "
    "Volta and newer; absent where the GPU cannot tell it). rate() of it is the "
    "mean power over the window.",
    _GPU,
)
GPU_POWER_LIMIT = Series(
    "servemon_gpu_power_limit_watts",
    "gauge",
    "watts",
    "Enforced power limit.",
    _GPU,
)
GPU_TEMPERATURE = Series(
    "servemon_gpu_temperature_celsius",
    "gauge",
    "celsius",
    "GPU temperature.",
    _GPU,
)
GPU_SM_CLOCK = Series(
    "servemon_gpu_sm_clock_hertz",
    "gauge",
    "hertz",
    "SM clock.",
    _GPU,
)
GPU_MEMORY_CLOCK = Series(
    "servemon_gpu_memory_clock_hertz",
    "gauge",
    "hertz",
    "Memory clock.",
    _GPU,
)
GPU_MEMORY_BANDWIDTH_PEAK = Series(
    "servemon_gpu_memory_bandwidth_peak_bytes_per_second",
    "gauge",
    "bytes/s",
    "Peak memory bandwidth from NVML: memory bus width times the highest memory "
    "clock, twice per clock (the figure data sheets give), where NVML tells both.",
    _GPU,
)
GPU_THROTTLE = Series(
    "servemon_gpu_throttle_active",
    "gauge",
    "bool",
    "1 for each clock-throttle reason active now (sw_power_cap, hw_slowdown, "
    "sw_thermal, hw_thermal, hw_power_brake, gpu_idle, ...), 0 for the others.",
    (*_GPU, "reason"),
)
GPU_PCIE_RX = Series(
    "servemon_gpu_pcie_rx_bytes_per_second",
    "gauge",
    "bytes/s",
    "PCIe receive throughput (NVML's 20 ms sample), where available.",
    _GPU,
)
GPU_PCIE_TX = Series(
    "servemon_gpu_pcie_tx_bytes_per_second",
    "gauge",
    "bytes/s",
    "PCIe transmit throughput, where available.",
    _GPU,
)
GPU_ECC_ERRORS = Series(
    "servemon_gpu_ecc_errors_total",
    "counter",
    "errors",
    "Volatile ECC errors by type (corrected, uncorrected), where available.",
    (*_GPU, "type"),
)
GPU_PROCESS_MEMORY = Series(
    "servemon_gpu_process_memory_used_bytes",
    "gauge",
    "bytes",
    "GPU memory used per compute process.",
    (*_GPU, "pid", "process"),
)

GPU_SERIES: tuple[Series, ...] = (
    GPU_UP,
    GPU_SAMPLE_AGE,
    GPU_UTILIZATION,
    GPU_MEMORY_UTILIZATION,
    GPU_MEMORY_USED,
    GPU_MEMORY_TOTAL,
    GPU_POWER,
    GPU_ENERGY,
    GPU_POWER_LIMIT,
    GPU_TEMPERATURE,
    GPU_SM_CLOCK,
    GPU_MEMORY_CLOCK,
    GPU_MEMORY_BANDWIDTH_PEAK,
    GPU_THROTTLE,
    GPU_PCIE_RX,
    GPU_PCIE_TX,
    GPU_ECC_ERRORS,
    GPU_PROCESS_MEMORY,
)

# -- canary probe ------------------------------------------------------------------

PROBE_REQUESTS = Series(
    "servemon_probe_requests_total",
    "counter",
    "requests",
    "Canary requests by outcome.",
    ("target", "model", "outcome"),
)
PROBE_TTFT = Series(
    "servemon_probe_ttft_seconds",
    "histogram",
    "seconds",
    "Canary time to first content chunk.",
    ("target", "model"),
)
PROBE_E2E = Series(
    "servemon_probe_e2e_seconds",
    "histogram",
    "seconds",
    "Canary end-to-end latency.",
    ("target", "model"),
)

_CONTROL = ("target", "model", "signal")
CLIENT_CONTROL_SETPOINT = Series(
    "servemon_client_control_setpoint",
    "gauge",
    "signal",
    "servemon control: the value the signal is held at (in the signal's unit).",
    _CONTROL,
)
CLIENT_CONTROL_MEASURED = Series(
    "servemon_client_control_measured",
    "gauge",
    "signal",
    "servemon control: the signal as the controller last read it (NaN while blind).",
    _CONTROL,
)
CLIENT_CONTROL_OFFERED_RATE = Series(
    "servemon_client_control_offered_requests_per_second",
    "gauge",
    "requests/s",
    "servemon control: the open-loop rate the controller offers now.",
    _CONTROL,
)
CLIENT_CONTROL_ACHIEVED_RATE = Series(
    "servemon_client_control_achieved_requests_per_second",
    "gauge",
    "requests/s",
    "servemon control: requests sent per second over the last control interval.",
    _CONTROL,
)

CLIENT_SERIES: tuple[Series, ...] = (
    CLIENT_REQUESTS,
    CLIENT_TTFT,
    CLIENT_TTFC,
    CLIENT_ITL,
    CLIENT_TPOT,
    CLIENT_E2E,
    CLIENT_DISPATCH_LAG,
    CLIENT_OUTPUT_TOKENS,
    CLIENT_PROMPT_TOKENS,
    CLIENT_TARGET_RATE,
    CLIENT_IN_FLIGHT,
    CLIENT_CURRENT_STAGE,
    CLIENT_HELD_BACK,
    CLIENT_SKIPPED,
    CLIENT_RECONNECTS,
    CLIENT_SERVER_QUEUE,
    CLIENT_TTFT_GAP,
    CLIENT_CPU,
    CLIENT_LOOP_DELAY,
    CLIENT_LIMITED,
    CLIENT_CONTROL_SETPOINT,
    CLIENT_CONTROL_MEASURED,
    CLIENT_CONTROL_OFFERED_RATE,
    CLIENT_CONTROL_ACHIEVED_RATE,
)

SCHEMA: tuple[Series, ...] = (
    *ENGINE_SERIES,
    ENGINE_INFO,
    TARGET_UP,
    TARGET_SCRAPE_DURATION,
    TARGET_SCRAPE_ERRORS,
    *GPU_SERIES,
    PROBE_REQUESTS,
    PROBE_TTFT,
    PROBE_E2E,
    *CLIENT_SERIES,
)
