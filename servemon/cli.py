"""The ``servemon`` console script."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from servemon import __version__
from servemon.errors import ServemonError
from servemon.fields import read_yaml
from simulator.config import DIALECTS, SimConfig, merge

__all__ = ["main"]

F = TypeVar("F", bound=Callable[..., Any])

SIM_FLAGS = (
    "host",
    "port",
    "profile",
    "served_model_name",
    "max_num_seqs",
    "max_num_batched_tokens",
    "num_gpu_blocks",
    "block_size",
    "max_model_len",
    "enable_prefix_caching",
    "eos_probability",
    "speed",
    "metrics_dialect",
    "seed",
    "trace",
)
FAULT_FLAGS = {
    "http_500_fraction": "http_500_fraction",
    "http_503_fraction": "http_503_fraction",
    "cut_stream_fraction": "cut_stream_fraction",
    "malformed_sse_fraction": "malformed_sse_fraction",
    "first_token_stall": "first_token_stall_s",
    "slow_headers": "slow_headers_s",
    "metrics_fault": "metrics",
    "role_chunk": "role_chunk",
    "role_chunk_delay": "role_chunk_delay_s",
}


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="servemon")
def main() -> None:
    """Watch LLM serving endpoints under load."""


def _sim_options(func: F) -> F:
    options = [
        click.option(
            "--config",
            "config_file",
            type=click.Path(path_type=Path),
            help="YAML file with any of these settings; flags win.",
        ),
        click.option("--host", help="Address to bind. [default: 127.0.0.1]"),
        click.option(
            "--port", type=int, help="Port; 0 picks a free one. [default: 8000]"
        ),
        click.option(
            "--profile",
            help="Built-in profile (tiny, qwen3-0.6b-eager) or a "
            "profile YAML file. [default: qwen3-0.6b-eager]",
        ),
        click.option(
            "--served-model-name", help="Model id to serve. [default: the profile's]"
        ),
        click.option(
            "--max-num-seqs",
            type=int,
            help="Most sequences in one step. [default: 256]",
        ),
        click.option(
            "--max-num-batched-tokens",
            type=int,
            help="Most tokens in one step (chunked prefill). [default: 2048]",
        ),
        click.option(
            "--num-gpu-blocks",
            type=int,
            help="KV cache blocks. [default: the profile's]",
        ),
        click.option(
            "--block-size", type=int, help="Tokens per KV block. [default: 16]"
        ),
        click.option(
            "--max-model-len",
            type=int,
            help="Longest prompt + output. [default: the profile's]",
        ),
        click.option(
            "--enable-prefix-caching/--no-prefix-caching",
            default=None,
            help="Reuse cached prompt blocks. [default: on]",
        ),
        click.option(
            "--eos-probability",
            type=float,
            help="Per-token chance of an "
            "early stop unless ignore_eos. [default: the profile's]",
        ),
        click.option(
            "--speed",
            type=float,
            help="Speed factor on every step (2 = twice as fast). [default: 1]",
        ),
        click.option(
            "--metrics-dialect",
            type=click.Choice(DIALECTS),
            help="Metric names of which engine and version. [default: vllm]",
        ),
        click.option(
            "--seed",
            type=int,
            help="Seed of output lengths, text and fault draws. [default: 0]",
        ),
        click.option(
            "--trace",
            help="Write one JSON line per request (server-side "
            "monotonic times) to this file.",
        ),
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
            type=float,
            help="Seconds of stall before "
            "a request reaches the engine (after headers).",
        ),
        click.option(
            "--slow-headers",
            type=float,
            help="Seconds before the response headers are sent.",
        ),
        click.option(
            "--metrics-fault",
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
            type=float,
            help="Send the role chunk this many seconds after the headers (0: at "
            "once) instead of with the first token, as vLLM does.",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def sim_config(config_file: Path | None, flags: dict[str, Any]) -> SimConfig:
    """The simulator's config: defaults, then the YAML file, then flags."""
    config = SimConfig()
    if config_file is not None:
        config = merge(config, read_yaml(config_file), str(config_file))
    overrides: dict[str, Any] = {k: flags.get(k) for k in SIM_FLAGS}
    overrides["faults"] = {
        field: flags.get(flag) for flag, field in FAULT_FLAGS.items()
    }
    return merge(config, overrides, "command line")


@main.command()
@_sim_options
def sim(config_file: Path | None, **flags: Any) -> None:
    """Serve a simulated vLLM endpoint (OpenAI API and vLLM /metrics)."""
    config = _run_or_exit(lambda: sim_config(config_file, flags))
    _run_or_exit(lambda: asyncio.run(_serve_sim(config)))


async def _serve_sim(config: SimConfig) -> None:
    from simulator.server import SimServer

    server = SimServer(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        click.echo(
            f"servemon sim: serving {server.model} (profile {server.profile.name}, "
            f"metrics {config.metrics_dialect}) on {server.url}",
        )
        sys.stdout.flush()
        await stop.wait()
    click.echo("servemon sim: stopped")


@main.command()
@click.option(
    "--profile",
    default="qwen3-0.6b-eager",
    show_default=True,
    help="Simulator profile.",
)
@click.option(
    "--number",
    type=click.IntRange(1, 10_000),
    default=16,
    show_default=True,
    help="Requests to measure.",
)
@click.option(
    "--concurrency",
    type=click.IntRange(1, 1024),
    default=8,
    show_default=True,
    help="Requests in flight.",
)
@click.option(
    "--prompt-tokens",
    type=click.IntRange(1, 100_000),
    default=128,
    show_default=True,
    help="Prompt length in words (tokens for the sim).",
)
@click.option(
    "--max-tokens",
    type=click.IntRange(1, 100_000),
    default=128,
    show_default=True,
    help="Output limit per request.",
)
@click.option("--seed", type=int, default=0, show_default=True)
def demo(
    profile: str,
    number: int,
    concurrency: int,
    prompt_tokens: int,
    max_tokens: int,
    seed: int,
) -> None:
    """Start the built-in simulator and measure a burst of streamed requests."""
    from servemon.demo import run_demo

    _run_or_exit(
        lambda: asyncio.run(
            run_demo(
                profile=profile,
                number=number,
                concurrency=concurrency,
                prompt_tokens=prompt_tokens,
                max_tokens=max_tokens,
                seed=seed,
            )
        )
    )


T = TypeVar("T")


def _run_or_exit(func: Callable[[], T]) -> T:
    """Run ``func``; a ServemonError becomes one line on stderr and exit 2."""
    try:
        return func()
    except ServemonError as exc:
        click.echo(f"servemon: error: {exc}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        with contextlib.suppress(Exception):
            click.echo("servemon: interrupted", err=True)
        sys.exit(130)
