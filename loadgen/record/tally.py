"""A run's summaries as its requests finish (:class:`Tally`): per stage, per
level of a repeated run, per turn of a conversation and per model of a mix. The
runner, ``merge`` and a rebuild all count through it, and give the stages their
energy and the server's hit rates through :func:`with_energy` and
:func:`with_hit_rates`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import TypedDict, TypeVar

from servemon.core.slo import SloTerm
from servemon.loadgen.record.energy import Energy, EnergyCounters, Window
from servemon.loadgen.record.reading import Reading, server_hit_rates
from servemon.loadgen.record.runrecord import StageResult
from servemon.loadgen.record.summary import Summarizer, Summary
from servemon.loadgen.send.timing import RequestTiming

__all__ = ["Groups", "Tally", "with_energy", "with_hit_rates"]

#: A group's key: a turn's index or a model's name.
K = TypeVar("K", int, str)


class Groups(TypedDict):
    """The grouped summaries of a run (fields of
    :class:`~servemon.loadgen.record.runrecord.RunSummary`)."""

    by_turn: dict[str, Summary] | None
    by_model: dict[str, Summary] | None
    by_level: dict[str, Summary] | None


class Tally:
    """A run's summaries as its requests finish: one :class:`Summarizer` per
    stage, merged into the whole run's at the end. The runner, ``merge`` and a
    rebuild all count through it, so a figure is summed the same way wherever it
    is summed."""

    def __init__(self, slo: Sequence[SloTerm] = ()) -> None:
        self.slo = list(slo)
        self.stages: dict[int, Summarizer] = {}
        #: The whole run's requests by a conversation's turn index and by the
        #: model of a mix they asked for (only requests that say so).
        self.turns: dict[int, Summarizer] = {}
        self.models: dict[str, Summarizer] = {}

    def add(self, timing: RequestTiming) -> None:
        """One finished request (summed once, into its stage: the overall summary
        is the stages' merged at the end; and into its turn and its model)."""
        stage = self.stages.get(timing.stage)
        if stage is None:
            stage = self.stages[timing.stage] = Summarizer(self.slo)
        stage.add(timing)
        if timing.turn is not None:
            self._group(self.turns, timing.turn).add(timing)
        if timing.model is not None:
            self._group(self.models, timing.model).add(timing)

    def _group(self, groups: dict[K, Summarizer], key: K) -> Summarizer:
        found = groups.get(key)
        if found is None:
            found = groups[key] = Summarizer(self.slo)
        return found

    def groups(
        self,
        stages: Sequence[StageResult] = (),
        durations: Sequence[float | None] = (),
    ) -> Groups:
        """``by_turn``, ``by_model`` and ``by_level`` of a
        :class:`~servemon.loadgen.record.runrecord.RunSummary` (None: no request said,
        no stage is a repeat; throughput over each group's own span, a level's over its
        repeats' ``durations``)."""
        return {
            "by_turn": {str(k): self.turns[k].summary() for k in sorted(self.turns)}
            or None,
            "by_model": {k: self.models[k].summary() for k in sorted(self.models)}
            or None,
            "by_level": self.levels(stages, durations),
        }

    def levels(
        self, stages: Sequence[StageResult], durations: Sequence[float | None]
    ) -> dict[str, Summary] | None:
        """``by_level``: the repeats of each level pooled, throughput over their
        durations summed (a repeat without one: the span of its requests), energy
        summed where every repeat has its own; None when no stage is a repeat."""
        pooled: dict[str, tuple[Summarizer, float, list[Energy | None]]] = {}
        for stage, duration in zip(stages, durations, strict=True):
            if stage.repeat is None:
                continue
            own = self.stages.get(stage.stage) or Summarizer(self.slo)
            merged, total, energy = pooled.get(stage.label) or (
                Summarizer(self.slo),
                0.0,
                [],
            )
            merged.merge(own)
            energy.append(None if stage.summary is None else stage.summary.energy)
            pooled[stage.label] = (merged, total + (duration or own.span_s), energy)
        return {
            level: replace(merged.summary(total), energy=_together(energy))
            for level, (merged, total, energy) in pooled.items()
        } or None

    def overall(self) -> Summary:
        """The whole run's summary (the span of all its requests)."""
        every = Summarizer(self.slo)
        for index in sorted(self.stages):
            every.merge(self.stages[index])
        return every.summary()

    def finished(self, stage: int) -> int:
        """Requests of ``stage`` finished so far."""
        own = self.stages.get(stage)
        return 0 if own is None else own.requests

    def results(
        self, stages: Sequence[StageResult], durations: Sequence[float | None]
    ) -> tuple[list[StageResult], Summary]:
        """``stages`` with their summaries and achieved rates (throughput over
        ``durations[i]``; None: the span of the stage's requests), and the overall
        summary."""
        out = []
        for stage, duration in zip(stages, durations, strict=True):
            own = self.stages.get(stage.stage) or Summarizer(self.slo)
            summary = own.summary(duration)
            achieved = stage.sent / summary.duration_s if summary.duration_s else 0.0
            out.append(replace(stage, summary=summary, achieved_rate=achieved))
        return out, self.overall()


def _together(parts: Sequence[Energy | None]) -> Energy | None:
    """The energy of several windows, where every one has it."""
    known = [p for p in parts if p is not None]
    if not known or len(known) < len(parts):
        return None
    total = known[0]
    for part in known[1:]:
        total = total.plus(part)
    return total


def with_energy(
    counters: EnergyCounters,
    windows: Sequence[Window],
    stages: list[StageResult],
    overall: Summary,
    prices: tuple[float | None, float | None],
) -> tuple[list[StageResult], Summary]:
    """Each stage's summary with the energy of its window, and the whole run's
    with the energy from the first window's start to the last one's end."""
    out = []
    for window, stage in zip(windows, stages, strict=True):
        energy = counters.window(window, prices)
        if energy is not None and stage.summary is not None:
            stage = replace(stage, summary=replace(stage.summary, energy=energy))
        out.append(stage)
    began = [s for s, _ in windows if s is not None]
    ended = [e for _, e in windows if e is not None]
    whole = (min(began, default=None), max(ended, default=None))
    return out, replace(overall, energy=counters.window(whole, prices))


def with_hit_rates(
    readings: Iterable[Reading], windows: Sequence[Window], stages: list[StageResult]
) -> list[StageResult]:
    """Each stage with the server's prefix-cache hit rate over its window
    (:func:`~servemon.loadgen.record.reading.server_hit_rates`)."""
    rates = server_hit_rates(readings, windows)
    return [
        replace(s, server_hit_rate=None if rate is None else round(rate, 6))
        for s, rate in zip(stages, rates, strict=True)
    ]
