"""When ``servemon replay`` sends each request of a trace: its times, scaled,
windowed and looped.

The window is ``[--from, --to)`` in the trace's own seconds (from its first
request). An entry at trace time ``t`` is sent at ``(t - from) * time_scale /
rate_scale`` after the start: ``--time-scale 2`` stretches the trace to twice its
length, ``--rate-scale 2`` sends it twice as fast. ``--loops N`` sends the window N
times back to back, each loop one window later (a window without ``--to`` lasts
until its last entry plus the mean gap between entries). Request indices are
``loop * entries + entry`` so that the workload builds loop ``loop``'s prompt of
that entry (:mod:`servemon.loadgen.workloads.traceprompts`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from servemon.core.errors import ConfigError
from servemon.loadgen.workloads.tracefile import TraceEntry

__all__ = ["ReplayPlan", "replay_plan"]


@dataclass(frozen=True, slots=True)
class ReplayPlan:
    """The sends of a replay: (request index, offset in seconds), in time order."""

    sends: tuple[tuple[int, float], ...]
    duration_s: float

    @property
    def rate(self) -> float:
        """The mean offered rate."""
        return len(self.sends) / self.duration_s if self.duration_s else 0.0


def replay_plan(
    entries: Sequence[TraceEntry],
    *,
    time_scale: float = 1.0,
    rate_scale: float = 1.0,
    start_s: float | None = None,
    end_s: float | None = None,
    loops: int = 1,
) -> ReplayPlan:
    """The sends of ``entries`` (in time order, times from the first)."""
    low = start_s or 0.0
    inside = [
        (i, e.at_s)
        for i, e in enumerate(entries)
        if e.at_s >= low and (end_s is None or e.at_s < end_s)
    ]
    if not inside:
        raise ConfigError(
            f"--from/--to: no request of the trace in [{low:g}, "
            f"{'end' if end_s is None else f'{end_s:g}'}) s"
        )
    if end_s is not None:
        window = end_s - low
    else:
        span = inside[-1][1] - inside[0][1]
        gap = span / (len(inside) - 1) if len(inside) > 1 else 1.0
        window = inside[-1][1] - low + gap
    factor = time_scale / rate_scale
    sends = [
        (loop * len(entries) + i, (loop * window + at - low) * factor)
        for loop in range(loops)
        for i, at in inside
    ]
    return ReplayPlan(tuple(sends), loops * window * factor)
