"""The ``servemon`` console script."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

import click

from loadgen.config import LoadConfig, merge_load, parse_extra_body
from monitor.config import ExporterConfig, merge_exporter, parse_target
from servemon import __version__
from servemon.errors import ConfigError, ServemonError
from servemon.fields import read_yaml
from simulator.config import DIALECTS, WIRE_DIALECTS, SimConfig, merge

__all__ = ["cli", "main"]

F = TypeVar("F", bound=Callable[..., Any])
#: The run directories a command reads (compare, merge).
RUN_DIRS = click.argument(
    "run_dirs",
    nargs=-1,
    required=True,
    type=click.Path(path_type=Path, file_okay=False),
)
T = TypeVar("T")

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
    "dialect",
    "enable_prompt_tokens_details",
    "enable_per_request_metrics",
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
def cli() -> None:
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
            "--dialect",
            type=click.Choice(WIRE_DIALECTS),
            help="Whose wire format: stream grammar, errors, endpoints "
            "(llamacpp also sets its metric names). [default: vllm]",
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
    return _with_options(options, func)


def _with_options(options: Sequence[Callable[[Any], Any]], func: F) -> F:
    """``func`` decorated with ``options``, the first one outermost (shown first)."""
    decorated: Any = func
    for option in reversed(options):
        decorated = option(decorated)
    result: F = decorated
    return result


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


@cli.command()
@_sim_options
@click.option(
    "--exit-with-parent",
    is_flag=True,
    hidden=True,
    help="Stop when the parent process goes away (for embedding).",
)
def sim(config_file: Path | None, exit_with_parent: bool, **flags: Any) -> None:
    """Serve a simulated vLLM endpoint (OpenAI API and vLLM /metrics)."""
    config = _run_or_exit(lambda: sim_config(config_file, flags))
    _run_or_exit(lambda: asyncio.run(_serve_sim(config, exit_with_parent)))


async def _serve_sim(config: SimConfig, exit_with_parent: bool = False) -> None:
    from simulator.server import SimServer

    server = SimServer(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    watchdog = (
        asyncio.create_task(_watch_parent(os.getppid(), stop))
        if exit_with_parent
        else None
    )
    async with server:
        click.echo(
            f"servemon sim: serving {server.model} (profile {server.profile.name}, "
            f"metrics {config.metrics_dialect}) on {server.url}",
        )
        sys.stdout.flush()
        await stop.wait()
    if watchdog is not None:
        watchdog.cancel()
    click.echo("servemon sim: stopped")


async def _watch_parent(parent: int, stop: asyncio.Event) -> None:
    """Set ``stop`` once this process has been re-parented (its parent died)."""
    while os.getppid() == parent:  # noqa: ASYNC110 (no event exists for this)
        await asyncio.sleep(0.5)
    stop.set()


@cli.command()
@click.option(
    "--profile",
    default="qwen3-0.6b-eager",
    show_default=True,
    help="Simulator profile.",
)
@click.option(
    "--max-num-seqs",
    type=click.IntRange(1, 4096),
    default=16,
    show_default=True,
    help="The simulator's batch size.",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=Path("runs"),
    show_default=True,
    help="Parent of the run directory.",
)
@click.option(
    "--max-duration",
    type=float,
    default=150.0,
    show_default=True,
    help="Seconds the capacity search may take.",
)
@click.option(
    "--step-seconds",
    type=float,
    default=10.0,
    show_default=True,
    help="Length of one step of the search.",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--keep", is_flag=True, help="Keep everything up after the search, until Ctrl-C."
)
def demo(
    profile: str,
    max_num_seqs: int,
    out: Path,
    max_duration: float,
    step_seconds: float,
    seed: int,
    keep: bool,
) -> None:
    """Simulator, exporter and Prometheus, a short capacity search, a report."""
    from servemon.demo import run_demo

    result = _run_or_exit(
        lambda: _asyncio_run(
            run_demo(
                profile=profile,
                max_num_seqs=max_num_seqs,
                out=out,
                seed=seed,
                max_duration=max_duration,
                step_seconds=step_seconds,
                keep=keep,
            )
        )
    )
    if result.status != "completed":
        sys.exit(130)


def _load_options(func: F) -> F:
    options = [
        click.option(
            "--config",
            "config_file",
            type=click.Path(path_type=Path),
            help="YAML with any of these settings (names with underscores); flags win.",
        ),
        click.option(
            "--target",
            help="Base URL of an OpenAI-compatible server. "
            "Without it the built-in simulator is started on a free port.",
        ),
        click.option(
            "--target-name",
            help="The target label of the live client series. [default: host:port "
            "of --target, as the exporter names it]",
        ),
        click.option(
            "--model", help="Model to ask for. [default: the first of /v1/models]"
        ),
        click.option(
            "--api",
            type=click.Choice(["chat", "completions"]),
            help="Which API. [default: chat]",
        ),
        click.option(
            "--stream/--no-stream",
            default=None,
            help="Stream responses (TTFT and ITL need it). [default: stream]",
        ),
        click.option(
            "--workload",
            help="random:prompt=N,output=N | shared-prefix:"
            "prefix=N,prompts=N,suffix=N,output=N | file:PATH. [default: "
            "random:prompt=128,output=128]",
        ),
        click.option(
            "--tokenizer",
            help="A local tokenizer.json for exact prompt "
            "lengths. [default: the target's /tokenize, else an estimate]",
        ),
        click.option(
            "--ignore-eos/--no-ignore-eos",
            default=None,
            help="Ask for the full output length.",
        ),
        click.option(
            "--extra-body", help="JSON object merged into every request body."
        ),
        click.option(
            "--header",
            multiple=True,
            help="'Name: value' added to every "
            "request (never recorded). SERVEMON_API_KEY sets a bearer token.",
        ),
        click.option(
            "--timeout", type=float, help="Seconds a request may take. [default: 600]"
        ),
        click.option("--out", help="Parent of the run directory. [default: runs]"),
        click.option(
            "--metrics-host",
            help="Address of the live client /metrics (0.0.0.0 inside a pod). "
            "[default: 127.0.0.1]",
        ),
        click.option(
            "--metrics-port",
            type=int,
            help="Port of the live client "
            "/metrics on 127.0.0.1 (0: any free). [default: 9401]",
        ),
        click.option(
            "--seed",
            type=int,
            help="Seed of arrivals, prompts and cancellations. [default: 0]",
        ),
        click.option(
            "--slo",
            help="e.g. ttft_p95<=0.5,itl_p95<=0.05,error_rate<=0.01 "
            "(seconds): goodput and pass/fail per stage.",
        ),
        click.option(
            "--cancel-fraction",
            type=float,
            help="Fraction of requests the client walks away from.",
        ),
        click.option("--cancel-after", type=float, help="... after this many seconds."),
        click.option(
            "--cancel-after-tokens",
            type=int,
            help="... or after this many content chunks.",
        ),
        click.option(
            "--grace",
            type=float,
            help="Seconds requests in flight get after Ctrl-C or SIGTERM. [default: 5]",
        ),
        click.option(
            "--sim-arg",
            "sim_args",
            multiple=True,
            help="Extra flag for the built-in simulator, e.g. "
            "--sim-arg=--max-num-seqs=8 (repeatable).",
        ),
        click.option(
            "--sim-profile",
            help="Profile of the built-in simulator when "
            "there is no --target. [default: qwen3-0.6b-eager]",
        ),
    ]
    return _with_options(options, func)


def load_config(config_file: Path | None, flags: dict[str, Any]) -> LoadConfig:
    """A load run's config: defaults, then the YAML file, then flags."""
    config = LoadConfig()
    if config_file is not None:
        config = merge_load(config, read_yaml(config_file), str(config_file))
    overrides = dict(flags)
    if overrides.get("extra_body") is not None:
        overrides["extra_body"] = parse_extra_body(overrides["extra_body"])
    for key in ("parallel", "number"):
        if overrides.get(key):
            overrides[key] = _int_list(key, overrides[key])
    return merge_load(config, overrides, "command line")


