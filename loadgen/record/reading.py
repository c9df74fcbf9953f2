"""One reading of the server's signals, whichever sampler took it.

A run reads the server either from the target's ``/metrics``
(:mod:`servemon.loadgen.run.sampler`: samples per rank and model) or from Prometheus
(:mod:`servemon.loadgen.run.promsource`: one value per signal of
:mod:`servemon.core.signals`). Both lines go to ``server_metrics.jsonl`` as they are;
what the drivers and the summary read back is a :class:`Reading` of either, built by
:func:`reading_of`, with the sums and maxima over ranks made once, here: waiting,
running and preemptions are summed, KV-cache usage is the fullest engine's.

A signal the line did not carry is None, never 0. A Prometheus line that failed is a
reading with nothing in it (a blind moment the capacity search counts); a failed
scrape of ``/metrics`` is no reading.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields

from servemon.core import names

__all__ = ["JUDGED", "Reading", "reading_of", "server_hit_rates"]

#: The signals a capacity step is judged on, and whose absence makes it blind.
JUDGED = ("waiting", "kv_cache_usage", "preemptions")

#: Each series of the target's ``/metrics`` a reading keeps, and how its ranks
#: combine (the fields of :class:`Reading`).
_DIRECT: dict[str, tuple[str, str]] = {
    names.ENGINE_REQUESTS_WAITING.name: ("waiting", "sum"),
    names.ENGINE_REQUESTS_RUNNING.name: ("running", "sum"),
    names.ENGINE_KV_CACHE_USAGE.name: ("kv_cache_usage", "max"),
    names.ENGINE_PREEMPTIONS.name: ("preemptions", "sum"),
    names.ENGINE_PREFIX_HITS.name: ("prefix_hits", "sum"),
    names.ENGINE_PREFIX_QUERIES.name: ("prefix_queries", "sum"),
}


@dataclass(frozen=True, slots=True)
class Reading:
    """The server's signals at one moment (monotonic ``at``); None: not read.

    The first eight fields are :data:`servemon.core.signals.SIGNALS`, by the same names
    (Prometheus answers each; ``/metrics`` gives the engine's four). The prefix
    cache's counters (tokens, every rank summed) come from ``/metrics`` only.
    """

    at: float
    waiting: float | None = None
    running: float | None = None
    kv_cache_usage: float | None = None
    preemptions: float | None = None
    ttft_p95: float | None = None
    error_rate: float | None = None
    gpu_utilization: float | None = None
    burn_rate: float | None = None
    prefix_hits: float | None = None
    prefix_queries: float | None = None

    def signal(self, name: str) -> float | None:
        """The signal called ``name`` (a name of
        :data:`servemon.core.signals.SIGNALS`)."""
        value: float | None = getattr(self, name)
        return value

    def judged(self) -> bool:
        """Whether it carries any signal a capacity step is judged on."""
        return any(getattr(self, k) is not None for k in JUDGED)


_FIELDS = frozenset(f.name for f in fields(Reading)) - {"at"}


def reading_of(line: Mapping[str, object]) -> Reading | None:
    """The reading of one line of ``server_metrics.jsonl`` (None: a failed scrape
    of ``/metrics``, or a line of another kind)."""
    mono = line["mono_s"]
    if not isinstance(mono, int | float | str):
        raise TypeError(f"mono_s is not a number: {mono!r}")
    at = float(mono)
    signals = line.get("signals")
    if isinstance(signals, Mapping):  # Prometheus
        return Reading(at, **{k: v for k, v in signals.items() if k in _FIELDS})
    if line.get("source") == "prometheus" and "error" in line:
        return Reading(at)  # blind: Prometheus did not answer
    samples = line.get("samples")
    if not samples:
        return None
    if not isinstance(samples, Sequence):
        raise TypeError(f"samples is not a list: {samples!r}")
    values: dict[str, float] = {}
    for name, _labels, value in samples:
        kept = _DIRECT.get(name)
        if kept is None:
            continue
        key, how = kept
        seen = values.get(key)
        if seen is None:
            values[key] = float(value)
        elif how == "sum":
            values[key] = seen + value
        else:
            values[key] = max(seen, value)
    return Reading(at, **values)


def server_hit_rates(
    readings: Iterable[Reading],
    windows: Sequence[tuple[float | None, float | None]],
) -> list[float | None]:
    """Each window's prefix-cache hit rate by the server's own counters: the rise
    of its prefix-cache hits over the rise of its queries (tokens; every rank
    summed) between the readings around the window's start and end. None where the
    target does not count them, the window has no readings around it, or nothing
    was asked of the cache."""
    counters = [
        (r.at, r.prefix_hits or 0.0, r.prefix_queries)
        for r in readings
        if r.prefix_queries is not None
    ]
    out: list[float | None] = []
    for start, end in windows:
        if start is None or end is None or not counters:
            out.append(None)
            continue
        before = [c for c in counters if c[0] <= start] or counters[:1]
        after = [c for c in counters if c[0] >= end] or counters[-1:]
        first, last = before[-1], after[0]
        asked = last[2] - first[2]
        out.append((last[1] - first[1]) / asked if asked > 0 else None)
    return out
