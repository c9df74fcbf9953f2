"""Guard rails: stop a load run at once when it is plainly harming the target.

On by default for every load command. A run stops, with the reason recorded, when

- the share of failed requests over the last ``window_s`` seconds passes
  ``abort_error_rate`` (default 0.2, judged once at least ``min_requests`` finished);
- the target stops answering: only connection errors or timeouts for ``dead_after_s``;
- the waiting queue runs away: the engine reports more than ``max_waiting`` waiting.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from servemon.core.outcomes import failed
from servemon.loadgen.send.timing import Outcome, RequestTiming

__all__ = ["GuardRail"]

_DEAD = (Outcome.CONNECT_ERROR, Outcome.TIMEOUT)


@dataclass
class GuardRail:
    """Watches finished requests and engine samples; says why to stop, if it should."""

    abort_error_rate: float = 0.2
    window_s: float = 10.0
    min_requests: int = 10
    dead_after_s: float = 5.0
    max_waiting: float = 5000.0

    def __post_init__(self) -> None:
        # (end time, failed, dead) of recent requests, with running counts.
        self._recent: deque[tuple[float, bool, bool]] = deque()
        self._failed = 0
        self._dead = 0
        self._dead_since: float | None = None

    def observe(self, timing: RequestTiming) -> str | None:
        """Account for one finished request; a reason to stop, or None."""
        return self.observe_end(timing.outcome, timing.sent_s, timing.end_s)

    def observe_end(self, outcome: Outcome, sent_s: float, now: float) -> str | None:
        """Account for one finished request by its outcome, send and end; a
        reason to stop, or None."""
        dead = outcome in _DEAD
        bad = failed(outcome)
        self._recent.append((now, bad, dead))
        self._failed += bad
        self._dead += dead
        while self._recent and self._recent[0][0] < now - self.window_s:
            _at, old_failed, old_dead = self._recent.popleft()
            self._failed -= old_failed
            self._dead -= old_dead
        if dead:
            if self._dead_since is None:
                self._dead_since = sent_s
        else:
            self._dead_since = None
        dead_for = now - self._dead_since if self._dead_since is not None else 0.0
        stopped_answering = (
            f"the target stopped answering: only connection errors and timeouts "
            f"for {dead_for:.1f} s"
        )
        if dead_for >= self.dead_after_s:
            return stopped_answering
        if len(self._recent) >= self.min_requests:
            share = self._failed / len(self._recent)
            if share > self.abort_error_rate:
                if self._dead == self._failed and self._dead_since is not None:
                    return stopped_answering  # every failure is the target gone
                return (
                    f"error rate {share:.0%} over the last {self.window_s:g} s "
                    f"passed --abort-error-rate {self.abort_error_rate:g}"
                )
        return None

    def observe_waiting(self, waiting: float) -> str | None:
        """Account for the engine's waiting queue; a reason to stop, or None."""
        if waiting > self.max_waiting:
            return (
                f"the waiting queue ran away: {waiting:.0f} requests waiting "
                f"(over {self.max_waiting:g})"
            )
        return None