def _int_list(name: str, text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.replace(",", " ").split())
    except ValueError:
        raise ConfigError(
            f"--{name}: expected integers, e.g. --{name} 1 2 4 8"
        ) from None


def _run_load(kind: Literal["ramp", "sweep", "capacity"], config: LoadConfig) -> None:
    from servemon.load import run_command

    result = _run_or_exit(lambda: _asyncio_run(run_command(kind, config, sys.argv)))
    if result.status != "completed":
        sys.exit(130)


def _asyncio_run(coro: Coroutine[Any, Any, T]) -> T:
    """Run on uvloop where it is installed, else asyncio's default loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


@cli.command()
@_load_options
@click.option(
    "--stages", help="RPS:SECONDS,... e.g. 2:30,4:30,8:30. [default: 1:10,2:10,4:10]"
)
@click.option("--rps-start", type=float, help="First rate of a linear ramp.")
@click.option("--rps-end", type=float, help="Last rate of a linear ramp.")
@click.option("--rps-step", type=float, help="Rate increment. [default: 1]")
@click.option("--step-seconds", type=float, help="Seconds per rate. [default: 30]")
@click.option("--arrival", help="constant | poisson | gamma:CV. [default: poisson]")
@click.option(
    "--max-inflight",
    type=int,
    help="Safety cap on requests in flight; "
    "what it holds back is counted. [default: 1000]",
)
@click.option(
    "--late",
    type=click.Choice(["send", "skip"]),
    help="Requests that "
    "could only go out late: send them late, or skip them. [default: send]",
)
@click.option(
    "--late-tolerance",
    type=float,
    help="Seconds late before --late skip applies. [default: 1]",
)
@click.option("--max-requests", type=int, help="Stop the schedule after this many.")
@click.option(
    "--shard",
    help="Run shard I of N (0-based): every N-th arrival of the "
    "same seeded schedule; merge the shards with servemon merge.",
)
@click.option(
    "--start-at",
    help="Start the schedule at this UTC time (ISO 8601), so "
    "that shards start together.",
)
@click.option(
    "--workers",
    type=int,
    help="Send the schedule from this many "
    "processes (shards merged at the end), when one cannot keep up. "
    "[default: 1]",
)
def ramp(config_file: Path | None, **flags: Any) -> None:
    """Open-loop load: requests at scheduled times, whatever is in flight."""
    config = _run_or_exit(lambda: load_config(config_file, flags))
    _run_load("ramp", config)


@cli.command()
@_load_options
@click.option(
    "--parallel", help="Concurrency levels, e.g. --parallel 1 2 4 8. [default: 1 2 4 8]"
)
@click.option(
    "--number",
    help="Requests measured per level (one value, or one per level). [default: 16]",
)
@click.option(
    "--warmup", type=int, help="Warm-up requests per level, not counted. [default: 0]"
)
def sweep(config_file: Path | None, **flags: Any) -> None:
    """Closed loop: each level keeps N requests in flight until M have finished."""
    config = _run_or_exit(lambda: load_config(config_file, flags))
    _run_load("sweep", config)


@cli.command()
@click.option(
    "--config",
    "config_file",
    type=click.Path(path_type=Path),
    help="YAML with any of these settings (targets: a list of {url, name, "
    "engine, model}); flags win.",
)
@click.option(
    "--target",
    "targets",
    multiple=True,
    help="[NAME=]URL of an engine "
    "(repeatable). NAME becomes the target label [default: host:port].",
)
@click.option("--listen", help="Address for /metrics. [default: 127.0.0.1:9400]")
@click.option(
    "--scrape-timeout",
    type=float,
    help="Seconds to wait for a target "
    "(kept below the scraper's own timeout). [default: 2.5]",
)
@click.option(
    "--max-body-bytes",
    type=int,
    help="Largest /metrics body accepted from a target. [default: 8 MiB]",
)
@click.option(
    "--passthrough/--no-passthrough",
    default=None,
    help="Also pass through families servemon does not know.",
)
@click.option("--gpu/--no-gpu", default=None, help="GPU stats from NVML. [default: on]")
@click.option(
    "--gpu-interval", type=float, help="Seconds between NVML reads. [default: 2]"
)
@click.option(
    "--probe-interval",
    type=float,
    help="Seconds between canary requests per target. [default: off]",
)
@click.option("--probe-prompt", help="The canary's prompt.")
@click.option(
    "--probe-max-tokens", type=int, help="The canary's max_tokens. [default: 8]"
)
@click.option(
    "--auth-file",
    help="YAML with bearer_token or basic_auth that /metrics asks scrapers for.",
)
@click.option("--exit-with-parent", is_flag=True, hidden=True)
@click.option(
    "--fake-gpu",
    is_flag=True,
    help="Serve a made-up GPU instead of NVML (demos and tests without a GPU).",
)
def exporter(
    config_file: Path | None,
    targets: tuple[str, ...],
    fake_gpu: bool,
    exit_with_parent: bool,
    **flags: Any,
) -> None:
    """Export engine /metrics in servemon's schema, GPU stats and a canary probe."""
    config = _run_or_exit(lambda: exporter_config(config_file, targets, flags))
    _run_or_exit(
        lambda: _asyncio_run(_serve_exporter(config, fake_gpu, exit_with_parent))
    )


