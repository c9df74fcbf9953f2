"""A load command's settings turned into a plan, checked before anything starts:
the stages of a ramp or the levels of a sweep, the start time, the rate bound, and
the config as the run record keeps it (secrets redacted)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from servemon.core.errors import ConfigError
from servemon.core.fields import Secret
from servemon.core.wire.webconfig import WebConfig, load_web_config
from servemon.loadgen.record.runrecord import parallel_label, rate_label
from servemon.loadgen.run.config import (
    PROMETHEUS_ONLY,
    Kind,
    LoadConfig,
    config_headers,
)
from servemon.loadgen.run.flat import config_text
from servemon.loadgen.run.stages import StageRecord
from servemon.loadgen.run.target import is_loopback
from servemon.loadgen.send.arrivals import linear_stages, parse_stages
from servemon.loadgen.send.cpulatency import check_cpu_latency
from servemon.loadgen.workloads.modelmix import ModelMix, parse_model
from servemon.loadgen.workloads.replayplan import ReplayPlan, replay_plan
from servemon.loadgen.workloads.tracefile import TraceEntry

__all__ = [
    "DEFAULT_PARALLEL",
    "DEFAULT_STAGES",
    "DEFAULT_STEP_S",
    "LOOPBACK_RPS_MAX",
    "MIN_REQUESTS",
    "RAMP_RPS_STEP",
    "RAMP_STEP_S",
    "Kind",
    "Plan",
    "capacity_step_s",
    "check_rate_bound",
    "make_plan",
    "recorded_config",
    "redact_argv",
    "replay_plan_of",
    "step_seconds",
]

DEFAULT_STAGES = "1:10,2:10,4:10"
DEFAULT_PARALLEL = (1, 2, 4, 8)
#: A capacity search's step length when ``--step-seconds`` is not given.
DEFAULT_STEP_S = 20.0
#: A linear ramp's step (``--rps-start``/``--rps-end``): its rate increment and
#: length when ``--rps-step`` and ``--step-seconds`` are not given.
RAMP_RPS_STEP = 1.0
RAMP_STEP_S = 30.0
#: The highest rate a search or a controller may offer a target on this machine
#: when ``--rps-max`` is not given (elsewhere ``--rps-max`` is required).
LOOPBACK_RPS_MAX = {"capacity": 10_000.0, "control": 1000.0}


@dataclass(frozen=True, slots=True)
class Plan:
    """A load command's settings, checked and planned once before anything starts
    (:func:`make_plan`), and handed down to the run: its kind, the stages of a ramp
    or the levels of a sweep (a capacity search adds its steps as it goes), and a
    replay's sends; the files the settings name, read once: the header file's
    headers (secrets, which print redacted) and the web config."""

    kind: Kind
    stages: list[StageRecord]
    replay: ReplayPlan | None = None
    #: ``--model a=0.7,b=0.3``: the mix (None: one model, or the target's).
    mix: ModelMix | None = None
    #: ``--header-file`` and ``--header``'s (``SERVEMON_API_KEY`` is the run's).
    headers: Mapping[str, Secret] = field(default_factory=dict)
    #: ``--web-config-file``, read and checked.
    web_config: WebConfig | None = None


def make_plan(kind: Kind, config: LoadConfig) -> Plan:
    """Check a load command's settings and plan it. Every check that needs no
    target and that the config's types do not already make (stages, SLO, arrival,
    shard, start time and workload are parsed when the config is built): how the
    settings fit together, and the files they name (a trace or prompt file, read
    whole to check every line, once). Run before anything is started, so a bad flag
    costs nothing; call it off the loop (it reads files)."""
    config.check_section(kind)
    _refuse_repeats(kind, config.repeats)  # before a replay reads its trace
    replay = _replay_of(config) if kind == "replay" else None
    stages = _repeated(_stages(kind, config, replay), config.repeats)
    _check(kind, config)
    mix = parse_model(config.model) if config.model else None
    web_config = (
        load_web_config(Path(config.web_config_file))
        if config.web_config_file is not None
        else None
    )
    return Plan(kind, stages, replay, mix, config_headers(config), web_config)


def _check(kind: Kind, config: LoadConfig) -> None:
    config.check_tiers(kind)
    if kind == "capacity":
        if not config.slo:
            raise ConfigError(
                "--slo: capacity needs an SLO, e.g. --slo 'ttft_p95<=0.5'"
            )
        if config.settle >= step_seconds(config.step_seconds):
            raise ConfigError(
                f"--settle {config.settle:g}: must be shorter than the step"
            )
        low = min(config.rps_min, config.rps_max or 1e9)
        first = capacity_step_s(config.step_seconds, config.settle, low)
        if first > config.max_duration:
            raise ConfigError(
                f"--max-duration {config.max_duration:g}: the first step, at "
                f"--rps-min {config.rps_min:g} req/s, takes {first:.0f} s "
                f"({MIN_REQUESTS} judged requests after --settle "
                f"{config.settle:g}); raise --max-duration or --rps-min"
            )
    if config.cancel_fraction > 0 and (
        config.cancel_after is None and config.cancel_after_tokens is None
    ):
        raise ConfigError(
            "--cancel-fraction: give --cancel-after or --cancel-after-tokens"
        )
    config.workload.check()
    check_energy(config.energy)
    if config.gpu_hour_cost is not None and config.node_hour_cost is not None:
        raise ConfigError(
            "--node-hour-cost: give one price, per GPU (--gpu-hour-cost) or per node"
        )
    if kind == "sweep" and config.over_context == "skip":
        raise ConfigError(
            "--over-context skip: a closed loop has no schedule to leave a request "
            "out of; use truncate or send"
        )
    _check_sessions(kind, config)
    _check_signals(config)
    if config.cpu_dma_latency is not None:
        check_cpu_latency(config.cpu_dma_latency)


#: What ``--repeats`` cannot repeat, and why (one line each).
_NOT_REPEATED = {
    "capacity": "a capacity search picks its next step from the last one; ramp "
    "or sweep the levels around the capacity it found with --repeats",
    "control": "a controller holds one setpoint for --duration; run it again "
    "for another sample",
    "replay": "a trace's prompts are the trace's, so a second pass would find "
    "them in the prefix cache; replay it again with another --seed and compare",
}


def _refuse_repeats(kind: Kind, repeats: int) -> None:
    if repeats > 1 and kind in _NOT_REPEATED:
        raise ConfigError(f"--repeats {repeats}: not for {kind}: {_NOT_REPEATED[kind]}")


def _repeated(stages: list[StageRecord], repeats: int) -> list[StageRecord]:
    """Each stage ``repeats`` times in a row (indices renumbered, each copy
    numbered 1..N); the stages as they are for one."""
    if repeats == 1:
        return stages
    return [
        replace(stage, index=i * repeats + r, repeat=r + 1)
        for i, stage in enumerate(stages)
        for r in range(repeats)
    ]


def check_energy(value: str) -> None:
    """``--energy`` (:mod:`.energy`): auto, off, nvml or an http(s) URL."""
    if value in ("auto", "off", "nvml") or value.startswith(("http://", "https://")):
        return
    raise ConfigError(
        f"--energy {value!r}: expected auto, off, nvml or the http(s) URL of an "
        "exporter's /metrics"
    )


#: A capacity step lasts long enough for about this many judged requests.
MIN_REQUESTS = 10


def capacity_step_s(step_s: float | None, settle: float, rate: float) -> float:
    """A capacity step's length at ``rate``: the step, or longer at a low rate,
    for :data:`MIN_REQUESTS` judged requests after the settle time (``--settle``)."""
    return max(step_seconds(step_s), settle + MIN_REQUESTS / rate)


def step_seconds(step_s: float | None) -> float:
    """A capacity step's length (``--step-seconds``, else the default)."""
    return step_s if step_s is not None else DEFAULT_STEP_S


