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
    CapacityArgs,
    ControlArgs,
    Kind,
    LoadConfig,
    RampArgs,
    ReplayArgs,
    SweepArgs,
    config_headers,
)
from servemon.loadgen.run.flat import config_text
from servemon.loadgen.run.sections import MIN_REQUESTS, Section
from servemon.loadgen.run.stages import StageRecord
from servemon.loadgen.run.target import is_loopback
from servemon.loadgen.send.arrivals import Stage, linear_stages, parse_stages
from servemon.loadgen.send.cpulatency import check_cpu_latency
from servemon.loadgen.workloads.replayplan import ReplayPlan, replay_plan
from servemon.loadgen.workloads.tracefile import TraceEntry

__all__ = [
    "DEFAULT_PARALLEL",
    "DEFAULT_STAGES",
    "LOOPBACK_RPS_MAX",
    "RAMP_RPS_STEP",
    "RAMP_STEP_S",
    "Kind",
    "Plan",
    "check_rate_bound",
    "make_plan",
    "recorded_config",
    "redact_argv",
    "replay_plan_of",
    "sweep_levels",
]

DEFAULT_STAGES = "1:10,2:10,4:10"
DEFAULT_PARALLEL = (1, 2, 4, 8)
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
    #: ``--header-file`` and ``--header``'s (``SERVEMON_API_KEY`` is the run's).
    headers: Mapping[str, Secret] = field(default_factory=dict)
    #: ``--web-config-file``, read and checked.
    web_config: WebConfig | None = None


def make_plan(kind: Kind, config: LoadConfig) -> Plan:
    """Check a load command's settings and plan it. Every check that needs no
    target and that the config's types do not already make (the flags' grammars
    are parsed, each command's own flags are its section, and a section checks its
    own fields when the config is built): how the settings fit together, and the
    files they name (a trace or prompt file, read whole to check every line, once).
    Run before anything is started, so a bad flag costs nothing; call it off the
    loop (it reads files)."""
    section = config.section(kind)
    replay = _replay_of(config, section) if isinstance(section, ReplayArgs) else None
    stages = _stages(config, section, replay)
    if isinstance(section, RampArgs | SweepArgs):
        stages = _repeated(stages, section.repeats)
    _check(kind, config, section)
    web_config = (
        load_web_config(Path(config.web_config_file))
        if config.web_config_file is not None
        else None
    )
    return Plan(kind, stages, replay, config_headers(config), web_config)


def _check(kind: Kind, config: LoadConfig, section: Section) -> None:
    config.check_tiers(kind)
    if isinstance(section, CapacityArgs):
        _check_capacity(config, section)
    if config.cancel_fraction > 0 and (
        config.cancel_after is None and config.cancel_after_tokens is None
    ):
        raise ConfigError(
            "--cancel-fraction: give --cancel-after or --cancel-after-tokens"
        )
    config.workload.check()
    if config.gpu_hour_cost is not None and config.node_hour_cost is not None:
        raise ConfigError(
            "--node-hour-cost: give one price, per GPU (--gpu-hour-cost) or per node"
        )
    if isinstance(section, SweepArgs) and config.over_context == "skip":
        raise ConfigError(
            "--over-context skip: a closed loop has no schedule to leave a request "
            "out of; use truncate or send"
        )
    _check_sessions(kind, config, section)
    _check_signals(config)
    if config.cpu_dma_latency is not None:
        check_cpu_latency(config.cpu_dma_latency)


def _check_capacity(config: LoadConfig, search: CapacityArgs) -> None:
    """A capacity search has an SLO, and its first step fits ``--max-duration``
    (the section itself has checked ``--settle`` against the step)."""
    if not config.slo:
        raise ConfigError("--slo: capacity needs an SLO, e.g. --slo 'ttft_p95<=0.5'")
    low = min(search.rps_min, config.rps_max or 1e9)
    first = search.step_at(low)
    if first > search.max_duration:
        raise ConfigError(
            f"--max-duration {search.max_duration:g}: the first step, at "
            f"--rps-min {search.rps_min:g} req/s, takes {first:.0f} s "
            f"({MIN_REQUESTS} judged requests after --settle "
            f"{search.settle:g}); raise --max-duration or --rps-min"
        )


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