def exporter_config(
    config_file: Path | None, targets: Sequence[str], flags: dict[str, Any]
) -> ExporterConfig:
    """The exporter's config: defaults, then the YAML file, then flags."""
    config = ExporterConfig()
    if config_file is not None:
        config = merge_exporter(config, read_yaml(config_file), str(config_file))
    overrides = dict(flags)
    overrides["targets"] = tuple(parse_target(t) for t in targets)
    config = merge_exporter(config, overrides, "command line")
    if not config.targets:
        raise ConfigError("--target: give at least one (or targets: in --config)")
    return config


async def _serve_exporter(
    config: ExporterConfig, fake_gpu: bool = False, exit_with_parent: bool = False
) -> None:
    import logging

    from monitor.exporter import Exporter
    from monitor.gpu import FakeGpuReader

    logging.basicConfig(level=logging.INFO, format="servemon exporter: %(message)s")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    watchdog = (
        asyncio.create_task(_watch_parent(os.getppid(), stop))
        if exit_with_parent
        else None
    )
    async with Exporter(
        config, gpu_reader=FakeGpuReader() if fake_gpu else None
    ) as exp:
        names = ", ".join(f"{t.name}={t.url}" for t in exp.targets)
        click.echo(f"servemon exporter: serving {exp.url}/metrics for {names}")
        sys.stdout.flush()
        await stop.wait()
    if watchdog is not None:
        watchdog.cancel()
    click.echo("servemon exporter: stopped")