def _stages(
    kind: Kind, config: LoadConfig, replay: ReplayPlan | None
) -> list[StageRecord]:
    if kind == "capacity":
        return []
    if config.control is not None:
        control = config.control
        return [StageRecord(0, f"hold {control.hold}", None, None, control.duration)]
    if replay is not None:
        return [StageRecord(0, "trace", replay.rate, None, replay.duration_s)]
    if kind == "ramp":
        if config.stages is not None:
            stages = list(config.stages)
        elif config.rps_start is not None:
            stages = linear_stages(
                config.rps_start,
                config.rps_end if config.rps_end is not None else config.rps_start,
                config.rps_step if config.rps_step is not None else RAMP_RPS_STEP,
                config.step_seconds if config.step_seconds is not None else RAMP_STEP_S,
            )
        else:
            stages = parse_stages(DEFAULT_STAGES)
        unit = "rps" if config.workload.sessions is None else "sessions/s"
        return [
            StageRecord(s.index, rate_label(s.rate, unit), s.rate, None, s.duration_s)
            for s in stages
        ]
    levels = sweep_levels(config)
    numbers = list(config.number)
    if len(numbers) == 1:
        numbers *= len(levels)
    if len(numbers) != len(levels):
        raise ConfigError(
            f"--number: {len(numbers)} values for {len(levels)} --parallel "
            "levels (give one, or one per level)"
        )
    users = config.workload.sessions is not None
    return [
        StageRecord(i, parallel_label(p, users=users), None, p, None)
        for i, p in enumerate(levels)
    ]


