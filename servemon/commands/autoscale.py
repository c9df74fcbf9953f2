"""``servemon autoscale``: KEDA and HPA settings from a capacity run's saturation
point (:mod:`servemon.loadgen.record.saturation`,
:mod:`servemon.dashboards.autoscale`)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import click

from servemon.core.errors import ConfigError

__all__ = ["autoscale"]

_KINDS = {"deployment": "Deployment", "statefulset": "StatefulSet"}


def _target_ref(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    kind, _, name = value.partition("/")
    if kind.lower() not in _KINDS or not name:
        raise click.BadParameter("expected deployment/NAME or statefulset/NAME")
    return value


def _window(_ctx: click.Context, _param: click.Parameter, value: str) -> int:
    from servemon.core.promql import parse_duration

    seconds = parse_duration(value)
    if seconds is None or seconds < 1 or seconds != int(seconds):
        raise click.BadParameter("expected a Prometheus duration of whole seconds")
    return int(seconds)


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path, file_okay=False))
@click.option(
    "--target-ref",
    required=True,
    callback=_target_ref,
    metavar="KIND/NAME",
    help="The workload to scale: deployment/NAME or statefulset/NAME.",
)
@click.option("--namespace", default="default", show_default=True)
@click.option(
    "--headroom",
    type=click.FloatRange(0, 1, max_open=True),
    default=0.2,
    show_default=True,
    help="Share below the saturation point to hold each replica at.",
)
@click.option("--min-replicas", type=click.IntRange(min=1), default=1, show_default=1)
@click.option("--max-replicas", type=click.IntRange(min=1), default=8, show_default=8)
@click.option(
    "--signal",
    type=click.Choice(["queue", "kv_cache"]),
    help="Scale on this signal. [default: what saturated first]",
)
@click.option(
    "--statistic",
    type=click.Choice(["mean", "p90"]),
    default="mean",
    show_default=True,
    help="The signal's figure over a step.",
)
@click.option(
    "--level-at",
    type=click.Choice(["limit", "capacity"]),
    default="limit",
    show_default=True,
    help="Read the signal's level where the SLO reached its limit (between the "
    "steps nearest it on each side), or over the capacity step.",
)
@click.option("--tier", help="With several SLO tiers: the tier's capacity to use.")
@click.option(
    "--measured-replicas",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Replicas the capacity run measured together (the queue is their sum).",
)
@click.option(
    "--vllm-names",
    is_flag=True,
    help="Query vLLM's own metric names (Prometheus scrapes vLLM, not servemon).",
)
@click.option(
    "--select",
    "selector",
    metavar="MATCHERS",
    help='Label matchers picking the workload\'s series. [default: namespace="NS",'
    'POD_LABEL=~"NAME-.*"]',
)
@click.option("--pod-label", default="pod", show_default=True)
@click.option(
    "--window",
    default="1m",
    show_default=True,
    callback=_window,
    help="The recording rule's averaging window.",
)
@click.option(
    "--prometheus",
    default="http://prometheus-operated.monitoring.svc:9090",
    show_default=True,
    help="The Prometheus KEDA queries.",
)
@click.option(
    "--scale-down-window",
    type=click.IntRange(0, 3600),
    default=300,
    show_default=True,
    help="Seconds of lower recommendations before scaling down.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["keda", "hpa", "adapter", "rules", "all"]),
    default="all",
    show_default=True,
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="Write each format to its file here. [default: print]",
)
def autoscale(
    run_dir: Path,
    target_ref: str,
    namespace: str,
    headroom: float,
    min_replicas: int,
    max_replicas: int,
    signal: str | None,
    statistic: str,
    level_at: str,
    tier: str | None,
    measured_replicas: int,
    vllm_names: bool,
    selector: str | None,
    pod_label: str,
    window: int,
    prometheus: str,
    scale_down_window: int,
    fmt: str,
    out_dir: Path | None,
) -> None:
    """KEDA ScaledObject, HPA and recording rule from RUN_DIR's capacity search:
    the threshold is the level of what saturated first where the SLO reached its
    limit, less headroom."""
    from servemon.core.signals import parse_selector
    from servemon.dashboards.autoscale import (
        FILES,
        FORMATS,
        Autoscaler,
        ScaleTarget,
        render,
        signal_series,
    )
    from servemon.loadgen.record.saturation import saturation_point

    if min_replicas > max_replicas:
        raise ConfigError("--min-replicas is above --max-replicas")
    kind, _, name = target_ref.partition("/")
    point = saturation_point(
        run_dir,
        signal=signal,
        statistic="p90" if statistic == "p90" else "mean",
        tier=tier,
        measured_replicas=measured_replicas,
        at="capacity" if level_at == "capacity" else "limit",
    )
    threshold = point.value * (1 - headroom)
    metric = signal_series(point.signal, vllm_names)[0]
    if threshold <= 0:
        raise ConfigError(
            f"{metric} was {point.value:g} ({statistic}) at the saturation point: "
            "no level to scale on; try --statistic p90 or the other --signal"
        )
    matchers = parse_selector(selector) or (
        f'namespace="{namespace}"',
        f'{pod_label}=~"{name}-.*"',
    )
    replicas = f", / {measured_replicas} replicas" if measured_replicas > 1 else ""
    if point.below is not None and point.above is not None:
        lo, hi = point.below, point.above
        where = (
            f"{metric} at the SLO's limit, between the {lo.rate:g} req/s step (at "
            f"{lo.slo_ratio:.2f} of the limit: {lo.value:.4g}) and the {hi.rate:g} "
            f"req/s step ({hi.slo_ratio:.2f}: {hi.value:.4g}), each the {statistic} "
            f"after the {point.settle_s:g} s settle{replicas}: {point.value:.4g} "
            "per replica"
        )
    else:
        fallback = (
            "" if level_at == "capacity" else " (no step on each side of the limit)"
        )
        where = (
            f"{metric} during the {point.capacity_rps:g} req/s step{fallback} "
            f"({point.samples} samples after the {point.settle_s:g} s settle"
            f"{replicas}): {statistic} {point.value:.4g} per replica"
        )
    why = (
        f"capacity {point.capacity_rps:g} req/s ({point.slo or 'the SLO'}) in "
        f"{run_dir}; saturated first: "
        + (point.signal if point.found else f"other ({point.signal} asked for)"),
        where,
        f"threshold = {point.value:.4g} x (1 - {headroom:g}) = {threshold:.3g}",
    )
    scaler = Autoscaler(
        target=ScaleTarget(_KINDS[kind.lower()], name, namespace),
        signal=point.signal,
        threshold=threshold,
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        matchers=matchers,
        vllm_names=vllm_names,
        pod_label=pod_label,
        window_s=window,
        prometheus=prometheus,
        scale_down_window_s=scale_down_window,
        why=why,
    )
    command = shlex.join(["servemon", *sys.argv[1:]])
    chosen = FORMATS if fmt == "all" else tuple(f for f in FORMATS if f == fmt)
    if out_dir is None:
        click.echo("---\n".join(render(scaler, f, command) for f in chosen), nl=False)
        return
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for f in chosen:
            path = out_dir / FILES[f]
            path.write_text(render(scaler, f, command), encoding="utf-8")
            click.echo(str(path))
    except OSError as exc:
        raise ConfigError(f"--out {out_dir}: cannot write: {exc.strerror}") from None
