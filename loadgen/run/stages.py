"""A stage while it runs: the runtime state of one stage (ramp, capacity step) or
level (sweep) that the board keeps and the dispatcher's counts fill, turned into the
record's :class:`~servemon.loadgen.record.runrecord.StageResult` at the end."""

from __future__ import annotations

from dataclasses import dataclass, field

from servemon.loadgen.record.runrecord import ClientLimit, StageResult

__all__ = ["StageRecord"]


@dataclass(slots=True)
class StageRecord:
    """One stage (ramp, capacity step) or level (sweep) while it runs: monotonic
    times, and the dispatcher's counts."""

    index: int
    label: str
    target_rate: float | None
    parallel: int | None
    planned_s: float | None
    start_s: float | None = None
    end_s: float | None = None
    sent: int = 0
    held_back: int = 0
    skipped: int = 0
    client_limits: list[ClientLimit] = field(default_factory=list)
    #: A sessions workload's sessions started in the stage, and those of them
    #: cut short (a turn due past the schedule's end, or a failed turn); ``sent``
    #: then counts turns.
    sessions: int | None = None
    sessions_cut: int | None = None
    #: Which run of its level this stage is (1..N), with ``--repeats N`` > 1.
    repeat: int | None = None

    def duration_s(self) -> float | None:
        """What its throughput divides by: the planned length, cut short where the
        stage ended early; None (the span of its requests) if it never started."""
        if self.planned_s is None or self.start_s is None:
            return None
        if self.end_s is None:
            return self.planned_s
        return min(self.planned_s, self.end_s - self.start_s)

    def until_s(self) -> float | None:
        """Its window's end: when it ended, else its planned end (None if it
        never started)."""
        if self.end_s is not None or self.start_s is None:
            return self.end_s
        return None if self.planned_s is None else self.start_s + self.planned_s

    def result(self, origin_s: float) -> StageResult:
        """The record's form, times relative to ``origin_s``."""
        return StageResult(
            stage=self.index,
            label=self.label,
            target_rate=self.target_rate,
            parallel=self.parallel,
            planned_s=self.planned_s,
            start_s=None if self.start_s is None else self.start_s - origin_s,
            end_s=None if self.end_s is None else self.end_s - origin_s,
            sent=self.sent,
            held_back=self.held_back,
            skipped=self.skipped,
            client_limits=list(self.client_limits),
            sessions=self.sessions,
            sessions_cut=self.sessions_cut,
            repeat=self.repeat,
        )