def _stages(
    config: LoadConfig, section: Section, replay: ReplayPlan | None
) -> list[StageRecord]:
    if isinstance(section, CapacityArgs):
        return []  # the search adds its steps as it goes
    if isinstance(section, ControlArgs):
        return [StageRecord(0, f"hold {section.hold}", None, None, section.duration)]
    if replay is not None:
        return [StageRecord(0, "trace", replay.rate, None, replay.duration_s)]
    if isinstance(section, RampArgs):
        unit = "rps" if config.workload.sessions is None else "sessions/s"
        return [
            StageRecord(s.index, rate_label(s.rate, unit), s.rate, None, s.duration_s)
            for s in _ramp_stages(section)
        ]
    assert isinstance(section, SweepArgs)
    levels = sweep_levels(section, config)
    numbers = list(section.number)
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


def _ramp_stages(ramp: RampArgs) -> list[Stage]:
    """A ramp's stages: ``--stages``, a linear ramp, else :data:`DEFAULT_STAGES`."""
    if ramp.stages is not None:
        return list(ramp.stages)
    if ramp.rps_start is not None:
        return linear_stages(
            ramp.rps_start,
            ramp.rps_end if ramp.rps_end is not None else ramp.rps_start,
            ramp.rps_step if ramp.rps_step is not None else RAMP_RPS_STEP,
            ramp.step_seconds if ramp.step_seconds is not None else RAMP_STEP_S,
        )
    return parse_stages(DEFAULT_STAGES)


def sweep_levels(sweep: SweepArgs, config: LoadConfig) -> tuple[int, ...]:
    """A sweep's levels: ``--parallel``, else a sessions workload's ``users=N``,
    else 1 2 4 8."""
    spec = config.workload.sessions
    users = None if spec is None else spec.users
    if sweep.parallel is not None:
        if users is not None and sweep.parallel != (users,):
            raise ConfigError(
                f"--parallel and the workload's users={users} both set the users: "
                "give one"
            )
        return sweep.parallel
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


def _check_sessions(kind: Kind, config: LoadConfig, section: Section) -> None:
    spec = config.workload.sessions
    if spec is None:
        return
    sweep = section if isinstance(section, SweepArgs) else None
    if spec.users is not None and sweep is None:
        raise ConfigError(
            f"--workload: sessions: users={spec.users} is N users in a closed loop: "
            "run it with servemon sweep (or drop users= to start sessions at the "
            f"{kind}'s rates)"
        )
    if sweep is not None and sweep.warmup:
        raise ConfigError("--warmup: not with a sessions workload (turns are whole)")


def _replay_of(config: LoadConfig, args: ReplayArgs) -> ReplayPlan:
    """The sends of ``servemon replay``: the workload's trace, scaled and windowed."""
    if config.workload.trace_path is None:
        raise ConfigError(
            f"--workload {config.workload}: replay sends a trace (trace:PATH)"
        )
    return replay_plan_of(args, config.workload.trace_entries())


def replay_plan_of(args: ReplayArgs, entries: Sequence[TraceEntry]) -> ReplayPlan:
    """The sends of a replay of ``entries`` with its section's scaling and window
    (the section has checked that the window is one)."""
    return replay_plan(
        entries,
        time_scale=args.time_scale,
        rate_scale=args.rate_scale,
        start_s=args.trace_from,
        end_s=args.trace_to,
        loops=args.loops,
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
    """The config as run.json keeps it: flags' own text, header values redacted,
    and nothing of what was done after the run (``--no-report``)."""
    data = config_text(config)
    del data["report"]
    data["header"] = [
        f"{h.partition(':')[0].strip()}: <redacted>" for h in config.header
    ]
    return data
