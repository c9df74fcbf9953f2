"""A load command's own section of the config: the flags only that command takes,
as the one dataclass its driver reads.

:class:`~servemon.loadgen.run.config.LoadConfig` holds the flags several load
commands read at its top level and one section per command, in the field named as
the command: ``ramp`` (:class:`RampArgs`), ``sweep`` (:class:`SweepArgs`),
``capacity`` (:class:`CapacityArgs`), ``replay`` (:class:`ReplayArgs`) and
``control`` (:class:`ControlArgs`). A ramp and a replay each send a schedule of
their own, so both sections are a :class:`Schedule` (``--max-requests``,
``--shard``). Which flag a command takes falls out of these types: a flag of another
command's section is refused in one line naming the flag and the command
(:func:`servemon.loadgen.run.flat.config_of`), with the refusing section's reason
where it gives one (:attr:`ControlArgs.REFUSES`), and the driver gets its section
itself, not a copy of some of the config's fields.

The grammars the sections hold are parsed here, once, where the config is built:
``--stages`` into :class:`~servemon.loadgen.send.arrivals.Stage` s, ``--shard`` into
a :class:`~servemon.loadgen.send.arrivals.Shard`, ``--hold SIGNAL=SETPOINT`` into a
:class:`Hold` whose signal is a :data:`Signal`.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable, Mapping
from dataclasses import field
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from annotated_types import Ge, Gt, Le
from pydantic import BeforeValidator
from pydantic.dataclasses import dataclass

from servemon.core.errors import ConfigError
from servemon.core.fields import FORBID_EXTRA
from servemon.loadgen.send.arrivals import Shard, Stage, parse_stages

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = [
    "DEFAULT_STEP_S",
    "HOLDABLE",
    "MIN_REQUESTS",
    "PACED",
    "PACED_BY_DEFAULT",
    "PROMETHEUS_ONLY",
    "SECTIONS",
    "CapacityArgs",
    "ControlArgs",
    "Hold",
    "Kind",
    "Positive",
    "RampArgs",
    "ReplayArgs",
    "Schedule",
    "Section",
    "Signal",
    "SweepArgs",
    "check_sections",
    "from_text",
    "paces",
    "parse_hold",
    "refusal",
]

#: What ``--hold`` can hold.
Signal = Literal[
    "waiting", "kv_cache_usage", "ttft_p95", "burn_rate", "gpu_utilization"
]
HOLDABLE: tuple[Signal, ...] = typing.get_args(Signal)
#: Signals only Prometheus has (the generated rules, the GPU exporter).
PROMETHEUS_ONLY: tuple[Signal, ...] = ("burn_rate", "gpu_utilization")
#: Signals whose sends ``--pace`` can pace, by what the client knows without lag
#: (the prefill backlog; the requests in flight).
PACED: tuple[Signal, ...] = ("ttft_p95", "waiting", "kv_cache_usage")
#: ... and those paced unless ``--no-pace``. Why these and not the queue, with the
#: figures: docs/capacity.md, "Why the law has this shape".
PACED_BY_DEFAULT: tuple[Signal, ...] = ("kv_cache_usage",)

Positive = Annotated[float, Gt(0)]


def from_text(parse: Callable[[str], Any]) -> BeforeValidator:
    """Parse a flag's text into its type once, where the config is built; a value
    of the type already (a config laid over another) passes through."""
    return BeforeValidator(
        lambda value: parse(value) if isinstance(value, str) else value
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Hold:
    """``--hold SIGNAL=SETPOINT``, parsed once where the config is built; ``str()``
    gives its text back."""

    signal: Signal
    setpoint: float
    text: str

    def __str__(self) -> str:
        return self.text


def _signal(name: str) -> Signal | None:
    for signal in HOLDABLE:
        if signal == name:
            return signal
    return None


def parse_hold(text: str) -> Hold:
    """``SIGNAL=SETPOINT`` as a :class:`Hold`; a one-line error naming the part at
    fault."""
    name, sep, value = text.partition("=")
    signal = _signal(name.strip())
    if not sep or signal is None:
        raise ConfigError(
            f"--hold {text!r}: expected SIGNAL=SETPOINT with SIGNAL one of "
            f"{', '.join(HOLDABLE)}"
        )
    try:
        setpoint = float(value)
    except ValueError:
        setpoint = math.nan
    if not (setpoint > 0 and math.isfinite(setpoint)):
        raise ConfigError(f"--hold {signal}: the setpoint must be a number > 0")
    if signal in ("kv_cache_usage", "gpu_utilization") and setpoint >= 1:
        raise ConfigError(f"--hold {signal}: a ratio below 1, got {setpoint:g}")
    return Hold(signal, setpoint, text)


def paces(pace: bool | None, signal: Signal) -> bool:
    """Whether ``servemon control --hold SIGNAL=…`` paces its sends: ``--pace`` or
    ``--no-pace`` where given, else :data:`PACED_BY_DEFAULT`."""
    return signal in PACED_BY_DEFAULT if pace is None else pace


HoldText = Annotated[Hold, from_text(parse_hold)]
Stages = Annotated[tuple[Stage, ...], from_text(lambda t: tuple(parse_stages(t)))]
ShardSpec = Annotated[Shard, from_text(Shard.parse)]
#: ``--repeats``: each stage (a ramp's stage, a sweep's level) this many times in a
#: row, each with new draws: what ``compare`` judges a difference by (the spread
#: between runs, not only between requests of one run).
Repeats = Annotated[int, Ge(1), Le(100)]

#: A capacity search's step length when ``--step-seconds`` is not given.
DEFAULT_STEP_S = 20.0
#: A capacity step lasts long enough for about this many judged requests.
MIN_REQUESTS = 10


@dataclass(frozen=True, slots=True, kw_only=True, config=FORBID_EXTRA)
class Schedule:
    """What a command that sends a schedule of its own takes (a ramp's stages, a
    replay's trace): how much of it, and which shard. The in-flight cap, the late
    rule and the start (``--start-at``) are every open-loop command's, at the
    config's top level."""

    #: Stop the schedule after this many requests.
    max_requests: Annotated[int, Ge(1)] | None = None
    #: Send shard I of N: every N-th request of the same schedule.
    shard: ShardSpec | None = None


@dataclass(frozen=True, slots=True, kw_only=True, config=FORBID_EXTRA)
class RampArgs(Schedule):
    """``servemon ramp``'s own flags (``LoadConfig.ramp``): its stages, given as
    ``--stages`` or as a linear ramp (``--rps-start`` to ``--rps-end``), and the
    repeats. The plan reads the stages; the driver, the schedule's part."""

    #: ``RPS:SECONDS,...``; None: the linear ramp, else the plan's default.
    stages: Stages | None = None
    #: A linear ramp's first rate, last rate, increment and step length.
    rps_start: Positive | None = None
    rps_end: Positive | None = None
    rps_step: Positive | None = None
    step_seconds: Positive | None = None
    repeats: Repeats = 1


@dataclass(frozen=True, slots=True, kw_only=True, config=FORBID_EXTRA)
class SweepArgs:
    """``servemon sweep``'s own flags (``LoadConfig.sweep``): the closed loop's
    levels, what each measures, and the repeats."""

    #: Requests in flight at each level; None: ``users=N`` of a sessions workload,
    #: else 1 2 4 8.
    parallel: tuple[Annotated[int, Ge(1)], ...] | None = None
    #: Requests measured at each level: one value, or one per level.
    number: tuple[Annotated[int, Ge(1)], ...] = (16,)
    #: Requests sent first at each level and not measured.
    warmup: Annotated[int, Ge(0)] = 0
    repeats: Repeats = 1


@dataclass(frozen=True, slots=True, kw_only=True, config=FORBID_EXTRA)
class CapacityArgs:
    """``servemon capacity``'s own flags (``LoadConfig.capacity``): where the search
    starts, how long it and each step may take, and when it stops bisecting. Its
    SLO (``--slo``, several tiers only here) and bound (``--rps-max``) are at the
    config's top level."""

    REFUSES: ClassVar[dict[str, str]] = {
        "repeats": "a capacity search picks its next step from the last one; ramp "
        "or sweep the levels around the capacity it found with --repeats",
    }

    #: Where the search starts.
    rps_min: Positive = 0.5
    #: Seconds the whole search may take.
    max_duration: Positive = 600.0
    #: Seconds at the start of a step not judged.
    settle: Annotated[float, Ge(0)] = 5.0
    #: The bracket's width, relative, at which the search ends.
    precision: Annotated[float, Gt(0), Le(1)] = 0.05
    #: A step's length; None: :data:`DEFAULT_STEP_S`.
    step_seconds: Positive | None = None

    def __post_init__(self) -> None:
        if self.settle >= self.step_s:
            raise ConfigError(
                f"--settle {self.settle:g}: must be shorter than the step"
            )

    @property
    def step_s(self) -> float:
        """A step's length (``--step-seconds``, else the default)."""
        return self.step_seconds if self.step_seconds is not None else DEFAULT_STEP_S

    def step_at(self, rate: float) -> float:
        """A step's length at ``rate``: the step, or longer at a low rate, for
        :data:`MIN_REQUESTS` judged requests after the settle time."""
        return max(self.step_s, self.settle + MIN_REQUESTS / rate)


@dataclass(frozen=True, slots=True, kw_only=True, config=FORBID_EXTRA)
class ReplayArgs(Schedule):
    """``servemon replay``'s own flags (``LoadConfig.replay``): how the trace (the
    workload's ``trace:PATH``) is scaled, windowed and looped."""

    REFUSES: ClassVar[dict[str, str]] = {
        "repeats": "a trace's prompts are the trace's, so a second pass would find "
        "them in the prefix cache; replay it again with another --seed and compare",
    }

    #: Multiply the trace's gaps by this.
    time_scale: Positive = 1.0
    #: Send this many times as fast.
    rate_scale: Positive = 1.0
    #: The window of the trace, in its seconds (``--from``, ``--to``).
    trace_from: Annotated[float, Ge(0)] | None = None
    trace_to: Positive | None = None
    #: Send the window this many times.
    loops: Annotated[int, Ge(1), Le(1000)] = 1

    def __post_init__(self) -> None:
        if self.trace_to is not None and self.trace_to <= (self.trace_from or 0):
            raise ConfigError(f"--to {self.trace_to:g}: must be after --from")


@dataclass(frozen=True, slots=True, kw_only=True, config=FORBID_EXTRA)
class ControlArgs:
    """``servemon control``'s own flags (``LoadConfig.control``), what its driver
    reads. The signal source (``--prometheus``, ``--sample-interval``, ...) and the
    rate bound ``--rps-max`` are every command's, at the config's top level.
    :attr:`REFUSES`: a flag of another command's section this one refuses with a
    reason (the refusal itself falls out of the sections)."""

    REFUSES: ClassVar[dict[str, str]] = {
        "repeats": "a controller holds one setpoint for --duration; run it again "
        "for another sample",
    }

    #: ``SIGNAL=SETPOINT``: waiting, kv_cache_usage, ttft_p95, burn_rate,
    #: gpu_utilization. A field's ``needs`` is what the command says without it.
    hold: HoldText = field(metadata={"needs": "SIGNAL=SETPOINT, e.g. waiting=8"})
    #: How long the signal is held.
    duration: Positive = 600.0
    #: The rate to start from; None: 1, or ``rps_min`` above that.
    rps_start: Positive | None = None
    #: Never offer less.
    rps_min: Positive = 0.5
    #: Seconds between rate changes; None: from the signal's delay.
    control_interval: Positive | None = None
    #: Stop when the signal has been missing this long (the controller is blind).
    blind_timeout: Positive = 60.0
    #: ttft_p95, waiting: pace each gap by the client's prefill backlog;
    #: kv_cache_usage: by its requests in flight
    #: (servemon.loadgen.drivers.control.backlog). None: as :func:`paces` says (KV
    #: usage paced, the others not).
    pace: bool | None = None

    def __post_init__(self) -> None:
        if self.pace and self.hold.signal not in PACED:
            raise ConfigError(
                f"--pace: paces the sends of --hold {', '.join(PACED)} (by what "
                f"the client knows without lag), not of --hold {self.hold.signal}"
            )


#: The load commands, each a driver (:mod:`servemon.loadgen.runner`).
Kind = Literal["ramp", "sweep", "capacity", "replay", "control"]

#: A command's section (:data:`SECTIONS`).
Section = RampArgs | SweepArgs | CapacityArgs | ReplayArgs | ControlArgs

#: Each command's section type, held in the field of
#: :class:`~servemon.loadgen.run.config.LoadConfig` named as the command: which flag
#: a command takes falls out of these.
SECTIONS: dict[Kind, type[Section]] = {
    "ramp": RampArgs,
    "sweep": SweepArgs,
    "capacity": CapacityArgs,
    "replay": ReplayArgs,
    "control": ControlArgs,
}


def _flag(name: str) -> str:
    return name.replace("_", "-")


def _set_field(section: DataclassInstance) -> str:
    """The first field of ``section`` not at its default (else its first): the
    flag a refusal names."""
    fields = dataclasses.fields(section)
    for f in fields:
        default = (
            f.default
            if f.default_factory is dataclasses.MISSING
            else f.default_factory()
        )
        if getattr(section, f.name) != default:
            return f.name
    return fields[0].name


def refusal(key: str, kind: Kind) -> str:
    """Why ``kind`` refuses flag ``key`` of other commands' sections: the commands
    that take it, and the reason ``kind``'s section gives (``REFUSES``), if any."""
    owners = [k for k, c in SECTIONS.items() if key in _field_names(c)]
    why = getattr(SECTIONS[kind], "REFUSES", {}).get(key)
    takes = "takes" if len(owners) == 1 else "take"
    return (
        f"--{_flag(key)}: only servemon {' and '.join(owners)} {takes} it, not {kind}"
        + ("" if why is None else f": {why}")
    )


def _field_names(cls: type[DataclassInstance]) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


def check_sections(given: Mapping[Kind, Section | None], kind: Kind) -> None:
    """``kind``'s section is ``given``, and no other command's is, in one line
    naming the flag at fault."""
    for name, section in given.items():
        if section is not None and name != kind:
            raise ConfigError(refusal(_set_field(section), kind))
    if given.get(kind) is None:
        first = dataclasses.fields(SECTIONS[kind])[0]
        needs = first.metadata.get("needs")
        if needs is None:
            raise ConfigError(f"{kind}: not a servemon {kind} config")
        raise ConfigError(f"--{_flag(first.name)}: {kind} needs {needs}")
