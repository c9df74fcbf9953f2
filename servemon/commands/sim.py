"""``servemon sim``: serve the simulated vLLM endpoint until stopped.

Each option is a field of :class:`servemon.simulator.config.SimConfig`, and each fault
option is named after its field of :class:`servemon.simulator.config.Faults`, so the
flags map onto the config by name alone.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from pathlib import Path
from typing import Any

import click

from servemon.commands import options
from servemon.commands.defaults import fill_defaults
from servemon.core.fields import layer_config
from servemon.lifecycle import stop_on_signals, stop_when_orphaned
from servemon.simulator.config import (
    DIALECTS,
    REASONING_FIELDS,
    WIRE_DIALECTS,
    Faults,
    SimConfig,
)

__all__ = ["sim", "sim_config"]

FAULTS = tuple(f.name for f in dataclasses.fields(Faults))

sim_options = options.compose(
    options.config_file(),
    click.option("--host", help="Address to bind."),
    click.option("--port", type=int, help="Port; 0 picks a free one."),
    options.profile(),
    click.option(
        "--served-model-name",
        multiple=True,
        help="Model id to serve; repeat for aliases (the first names the model in "
        "responses and metrics). [default: the profile's]",
    ),
    click.option(
        "--lora-modules",
        multiple=True,
        help="A LoRA adapter to serve, NAME or NAME=PATH (the path is ignored); "
        "repeat for more.",
    ),
    click.option(
        "--max-loras",
        type=int,
        help="Most distinct LoRA adapters in one batch.",
    ),
    click.option(
        "--max-cpu-loras",
        type=int,
        help="LoRA adapters kept loaded. [default: --max-loras]",
    ),
    click.option(
        "--lora-load",
        "lora_load_s",
        type=float,
        help="Seconds a step takes longer per adapter it must load.",
    ),
    click.option(
        "--reasoning-tokens",
        help="Reasoning tokens first in each answer: N, or A:B drawn per request.",
    ),
    click.option(
        "--reasoning-field",
        type=click.Choice(REASONING_FIELDS),
        help="Chat field for reasoning: reasoning_content (vLLM <= 0.11.0, "
        "llama.cpp), reasoning (vLLM >= 0.16) or both (vLLM 0.11.1-0.15).",
    ),
    click.option(
        "--reasoning-usage",
        is_flag=True,
        default=None,
        help="usage.completion_tokens_details.reasoning_tokens (vLLM does not "
        "report it).",
    ),
    options.max_num_seqs(),
    click.option(
        "--max-num-batched-tokens",
        type=int,
        help="Most tokens in one step (chunked prefill).",
    ),
    click.option(
        "--num-gpu-blocks", type=int, help="KV cache blocks. [default: the profile's]"
    ),
    click.option("--block-size", type=int, help="Tokens per KV block. [default: 16]"),
    click.option(
        "--max-model-len",
        type=int,
        help="Longest prompt + output. [default: the profile's]",
    ),
    click.option(
        "--enable-prefix-caching/--no-prefix-caching",
        default=None,
        help="Reuse cached prompt blocks.",
    ),
    click.option(
        "--eos-probability",
        type=float,
        help="Per-token chance of an early stop unless ignore_eos. "
        "[default: the profile's]",
    ),
    click.option(
        "--speed",
        type=float,
        help="Speed factor on every step (2 = twice as fast).",
    ),
    click.option(
        "--max-num-queued-reqs",
        type=int,
        help="Refuse (503) a request that finds this many in flight, as vLLM's "
        "flag. [default: no limit]",
    ),
    click.option(
        "--max-num-queued-tokens",
        type=int,
        help="Refuse (503) a request while this many prompt tokens wait to be "
        "prefilled, as vLLM's flag. [default: no limit]",
    ),
    click.option(
        "--enable-mfu-metrics",
        is_flag=True,
        default=None,
        help="Count the vllm:estimated_* FLOPs and bytes (vllm-0.25 and later "
        "dialects), as vLLM's flag.",
    ),
    click.option(
        "--metrics-dialect",
        type=click.Choice(DIALECTS),
        help="Metric names of which engine and version.",
    ),
    click.option(
        "--dialect",
        type=click.Choice(WIRE_DIALECTS),
        help="Whose wire format: stream grammar, errors, endpoints "
        "(llamacpp also sets its metric names).",
    ),
    click.option(
        "--enable-prompt-tokens-details",
        is_flag=True,
        default=None,
        help="usage.prompt_tokens_details.cached_tokens, as vLLM's flag.",
    ),
    click.option(
        "--enable-per-request-metrics",
        is_flag=True,
        default=None,
        help="A per-request metrics object, as vLLM's flag.",
    ),
    options.seed(),
    click.option(
        "--trace",
        help="Write one JSON line per request (server-side monotonic times) to "
        "this file.",
    ),
    # faults: the second name of each is its field of Faults
    click.option(
        "--http-500-fraction", type=float, help="Fraction of requests answered 500."
    ),
    click.option("--http-503-fraction", type=float, help="Fraction answered 503."),
    click.option(
        "--cut-stream-fraction",
        type=float,
        help="Fraction of streams cut half-way without [DONE].",
    ),
    click.option(
        "--malformed-sse-fraction",
        type=float,
        help="Fraction of streams with a malformed SSE line half-way.",
    ),
    click.option(
        "--first-token-stall",
        "first_token_stall_s",
        type=float,
        help="Seconds of stall before a request reaches the engine (after headers).",
    ),
    click.option(
        "--slow-headers",
        "slow_headers_s",
        type=float,
        help="Seconds before the response headers are sent.",
    ),
    click.option(
        "--metrics-fault",
        "metrics",
        type=click.Choice(["ok", "garbage", "hang", "503"]),
        help="How /metrics misbehaves. [default: ok]",
    ),
    click.option(
        "--role-chunk/--no-role-chunk",
        default=None,
        help="Send a role-only first chunk, as vLLM does. [default: on]",
    ),
    click.option(
        "--role-chunk-delay",
        "role_chunk_delay_s",
        type=float,
        help="Send the role chunk this many seconds after the headers (0: at "
        "once) instead of with the first token, as vLLM does.",
    ),
)


def sim_config(config_file: Path | None, flags: dict[str, Any]) -> SimConfig:
    """The simulator's config from ``sim``'s options (faults by their field names)."""
    given = dict(flags)
    given["faults"] = {name: given.pop(name, None) for name in FAULTS}
    return layer_config(SimConfig, config_file, given)


@click.command()
@sim_options
@options.exit_with_parent()
def sim(config_file: Path | None, exit_with_parent: bool, **flags: Any) -> None:
    """Serve a simulated vLLM endpoint (OpenAI API and vLLM /metrics)."""
    config = sim_config(config_file, flags)
    asyncio.run(_serve(config, exit_with_parent))


async def _serve(config: SimConfig, exit_with_parent: bool) -> None:
    from servemon.simulator.server import SimServer

    server = SimServer(config)
    stop = asyncio.Event()
    with stop_on_signals(stop):
        async with stop_when_orphaned(stop, exit_with_parent), server:
            click.echo(
                f"servemon sim: serving {server.model} (profile "
                f"{server.profile.name}, metrics {config.metrics_dialect}) on "
                f"{server.url}",
            )
            sys.stdout.flush()
            await stop.wait()
    click.echo("servemon sim: stopped")


fill_defaults(sim, SimConfig)
