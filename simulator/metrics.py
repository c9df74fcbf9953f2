"""The simulator's ``/metrics``: engine stats named as a chosen engine version would.

Dialects (``--metrics-dialect``):

``vllm``       vLLM V1 as of 0.11+: ``kv_cache_usage_perc``, ``prefix_cache_*`` in
               tokens, ``inter_token_latency_seconds``; labels ``model_name`` and
               ``engine``.
``vllm-0.25``  the above plus what 0.25 added (:mod:`.newer`): waiting by reason,
               prompt tokens by source and cached, prefill KV, MFU estimates.
``vllm-0.34``  the above plus what 0.32-0.34 added: admission rejections, cached
               prompt tokens by tier, preemptions per request.
``vllm-0.10``  the above plus the deprecated spellings side by side
               (``gpu_cache_usage_perc``, ``gpu_prefix_cache_*``,
               ``time_per_output_token_seconds``), as 0.10.x emitted them.
``vllm-0.8``   early V1: old spellings only, prefix cache counted in blocks, no
               ``engine`` label.
``vllm-v0``    the V0 engine: hit-rate gauges instead of counters, swapped
               requests.

Every vLLM dialect has ``vllm:lora_requests_info`` when LoRA adapters are served
(V0 had it too).
``sglang``     SGLang's ``sglang:`` names, a cache hit-rate gauge, per-rank labels.
``llamacpp``   llama-server's ``--metrics``: ``llamacpp:`` counters and gauges, no
               labels, no histograms (the names its server code registers).

Every dialect's histograms use vLLM's V1 bucket edges. The collector reads engine
state in memory only; it never blocks.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from servemon.simulator.engine import Engine
from servemon.simulator.newer import since_025, since_032
from servemon.simulator.stats import Histogram

__all__ = ["EngineMetrics"]

FINISH_REASONS = ("stop", "length", "abort")
#: The vLLM release each V1 dialect that is not the default stands for; a series
#: vLLM added in release R appears in the dialects of R and later only.
RELEASES: dict[str, tuple[int, int]] = {"vllm-0.25": (0, 25), "vllm-0.34": (0, 34)}


class EngineMetrics(Collector):
    """A prometheus_client collector over one :class:`Engine`."""

    def __init__(self, engine: Engine, model: str, dialect: str) -> None:
        self.engine = engine
        self.model = model
        self.dialect = dialect
        self.created = time.time()
        self._last_gen = (time.monotonic(), 0)

    def collect(self) -> Iterable[Metric]:
        if self.dialect == "sglang":
            yield from self._sglang()
        elif self.dialect == "llamacpp":
            yield from self._llamacpp()
        else:
            yield from self._vllm()

    # -- vLLM -------------------------------------------------------------------

    def _vllm(self) -> Iterator[Metric]:
        d = self.dialect
        eng, st = self.engine, self.engine.stats
        release = RELEASES.get(d, (0, 0))
        v1 = d in ("vllm", "vllm-0.10", "vllm-0.8") or d in RELEASES
        new_names = d in ("vllm", "vllm-0.10") or d in RELEASES
        keys = ["model_name", "engine"] if new_names else ["model_name"]
        vals = [self.model, "0"][: len(keys)]
        old_names = d in ("vllm-0.10", "vllm-0.8", "vllm-v0")

        def gauge(name: str, doc: str, value: float) -> Metric:
            fam = GaugeMetricFamily(name, doc, labels=keys)
            fam.add_metric(vals, value)
            return fam

        def counter(name: str, doc: str, value: float) -> Metric:
            fam = CounterMetricFamily(name, doc, labels=keys)
            fam.add_metric(vals, value, created=self.created if v1 else None)
            return fam

        yield gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            len(eng.running),
        )
        yield gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            len(eng.waiting),
        )
        usage = eng.pool.usage()
        if new_names:
            yield gauge(
                "vllm:kv_cache_usage_perc",
                "KV-cache usage. 1 means 100 percent usage.",
                usage,
            )
        if old_names:
            doc = "GPU KV-cache usage. 1 means 100 percent usage."
            if d == "vllm-0.10":
                doc += " DEPRECATED: Use vllm:kv_cache_usage_perc instead."
            yield gauge("vllm:gpu_cache_usage_perc", doc, usage)
        if d == "vllm-v0":
            yield gauge(
                "vllm:num_requests_swapped", "Number of requests swapped to CPU.", 0
            )
            yield gauge("vllm:cpu_cache_usage_perc", "CPU KV-cache usage.", 0.0)
            rate = (
                st.prefix_hit_blocks / st.prefix_query_blocks
                if st.prefix_query_blocks
                else 0.0
            )
            yield gauge(
                "vllm:gpu_prefix_cache_hit_rate",
                "GPU prefix cache block hit rate.",
                rate,
            )
            yield gauge(
                "vllm:cpu_prefix_cache_hit_rate",
                "CPU prefix cache block hit rate.",
                -1.0,
            )
        if new_names:
            yield counter(
                "vllm:prefix_cache_queries",
                "Prefix cache queries, in terms of number of queried tokens.",
                st.prefix_queries,
            )
            yield counter(
                "vllm:prefix_cache_hits",
                "Prefix cache hits, in terms of number of cached tokens.",
                st.prefix_hits,
            )
        if d == "vllm-0.10":
            yield counter(
                "vllm:gpu_prefix_cache_queries",
                "GPU prefix cache queries, in terms of number of queried tokens."
                " DEPRECATED: Use vllm:prefix_cache_queries instead.",
                st.prefix_queries,
            )
            yield counter(
                "vllm:gpu_prefix_cache_hits",
                "GPU prefix cache hits, in terms of number of cached tokens."
                " DEPRECATED: Use vllm:prefix_cache_hits instead.",
                st.prefix_hits,
            )
        if d == "vllm-0.8":
            yield counter(
                "vllm:gpu_prefix_cache_queries",
                "GPU prefix cache queries, in terms of number of queried blocks.",
                st.prefix_query_blocks,
            )
            yield counter(
                "vllm:gpu_prefix_cache_hits",
                "GPU prefix cache hits, in terms of number of cached blocks.",
                st.prefix_hit_blocks,
            )
        yield counter(
            "vllm:num_preemptions",
            "Cumulative number of preemption from the engine.",
            st.preemptions,
        )
        yield counter(
            "vllm:prompt_tokens",
            "Number of prefill tokens processed.",
            st.prompt_tokens,
        )
        yield counter(
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            st.generation_tokens,
        )
        success = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=[*keys, "finished_reason"],
        )
        for reason in FINISH_REASONS:
            success.add_metric(
                [*vals, reason],
                st.finished[reason],
                created=self.created if v1 else None,
            )
        yield success

        def hist(name: str, doc: str, h: Histogram) -> Metric:
            fam = HistogramMetricFamily(name, doc, labels=keys)
            fam.add_metric(vals, h.cumulative(), sum_value=h.total)
            return fam

        yield hist(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            st.ttft,
        )
        if new_names:
            yield hist(
                "vllm:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
                st.itl,
            )
            yield hist(
                "vllm:request_time_per_output_token_seconds",
                "Histogram of time_per_output_token_seconds per request.",
                st.tpot,
            )
        if old_names:
            doc = "Histogram of time per output token in seconds."
            if d == "vllm-0.10":
                doc += " DEPRECATED: Use vllm:inter_token_latency_seconds instead."
            yield hist("vllm:time_per_output_token_seconds", doc, st.itl)
        yield hist(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            st.e2e,
        )
        yield hist(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            st.queue,
        )
        yield hist(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            st.inference,
        )
        yield hist(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            st.prefill,
        )
        yield hist(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            st.decode,
        )
        yield hist(
            "vllm:request_prompt_tokens",
            "Number of prefill tokens processed.",
            st.request_prompt_tokens,
        )
        yield hist(
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            st.request_generation_tokens,
        )
        yield hist(
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            st.params_max_tokens,
        )
        yield hist(
            "vllm:request_params_n",
            "Histogram of the n request parameter.",
            st.params_n,
        )
        yield hist(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            st.iteration_tokens,
        )
        if release >= (0, 25):
            yield from since_025(self.engine, self.created, keys, vals)
        if release >= (0, 32):
            yield from since_032(self.engine, self.model, self.created, keys, vals)
        if eng.lora_enabled:
            yield self._lora_info()
        yield self._cache_config(with_engine=new_names)

    def _lora_info(self) -> Metric:
        """vLLM's ``lora_requests_info``: one sample per adapter state ever
        recorded, its value the wall-clock time it was last the state (so the
        newest sample is now's); no ``model_name`` or ``engine`` label."""
        keys = ["max_lora", "waiting_lora_adapters", "running_lora_adapters"]
        fam = GaugeMetricFamily(
            "vllm:lora_requests_info", "Running stats on lora requests.", labels=keys
        )
        max_lora = str(self.engine.args.max_loras)
        for (running, waiting), stamp in self.engine.stats.lora_info.items():
            fam.add_metric([max_lora, waiting, running], stamp)
        return fam

    def _cache_config(self, *, with_engine: bool) -> Metric:
        args = self.engine.args
        info: dict[str, str] = {
            "block_size": str(args.block_size),
            "cache_dtype": "auto",
            "enable_prefix_caching": str(args.enable_prefix_caching),
            "gpu_memory_utilization": "0.9",
            "num_cpu_blocks": "None",
            "num_gpu_blocks": str(args.num_gpu_blocks),
            "num_gpu_blocks_override": "None",
            "prefix_caching_hash_algo": "builtin",
            "sliding_window": "None",
        }
        if with_engine:
            info["engine"] = "0"
        fam = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=sorted(info),
        )
        fam.add_metric([info[k] for k in sorted(info)], 1.0)
        return fam

    # -- SGLang -----------------------------------------------------------------

    def _llamacpp(self) -> Iterator[Metric]:
        eng, st = self.engine, self.engine.stats
        counters = (
            (
                "prompt_tokens_total",
                "Number of prompt tokens processed.",
                st.prompt_tokens,
            ),
            (
                "prompt_tokens_cached_total",
                "Number of prompt tokens from the cache.",
                st.prefix_hits,
            ),
            ("prompt_seconds_total", "Prompt process time", st.prefill.total),
            (
                "tokens_predicted_total",
                "Number of generation tokens processed.",
                st.generation_tokens,
            ),
            ("tokens_predicted_seconds_total", "Predict process time", st.decode.total),
        )
        for name, doc, value in counters:
            fam = CounterMetricFamily(f"llamacpp:{name}", doc)
            fam.add_metric([], value)
            yield fam
        gauges = (
            ("requests_processing", "Number of requests processing.", len(eng.running)),
            ("requests_deferred", "Number of requests deferred.", len(eng.waiting)),
            ("n_tokens_max", "Largest observed n_tokens.", eng.args.max_model_len),
        )
        for name, doc, value in gauges:
            gauge = GaugeMetricFamily(f"llamacpp:{name}", doc)
            gauge.add_metric([], value)
            yield gauge

    def _sglang(self) -> Iterator[Metric]:
        eng, st = self.engine, self.engine.stats
        keys = ["model_name", "engine_type", "tp_rank", "pp_rank"]
        vals = [self.model, "unified", "0", "0"]
        capacity = eng.pool.num_blocks * eng.pool.block_size
        used = round(eng.pool.usage() * capacity)
        now = time.monotonic()
        since, gen_then = self._last_gen
        elapsed = now - since
        throughput = (st.generation_tokens - gen_then) / elapsed if elapsed > 0 else 0.0
        self._last_gen = (now, st.generation_tokens)
        hit_rate = st.prefix_hits / st.prefix_queries if st.prefix_queries else 0.0
        gauges: Sequence[tuple[str, str, float]] = (
            (
                "sglang:num_running_reqs",
                "The number of running requests.",
                len(eng.running),
            ),
            (
                "sglang:num_queue_reqs",
                "The number of requests in the waiting queue.",
                len(eng.waiting),
            ),
            ("sglang:num_used_tokens", "The number of used tokens.", used),
            (
                "sglang:max_total_num_tokens",
                "Maximum total number of tokens in the KV cache pool.",
                capacity,
            ),
            ("sglang:token_usage", "The token usage.", eng.pool.usage()),
            ("sglang:cache_hit_rate", "The prefix cache hit rate.", hit_rate),
            (
                "sglang:gen_throughput",
                "The generation throughput (token/s).",
                throughput,
            ),
        )
        for name, doc, value in gauges:
            g = GaugeMetricFamily(name, doc, labels=keys)
            g.add_metric(vals, value)
            yield g
        counters: Sequence[tuple[str, str, float]] = (
            (
                "sglang:prompt_tokens",
                "Number of prefill tokens processed.",
                st.prompt_tokens,
            ),
            (
                "sglang:generation_tokens",
                "Number of generation tokens processed.",
                st.generation_tokens,
            ),
            ("sglang:cached_tokens", "Number of cached prompt tokens.", st.prefix_hits),
            (
                "sglang:num_requests",
                "Number of requests processed.",
                sum(st.finished.values()),
            ),
            (
                "sglang:num_aborted_requests",
                "Number of requests aborted.",
                st.finished["abort"],
            ),
        )
        for name, doc, value in counters:
            c = CounterMetricFamily(name, doc, labels=keys)
            c.add_metric(vals, value)
            yield c
        hists: Sequence[tuple[str, str, Histogram]] = (
            (
                "sglang:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                st.ttft,
            ),
            (
                "sglang:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
                st.itl,
            ),
            (
                "sglang:e2e_request_latency_seconds",
                "Histogram of End-to-end request latency in seconds",
                st.e2e,
            ),
            (
                "sglang:queue_time_seconds",
                "Histogram of queueing time in seconds.",
                st.queue,
            ),
        )
        for name, doc, h in hists:
            fam = HistogramMetricFamily(name, doc, labels=keys)
            fam.add_metric(vals, h.cumulative(), sum_value=h.total)
            yield fam
