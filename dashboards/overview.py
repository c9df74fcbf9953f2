"""The serving overview: load, queueing, cache, latency, throughput, GPU, SLO.

Latency panels put the client's and the server's histograms side by side. The SLO
row reads the same definitions as ``servemon rules``: the client error ratio counts
the errors :data:`servemon.dashboards.sli.ERRORS` defines, and the burn-rate panel
selects the recording rules by the names :mod:`servemon.dashboards.rule_names` gives
them.
"""

from __future__ import annotations

from grafanalib import core as g

from servemon.core import names as n
from servemon.core.promql import aggregate, braces, le_matcher
from servemon.dashboards.gpu import gpu_panels
from servemon.dashboards.panels import (
    DS,
    PEAK_BANDWIDTH,
    PEAK_TFLOPS,
    Layout,
    dashboard,
    dashed,
    peak_variables,
    percentiles,
    stat,
    timeseries,
)
from servemon.dashboards.queries import (
    TARGET,
    current,
    hist_mean,
    hist_quantile,
    increase,
    per_rank_rate,
    rate,
    ratio_of_rates,
    target_rate,
)
from servemon.dashboards.rule_names import burn_rate_regex
from servemon.dashboards.sli import ERRORS

__all__ = ["GOODPUT_TTFT", "burn_rates", "overview"]

#: The TTFT (seconds) the goodput panel counts as good: a client bucket edge.
GOODPUT_TTFT = 0.5


def burn_rates() -> str:
    """Every burn-rate recording rule of the picked targets."""
    return braces(f'__name__=~"{burn_rate_regex()}"', TARGET)


def _load(lay: Layout) -> None:
    lay.row("Load")
    lay.add(
        timeseries(
            "Target vs achieved request rate",
            "reqps",
            (target_rate(), "target"),
            (rate(n.CLIENT_REQUESTS), "client achieved"),
            (rate(n.ENGINE_REQUESTS_FINISHED), "server finished"),
        ),
        width=8,
    )
    lay.add(
        timeseries(
            "Completions by outcome",
            "reqps",
            (rate(n.CLIENT_REQUESTS, by=("outcome",)), "{{outcome}}"),
            (rate(n.ENGINE_REQUESTS_FINISHED, by=("reason",)), "server {{reason}}"),
            stack=False,
        ),
        width=8,
    )
    lay.add(
        timeseries(
            "In flight",
            "short",
            (current(n.CLIENT_IN_FLIGHT), "client in flight"),
            (current(n.ENGINE_REQUESTS_RUNNING), "server running"),
        ),
        width=8,
    )


