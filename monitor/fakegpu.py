"""Made-up GPUs for tests and demos: :class:`FakeGpuReader`, a
:class:`servemon.monitor.gpu.GpuReader` that serves fixed snapshots, or GPUs that draw
power by a :class:`PowerModel` and count its energy exactly (energy is the model's
integral, so a test can check the arithmetic of J/token end to end).
``servemon exporter --fake-gpu`` serves :data:`DEMO_WATTS` per GPU from it."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from servemon.monitor.gpu import (
    THROTTLE_REASONS,
    GpuProcess,
    GpuSample,
    GpuSnapshot,
    GpuUnavailable,
)

__all__ = ["DEMO_WATTS", "FakeGpuReader", "PowerModel", "PowerSteps", "SteadyPower"]


class PowerModel(Protocol):
    """How a fake GPU draws power: its power ``elapsed_s`` seconds after the reader
    was made, and the exact integral of that power from 0 to ``elapsed_s``."""

    def watts(self, elapsed_s: float) -> float: ...
    def joules(self, elapsed_s: float) -> float: ...


@dataclass(frozen=True, slots=True)
class SteadyPower:
    """A constant draw: ``watts`` at every moment, ``watts * t`` joules by ``t``."""

    power_watts: float

    def watts(self, elapsed_s: float) -> float:
        """The constant draw."""
        return self.power_watts

    def joules(self, elapsed_s: float) -> float:
        """``P * t``."""
        return self.power_watts * max(0.0, elapsed_s)


@dataclass(frozen=True, slots=True)
class PowerSteps:
    """A piecewise-constant draw: ``steps`` are ``(from_s, watts)`` pairs, the first
    from 0, each held until the next one starts; energy is their exact sum."""

    steps: tuple[tuple[float, float], ...]

    def __post_init__(self) -> None:
        starts = [start for start, _ in self.steps]
        if not starts or starts[0] != 0 or starts != sorted(set(starts)):
            raise ValueError("PowerSteps: (from_s, watts) pairs from 0, increasing")

    def watts(self, elapsed_s: float) -> float:
        """The draw of the step ``elapsed_s`` falls in."""
        return [w for start, w in self.steps if start <= max(0.0, elapsed_s)][-1]

    def joules(self, elapsed_s: float) -> float:
        """Each step's watts times the time spent in it, up to ``elapsed_s``."""
        ends = [start for start, _ in self.steps[1:]] + [float("inf")]
        return sum(
            w * (min(end, elapsed_s) - start)
            for (start, w), end in zip(self.steps, ends, strict=True)
            if elapsed_s > start
        )


#: The power a demo GPU draws (``servemon exporter --fake-gpu``).
DEMO_WATTS = 300.0
#: The made-up GPU a ``FakeGpuReader()`` serves (demos); ``--fake-gpus N`` numbers
#: copies of it.
_DEMO_GPU = GpuSample(
    0, "GPU-00000000-0000-0000-0000-000000000000", "Fake GPU", 0.5, 0.25,
    40 * 2**30, 80 * 2**30, DEMO_WATTS, 700.0, 55.0, 1.98e9, 2.619e9,
    dict.fromkeys(THROTTLE_REASONS, False), 1e6, 2e6, 0, 0,
    (GpuProcess(1, "python3", 39 * 2**30),), 3.352e12,
)  # fmt: skip


def _demo_gpus(count: int) -> tuple[GpuSample, ...]:
    return tuple(
        dataclasses.replace(
            _DEMO_GPU, index=i, uuid=f"GPU-00000000-0000-0000-0000-{i:012d}"
        )
        for i in range(count)
    )


class FakeGpuReader:
    """A :class:`~servemon.monitor.gpu.GpuReader` for tests and demos.

    Each ``read`` returns the next of ``snapshots`` (the last one repeatedly),
    stamped with ``clock()`` of the read; None gives ``gpus`` made-up GPUs (one by
    default) drawing :data:`DEMO_WATTS` steadily. ``power_watts`` (watts, or a
    :class:`PowerModel`) sets every GPU's power to the model's value at the read and
    its ``energy_joules`` to the model's exact energy since the reader was made, so
    energy and power always agree. ``fail_open`` / ``fail_read`` (attributes too, so
    a test can flip them) make ``open`` / ``read`` raise :class:`GpuUnavailable`
    with that message. ``opens``, ``reads`` and ``closes`` count the calls.
    """

    def __init__(
        self,
        snapshots: Sequence[GpuSnapshot] | None = None,
        *,
        power_watts: float | PowerModel | None = None,
        gpus: int = 1,
        clock: Callable[[], float] = time.monotonic,
        fail_open: str | None = None,
        fail_read: str | None = None,
    ) -> None:
        if snapshots is not None and not snapshots:
            raise ValueError("FakeGpuReader needs at least one snapshot (or None)")
        if gpus < 1 or (snapshots is not None and gpus != 1):
            raise ValueError("FakeGpuReader: gpus >= 1, and only without snapshots")
        if snapshots is None:
            snapshots = (GpuSnapshot(0.0, None, _demo_gpus(gpus)),)
            power_watts = DEMO_WATTS if power_watts is None else power_watts
        self._snapshots = tuple(snapshots)
        self._power = (
            SteadyPower(float(power_watts))
            if isinstance(power_watts, int | float)
            else power_watts
        )
        self._clock = clock
        self._made_s = clock()
        self.fail_open = fail_open
        self.fail_read = fail_read
        self.opens = self.reads = self.closes = 0
        self._served = 0  # snapshots handed out (failed reads skip none)

    def open(self) -> None:
        """Count the call; raise if ``fail_open`` is set."""
        self.opens += 1
        if self.fail_open is not None:
            raise GpuUnavailable(self.fail_open)

    def read(self) -> GpuSnapshot:
        """The next snapshot, stamped now, with the power model's power and energy;
        raise if ``fail_read`` is set."""
        self.reads += 1
        if self.fail_read is not None:
            raise GpuUnavailable(self.fail_read)
        snapshot = self._snapshots[min(self._served, len(self._snapshots) - 1)]
        self._served += 1
        now = self._clock()
        gpus = snapshot.gpus
        if (power := self._power) is not None:
            elapsed = now - self._made_s
            watts, joules = power.watts(elapsed), power.joules(elapsed)
            gpus = tuple(
                dataclasses.replace(g, power_watts=watts, energy_joules=joules)
                for g in gpus
            )
        return dataclasses.replace(snapshot, taken_s=now, gpus=gpus)

    def close(self) -> None:
        """Count the call."""
        self.closes += 1
