"""What a set of requests measured, summed up as they finish.

A :class:`Summarizer` takes finished requests one at a time and keeps counts, sums
and one :class:`~servemon.loadgen.record.figures.FigureStats` per latency figure — never
the requests themselves — so a run of any length summarizes in bounded memory. Its
:class:`Summary` holds counts, throughput, the distribution of every figure of
:data:`~servemon.loadgen.record.figures.FIGURES` and, with an SLO, goodput and which
terms held.

Percentiles are over ok requests only (dispatch lag: over every request); ITL pools
every gap of every ok request; they are exact up to
:data:`~servemon.loadgen.record.figures.EXACT_LIMIT` values per figure, within
:data:`~servemon.loadgen.record.figures.RELATIVE_ACCURACY` past it (``relative_error``
in each distribution says which). Throughput divides by ``duration_s``: the stage's own
length when the caller gives it, else first send to last end. The error rate is
failed over judged requests (:mod:`servemon.core.outcomes`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from servemon.core.outcomes import count_failed, count_not_judged, failed, judged
from servemon.core.slo import SloTerm
from servemon.loadgen.record.energy import ENERGY_KEYS, Energy
from servemon.loadgen.record.figures import (
    FIGURE_NAMES,
    FIGURES,
    Distribution,
    FigureStats,
)
from servemon.loadgen.record.slo import request_meets
from servemon.loadgen.send.timing import Outcome, RequestTiming

__all__ = [
    "FIGURE_NAMES",
    "Distribution",
    "Summarizer",
    "Summary",
    "flat_row",
    "summarize",
]

STATS = ("mean", "p50", "p90", "p95", "p99", "max")


@dataclass(frozen=True, slots=True)
class Summary:
    """What a set of requests measured (the ``summary`` of a stage in
    ``summary.json``; its figures sit there as top-level keys)."""

    requests: int
    outcomes: dict[str, int]
    duration_s: float
    request_throughput: float
    output_throughput: float
    mean_prompt_tokens: float | None
    mean_output_tokens: float | None
    prompt_throughput: float = 0.0
    error_rate: float = 0.0
    token_sources: dict[str, int] = field(default_factory=dict)
    goodput: float | None = None
    slo_met: dict[str, bool] | None = None
    #: Prompt tokens served from the server's prefix cache over prompt tokens, over
    #: the ok requests whose server reported cached tokens.
    cached_fraction: float | None = None
    #: Resends after the server closed an idle pooled connection (all requests).
    reconnects: int = 0
    #: Ok answers that ended without ``data: [DONE]`` (every non-streamed one).
    without_done: int = 0
    #: Mean reasoning tokens of the ok answers whose usage reported them.
    mean_reasoning_tokens: float | None = None
    #: Mean tokens of history a conversation's turn sent (sessions workloads).
    mean_history_tokens: float | None = None
    #: What the target's GPUs used over the stage, where it could be read
    #: (:mod:`servemon.loadgen.record.energy`); None: not measured.
    energy: Energy | None = None
    #: The distribution of each figure of FIGURES that any request had.
    figures: dict[str, Distribution] = field(default_factory=dict)

    @property
    def ok(self) -> int:
        """Requests that ended ``ok``."""
        return self.outcomes.get(str(Outcome.OK), 0)

    @property
    def failed(self) -> int:
        """Requests that failed (:mod:`servemon.core.outcomes`): not ok, not
        cancelled."""
        return count_failed(self.outcomes)

    @property
    def cancelled(self) -> int:
        """Requests the client cancelled: walked away from, or the run stopped
        first. Neither ok nor failed."""
        return count_not_judged(self.outcomes)

    def figure(self, name: str) -> Distribution | None:
        """A latency figure by name (one of FIGURE_NAMES); None if none had it."""
        if name not in FIGURE_NAMES:
            raise KeyError(name)
        return self.figures.get(name)

    def value(self, key: str) -> float | None:
        """``ttft_p95``-style lookups, ``error_rate``, and the energy figures
        (:data:`~servemon.loadgen.record.energy.ENERGY_KEYS`: None without energy)."""
        if key == "error_rate":
            return self.error_rate
        if key in ENERGY_KEYS:
            if self.energy is None:
                return None
            tokens = (self.mean_output_tokens or 0.0) * self.ok
            good = (
                self.ok
                if self.goodput is None
                else round(self.goodput * self.duration_s)
            )
            return self.energy.figure(key, tokens, good)
        figure, _, stat = key.rpartition("_")
        dist = self.figure(figure)
        return None if dist is None else dist.stat(stat)

    def to_json(self) -> dict[str, object]:
        """The ``summary.json`` form: scalars, then one object (or null) per figure."""
        data: dict[str, object] = {
            f.name: getattr(self, f.name) for f in fields(self) if f.name != "figures"
        }
        data["energy"] = None if self.energy is None else self.energy.to_json()
        for name in FIGURE_NAMES:
            dist = self.figures.get(name)
            data[name] = None if dist is None else _dist_json(dist)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Summary:
        """A summary back from :meth:`to_json` (unknown keys are ignored, so a
        newer servemon's record still reads)."""
        known = {f.name for f in fields(cls)} - {"figures"}
        values = {k: v for k, v in data.items() if k in known}
        values["energy"] = Energy.from_json(data.get("energy"))
        figures = {
            name: Distribution(**item)
            for name in FIGURE_NAMES
            if isinstance(item := data.get(name), dict)
        }
        return cls(**values, figures=figures)


def _dist_json(dist: Distribution) -> dict[str, object]:
    return {f.name: getattr(dist, f.name) for f in fields(dist)}


class Summarizer:
    """Takes finished requests one by one; :meth:`summary` sums them up."""

    def __init__(self, slo: Sequence[SloTerm] = ()) -> None:
        self.slo = tuple(slo)
        self.requests = 0
        self.outcomes: Counter[str] = Counter()
        self.token_sources: Counter[str] = Counter()
        self.figures = {name: FigureStats() for name in FIGURE_NAMES}
        self.ok = 0
        self.output_tokens = 0
        self.prompt_tokens = 0
        self.prompted = 0
        self.cache_known_prompt = 0
        self.cached_tokens = 0
        self.judged = 0
        self.failed = 0
        self.good = 0
        self.reconnects = 0
        self.without_done = 0
        self.reasoned = 0
        self.reasoning_tokens = 0
        self.historied = 0
        self.history_tokens = 0
        self.first_sent_s = math.inf
        self.last_end_s = -math.inf

    def add(self, t: RequestTiming) -> None:
        """One more finished request."""
        self.requests += 1
        self.outcomes[str(t.outcome)] += 1
        self.reconnects += t.reconnects
        self.first_sent_s = min(self.first_sent_s, t.sent_s)
        self.last_end_s = max(self.last_end_s, t.end_s)
        if judged(t.outcome):
            self.judged += 1
            self.failed += failed(t.outcome)
        ok = t.outcome is Outcome.OK
        for figure in FIGURES:
            if figure.ok_only and not ok:
                continue
            stats = self.figures[figure.name]
            if figure.values is not None:
                stats.extend(figure.values(t))
            elif (value := figure.value(t)) is not None:
                stats.add(value)
        if not ok:
            return
        self.ok += 1
        self.output_tokens += t.output_tokens
        self.token_sources[str(t.token_source)] += 1
        if t.prompt_tokens is not None:
            self.prompt_tokens += t.prompt_tokens
            self.prompted += 1
            if t.cached_tokens is not None and t.prompt_tokens:
                self.cache_known_prompt += t.prompt_tokens
                self.cached_tokens += t.cached_tokens
        if t.first_chunk_s is not None and not t.done_sentinel:
            self.without_done += 1
        if t.reasoning_tokens is not None:
            self.reasoned += 1
            self.reasoning_tokens += t.reasoning_tokens
        if t.history_tokens is not None:
            self.historied += 1
            self.history_tokens += t.history_tokens
        if self.slo and request_meets(t, self.slo):
            self.good += 1

    def merge(self, other: Summarizer) -> None:
        """Fold ``other``'s requests into these (same SLO): as if each had been
        added here."""
        self.requests += other.requests
        self.outcomes.update(other.outcomes)
        self.token_sources.update(other.token_sources)
        for name, stats in self.figures.items():
            stats.merge(other.figures[name])
        for key in (
            "ok",
            "output_tokens",
            "prompt_tokens",
            "prompted",
            "cache_known_prompt",
            "cached_tokens",
            "judged",
            "failed",
            "good",
            "reconnects",
            "without_done",
            "reasoned",
            "reasoning_tokens",
            "historied",
            "history_tokens",
        ):
            setattr(self, key, getattr(self, key) + getattr(other, key))
        self.first_sent_s = min(self.first_sent_s, other.first_sent_s)
        self.last_end_s = max(self.last_end_s, other.last_end_s)

    def extend(self, timings: Iterable[RequestTiming]) -> Summarizer:
        """Several more; returns itself."""
        for t in timings:
            self.add(t)
        return self

    @property
    def span_s(self) -> float:
        """First send to last end (0 with no requests)."""
        return max(0.0, self.last_end_s - self.first_sent_s) if self.requests else 0.0

    def summary(self, duration_s: float | None = None) -> Summary:
        """The summary so far; throughput over ``duration_s`` (default: the span)."""
        duration = self.span_s if duration_s is None else duration_s
        per_s = 1.0 / duration if duration > 0 else 0.0
        figures = {
            name: dist
            for name, stats in self.figures.items()
            if (dist := stats.distribution()) is not None
        }
        summary = Summary(
            requests=self.requests,
            outcomes=dict(self.outcomes),
            duration_s=duration,
            request_throughput=self.ok * per_s,
            output_throughput=self.output_tokens * per_s,
            mean_prompt_tokens=self.prompt_tokens / self.prompted
            if self.prompted
            else None,
            mean_output_tokens=self.output_tokens / self.ok if self.ok else None,
            prompt_throughput=self.prompt_tokens * per_s,
            error_rate=self.failed / self.judged if self.judged else 0.0,
            token_sources=dict(self.token_sources),
            cached_fraction=self.cached_tokens / self.cache_known_prompt
            if self.cache_known_prompt
            else None,
            reconnects=self.reconnects,
            without_done=self.without_done,
            mean_reasoning_tokens=self.reasoning_tokens / self.reasoned
            if self.reasoned
            else None,
            mean_history_tokens=self.history_tokens / self.historied
            if self.historied
            else None,
            figures=figures,
        )
        if not self.slo:
            return summary
        met = {}
        for term in self.slo:
            value = summary.value(term.key)
            met[str(term)] = value is not None and value <= term.threshold
        return replace(summary, goodput=self.good * per_s, slo_met=met)


def summarize(
    timings: Iterable[RequestTiming],
    *,
    duration_s: float | None = None,
    slo: Sequence[SloTerm] = (),
) -> Summary:
    """Summarize finished requests (see the module docstring)."""
    return Summarizer(slo).extend(timings).summary(duration_s)


def flat_row(summary: Summary) -> dict[str, object]:
    """One CSV row: counts, throughput, and every statistic of every figure."""

    def rounded(value: float | None) -> float | None:
        return None if value is None else round(value, 6)

    row: dict[str, object] = {
        "requests": summary.requests,
        "ok": summary.ok,
        "errors": summary.failed,
        "cancelled": summary.cancelled,
        "error_rate": rounded(summary.error_rate),
        "duration_s": rounded(summary.duration_s),
        "request_throughput": rounded(summary.request_throughput),
        "output_throughput": rounded(summary.output_throughput),
        "prompt_throughput": rounded(summary.prompt_throughput),
        "goodput": rounded(summary.goodput),
        "mean_prompt_tokens": summary.mean_prompt_tokens,
        "mean_output_tokens": summary.mean_output_tokens,
        "cached_fraction": summary.cached_fraction,
        "reconnects": summary.reconnects,
        "without_done": summary.without_done,
        "mean_reasoning_tokens": summary.mean_reasoning_tokens,
        "mean_history_tokens": summary.mean_history_tokens,
        "energy_j": None if summary.energy is None else rounded(summary.energy.joules),
        **{key: rounded(summary.value(key)) for key in ENERGY_KEYS},
    }
    for name in FIGURE_NAMES:
        dist = summary.figures.get(name)
        for stat in STATS:
            row[f"{name}_{stat}_s"] = None if dist is None else rounded(dist.stat(stat))
    return row