def _queueing_and_cache(lay: Layout) -> None:
    lay.row("Queueing")
    by_target = ("target",)
    lay.add(
        timeseries(
            "Running vs waiting",
            "short",
            (current(n.ENGINE_REQUESTS_RUNNING, by=by_target), "running {{target}}"),
            (current(n.ENGINE_REQUESTS_WAITING, by=by_target), "waiting {{target}}"),
        ),
        width=6,
    )
    lay.add(
        timeseries("Queue time", "s", *percentiles(n.ENGINE_QUEUE, "queue")),
        width=6,
    )
    lay.add(
        timeseries(
            "Preemptions",
            "short",
            (rate(n.ENGINE_PREEMPTIONS, by=by_target), "{{target}}"),
            description="Requests evicted from the batch per second.",
        ),
        width=6,
    )
    lay.add(_lora_adapters(by_target), width=6)
    lay.add(
        timeseries(
            "Why requests wait",
            "short",
            (
                current(n.ENGINE_REQUESTS_WAITING_BY_REASON, by=("target", "reason")),
                "{{reason}} {{target}}",
            ),
            description="vLLM's waiting requests by reason: capacity (no room in "
            "the batch or the KV cache: load), deferred (LoRA budget, KV transfer, "
            "blocked: not load). A split of the waiting requests, stacked.",
            stack=True,
        ),
        width=8,
    )
    lay.add(
        timeseries(
            "Admission rejections",
            "reqps",
            (
                rate(n.ENGINE_ADMISSION_REJECTIONS, by=("target", "reason")),
                "{{reason}} {{target}}",
            ),
            description="Requests vLLM refused because a queue limit "
            "(--max-num-queued-reqs, --max-num-queued-tokens) was reached: load "
            "shed, errors to the client, and errors of the engine availability SLO.",
        ),
        width=8,
    )
    lay.add(
        timeseries(
            "Preemptions per request",
            "short",
            *percentiles(n.ENGINE_REQUEST_PREEMPTIONS, "preemptions"),
            (hist_mean(n.ENGINE_REQUEST_PREEMPTIONS), "mean"),
            description="How many times each finished request was preempted "
            "(vLLM's histogram, edges 1, 2, 3, 4, 5, 10, 20: a quantile below 1 "
            "reads as up to 1).",
        ),
        width=8,
    )
    lay.row("Cache")
    lay.add(
        timeseries(
            "KV cache usage",
            "percentunit",
            (current(n.ENGINE_KV_CACHE_USAGE, agg="max", by=by_target), "{{target}}"),
        )
    )
    lay.add(
        timeseries(
            "Prefix cache hit ratio",
            "percentunit",
            (
                ratio_of_rates(
                    n.ENGINE_PREFIX_HITS, n.ENGINE_PREFIX_QUERIES, by=by_target
                ),
                "{{target}}",
            ),
            (
                current(n.ENGINE_PREFIX_HIT_RATIO, agg="avg", by=by_target),
                "{{target}} (engine ratio)",
            ),
            description="rate(hits) / rate(queries) where the engine counts "
            "both; the engine's own ratio where it only gives one.",
        )
    )
    lay.add(
        timeseries(
            "Prompt tokens by source (what the cache saved)",
            "short",
            (
                rate(n.ENGINE_PROMPT_TOKENS_BY_SOURCE, by=("source",)),
                "{{source}}",
            ),
            description="Prompt tokens per second by where their KV came from: "
            "local_compute was prefilled, local_cache_hit (prefix cache) and "
            "external_kv_transfer (a KV connector) were not. Stacked: the whole is "
            "the prompt tokens per second.",
            stack=True,
        )
    )
    lay.add(
        timeseries(
            "Cached prompt tokens",
            "short",
            (rate(n.ENGINE_PROMPT_TOKENS_CACHED, by=("target",)), "{{target}}"),
            (
                rate(n.ENGINE_PROMPT_TOKENS_CACHED_BY_SOURCE, by=("source",)),
                "tier {{source}}",
            ),
            description="Prompt tokens per second not prefilled because their KV "
            "was cached, and by the tier that held them (device, host, p2p, "
            "disk).",
        )
    )


def _utilization() -> g.TimeSeries:
    """MFU and memory-bandwidth utilization from the engine's own estimates."""
    flops = per_rank_rate(n.ENGINE_ESTIMATED_FLOPS)
    read = per_rank_rate(n.ENGINE_ESTIMATED_READ_BYTES)
    write = per_rank_rate(n.ENGINE_ESTIMATED_WRITE_BYTES)
    nvml = current(n.GPU_MEMORY_BANDWIDTH_PEAK, agg="max")
    peak = f"({nvml} or vector({PEAK_BANDWIDTH} * 1e9))"
    return timeseries(
        "MFU and memory-bandwidth utilization (engine estimates)",
        "percentunit",
        (
            aggregate("avg", f"{flops} / ({PEAK_TFLOPS} * 1e12)", ("target",)),
            "MFU {{target}}",
        ),
        (
            aggregate(
                "avg", f"({read} + {write}) / on() group_left() {peak}", ("target",)
            ),
            "bandwidth {{target}}",
        ),
        description="vLLM's FLOP and byte estimates per GPU (--enable-mfu-metrics) "
        "over the GPU's peak, averaged over the data-parallel ranks. The peak "
        "bandwidth is NVML's (bus width x highest memory clock x 2, the largest of "
        "the picked GPUs), else the peak_bandwidth_gbps variable; the peak TFLOP/s "
        "is the peak_tflops variable (dense, in the model's dtype): NVML does not "
        "tell it.",
    )


def _lora_adapters(by: tuple[str, ...]) -> g.TimeSeries:
    """Adapter pressure: adapters running and waiting against --max-loras."""
    return timeseries(
        "LoRA adapters",
        "short",
        (current(n.ENGINE_LORA_RUNNING, by=by), "running {{target}}"),
        (current(n.ENGINE_LORA_WAITING, by=by), "waiting {{target}}"),
        (current(n.ENGINE_LORA_MAX, agg="max", by=by), "max_lora {{target}}"),
        description="Adapters with requests in the batch and adapters with "
        "requests waiting, against the most one batch may hold (vLLM's "
        "--max-loras). Waiting adapters while running is at max_lora: requests "
        "queue for an adapter's turn, not for KV or sequence room. Empty "
        "without LoRA.",
        overrides=[dashed("max_lora.*")],
    )