@cli.command()
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path),
    default=Path("dashboards/json"),
    show_default=True,
    help="Folder for the dashboard JSON files.",
)
def dashboards(out_dir: Path) -> None:
    """Generate the Grafana dashboards (serving overview, ramp test, GPU)."""
    from dashboards.build import write_dashboards

    for path in write_dashboards(out_dir):
        click.echo(str(path))


@cli.command()
@click.argument("run_dir", type=click.Path(path_type=Path, file_okay=False))
def report(run_dir: Path) -> None:
    """Write RUN_DIR/report.html from the run directory alone."""
    from loadgen.report import write_report

    click.echo(str(_run_or_exit(lambda: write_report(run_dir))))


@cli.command()
@RUN_DIRS
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=Path("compare.html"),
    show_default=True,
    help="Where to write the HTML comparison.",
)
def compare(run_dirs: tuple[Path, ...], out: Path) -> None:
    """Compare run directories level by level, with ratios and caveats."""
    from rich.console import Console
    from rich.table import Table

    from loadgen.compare import header, rows, write_compare

    if len(run_dirs) < 2:
        _run_or_exit(_fail("compare: give at least two run directories"))
    result = _run_or_exit(lambda: write_compare(run_dirs, out))
    if not result.levels:
        _run_or_exit(_fail("compare: the runs share no load level (rate or parallel)"))
    table = Table(title="servemon compare", title_justify="left")
    for column in header(result):
        table.add_column(column, justify="right")
    for row in rows(result):
        table.add_row(*row)
    console = Console(soft_wrap=True)
    if not console.is_terminal:
        console = Console(soft_wrap=True, width=200)
    console.print(table)
    for warning in result.warnings:
        console.print(f"caution: {warning}")
    console.print(f"written: {out}")


