"""What the requests in flight hold in the server's KV cache, as the client sees
them: the model behind ``servemon control --hold kv_cache_usage``.

KV usage is what the running requests hold, so the server's gauge answers a change
of rate only as requests are replaced, over about a lifetime, and it carries the
noise of how many happen to be in flight. The client knows that population without
lag: every request it has in flight, when it went out and its prompt. From the
requests it saw finish it learns their shape (time to first token, output length)
and the server's decode speed now (tokens a second over the last seconds of each
stream, so a slower server shows within seconds, not a lifetime later), and
models what each request holds::

    held = prompt + tokens made      (made: decode speed x time since the first token,
                                      up to the output length; then it finishes)

:class:`HeldTokens` sums that over the requests in flight (``held``): the law
(:class:`servemon.loadgen.drivers.control.law.ControlLaw`) scales the sum to the
measured gauge
(block rounding, other traffic). What a request holds on average over its life
(:attr:`Shape.mean_held`: its prompt, and half its output for the part of its life it
decodes) turns the setpoint into a number of requests in flight, which the law holds
like a queue.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field

from servemon.loadgen.send.timing import Outcome, RequestTiming

__all__ = ["MIN_FINISHED", "Held", "HeldTokens", "Shape", "tail_speed"]

#: Finished requests the shape needs before the model is used.
MIN_FINISHED = 5


def tail_speed(timing: RequestTiming, tail_s: float) -> float | None:
    """Output tokens a second over the last ``tail_s`` seconds of a stream (all of
    it if shorter); None without two content chunks."""
    chunks = timing.content_s
    if len(chunks) < 2 or timing.output_tokens < 1:
        return None
    per_chunk = timing.output_tokens / len(chunks)
    last = chunks[-1]
    i = bisect.bisect_right(chunks, last - tail_s)
    if i == 0:
        span, count = last - chunks[0], len(chunks) - 1
    else:
        span, count = tail_s, len(chunks) - i
    return count * per_chunk / span if span > 0 else None


@dataclass(frozen=True, slots=True)
class Shape:
    """The recent requests' shape: means over the last finished ones, and the
    decode speed over the last seconds of the last few."""

    ttft_s: float
    decode_tps: float  # output tokens a second, per request, after the first
    output_tokens: float
    prompt_tokens: float

    @property
    def lifetime_s(self) -> float:
        """A request's lifetime at this speed."""
        return self.ttft_s + self.output_tokens / self.decode_tps

    @property
    def mean_held(self) -> float:
        """What a request in flight holds on average over its life: its prompt, and
        half its output over the share of its life it decodes (the requests in
        flight at a steady rate are of every age)."""
        decode_s = self.output_tokens / self.decode_tps
        return self.prompt_tokens + self.output_tokens * decode_s / (
            2 * (self.ttft_s + decode_s)
        )


@dataclass(frozen=True, slots=True)
class Held:
    """The model at a control tick: its mean over the window the gauge's samples
    describe (``seen``), the requests in flight now (``count``), and what one holds
    on average over its life (``each``, :attr:`Shape.mean_held`)."""

    seen: float
    count: int
    each: float


@dataclass(slots=True)
class _Flight:
    sent_s: float
    prompt_tokens: int | None
    #: Output tokens the model says it has made.
    made: float = 0.0


@dataclass(slots=True)
class HeldTokens:
    """The requests in flight (``started``) and the shape of the last ``recent``
    that finished, their decode speed over the last ``tail_s`` seconds of the last
    ``speed_recent`` (a sink of the sender's
    :class:`~servemon.loadgen.run.sender.Hooks`)."""

    recent: int = 50
    speed_recent: int = 20
    tail_s: float = 4.0
    inflight: dict[str, _Flight] = field(default_factory=dict)
    #: (ttft, output tokens, prompt tokens) of the last finished, ok ones.
    done: deque[tuple[float, int, int | None]] = field(default_factory=deque)
    speeds: deque[float] = field(default_factory=deque)
    #: When the requests' tokens were last brought up to date (None: not yet).
    advanced_s: float | None = None

    def started(
        self, request_id: str, sent_s: float, prompt_tokens: int | None
    ) -> None:
        """A request went out at monotonic ``sent_s``."""
        self.inflight[request_id] = _Flight(sent_s, prompt_tokens)

    def __call__(self, timing: RequestTiming) -> None:
        self.inflight.pop(timing.request_id, None)
        out = timing.output_tokens
        if timing.outcome is not Outcome.OK or timing.ttft is None or out < 1:
            return
        self.done.append((timing.ttft, out, timing.prompt_tokens))
        while len(self.done) > self.recent:
            self.done.popleft()
        speed = tail_speed(timing, self.tail_s)
        if speed is not None:
            self.speeds.append(speed)
            while len(self.speeds) > self.speed_recent:
                self.speeds.popleft()

    def shape(self) -> Shape | None:
        """The recent requests' shape; None until :data:`MIN_FINISHED` finished."""
        n = len(self.done)
        if n < MIN_FINISHED or not self.speeds:
            return None
        ttft = sum(d[0] for d in self.done) / n
        output = sum(d[1] for d in self.done) / n
        prompts = [d[2] for d in self.done if d[2] is not None]
        prompt = sum(prompts) / len(prompts) if prompts else 0.0
        return Shape(ttft, sum(self.speeds) / len(self.speeds), output, prompt)

    def _advance(self, now: float, shape: Shape) -> None:
        """Bring every request's tokens made up to ``now`` at today's speed (from
        its age, the first time)."""
        since = self.advanced_s
        for f in self.inflight.values():
            first = f.sent_s + shape.ttft_s
            begin = first if since is None else max(since, first)
            if now > begin:
                f.made += (now - begin) * shape.decode_tps
        self.advanced_s = now

    def _prompt(self, shape: Shape, f: _Flight) -> float:
        return (
            shape.prompt_tokens if f.prompt_tokens is None else float(f.prompt_tokens)
        )

    def held(self, now: float) -> float | None:
        """What the requests in flight hold now (None: no shape yet)."""
        shape = self.shape()
        if shape is None:
            return None
        self._advance(now, shape)
        out = shape.output_tokens
        return sum(
            self._prompt(shape, f) + min(out, f.made) for f in self.inflight.values()
        )