def _latency_and_throughput(lay: Layout) -> None:
    lay.row("Latency: the client's and the server's view")
    lay.add(
        timeseries(
            "TTFT",
            "s",
            *percentiles(n.CLIENT_TTFT, "client"),
            *percentiles(n.ENGINE_TTFT, "server"),
            (hist_quantile(n.PROBE_TTFT, 0.95), "probe p95"),
            description="Client: to the first content chunk. Server: the "
            "engine's own histogram.",
        ),
        width=8,
    )
    lay.add(
        timeseries(
            "Inter-token latency",
            "s",
            *percentiles(n.CLIENT_ITL, "client"),
            *percentiles(n.ENGINE_ITL, "server"),
        ),
        width=8,
    )
    lay.add(
        timeseries(
            "End-to-end latency",
            "s",
            *percentiles(n.CLIENT_E2E, "client"),
            *percentiles(n.ENGINE_E2E, "server"),
        ),
        width=8,
    )
    lay.row("Throughput")
    lay.add(
        timeseries(
            "Tokens per second",
            "short",
            (rate(n.ENGINE_PROMPT_TOKENS), "prompt (server)"),
            (rate(n.ENGINE_GENERATION_TOKENS), "generation (server)"),
            (rate(n.CLIENT_OUTPUT_TOKENS), "output (client)"),
        )
    )
    lay.add(
        timeseries(
            "Batch fullness: tokens per engine step",
            "short",
            *percentiles(n.ENGINE_ITERATION_TOKENS, "tokens"),
            (hist_mean(n.ENGINE_ITERATION_TOKENS), "mean"),
            description="Prompt and generated tokens each engine step ran, "
            "against the token budget (vLLM's --max-num-batched-tokens): far below "
            "it under load, the batch is limited by something else (sequences, "
            "KV cache).",
        )
    )
    lay.add(_utilization())
    lay.add(
        g.Heatmap(
            title="Client TTFT distribution",
            dataSource=DS,
            dataFormat="tsbuckets",
            targets=[
                g.Target(
                    expr=increase(n.CLIENT_TTFT, by=("le",), part="bucket"),
                    legendFormat="{{le}}",
                    format="heatmap",
                    refId="A",
                    datasource=DS,
                )
            ],
            yAxis=g.YAxis(format="s"),
            hideZeroBuckets=True,
        )
    )


def _slo(lay: Layout) -> None:
    lay.row("SLO")
    errors = ERRORS["client"]
    within = f"{GOODPUT_TTFT:g} s"
    lay.add(
        stat(
            f"Goodput (client, TTFT within {within})",
            "reqps",
            rate(n.CLIENT_TTFT, le_matcher(GOODPUT_TTFT), part="bucket"),
            f"Requests per second whose TTFT met {within} (a bucket edge).",
        ),
        width=6,
    )
    lay.add(
        stat(
            "Client error ratio",
            "percentunit",
            f"({rate(n.CLIENT_REQUESTS, errors.failed)} or vector(0)) / "
            f"{rate(n.CLIENT_REQUESTS, *errors.judged)}",
        ),
        width=6,
    )
    lay.add(stat("Targets up", "short", current(n.TARGET_UP)), width=6)
    lay.add(stat("Probe p95 TTFT", "s", hist_quantile(n.PROBE_TTFT, 0.95)), width=6)
    lay.add(
        timeseries(
            "SLO burn rate (from servemon rules)",
            "short",
            (burn_rates(), "{{__name__}}"),
            description="Recording rules generated by `servemon rules`; one line "
            "per SLO and window. 1 = spending the budget exactly at the "
            "allowed pace.",
        ),
        width=24,
    )


def overview() -> g.Dashboard:
    """Serving overview: load, queueing, cache, latency, throughput, GPU, SLO."""
    lay = Layout()
    _load(lay)
    _queueing_and_cache(lay)
    _latency_and_throughput(lay)
    lay.row("GPU")
    gpu_panels(lay)
    _slo(lay)
    return dashboard(
        "servemon: serving overview",
        "servemon-overview",
        lay,
        gpu=True,
        variables=peak_variables(),
    )
