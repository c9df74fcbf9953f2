"""``servemon exporter``: serve engine metrics, GPU stats and the probe until stopped.

Each option but the ``--fake-gpu*`` ones is a field of
:class:`servemon.monitor.config.ExporterConfig`.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from servemon.commands import options
from servemon.commands.defaults import fill_defaults
from servemon.core.errors import ConfigError
from servemon.core.fields import layer_config
from servemon.lifecycle import run_async, stop_on_signals, stop_when_orphaned
from servemon.monitor.config import ExporterConfig, parse_target

if TYPE_CHECKING:
    from servemon.monitor.fakegpu import FakeGpuReader

__all__ = ["exporter", "exporter_config"]


@click.command()
@options.config_file()
@click.option(
    "--target",
    "targets",
    multiple=True,
    help="[NAME=]URL of an engine (repeatable; in --config, targets: a list of "
    "{url, name, engine, model}). NAME becomes the target label [default: "
    "host:port].",
)
@click.option("--listen", help="Address for /metrics.")
@click.option(
    "--scrape-timeout",
    type=float,
    help="Seconds to wait for a target (kept below the scraper's own timeout).",
)
@click.option(
    "--max-body-bytes",
    type=int,
    help="Largest /metrics body accepted from a target.",
)
@click.option(
    "--passthrough/--no-passthrough",
    default=None,
    help="Also pass through families servemon does not know.",
)
@click.option("--gpu/--no-gpu", default=None, help="GPU stats from NVML.")
@click.option("--gpu-interval", type=float, help="Seconds between NVML reads.")
@click.option(
    "--probe-interval",
    type=float,
    help="Seconds between canary requests per target. [default: off]",
)
@click.option("--probe-prompt", help="The canary's prompt.")
@click.option("--probe-max-tokens", type=int, help="The canary's max_tokens.")
@click.option(
    "--auth-file",
    help="YAML with bearer_token or basic_auth that /metrics asks scrapers for "
    "(for hashed passwords and TLS: --web-config-file).",
)
@options.web_config_file()
@options.exit_with_parent()
@click.option(
    "--fake-gpu",
    is_flag=True,
    help="Serve a made-up GPU instead of NVML (demos and tests without a GPU), "
    "drawing a steady power whose energy counter grows at that rate.",
)
@click.option(
    "--fake-gpus",
    type=click.IntRange(min=1),
    help="How many made-up GPUs (implies --fake-gpu). [default: 1]",
)
@click.option(
    "--fake-gpu-watts",
    type=click.FloatRange(min=0),
    help="Each made-up GPU's steady power in watts (implies --fake-gpu). "
    "[default: 300]",
)
def exporter(
    config_file: Path | None,
    targets: tuple[str, ...],
    fake_gpu: bool,
    fake_gpus: int | None,
    fake_gpu_watts: float | None,
    exit_with_parent: bool,
    **flags: Any,
) -> None:
    """Export engine /metrics in servemon's schema, GPU stats and a canary probe."""
    config = exporter_config(config_file, targets, flags)
    fake = None
    if fake_gpu or fake_gpus is not None or fake_gpu_watts is not None:
        fake = (fake_gpus or 1, fake_gpu_watts)
    run_async(_serve(config, fake, exit_with_parent))


def exporter_config(
    config_file: Path | None, targets: tuple[str, ...], flags: dict[str, Any]
) -> ExporterConfig:
    """The exporter's config from its options; it needs at least one target."""
    given = {**flags, "targets": tuple(parse_target(t) for t in targets)}
    config = layer_config(ExporterConfig, config_file, given)
    if not config.targets:
        raise ConfigError("--target: give at least one (or targets: in --config)")
    return config


async def _serve(
    config: ExporterConfig,
    fake: tuple[int, float | None] | None,
    exit_with_parent: bool,
) -> None:
    """Serve until stopped; ``fake`` is (count, watts) of made-up GPUs, if any."""
    import logging

    from servemon.monitor.exporter import Exporter

    logging.basicConfig(level=logging.INFO, format="servemon exporter: %(message)s")
    stop = asyncio.Event()
    with stop_on_signals(stop):
        async with (
            stop_when_orphaned(stop, exit_with_parent),
            Exporter(config, gpu_reader=_fake_reader(fake)) as exp,
        ):
            names = ", ".join(f"{t.name}={t.url}" for t in exp.targets)
            click.echo(f"servemon exporter: serving {exp.url}/metrics for {names}")
            sys.stdout.flush()
            await stop.wait()
    click.echo("servemon exporter: stopped")


def _fake_reader(fake: tuple[int, float | None] | None) -> FakeGpuReader | None:
    """``count`` made-up GPUs drawing ``watts`` each (None: the demo's 300 W)."""
    from servemon.monitor.fakegpu import FakeGpuReader

    if fake is None:
        return None
    count, watts = fake
    return FakeGpuReader(gpus=count, power_watts=watts)


fill_defaults(exporter, ExporterConfig)
