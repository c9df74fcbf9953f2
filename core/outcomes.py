"""How a request ends, and which endings count as failed: the one definition that the
run summaries, the SLO checks, the recording rules and the dashboards all use.

A request is *judged* unless it was cancelled (the client walked away on purpose, or
the run was stopped); a judged request *failed* unless it ended ``ok``. The PromQL
matchers below are built from the same sets, so an outcome added here reaches every
error rate at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

__all__ = [
    "FAILED",
    "FAILED_MATCHER",
    "JUDGED_MATCHER",
    "NOT_JUDGED",
    "Outcome",
    "count_failed",
    "count_not_judged",
    "failed",
    "judged",
]


class Outcome(StrEnum):
    """How a request ended (the ``outcome`` label of the client series)."""

    OK = "ok"
    HTTP_ERROR = "http_error"
    TIMEOUT = "timeout"
    CONNECT_ERROR = "connect_error"
    STREAM_ERROR = "stream_error"
    #: The answer passed a bound of :mod:`servemon.core.wire.limits` (body, SSE event or
    #: stream, headers): a gzip bomb, a header flood, an event without end.
    RESPONSE_TOO_LARGE = "response_too_large"
    CANCELLED = "cancelled"


NOT_JUDGED: frozenset[Outcome] = frozenset({Outcome.CANCELLED})
FAILED: frozenset[Outcome] = frozenset(Outcome) - NOT_JUDGED - {Outcome.OK}


def judged(outcome: Outcome) -> bool:
    """Whether a request with this outcome counts in an error rate at all."""
    return outcome not in NOT_JUDGED


def failed(outcome: Outcome) -> bool:
    """Whether a request with this outcome counts as an error."""
    return outcome in FAILED


def count_failed(by_outcome: Mapping[str, int]) -> int:
    """The failed requests among counts by outcome label. As :data:`FAILED_MATCHER`
    counts them: an outcome this version does not know (a newer client's) fails."""
    unfailed = {o.value for o in NOT_JUDGED | {Outcome.OK}}
    return sum(n for name, n in by_outcome.items() if name not in unfailed)


def count_not_judged(by_outcome: Mapping[str, int]) -> int:
    """The requests among counts by outcome label that no error rate judges: the
    ones the client cancelled (walked away, or the run stopped first)."""
    return sum(by_outcome.get(o.value, 0) for o in NOT_JUDGED)


def _alternation(outcomes: frozenset[Outcome]) -> str:
    return "|".join(sorted(o.value for o in outcomes))


#: Label matcher selecting failed requests of ``servemon_client_requests_total``:
#: written as "neither ok nor unjudged", so an outcome label that a newer client
#: sends and this one does not know still counts as a failure.
FAILED_MATCHER = f'outcome!~"{_alternation(NOT_JUDGED | {Outcome.OK})}"'
#: Label matcher selecting judged requests (the error rate's denominator).
JUDGED_MATCHER = f'outcome!~"{_alternation(NOT_JUDGED)}"'