def sweep_levels(config: LoadConfig) -> tuple[int, ...]:
    """A sweep's levels: ``--parallel``, else a sessions workload's ``users=N``,
    else 1 2 4 8."""
    spec = config.workload.sessions
    users = None if spec is None else spec.users
    if config.parallel is not None:
        if users is not None and config.parallel != (users,):
            raise ConfigError(
                f"--parallel and the workload's users={users} both set the users: "
                "give one"
            )
        return config.parallel
    return DEFAULT_PARALLEL if users is None else (users,)


def _check_signals(config: LoadConfig) -> None:
    """``--prometheus``, ``--select`` and ``--hold`` fit together."""
    if config.select and config.prometheus is None:
        raise ConfigError("--select: picks series in Prometheus: give --prometheus")
    if config.prometheus_auth_file and config.prometheus is None:
        raise ConfigError("--prometheus-auth-file: give --prometheus too")
    if config.prometheus is not None:
        scheme = urlsplit(config.prometheus).scheme
        if scheme not in ("http", "https"):
            raise ConfigError(
                f"--prometheus {config.prometheus!r}: expected an http(s) URL"
            )
    control = config.control
    if control is None:  # the section holds --hold and --pace: control's alone
        return
    signal = control.hold.signal
    if signal in PROMETHEUS_ONLY and config.prometheus is None:
        raise ConfigError(
            f"--hold {signal}: read from Prometheus (the generated rules, the GPU "
            "exporter): give --prometheus"
        )
    if config.rps_max is not None and config.rps_max < control.rps_min:
        raise ConfigError(f"--rps-max {config.rps_max:g}: below --rps-min")


def _check_sessions(kind: Kind, config: LoadConfig) -> None:
    spec = config.workload.sessions
    if spec is None:
        return
    if spec.users is not None and kind != "sweep":
        raise ConfigError(
            f"--workload: sessions: users={spec.users} is N users in a closed loop: "
            "run it with servemon sweep (or drop users= to start sessions at the "
            f"{kind}'s rates)"
        )
    if kind == "sweep" and config.warmup:
        raise ConfigError("--warmup: not with a sessions workload (turns are whole)")


def _replay_of(config: LoadConfig) -> ReplayPlan:
    """The sends of ``servemon replay``: the workload's trace, scaled and windowed."""
    if config.workload.trace_path is None:
        raise ConfigError(
            f"--workload {config.workload}: replay sends a trace (trace:PATH)"
        )
    return replay_plan_of(config, config.workload.trace_entries())


def replay_plan_of(config: LoadConfig, entries: Sequence[TraceEntry]) -> ReplayPlan:
    """The sends of a replay of ``entries`` with ``config``'s scaling and window."""
    if config.trace_to is not None and config.trace_to <= (config.trace_from or 0):
        raise ConfigError(f"--to {config.trace_to:g}: must be after --from")
    return replay_plan(
        entries,
        time_scale=config.time_scale,
        rate_scale=config.rate_scale,
        start_s=config.trace_from,
        end_s=config.trace_to,
        loops=config.loops,
    )


def check_rate_bound(
    kind: str, config: LoadConfig, target: str, stages: Sequence[StageRecord]
) -> None:
    """A guard rail: open-loop load on another machine needs ``--rps-max``."""
    if kind == "sweep":
        return
    if config.rps_max is None:
        if not is_loopback(target):
            raise ConfigError(
                f"--rps-max: required when the target is not on this machine "
                f"({urlsplit(target).hostname}): it bounds the load servemon may send"
            )
        return
    over = [r for s in stages if (r := s.target_rate or 0.0) > config.rps_max]
    if over:
        raise ConfigError(
            f"--stages: {max(over):g} req/s is over --rps-max {config.rps_max:g}"
        )


def redact_argv(argv: Sequence[str]) -> list[str]:
    """The command line with every ``--header`` value replaced by ``<redacted>``."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            name = arg.partition(":")[0]
            out.append(f"{name}: <redacted>")
            hide_next = False
        elif arg == "--header":
            out.append(arg)
            hide_next = True
        elif arg.startswith("--header="):
            out.append(
                f"--header={arg.removeprefix('--header=').partition(':')[0]}: "
                "<redacted>"
            )
        else:
            out.append(arg)
    return out


def recorded_config(config: LoadConfig) -> dict[str, Any]:
    """The config as run.json keeps it: flags' own text, header values redacted."""
    data = config_text(config)
    data["header"] = [
        f"{h.partition(':')[0].strip()}: <redacted>" for h in config.header
    ]
    return data
