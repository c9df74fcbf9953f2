"""Figures over a set of requests: counts, throughput, latency percentiles, goodput.

Percentiles use the inclusive method (linear interpolation between closest ranks, as
numpy's default), over ok requests only; ITL pools every gap of every ok request.
Throughput is over ``duration_s``: the stage's own length when the caller gives it,
else first send to last end.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from loadgen.slo import SloTerm, request_meets
from loadgen.timing import Outcome, RequestTiming
from monitor.outcomes import failed, judged

__all__ = [
    "FIGURE_NAMES",
    "Distribution",
    "StageSummaries",
    "Summary",
    "flat_row",
    "summarize",
    "summarize_stages",
    "summary_from_json",
]

#: Latency figures in a summary, in the order tables show them.
FIGURE_NAMES = (
    "ttft",
    "ttfc",
    "itl",
    "tpot",
    "e2e",
    "dispatch_lag",
    "ttft_from_scheduled",
    "e2e_from_scheduled",
    "server_queue",
    "server_prefill",
    "ttft_gap",
)


@dataclass(frozen=True, slots=True)
class Distribution:
    """Count, mean, percentiles and max of one figure, in seconds."""

    count: int
    mean: float
    p50: float
    p90: float
    p95: float
    p99: float
    max: float = 0.0

    @classmethod
    def of(cls, values: Sequence[float]) -> Distribution | None:
        """The distribution of ``values``; None when empty."""
        if not values:
            return None
        if len(values) == 1:
            v = values[0]
            return cls(1, v, v, v, v, v, v)
        cuts = statistics.quantiles(values, n=100, method="inclusive")
        return cls(
            count=len(values),
            mean=statistics.fmean(values),
            p50=cuts[49],
            p90=cuts[89],
            p95=cuts[94],
            p99=cuts[98],
            max=max(values),
        )

    def stat(self, name: str) -> float:
        """One statistic by name (``mean``, ``p50`` ... ``max``)."""
        value: float = getattr(self, name)
        return value


@dataclass(frozen=True, slots=True)
class Summary:
    """What a set of requests measured."""

    requests: int
    outcomes: dict[str, int]
    duration_s: float
    request_throughput: float
    output_throughput: float
    mean_prompt_tokens: float | None
    mean_output_tokens: float | None
    ttft: Distribution | None
    tpot: Distribution | None
    itl: Distribution | None
    e2e: Distribution | None
    ttfc: Distribution | None = None
    dispatch_lag: Distribution | None = None
    ttft_from_scheduled: Distribution | None = None
    e2e_from_scheduled: Distribution | None = None
    prompt_throughput: float = 0.0
    error_rate: float = 0.0
    token_sources: dict[str, int] = field(default_factory=dict)
    goodput: float | None = None
    slo_met: dict[str, bool] | None = None
    #: Server-reported seconds in the queue, from scheduling to the first token,
    #: and the client-side rest of TTFT (ok requests whose server reported them).
    server_queue: Distribution | None = None
    server_prefill: Distribution | None = None
    ttft_gap: Distribution | None = None
    #: Prompt tokens served from the server's prefix cache over prompt tokens, over
    #: the ok requests whose server reported cached tokens.
    cached_fraction: float | None = None
    #: Resends after the server closed an idle pooled connection (all requests).
    reconnects: int = 0
    #: Ok answers that ended without ``data: [DONE]`` (every non-streamed one).
    without_done: int = 0

    def figure(self, name: str) -> Distribution | None:
        """A latency figure by name (one of :data:`FIGURE_NAMES`)."""
        value: Distribution | None = getattr(self, name)
        return value

    def value(self, key: str) -> float | None:
        """``ttft_p95``-style lookups, and ``error_rate``."""
        if key == "error_rate":
            return self.error_rate
        figure, _, stat = key.rpartition("_")
        dist = self.figure(figure)
        return None if dist is None else dist.stat(stat)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


def summarize(
    timings: Sequence[RequestTiming],
    *,
    duration_s: float | None = None,
    slo: Sequence[SloTerm] = (),
) -> Summary:
    """Summarize finished requests (see the module docstring)."""
    ok = [t for t in timings if t.outcome is Outcome.OK]
    outcomes = Counter(str(t.outcome) for t in timings)
    if duration_s is None:
        duration_s = (
            max(t.end_s for t in timings) - min(t.sent_s for t in timings)
            if timings
            else 0.0
        )
    per_s = 1.0 / duration_s if duration_s > 0 else 0.0
    prompts = [t.prompt_tokens for t in ok if t.prompt_tokens is not None]

    def dist(values: list[float | None]) -> Distribution | None:
        return Distribution.of([v for v in values if v is not None])

    summary = Summary(
        requests=len(timings),
        outcomes=dict(outcomes),
        duration_s=duration_s,
        request_throughput=len(ok) * per_s,
        output_throughput=sum(t.output_tokens for t in ok) * per_s,
        mean_prompt_tokens=statistics.fmean(prompts) if prompts else None,
        mean_output_tokens=statistics.fmean([t.output_tokens for t in ok])
        if ok
        else None,
        ttft=dist([t.ttft for t in ok]),
        tpot=dist([t.tpot for t in ok]),
        itl=Distribution.of([gap for t in ok for gap in t.itl]),
        e2e=dist([t.e2e for t in ok]),
        ttfc=dist([t.time_to_first_chunk for t in ok]),
        dispatch_lag=dist([t.dispatch_lag for t in timings]),
        ttft_from_scheduled=dist([t.ttft_from_scheduled for t in ok]),
        e2e_from_scheduled=dist([t.e2e_from_scheduled for t in ok]),
        prompt_throughput=sum(prompts) * per_s,
        error_rate=_error_rate(timings),
        token_sources=dict(Counter(str(t.token_source) for t in ok)),
        server_queue=dist([t.server_queue_s for t in ok]),
        server_prefill=dist([t.server_prefill_s for t in ok]),
        ttft_gap=dist([t.ttft_gap for t in ok]),
        cached_fraction=_cached_fraction(ok),
        reconnects=sum(t.reconnects for t in timings),
        without_done=sum(
            1 for t in ok if t.first_chunk_s is not None and not t.done_sentinel
        ),
    )
    if not slo:
        return summary
    good = sum(1 for t in ok if request_meets(t, slo))
    met = {}
    for term in slo:
        value = summary.value(term.key)
        met[str(term)] = value is not None and value <= term.threshold
    return _replace(summary, goodput=good * per_s, slo_met=met)


def _cached_fraction(ok: Sequence[RequestTiming]) -> float | None:
    known = [t for t in ok if t.cached_tokens is not None and t.prompt_tokens]
    if not known:
        return None
    prompt = sum(t.prompt_tokens or 0 for t in known)
    return sum(t.cached_tokens or 0 for t in known) / prompt


def _error_rate(timings: Sequence[RequestTiming]) -> float:
    """Failed over finished requests; cancelled ones count neither way (the client
    walked away on purpose, or the run was stopped)."""
    counted = [t for t in timings if judged(t.outcome)]
    if not counted:
        return 0.0
    return sum(1 for t in counted if failed(t.outcome)) / len(counted)


def _replace(summary: Summary, **changes: Any) -> Summary:
    data = {name: getattr(summary, name) for name in Summary.__dataclass_fields__}
    data.update(changes)
    return Summary(**data)


def flat_row(summary: Summary) -> dict[str, Any]:
    """One CSV row: counts, throughput, and every statistic of every figure."""
    row: dict[str, Any] = {
        "requests": summary.requests,
        "ok": summary.outcomes.get("ok", 0),
        "errors": summary.requests - summary.outcomes.get("ok", 0),
        "error_rate": round(summary.error_rate, 6),
        "duration_s": round(summary.duration_s, 6),
        "request_throughput": round(summary.request_throughput, 6),
        "output_throughput": round(summary.output_throughput, 6),
        "prompt_throughput": round(summary.prompt_throughput, 6),
        "goodput": None if summary.goodput is None else round(summary.goodput, 6),
        "mean_prompt_tokens": summary.mean_prompt_tokens,
        "mean_output_tokens": summary.mean_output_tokens,
        "cached_fraction": summary.cached_fraction,
        "reconnects": summary.reconnects,
        "without_done": summary.without_done,
    }
    for name in FIGURE_NAMES:
        dist = summary.figure(name)
        for stat in ("mean", "p50", "p90", "p95", "p99", "max"):
            row[f"{name}_{stat}_s"] = (
                None if dist is None else round(dist.stat(stat), 6)
            )
    return row


def summarize_stages(
    metas: Sequence[Mapping[str, Any]],
    timings: Sequence[Sequence[RequestTiming]],
    durations: Sequence[float | None],
    slo: Sequence[SloTerm] = (),
) -> StageSummaries:
    """The ``summary.json`` stage entries (each stage's meta, its achieved rate and
    summary), the ``summary.csv`` rows (``all`` last), the summaries, and the
    overall summary.

    ``metas[i]`` describes stage ``i`` (``stage``, ``label``, ``target_rate``,
    ``sent``, ...); ``durations[i]`` is what its throughput divides by (None: the
    span of its requests). The one place a run's summary is assembled: the runner,
    ``merge`` and a run rebuilt from ``requests.jsonl`` all come here.
    """
    entries: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    summaries: list[Summary] = []
    for meta, own, duration in zip(metas, timings, durations, strict=True):
        summary = summarize(own, duration_s=duration, slo=slo)
        summaries.append(summary)
        sent = int(meta.get("sent") or 0)
        stage = {
            **meta,
            "achieved_rate": sent / summary.duration_s if summary.duration_s else 0.0,
        }
        entries.append({**stage, "summary": summary.to_json()})
        rows.append(
            {**{k: v for k, v in stage.items() if k != "label"}, **flat_row(summary)}
        )
    overall = summarize([t for own in timings for t in own], slo=slo)
    rows.append({"stage": "all", **flat_row(overall)})
    return StageSummaries(entries, rows, summaries, overall)


@dataclass(frozen=True, slots=True)
class StageSummaries:
    """What :func:`summarize_stages` returns."""

    entries: list[dict[str, Any]]
    rows: list[dict[str, Any]]
    summaries: list[Summary]
    overall: Summary


def summary_from_json(data: dict[str, Any]) -> Summary:
    """A :class:`Summary` back from its ``summary.json`` form."""
    fields = dict(data)
    for name in FIGURE_NAMES:
        value = fields.get(name)
        fields[name] = Distribution(**value) if isinstance(value, dict) else None
    return Summary(**fields)
