"""A full vLLM V1 ``/metrics`` exposition, and tiny servers that answer with it.

:class:`VllmExposition` is what one vLLM server (about 0.12, a text model, prefix
caching on, ``--data-parallel-size RANKS``, one API server) shows on ``/metrics``:
every family of ``shared/reference/engine-metrics.md`` section 1.2 that such a
deployment exposes, declared as vLLM declares them (labels ``model_name`` and
``engine``, counters with ``_total`` and ``_created``, histograms with their real
bucket edges: 1-2-5 token buckets up to ``max_model_len``), ``vllm:cache_config_info``,
prometheus_client's ``process_*`` and ``python_*`` families and the ``http_*``
families of prometheus-fastapi-instrumentator. The text is rendered once by
prometheus_client itself (so its formatting is the library's), then kept as lines
whose values this module updates: a few requests finish on every rank after each
answer (counters grow, histograms take observations, gauges move), so no two
answers need be the same. Left out, as a normal deployment does not show them:
multimodal cache, spec decode, LoRA, KV-block residency (``--kv-cache-metrics``),
sleep state, NIXL and MFU families, and the deprecated names hidden since 0.11/0.12.
vLLM answers ``/metrics`` through the instrumentator's handler, uncompressed.

Run as a script, it serves ``--targets`` such expositions, one port each, from one
process (pinned with ``--cpu``): ``GET /metrics``, ``/v1/models`` (with
``max_model_len``), ``/version`` and ``/health``. Each target's next exposition is
built when the process has been idle for a moment after answering, so that
answering costs no more than writing the bytes.

    python benchmarks/_vllm_exposition.py --targets 8 [--ranks 4] [--cpu 0]

prints ``serving URL URL ...`` (one base URL per target) once all listen, and runs
until SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import re
import signal
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    Summary,
    generate_latest,
)
from prometheus_client.utils import floatToGoString

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
MAX_MODEL_LEN = 8192
VERSION = "0.12.0"
BLOCK_SIZE = 16
NUM_GPU_BLOCKS = 29_339
HISTORY = 2000  # requests finished on each rank before the first answer
FINISHED_REASONS = ("stop", "length", "abort")
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")


def buckets_1_2_5(limit: int) -> tuple[float, ...]:
    """vLLM's ``build_1_2_5_buckets``: 1, 2, 5, 10, 20, 50, ... up to ``limit``."""
    out: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > limit:
                return tuple(out)
            out.append(float(value))
        exponent += 1


