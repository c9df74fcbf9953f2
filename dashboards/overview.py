"""The serving overview: load, queueing, cache, latency, throughput, GPU, SLO.

Latency panels put the client's and the server's histograms side by side. The SLO
row reads the same definitions as ``servemon rules``: the client error ratio counts
the errors :data:`dashboards.sli.ERRORS` defines, and the burn-rate panel selects
the recording rules by the names :mod:`dashboards.rule_names` gives them.
"""

from __future__ import annotations

from grafanalib import core as g

from dashboards.gpu import gpu_panels
from dashboards.panels import (
    DS,
    Layout,
    dashboard,
    dashed,
    percentiles,
    stat,
    timeseries,
)
from dashboards.queries import (
    TARGET,
    current,
    hist_quantile,
    increase,
    rate,
    ratio_of_rates,
    target_rate,
)
from dashboards.rule_names import burn_rate_regex
from dashboards.sli import ERRORS
from monitor import names as n
from monitor.promql import braces, le_matcher

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
    return dashboard("servemon: serving overview", "servemon-overview", lay, gpu=True)
