"""What an SLO can measure: the indicators behind ``servemon rules``.

Per source (the load generator's client series, or the engine's as the exporter
publishes them): the latency histograms a latency SLO can read and the bucket edges
they are published with, the finished-requests counter, and which finished requests
count as errors. The client's errors are :mod:`servemon.core.outcomes`' failed outcomes
over its judged ones (a cancelled request is the client's own doing, and every
stopped load test cancels some); the engine's are the finish reasons ``abort`` and
``error`` (``abort`` also counts clients that hung up) and the requests it refused
at admission (vLLM's queue limits): those never finish, so they count as requests
and as errors beside the finished ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from servemon.core import names
from servemon.core.buckets import (
    E2E_BUCKETS,
    ITL_BUCKETS,
    LATENCY_BUCKETS,
    TTFT_BUCKETS,
)
from servemon.core.names import Series
from servemon.core.outcomes import (
    FAILED_MATCHER,
    JUDGED_MATCHER,
    NOT_JUDGED,
    Outcome,
)

__all__ = [
    "ENGINE_ERROR_REASONS",
    "ERRORS",
    "HISTOGRAMS",
    "REQUESTS",
    "Errors",
    "Figure",
    "Histogram",
    "SourceName",
    "slo_series",
]

Figure = Literal["ttft", "itl", "tpot", "e2e"]
SourceName = Literal["client", "engine"]


@dataclass(frozen=True, slots=True)
class Histogram:
    """A latency histogram an SLO can use, and its bucket edges."""

    series: Series
    edges: tuple[float, ...]


#: Every histogram a latency SLO can use, by (source, figure): the one place that
#: pairs a servemon series with the bucket edges it is published with.
HISTOGRAMS: Mapping[tuple[SourceName, Figure], Histogram] = {
    ("client", "ttft"): Histogram(names.CLIENT_TTFT, LATENCY_BUCKETS["ttft"]),
    ("client", "itl"): Histogram(names.CLIENT_ITL, LATENCY_BUCKETS["itl"]),
    ("client", "tpot"): Histogram(names.CLIENT_TPOT, LATENCY_BUCKETS["tpot"]),
    ("client", "e2e"): Histogram(names.CLIENT_E2E, LATENCY_BUCKETS["e2e"]),
    ("engine", "ttft"): Histogram(names.ENGINE_TTFT, TTFT_BUCKETS),
    ("engine", "itl"): Histogram(names.ENGINE_ITL, ITL_BUCKETS),
    ("engine", "tpot"): Histogram(names.ENGINE_TPOT, ITL_BUCKETS),
    ("engine", "e2e"): Histogram(names.ENGINE_E2E, E2E_BUCKETS),
}

#: The finished-requests counter of each source: availability and the traffic guard.
REQUESTS: Mapping[SourceName, Series] = {
    "client": names.CLIENT_REQUESTS,
    "engine": names.ENGINE_REQUESTS_FINISHED,
}

#: The engine's finish reasons that count as errors.
ENGINE_ERROR_REASONS: tuple[str, ...] = ("abort", "error")


@dataclass(frozen=True, slots=True)
class Errors:
    """Which finished requests of a source count, and which of those failed.

    ``failed`` is a label matcher on the source's requests counter, ``judged`` the
    matchers of the requests that count at all (none: every finished request).
    ``refused``, where the source has one, counts requests turned away before they
    started (never finished): each is a request and an error. ``words`` names the
    failures for alert descriptions.
    """

    failed: str
    judged: tuple[str, ...]
    words: str
    refused: Series | None = None


def _client_words() -> str:
    fine = [Outcome.OK.value, *sorted(o.value for o in NOT_JUDGED)]
    return "outcomes other than " + " and ".join(fine)


#: The errors of an availability SLO, per source.
ERRORS: Mapping[SourceName, Errors] = {
    "client": Errors(FAILED_MATCHER, (JUDGED_MATCHER,), _client_words()),
    "engine": Errors(
        f'reason=~"{"|".join(ENGINE_ERROR_REASONS)}"',
        (),
        "engine finish reasons "
        + " and ".join(ENGINE_ERROR_REASONS)
        + ", and admission rejections",
        names.ENGINE_ADMISSION_REJECTIONS,
    ),
}


def slo_series() -> tuple[Series, ...]:
    """Every series an SLO can read, once each, in table order."""
    found = [h.series for h in HISTOGRAMS.values()] + list(REQUESTS.values())
    return tuple(dict.fromkeys(found))
