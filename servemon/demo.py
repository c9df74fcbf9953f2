"""``servemon demo``: the simulator, a burst of streamed requests, what was measured."""

from __future__ import annotations

import random

from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.table import Table

from loadgen.client import ClientSettings, make_session
from loadgen.closedloop import run_closed_loop
from loadgen.summary import Distribution, Summary, summarize
from loadgen.workload import chat_body, random_prompt
from simulator.config import SimConfig
from simulator.server import SimServer

__all__ = ["run_demo"]

SERVER_SERIES = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:request_success_total",
)


async def run_demo(
    *,
    profile: str,
    number: int,
    concurrency: int,
    prompt_tokens: int,
    max_tokens: int,
    seed: int,
) -> Summary:
    """Run the burst and print what the client and the server measured."""
    console = Console(soft_wrap=True)
    config = SimConfig(port=0, profile=profile, seed=seed)
    async with SimServer(config) as server, make_session(ClientSettings()) as session:
        console.print(
            f"servemon demo: simulator ({server.profile.name}, model {server.model})"
            f" on {server.url}; {number} streamed chat requests, "
            f"{concurrency} in flight, "
            f"{prompt_tokens}-word prompts, max_tokens {max_tokens}"
        )
        rng = random.Random(seed)
        prompts = [random_prompt(rng, prompt_tokens) for _ in range(number)]
        timings = await run_closed_loop(
            session,
            server.url + "/v1/chat/completions",
            lambda i: chat_body(server.model, prompts[i], max_tokens),
            concurrency=concurrency,
            number=number,
            id_prefix="demo",
        )
        async with session.get(server.url + "/metrics") as resp:
            exposition = await resp.text()
    summary = summarize(timings)
    console.print(_client_table(summary))
    console.print(_server_excerpt(exposition))
    return summary


def _client_table(summary: Summary) -> Table:
    table = Table(title="What the client measured", title_justify="left")
    for column in ("figure", "mean", "p50", "p90", "p99"):
        table.add_column(column, justify="left" if column == "figure" else "right")

    def row(name: str, dist: Distribution | None) -> None:
        if dist is None:
            table.add_row(name, "-", "-", "-", "-")
            return
        table.add_row(
            name,
            *(f"{v * 1000:.1f}" for v in (dist.mean, dist.p50, dist.p90, dist.p99)),
        )

    row("TTFT (ms)", summary.ttft)
    row("TPOT (ms)", summary.tpot)
    row("ITL (ms)", summary.itl)
    row("E2E (ms)", summary.e2e)
    outcomes = ", ".join(f"{k} {v}" for k, v in sorted(summary.outcomes.items()))
    table.caption = (
        f"{summary.requests} requests ({outcomes}) in {summary.duration_s:.2f} s: "
        f"{summary.request_throughput:.2f} req/s, "
        f"output {summary.output_throughput:.1f} tok/s, "
        f"mean output {summary.mean_output_tokens or 0:.1f} tokens"
    )
    return table


def _server_excerpt(exposition: str) -> str:
    lines = ["What the server's /metrics says now:"]
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name in SERVER_SERIES:
                labels = ",".join(
                    f'{k}="{v}"' for k, v in sorted(sample.labels.items())
                )
                lines.append(f"  {sample.name}{{{labels}}} {sample.value:g}")
    return "\n".join(lines)