def _fail(message: str) -> Callable[[], None]:
    def raise_it() -> None:
        raise ConfigError(message)

    return raise_it


@cli.command()
@_load_options
@click.option("--rps-min", type=float, help="Where the search starts. [default: 0.5]")
@click.option(
    "--rps-max",
    type=float,
    help="Never offer more (required when the "
    "target is not on this machine). [default: 10000 on loopback]",
)
@click.option(
    "--max-duration",
    type=float,
    help="Seconds the whole search may take. [default: 600]",
)
@click.option("--step-seconds", type=float, help="Length of one step. [default: 20]")
@click.option(
    "--settle",
    type=float,
    help="Seconds at the start of a step that are not judged. [default: 5]",
)
@click.option(
    "--precision",
    type=float,
    help="Stop bisecting when bad/good - 1 is below this. [default: 0.05]",
)
@click.option("--arrival", help="constant | poisson | gamma:CV. [default: poisson]")
@click.option(
    "--abort-error-rate",
    type=float,
    help="Stop at once above this error share over 10 s. [default: 0.2]",
)
def capacity(config_file: Path | None, **flags: Any) -> None:
    """Find the highest request rate that meets the SLO, and what saturates first."""
    config = _run_or_exit(lambda: load_config(config_file, flags))
    _run_load("capacity", config)


@cli.command("merge")
@RUN_DIRS
@click.option(
    "--out",
    "out_parent",
    type=click.Path(path_type=Path),
    default=Path("runs"),
    show_default=True,
    help="Parent of the merged run directory.",
)
def merge_command(run_dirs: tuple[Path, ...], out_parent: Path) -> None:
    """Merge shard run directories (servemon ramp --shard I/N) into one run."""
    from loadgen.merge import merge_runs

    path = _run_or_exit(lambda: merge_runs(run_dirs, out_parent))
    click.echo(f"merged run directory: {path}")
    click.echo(f"report: {path / 'report.html'}")


@cli.command()
@click.option(
    "--slo-config",
    type=click.Path(path_type=Path, dir_okay=False),
    required=True,
    help="SLO YAML (see deploy/slos.example.yaml).",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path),
    default=Path("deploy/rules"),
    show_default=True,
    help="Folder for the rule files.",
)
def rules(slo_config: Path, out_dir: Path) -> None:
    """Generate Prometheus recording rules and SLO burn-rate alerts."""
    from dashboards.rules import load_slo_config, write_rules

    config = _run_or_exit(lambda: load_slo_config(slo_config))
    for path in write_rules(config, out_dir):
        click.echo(str(path))


def join_multi_values(argv: list[str], names: Sequence[str]) -> list[str]:
    """``--parallel 1 2 4`` (EvalScope's form) as ``--parallel 1,2,4`` for click."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        out.append(argv[i])
        if argv[i] in names:
            values = []
            i += 1
            while i < len(argv) and argv[i].replace(",", "").isdigit():
                values.append(argv[i])
                i += 1
            out.append(",".join(values))
            continue
        i += 1
    return out


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


def main() -> None:
    """The console script: ``--parallel 1 2 4`` is accepted as EvalScope writes it."""
    cli(args=join_multi_values(sys.argv[1:], ("--parallel", "--number")))
