"""``servemon trace synth``: a synthetic trace with the shape real ones have.

Tests and demos need a trace, and none can be downloaded here, so this writes one in
the Mooncake format (:mod:`servemon.loadgen.workloads.tracefile`), seeded, with the
knobs production traffic has:

- arrivals: a Poisson process whose rate follows a day (``diurnal``: the rate swings
  by that fraction around ``rate`` over ``period_s``) and bursts (``bursts_per_hour``
  stretches of ``burst_s`` seconds at ``burst_x`` times the rate), drawn by thinning;
- heavy-tailed lengths: log-normal user messages and answers (a median and a
  ``sigma``), cut at ``max_tokens``;
- shared system prompts: each conversation starts with one of ``system_prompts``
  prompts of ``system_tokens`` tokens (a Zipf choice: a few are hot), so their
  blocks repeat across conversations;
- sessions: a conversation has 1 to ``turns`` turns (uniform); each later turn
  arrives an exponential think time (mean ``think_s``) after the one before and sends
  the whole history (system prompt, every message and answer so far) plus a new
  message, so its leading blocks are the previous turn's.

Each line gets ``session_id`` too. Block ids stand for whole prefixes, as Mooncake's
do: a block shared by two requests has the same id only if everything before it is
the same.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass

from servemon.loadgen.workloads.tracefile import BLOCK_TOKENS

__all__ = ["SynthSpec", "synthesize"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SynthSpec:
    """The knobs of a synthetic trace (see the module docstring)."""

    duration_s: float = 600.0
    rate: float = 2.0
    seed: int = 0
    diurnal: float = 0.0
    period_s: float = 86_400.0
    bursts_per_hour: float = 0.0
    burst_s: float = 30.0
    burst_x: float = 3.0
    input_median: int = 256
    output_median: int = 128
    sigma: float = 0.8
    max_tokens: int = 8192
    system_prompts: int = 4
    system_tokens: int = 1024
    turns: int = 1
    think_s: float = 20.0

    def __post_init__(self) -> None:
        checks = [
            (self.duration_s > 0, "duration must be > 0"),
            (self.rate > 0, "rate must be > 0"),
            (0 <= self.diurnal < 1, "diurnal must be in [0, 1)"),
            (self.period_s > 0, "period must be > 0"),
            (self.bursts_per_hour >= 0, "bursts-per-hour must be >= 0"),
            (self.burst_s > 0 and self.burst_x >= 1, "bursts: seconds > 0, x >= 1"),
            (self.input_median >= 1 and self.output_median >= 1, "medians >= 1"),
            (self.sigma >= 0, "sigma must be >= 0"),
            (self.max_tokens >= 1, "max-tokens must be >= 1"),
            (self.system_prompts >= 0 and self.system_tokens >= 0, "system >= 0"),
            (self.turns >= 1, "turns must be >= 1"),
            (self.think_s >= 0, "think must be >= 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


@dataclass(slots=True)
class _Turn:
    at_s: float
    session: int
    turn: int
    turns: int  # of its conversation
    history: int  # tokens before this turn's new message
    history_ids: tuple[int, ...]  # ids of the history's full blocks


class _Ids:
    """Block ids: one per distinct prefix, numbered in order of first use."""

    def __init__(self) -> None:
        self.next = 0

    def fresh(self, count: int) -> tuple[int, ...]:
        ids = tuple(range(self.next, self.next + count))
        self.next += count
        return ids


def _arrivals(spec: SynthSpec, rng: random.Random) -> Iterator[float]:
    """Session starts: a thinned Poisson process of the diurnal, bursty rate."""
    bursts: list[float] = []
    if spec.bursts_per_hour > 0:
        t = 0.0
        while True:
            t += rng.expovariate(spec.bursts_per_hour / 3600.0)
            if t >= spec.duration_s:
                break
            bursts.append(t)
    peak = spec.rate * (1 + spec.diurnal) * (spec.burst_x if bursts else 1.0)
    t = 0.0
    while True:
        t += rng.expovariate(peak)
        if t >= spec.duration_s:
            return
        rate = spec.rate * (
            1 + spec.diurnal * math.sin(2 * math.pi * t / spec.period_s)
        )
        if any(b <= t < b + spec.burst_s for b in bursts):
            rate *= spec.burst_x
        if rng.random() * peak < rate:
            yield t


def _length(rng: random.Random, median: int, spec: SynthSpec) -> int:
    value = median * math.exp(rng.gauss(0.0, spec.sigma))
    return max(1, min(spec.max_tokens, round(value)))


def synthesize(spec: SynthSpec) -> Iterator[dict[str, object]]:
    """The trace's lines (Mooncake fields plus ``session_id``), in time order."""
    rng = random.Random(f"trace-synth:{spec.seed}")
    ids = _Ids()
    system_blocks = spec.system_tokens // BLOCK_TOKENS
    systems = [ids.fresh(system_blocks) for _ in range(spec.system_prompts)]
    weights = [1 / (k + 1) for k in range(spec.system_prompts)]  # Zipf: a few hot
    # (time, order, turn): turns come out in time order; a conversation's next
    # turn is queued once the one before has been drawn (it extends its history).
    pending: list[tuple[float, int, _Turn]] = []
    order = 0
    for session, start in enumerate(_arrivals(spec, rng), 1):
        turns = rng.randint(1, spec.turns)
        if systems:
            system = systems[rng.choices(range(len(systems)), weights)[0]]
            first = _Turn(start, session, 1, turns, spec.system_tokens, system)
        else:
            first = _Turn(start, session, 1, turns, 0, ())
        order += 1
        heapq.heappush(pending, (start, order, first))
    while pending:
        _, _, turn = heapq.heappop(pending)
        message = _length(rng, spec.input_median, spec)
        answer = _length(rng, spec.output_median, spec)
        prompt = turn.history + message
        blocks = math.ceil(prompt / BLOCK_TOKENS)
        hash_ids = turn.history_ids + ids.fresh(blocks - len(turn.history_ids))
        yield {
            "timestamp": round(turn.at_s * 1000),
            "input_length": prompt,
            "output_length": answer,
            "hash_ids": list(hash_ids),
            "session_id": f"s{turn.session}",
        }
        if turn.turn < turn.turns:
            history = prompt + answer
            full = history // BLOCK_TOKENS
            # The next turn's full blocks: this turn's own, then fresh ones for
            # blocks holding its answer (the partial block's content changed).
            shared = hash_ids[: min(full, prompt // BLOCK_TOKENS)]
            kept = shared + ids.fresh(full - len(shared))
            think = rng.expovariate(1 / spec.think_s) if spec.think_s else 0.0
            at = turn.at_s + think
            if at < spec.duration_s:
                later = _Turn(
                    at, turn.session, turn.turn + 1, turn.turns, history, kept
                )
                order += 1
                heapq.heappush(pending, (at, order, later))
