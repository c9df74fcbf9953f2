"""The prefill backlog as the client sees it, and the pace that answers it: the
inner loop of ``servemon control --hold ttft_p95``.

A request's time to first token is mostly its wait behind the prompts sent before
it that the server has not started answering yet. The client knows that backlog
without lag: the prompt tokens of every request it sent that has no first token
yet. A p95 over a window of seconds answers a burst of Poisson arrivals only after
the burst has filled the window's top 5 %, so a law on the p95 alone, however
tuned, holds it no steadier than a fixed rate does (``benchmarks/RESULTS.md``).

:class:`PrefillBacklog` is the backlog; :meth:`PrefillBacklog.pace` is the factor on
the rate of the next gap: ``exp(-k (b - b̄) / b̄) * exp(d / (r T))``, clamped to
[:data:`PACE_MIN`, :data:`PACE_MAX`], where ``b`` is the backlog now, ``b̄`` its
average over the last ``tau_s`` seconds (at least one prompt), ``r`` the outer law's
rate and ``d`` the sends owed: ``r`` integrated over time, less the gaps drawn. A
burst that has piled up prompts slows the sends behind it, a lull speeds them, and
the sends owed (or sent ahead) bring what goes out back to ``r`` within about
:data:`PACE_CATCH_UP_S`: the law on the measured p95 still sets the level. (An
earlier pace multiplied by the mean stretch of the last ``tau_s``'s gaps instead:
on the simulator its 10-s intervals sent 0.96-0.97 of the law's rate on average,
spread 0.12-0.14, against 0.99 and 0.09 with the sends owed; see
``benchmarks/RESULTS.md``.) The sends stay open loop (none waits for an
answer), but less bursty than the process they are drawn from: each interval
records what went out over what was drawn at (:meth:`PrefillBacklog.mean_pace`).
The law does not pace while it drains a backlog (a TTFT far over its setpoint,
:data:`loadgen.drivers.controllaw.TTFT_DRAIN_OVER`; :meth:`PrefillBacklog.unpaced`); it
drains the count of requests here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from servemon.loadgen.send.timing import RequestTiming

__all__ = ["PACE_CATCH_UP_S", "PACE_GAIN", "PACE_MAX", "PACE_MIN", "PrefillBacklog"]

#: How hard the pace answers the backlog (``k``: e^-1 at twice its average).
PACE_GAIN = 1.0
PACE_MIN = 0.25
PACE_MAX = 2.0
#: How soon the sends owed bring the rate sent back to the law's (``T``: a deficit
#: of ``T`` seconds of sends multiplies the rate by e). A toy prefill queue
#: (``tests/unit/loadgen/test_backlog.py``, ten seeds) picked it: 1 s, 2 s and
#: 3 s held 89, 93 and 95 % of the 30-s p95s within ±15 % with 10-s send counts
#: spread 0.065, 0.082 and 0.095 (Poisson: 0.093).
PACE_CATCH_UP_S = 2.0
#: The most sends owed (or ahead), in catch-up times.
OWED_MAX = 3.0


@dataclass(slots=True)
class PrefillBacklog:
    """Prompt tokens sent and not yet answered with a first token (a starter,
    first-token listener and sink of the sender's
    :class:`~loadgen.run.sender.Hooks`)."""

    tau_s: float
    gain: float = PACE_GAIN
    #: request id -> its prompt tokens (None: the workload does not say).
    pending: dict[str, int | None] = field(default_factory=dict)
    #: Prompt tokens of the requests sent whose prompt is known, and how many.
    known_tokens: int = 0
    known: int = 0
    #: The pending requests' known prompt tokens, and how many are unknown.
    pending_tokens: int = 0
    pending_unknown: int = 0
    #: The backlog's average (tokens) and when it was last brought up to date.
    average: float | None = None
    averaged_s: float = 0.0
    #: The sends owed to the law's rate (negative: sent ahead), and when.
    owed: float = 0.0
    owed_s: float | None = None
    #: Sum and count of the stretches (1 / factor) given since :meth:`mean_pace`.
    paced_sum: float = 0.0
    paced_count: int = 0

    def started(
        self, request_id: str, sent_s: float, prompt_tokens: int | None
    ) -> None:
        if request_id in self.pending:
            return
        self.pending[request_id] = prompt_tokens
        if prompt_tokens is None:
            self.pending_unknown += 1
        else:
            self.pending_tokens += prompt_tokens
            self.known_tokens += prompt_tokens
            self.known += 1

    def first_token(self, request_id: str, at_s: float) -> None:
        if request_id not in self.pending:
            return
        prompt = self.pending.pop(request_id)
        if prompt is None:
            self.pending_unknown -= 1
        else:
            self.pending_tokens -= prompt

    def __call__(self, timing: RequestTiming) -> None:
        # Not streamed, failed, or no content: the answer is the end of it.
        self.first_token(timing.request_id, timing.end_s)

    def prompt_size(self) -> float:
        """A prompt's tokens: the mean of those sent that are known (1: none)."""
        return self.known_tokens / self.known if self.known else 1.0

    def count(self) -> int:
        """Requests sent and not yet answered."""
        return len(self.pending)

    def tokens(self) -> float:
        """The backlog now, in prompt tokens."""
        return self.pending_tokens + self.pending_unknown * self.prompt_size()

    def pace(self, now: float, rate: float) -> float:
        """The factor on ``rate`` (the law's) of a gap drawn at ``now`` (see the
        module)."""
        backlog = self.tokens()
        if self.average is None:
            self.average, self.averaged_s = backlog, now
        else:
            a = 1.0 - math.exp(-max(0.0, now - self.averaged_s) / self.tau_s)
            self.average += a * (backlog - self.average)
            self.averaged_s = now
        level = max(self.average, self.prompt_size())
        raw = math.exp(-self.gain * (backlog - self.average) / level)
        if self.owed_s is not None:
            self.owed += rate * max(0.0, now - self.owed_s)
        self.owed_s = now
        scale = max(rate * PACE_CATCH_UP_S, 1e-9)
        self.owed = max(-OWED_MAX * scale, min(OWED_MAX * scale, self.owed))
        factor = raw * math.exp(self.owed / scale)
        factor = max(PACE_MIN, min(PACE_MAX, factor))
        self.owed -= 1.0  # the gap drawn now ends in a send
        self.paced_sum += 1.0 / factor
        self.paced_count += 1
        return factor

    def unpaced(self, now: float) -> None:
        """A gap drawn at ``now`` without the pace (a drain): nothing is owed for
        the time unpaced."""
        self.owed, self.owed_s = 0.0, now

    def mean_pace(self) -> float | None:
        """The rate sent over the rate drawn at since the last call: the inverse
        of the mean stretch (None: no gap drawn)."""
        if not self.paced_count:
            return None
        mean = self.paced_count / self.paced_sum
        self.paced_sum, self.paced_count = 0.0, 0
        return mean