TOKENS = buckets_1_2_5(MAX_MODEL_LEN)
TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0)
TTFT += (2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
ITL += (5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
LATENCY = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0)
LATENCY += (50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION = (1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0)
ITERATION += (4096.0, 8192.0, 16384.0)
PARAMS_N = (1.0, 2.0, 5.0, 10.0, 20.0)
HTTP_HIGHR = (0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5)
HTTP_HIGHR += (3.0, 3.5, 4.0, 4.5, 5.0, 7.5, 10.0, 30.0, 60.0)
HTTP_HANDLERS = (
    ("/v1/chat/completions", "POST"),
    ("/v1/completions", "POST"),
    ("/v1/models", "GET"),
)


@dataclass(frozen=True, slots=True)
class Family:
    """One vLLM family as declared in vLLM's code (counters without ``_total``)."""

    name: str
    kind: str  # "gauge", "counter" or "histogram"
    doc: str
    label: str | None = None  # one extra label besides model_name and engine
    values: tuple[str, ...] = ()  # that label's values
    buckets: tuple[float, ...] = ()


def _g(name: str, doc: str) -> Family:
    return Family(name, "gauge", doc)


def _c(name: str, doc: str, label: str | None = None, *values: str) -> Family:
    return Family(name, "counter", doc, label, values)


def _h(name: str, doc: str, buckets: tuple[float, ...]) -> Family:
    return Family(name, "histogram", doc, buckets=buckets)


#: Every engine family this exposition has, labelled ``model_name`` and ``engine``.
FAMILIES: tuple[Family, ...] = (
    _g("vllm:num_requests_running", "Number of requests in model execution batches."),
    _g("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
    _g("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
    _c(
        "vllm:prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
    ),
    _c(
        "vllm:prefix_cache_hits",
        "Prefix cache hits, in terms of number of cached tokens.",
    ),
    _c(
        "vllm:external_prefix_cache_queries",
        "External prefix cache queries from KV connector cross-instance cache "
        "sharing, in terms of number of queried tokens.",
    ),
    _c(
        "vllm:external_prefix_cache_hits",
        "External prefix cache hits from KV connector cross-instance cache "
        "sharing, in terms of number of cached tokens.",
    ),
    _c("vllm:num_preemptions", "Cumulative number of preemption from the engine."),
    _c("vllm:prompt_tokens", "Number of prefill tokens processed."),
    _c(
        "vllm:prompt_tokens_by_source",
        "Number of prompt tokens by source.",
        "source",
        *PROMPT_SOURCES,
    ),
    _c(
        "vllm:prompt_tokens_cached",
        "Number of cached prompt tokens (local + external).",
    ),
    _c("vllm:generation_tokens", "Number of generation tokens processed."),
    _c(
        "vllm:request_success",
        "Count of successfully processed requests.",
        "finished_reason",
        *FINISHED_REASONS,
    ),
    _h("vllm:request_prompt_tokens", "Number of prefill tokens processed.", TOKENS),
    _h(
        "vllm:request_generation_tokens",
        "Number of generation tokens processed.",
        TOKENS,
    ),
    _h(
        "vllm:iteration_tokens_total",
        "Histogram of number of tokens per engine_step.",
        ITERATION,
    ),
    _h(
        "vllm:request_max_num_generation_tokens",
        "Histogram of maximum number of requested generation tokens.",
        TOKENS,
    ),
    _h("vllm:request_params_n", "Histogram of the n request parameter.", PARAMS_N),
    _h(
        "vllm:request_params_max_tokens",
        "Histogram of the max_tokens request parameter.",
        TOKENS,
    ),
    _h(
        "vllm:request_prefill_kv_computed_tokens",
        "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
        TOKENS,
    ),
    _h(
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        TTFT,
    ),
    _h(
        "vllm:inter_token_latency_seconds",
        "Histogram of inter-token latency in seconds.",
        ITL,
    ),
    _h(
        "vllm:request_time_per_output_token_seconds",
        "Histogram of time_per_output_token_seconds per request.",
        ITL,
    ),
    _h(
        "vllm:e2e_request_latency_seconds",
        "Histogram of e2e request latency in seconds.",
        LATENCY,
    ),
    _h(
        "vllm:request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
        LATENCY,
    ),
    _h(
        "vllm:request_inference_time_seconds",
        "Histogram of time spent in RUNNING phase for request.",
        LATENCY,
    ),
    _h(
        "vllm:request_prefill_time_seconds",
        "Histogram of time spent in PREFILL phase for request.",
        LATENCY,
    ),
    _h(
        "vllm:request_decode_time_seconds",
        "Histogram of time spent in DECODE phase for request.",
        LATENCY,
    ),
)

#: ``vllm:cache_config_info``'s labels: every CacheConfig field as a string.
CACHE_CONFIG = {
    "block_size": str(BLOCK_SIZE),
    "cache_dtype": "auto",
    "calculate_kv_scales": "False",
    "cpu_kvcache_space_bytes": "None",
    "cpu_offload_gb": "0",
    "enable_prefix_caching": "True",
    "gpu_memory_utilization": "0.9",
    "is_attention_free": "False",
    "kv_cache_memory_bytes": "None",
    "kv_sharing_fast_prefill": "False",
    "mamba_cache_dtype": "auto",
    "mamba_page_size_padded": "None",
    "mamba_ssm_cache_dtype": "auto",
    "num_cpu_blocks": "None",
    "num_gpu_blocks": str(NUM_GPU_BLOCKS),
    "num_gpu_blocks_override": "None",
    "prefix_caching_hash_algo": "sha256",
    "sliding_window": "None",
    "swap_space": "4",
    "swap_space_bytes": "4294967296",
}

_SAMPLE = re.compile(r"^([^{\s]+)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')

_Key = tuple[str, frozenset[tuple[str, str]]]


def _registry(ranks: int, model: str) -> CollectorRegistry:
    """Every family declared and every child created, as a fresh vLLM has them."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    for f in FAMILIES:
        labelnames = ["model_name", "engine"] + ([f.label] if f.label else [])
        metric: Gauge | Counter | Histogram
        if f.kind == "gauge":
            metric = Gauge(f.name, f.doc, labelnames, registry=registry)
        elif f.kind == "counter":
            metric = Counter(f.name, f.doc, labelnames, registry=registry)
        else:
            metric = Histogram(
                f.name, f.doc, labelnames, registry=registry, buckets=f.buckets
            )
        for rank in range(ranks):
            for value in f.values or (None,):
                extra = [value] if value is not None else []
                metric.labels(model, str(rank), *extra)
    info = Gauge(
        "vllm:cache_config_info",
        "Information of the LLMEngine's cache config",
        [*CACHE_CONFIG, "engine"],
        registry=registry,
    )
    for rank in range(ranks):
        info.labels(*CACHE_CONFIG.values(), str(rank)).set(1)
    requests = Counter(
        "http_requests_total",
        "Total number of requests by method, status and handler.",
        ["method", "status", "handler"],
        registry=registry,
    )
    sizes = [
        Summary(
            f"http_{what}_size_bytes",
            f"Content length of {how} by handler. Only value of header is "
            "respected. Otherwise ignored. No percentile calculated. ",
            ["handler"],
            registry=registry,
        )
        for what, how in (
            ("request", "incoming requests"),
            ("response", "outgoing responses"),
        )
    ]
    Histogram(
        "http_request_duration_highr_seconds",
        "Latency with many buckets but no API specific labels. Made for more "
        "accurate percentile calculations. ",
        registry=registry,
        buckets=HTTP_HIGHR,
    )
    duration = Histogram(
        "http_request_duration_seconds",
        "Latency with only few buckets by handler. Made to be only used if "
        "aggregation by handler is important. ",
        ["method", "handler"],
        registry=registry,
        buckets=(0.1, 0.5, 1.0),
    )
    for handler, method in HTTP_HANDLERS:
        for status in ("2xx", "4xx"):
            requests.labels(method, status, handler)
        for size in sizes:
            size.labels(handler)
        duration.labels(method, handler)
    return registry


class VllmExposition:
    """One vLLM server's ``/metrics`` text, with values that move between answers."""

    def __init__(
        self,
        ranks: int = 4,
        seed: int = 0,
        model: str = MODEL,
        history: int = HISTORY,
    ) -> None:
        """``history`` requests have finished on each rank before the first answer
        (0: a server just started, every counter at 0)."""
        self.ranks = ranks
        self.model = model
        self._rng = random.Random(seed)
        text = generate_latest(_registry(ranks, model)).decode()
        self._lines: list[str] = []
        self._prefix: list[str] = []
        self._values: list[float] = []
        self._index: dict[_Key, int] = {}
        self._buckets: dict[_Key, list[tuple[float, int]]] = {}
        for line in text.splitlines():
            self._add_line(line)
        for bounds in self._buckets.values():
            bounds.sort()
        self._dirty: set[int] = set()
        for rank in range(ranks):
            self.finish_requests(rank, history)
        self.body = self.render()

    def _add_line(self, line: str) -> None:
        i = len(self._lines)
        self._lines.append(line + "\n")
        match = _SAMPLE.match(line) if not line.startswith("#") else None
        if match is None:
            self._prefix.append("")
            self._values.append(0.0)
            return
        name, labels, value = match.groups()
        pairs = dict(_LABEL.findall(labels or ""))
        self._prefix.append(line[: -len(value)])
        self._values.append(float(value))
        self._index[(name, frozenset(pairs.items()))] = i
        if name.endswith("_bucket"):
            le = pairs.pop("le")
            key = (name.removesuffix("_bucket"), frozenset(pairs.items()))
            self._buckets.setdefault(key, []).append((float(le), i))

    def _labels(self, rank: int, **extra: str) -> frozenset[tuple[str, str]]:
        return frozenset(
            {"model_name": self.model, "engine": str(rank), **extra}.items()
        )

    def _add(self, name: str, labels: frozenset[tuple[str, str]], delta: float) -> None:
        i = self._index[(name, labels)]
        self._values[i] += delta
        self._dirty.add(i)

    def _set(self, name: str, labels: frozenset[tuple[str, str]], value: float) -> None:
        i = self._index[(name, labels)]
        self._values[i] = value
        self._dirty.add(i)

    def _observe(
        self,
        name: str,
        labels: frozenset[tuple[str, str]],
        value: float,
        times: int = 1,
    ) -> None:
        """``times`` observations of ``value`` into a histogram."""
        for bound, i in self._buckets[(name, labels)]:
            if value <= bound:
                self._values[i] += times
                self._dirty.add(i)
        self._add(name + "_count", labels, times)
        self._add(name + "_sum", labels, value * times)

    def finish_requests(self, rank: int, number: int) -> None:
        """``number`` requests finish on ``rank``: every family moves as in vLLM."""
        rng = self._rng
        at = self._labels(rank)
        for _ in range(number):
            prompt = min(MAX_MODEL_LEN - 512, max(4, int(rng.lognormvariate(6.3, 0.9))))
            max_tokens = rng.choice((256, 512, 1024, 2048))
            output = min(max_tokens, 1 + int(rng.lognormvariate(5.2, 0.9)))
            reason = "length" if output == max_tokens else "stop"
            if rng.random() < 0.01:
                reason = "abort"
            cached = int(prompt * rng.uniform(0.0, 0.7)) // BLOCK_SIZE * BLOCK_SIZE
            queue = rng.expovariate(1 / 0.04)
            prefill = 0.015 + (prompt - cached) * rng.uniform(2e-5, 4e-5)
            itl = rng.uniform(0.012, 0.032)
            decode = itl * (output - 1)
            ttft = queue + prefill
            e2e = ttft + decode
            self._add("vllm:prompt_tokens_total", at, prompt)
            self._add("vllm:generation_tokens_total", at, output)
            self._add("vllm:prefix_cache_queries_total", at, prompt)
            self._add("vllm:prefix_cache_hits_total", at, cached)
            self._add("vllm:prompt_tokens_cached_total", at, cached)
            for source, tokens in zip(
                PROMPT_SOURCES, (prompt - cached, cached, 0), strict=True
            ):
                by = self._labels(rank, source=source)
                self._add("vllm:prompt_tokens_by_source_total", by, tokens)
            done = self._labels(rank, finished_reason=reason)
            self._add("vllm:request_success_total", done, 1)
            if rng.random() < 0.003:
                self._add("vllm:num_preemptions_total", at, 1)
            self._observe("vllm:request_prompt_tokens", at, prompt)
            self._observe("vllm:request_generation_tokens", at, output)
            self._observe("vllm:request_max_num_generation_tokens", at, max_tokens)
            self._observe("vllm:request_params_max_tokens", at, max_tokens)
            self._observe("vllm:request_params_n", at, 1)
            self._observe(
                "vllm:request_prefill_kv_computed_tokens", at, prompt - cached
            )
            self._observe("vllm:iteration_tokens_total", at, rng.randint(8, 96), output)
            self._observe("vllm:iteration_tokens_total", at, prompt - cached + 32)
            self._observe("vllm:time_to_first_token_seconds", at, ttft)
            if output > 1:
                self._observe("vllm:inter_token_latency_seconds", at, itl, output - 1)
                self._observe("vllm:request_time_per_output_token_seconds", at, itl)
            self._observe("vllm:e2e_request_latency_seconds", at, e2e)
            self._observe("vllm:request_queue_time_seconds", at, queue)
            self._observe("vllm:request_inference_time_seconds", at, prefill + decode)
            self._observe("vllm:request_prefill_time_seconds", at, prefill)
            self._observe("vllm:request_decode_time_seconds", at, decode)
            self._http(rng, prompt, output, e2e)
        running = rng.randint(8, 48)
        self._set("vllm:num_requests_running", at, running)
        self._set("vllm:num_requests_waiting", at, rng.choice((0, 0, 0, 1, 2, 5)))
        self._set("vllm:kv_cache_usage_perc", at, round(rng.uniform(0.1, 0.85), 6))

    def _http(self, rng: random.Random, prompt: int, output: int, e2e: float) -> None:
        handler = HTTP_HANDLERS[0][0] if rng.random() < 0.9 else HTTP_HANDLERS[1][0]
        status = "2xx" if rng.random() < 0.995 else "4xx"
        on = frozenset({"handler": handler}.items())
        both = frozenset({"handler": handler, "method": "POST"}.items())
        self._add(
            "http_requests_total",
            frozenset({"handler": handler, "method": "POST", "status": status}.items()),
            1,
        )
        self._add("http_request_size_bytes_count", on, 1)
        self._add("http_request_size_bytes_sum", on, 200 + 5 * prompt)
        self._add("http_response_size_bytes_count", on, 1)
        self._add("http_response_size_bytes_sum", on, 0)  # streamed: no length
        self._observe("http_request_duration_highr_seconds", frozenset(), e2e)
        self._observe("http_request_duration_seconds", both, e2e)
        if rng.random() < 0.01:
            models = frozenset(
                {"handler": "/v1/models", "method": "GET", "status": "2xx"}.items()
            )
            self._add("http_requests_total", models, 1)
        cpu = self._values[self._index[("process_cpu_seconds_total", frozenset())]]
        self._set("process_cpu_seconds_total", frozenset(), round(cpu + 0.002, 3))

    def advance(self) -> None:
        """What happens between two scrapes: 0 to 3 requests finish per rank."""
        for rank in range(self.ranks):
            self.finish_requests(rank, self._rng.randint(0, 3))
        self.body = self.render()

    def render(self) -> bytes:
        """The exposition as vLLM answers it (text format 0.0.4)."""
        lines, prefix, values = self._lines, self._prefix, self._values
        for i in self._dirty:
            lines[i] = prefix[i] + floatToGoString(values[i]) + "\n"
        self._dirty.clear()
        return "".join(lines).encode()


class _Target:
    def __init__(self, exposition: VllmExposition) -> None:
        self.exposition = exposition
        self.stale = False


async def serve(host: str, targets: int, ranks: int) -> None:
    """Serve ``targets`` expositions, one port each, until SIGTERM or SIGINT."""
    state = [_Target(VllmExposition(ranks, seed=i)) for i in range(targets)]
    wake = asyncio.Event()
    models = {
        "object": "list",
        "data": [
            {
                "id": MODEL,
                "object": "model",
                "created": 1_790_000_000,
                "owned_by": "vllm",
                "root": MODEL,
                "max_model_len": MAX_MODEL_LEN,
            }
        ],
    }
    headers = {"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}

    def app_for(target: _Target) -> web.Application:
        async def metrics(request: web.Request) -> web.Response:
            target.stale = True
            wake.set()
            return web.Response(body=target.exposition.body, headers=headers)

        async def list_models(request: web.Request) -> web.Response:
            return web.json_response(models)

        async def version(request: web.Request) -> web.Response:
            return web.json_response({"version": VERSION})

        async def health(request: web.Request) -> web.Response:
            return web.Response()

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/v1/models", list_models)
        app.router.add_get("/version", version)
        app.router.add_get("/health", health)
        return app

    async def refresh() -> None:
        """Builds the next expositions once requests have stopped for 2 ms."""
        quiet = 0.002
        while True:
            await wake.wait()
            wake.clear()
            with contextlib.suppress(TimeoutError):
                while True:  # until no request has come for `quiet` seconds
                    async with asyncio.timeout(quiet):
                        await wake.wait()
                    wake.clear()
            for target in state:
                if target.stale:
                    target.stale = False
                    target.exposition.advance()
                    await asyncio.sleep(0)  # answer a request that came meanwhile

    runners = [web.AppRunner(app_for(t), access_log=None) for t in state]
    urls = []
    for runner in runners:
        await runner.setup()
        await web.TCPSite(runner, host, 0).start()
        bound_host, bound_port = runner.addresses[0][:2]
        urls.append(f"http://{bound_host}:{bound_port}")
    print("serving " + " ".join(urls), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    refresher = asyncio.create_task(refresh())
    try:
        await stop.wait()
    finally:
        refresher.cancel()
        for runner in runners:
            await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--targets", type=int, default=8)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--cpu", type=int, help="pin this process to one CPU")
    args = parser.parse_args()
    pin = args.cpu is not None and hasattr(os, "sched_setaffinity")
    if pin and (os.cpu_count() or 1) > args.cpu:
        os.sched_setaffinity(0, {args.cpu})
    coro = serve(args.host, args.targets, args.ranks)
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(coro)


if __name__ == "__main__":
    main()
