"""A load command's own section of the config: the flags only that command takes,
as the one dataclass its driver reads.

:class:`~servemon.loadgen.run.config.LoadConfig` holds the flags every load command
shares at its top level and one section per command that has flags of its own
(``LoadConfig.control``: :class:`ControlArgs`). A flag of another command's section
cannot be given (:func:`servemon.loadgen.run.flat.config_of` refuses it in one
line), and the driver gets its section itself, not a copy of some of the config's
fields.

The grammars the sections hold are parsed here, once, where the config is built:
``--hold SIGNAL=SETPOINT`` into a :class:`Hold` whose signal is a :data:`Signal`.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable
from dataclasses import field
from typing import Annotated, Any, Literal

from annotated_types import Gt
from pydantic import BeforeValidator
from pydantic.dataclasses import dataclass

from servemon.core.errors import ConfigError
from servemon.core.fields import FORBID_EXTRA

__all__ = [
    "HOLDABLE",
    "PACED",
    "PACED_BY_DEFAULT",
    "PROMETHEUS_ONLY",
    "ControlArgs",
    "Hold",
    "Positive",
    "Signal",
    "from_text",
    "paces",
    "parse_hold",
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


@dataclass(frozen=True, slots=True, kw_only=True, config=FORBID_EXTRA)
class ControlArgs:
    """``servemon control``'s own flags (``LoadConfig.control``), what its driver
    reads. The signal source (``--prometheus``, ``--sample-interval``, ...) and the
    rate bound ``--rps-max`` are every command's, at the config's top level."""

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
