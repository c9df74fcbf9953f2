"""The run's bookkeeping of a batch of records at once: a fleet's sliced credits
(:mod:`servemon.loadgen.fleet.slices`) come back as ``requests.jsonl`` lines, many
to a message, already in the run's frame.

A one-process run takes each request as a
:class:`~servemon.loadgen.send.timing.RequestTiming` (:meth:`RunContext._finished
<servemon.loadgen.run.context.RunContext>`): its line written, then its figures
added to the live metrics, the summaries, the progress display, the client watch and
the guard rail, one object at a time. Here the batch's lines are written as they
came (one write), and each figure is taken from the lines' own keys (the line
holds every figure a summary or a histogram wants: ``ttft_s``, ``itl_s``, ...) as a
column per stage and model, and added at once: a summary's
:class:`~servemon.loadgen.record.figures.FigureStats` extended, a histogram given
one count per bucket (:func:`~servemon.loadgen.run.live.observe_many`). What comes
out is what the one-process path gives for the same requests.

A batch is read whole before anything is written or added: a line that does not
read (a key missing, a value of the wrong type) raises :class:`BatchError`, and its
caller takes the batch one line at a time.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from servemon.core.outcomes import FAILED, NOT_JUDGED, Outcome
from servemon.core.slo import SloTerm
from servemon.loadgen.record.figures import FIGURE_NAMES, QUANTILES, exact_quantile
from servemon.loadgen.record.line import Line, keys
from servemon.loadgen.record.record import RunDirectory
from servemon.loadgen.record.summary import Summarizer
from servemon.loadgen.record.tally import Tally
from servemon.loadgen.run.clientwatch import ClientWatch
from servemon.loadgen.run.guard import GuardRail
from servemon.loadgen.run.live import LiveMetrics, observe_many
from servemon.loadgen.run.progress import Progress
from servemon.loadgen.run.sender import Sink, Starter

__all__ = ["BatchError", "Group", "RunBatch", "group_lines", "summarize_lines"]

#: Each latency figure of a summary (over ok requests) and its key in the line.
_OK_FIGURES: tuple[tuple[str, str], ...] = tuple(
    zip(
        (
            "ttft",
            "ttfc",
            "ttfa",
            "tpot",
            "e2e",
            "ttft_from_scheduled",
            "e2e_from_scheduled",
            "server_queue",
            "server_prefill",
            "server_decode",
            "ttft_gap",
        ),
        keys(
            "ttft_s",
            "ttfc_s",
            "ttfa_s",
            "tpot_s",
            "e2e_s",
            "ttft_from_scheduled_s",
            "e2e_from_scheduled_s",
            "server_queue_s",
            "server_prefill_s",
            "server_decode_s",
            "ttft_gap_s",
        ),
        strict=True,
    )
)
# A figure added to the summaries and not here would be silently missing.
assert {name for name, _ in _OK_FIGURES} | {"itl", "dispatch_lag"} == set(FIGURE_NAMES)
#: What an SLO term reads of one request (as ``request_meets``).
_TERM_KEYS = dict(
    zip(
        ("ttft", "ttfc", "tpot", "e2e", "dispatch_lag"),
        keys("ttft_s", "ttfc_s", "tpot_s", "e2e_s", "dispatch_lag_s"),
        strict=True,
    )
)
_OUTCOMES = frozenset(str(o) for o in Outcome)


class BatchError(Exception):
    """A batch with a line that does not read."""


@dataclass(slots=True)
class Group:
    """The lines of one stage and model, as columns."""

    stage: int
    model: str | None
    lines: list[Line] = field(default_factory=list)
    #: The ok ones among them.
    ok: list[Line] = field(default_factory=list)


def group_lines(lines: Sequence[Line]) -> list[Group]:
    """``lines`` by stage and model, each checked for the keys every line has
    (:class:`BatchError` where one lacks them)."""
    groups: dict[tuple[int, str | None], Group] = {}
    try:
        for line in lines:
            stage, model = line["stage"], line.get("model")
            outcome = line["outcome"]
            if (
                outcome not in _OUTCOMES
                or type(stage) is not int
                or not isinstance(line["id"], str)
                or not isinstance(line["sent_s"], float)
                or not isinstance(line["end_s"], float)
                or not isinstance(line["scheduled_s"], float)
            ):
                raise BatchError(f"a line that does not read: {line.get('id')!r}")
            group = groups.get((stage, model))
            if group is None:
                group = groups[stage, model] = Group(stage, model)
            group.lines.append(line)
            if outcome == "ok":
                group.ok.append(line)
    except (KeyError, TypeError) as exc:
        raise BatchError(f"a line that does not read: {exc}") from None
    return list(groups.values())


def _present(lines: Sequence[Line], key: str) -> list[float]:
    return [v for line in lines if (v := line.get(key)) is not None]


def _meets(line: Line, terms: Sequence[SloTerm]) -> bool:
    """Whether one ok request's line meets every latency term on its own."""
    for term in terms:
        if term.figure == "itl":
            gaps = sorted(line.get("itl_s") or ())
            if not gaps:
                continue
            if term.stat == "mean":
                value = sum(gaps) / len(gaps)
            elif term.stat == "max":
                value = gaps[-1]
            else:
                value = exact_quantile(gaps, QUANTILES[term.stat])
        else:
            key = _TERM_KEYS.get(term.figure)
            value = None if key is None else line.get(key)
        if value is not None and value > term.threshold:
            return False
    return True


def summarize_lines(s: Summarizer, group: Group) -> None:
    """Add ``group``'s requests to ``s``, as :meth:`Summarizer.add` would one by
    one."""
    lines, ok = group.lines, group.ok
    outcomes = Counter(line["outcome"] for line in lines)
    s.requests += len(lines)
    s.outcomes.update(outcomes)
    s.reconnects += sum(line.get("reconnects") or 0 for line in lines)
    s.first_sent_s = min(s.first_sent_s, min(line["sent_s"] for line in lines))
    s.last_end_s = max(s.last_end_s, max(line["end_s"] for line in lines))
    for outcome, count in outcomes.items():
        if outcome not in NOT_JUDGED:
            s.judged += count
            s.failed += count if outcome in FAILED else 0
    s.figures["dispatch_lag"].extend([line["dispatch_lag_s"] for line in lines])
    if not ok:
        return
    for name, key in _OK_FIGURES:
        values = _present(ok, key)
        if values:
            s.figures[name].extend(values)
    s.figures["itl"].extend(
        itertools.chain.from_iterable(line.get("itl_s") or () for line in ok)
    )
    s.ok += len(ok)
    s.output_tokens += sum(line.get("output_tokens") or 0 for line in ok)
    s.token_sources.update(line.get("token_source") or "chunks" for line in ok)
    for line in ok:
        prompt = line.get("prompt_tokens")
        if prompt is not None:
            s.prompt_tokens += prompt
            s.prompted += 1
            cached = line.get("cached_tokens")
            if cached is not None and prompt:
                s.cache_known_prompt += prompt
                s.cached_tokens += cached
        if line.get("first_chunk_s") is not None and not line.get("done_sentinel"):
            s.without_done += 1
        reasoning = line.get("reasoning_tokens")
        if reasoning is not None:
            s.reasoned += 1
            s.reasoning_tokens += reasoning
        history = line.get("history_tokens")
        if history is not None:
            s.historied += 1
            s.history_tokens += history
    if s.slo:
        s.good += sum(_meets(line, s.slo) for line in ok)


def observe_lines(live: LiveMetrics, group: Group) -> None:
    """Count ``group``'s requests in the live metrics, as
    :meth:`LiveMetrics.observe` would one by one."""
    c = live._stage_children(group.stage, group.model)
    for outcome, count in Counter(line["outcome"] for line in group.lines).items():
        counter = c.outcomes.get(outcome)
        if counter is None:
            counter = live.requests.labels(*c.labels, outcome)
            c.outcomes[outcome] = counter
        counter.inc(count)
    observe_many(c.lag, [max(0.0, line["dispatch_lag_s"]) for line in group.lines])
    reconnects = sum(line.get("reconnects") or 0 for line in group.lines)
    if reconnects:
        c.reconnects.inc(reconnects)
    ok = group.ok
    if not ok:
        return
    observe_many(c.server_queue, _present(ok, "server_queue_s"))
    observe_many(c.ttft_gap, [max(0.0, v) for v in _present(ok, "ttft_gap_s")])
    observe_many(
        c.itl,
        list(itertools.chain.from_iterable(line.get("itl_s") or () for line in ok)),
    )
    observe_many(c.ttft, _present(ok, "ttft_s"))
    observe_many(c.ttfc, _present(ok, "ttfc_s"))
    observe_many(c.tpot, _present(ok, "tpot_s"))
    observe_many(c.e2e, _present(ok, "e2e_s"))
    output = sum(line.get("output_tokens") or 0 for line in ok)
    if output:
        c.output_tokens.inc(output)
    prompt = sum(line.get("prompt_tokens") or 0 for line in ok)
    if prompt:
        c.prompt_tokens.inc(prompt)


@dataclass(slots=True, eq=False, kw_only=True)
class RunBatch:
    """A run's own bookkeeping, a batch at a time
    (:class:`~servemon.loadgen.run.sender.Batch`): the parts of the run that
    :meth:`RunContext._finished <servemon.loadgen.run.context.RunContext>` tells
    of each request, and that sink and its starter."""

    rundir: RunDirectory
    live: LiveMetrics
    tally: Tally
    progress: Progress
    watch: ClientWatch
    guard: GuardRail
    abort: Callable[[str | None], None]
    sink: Sink
    starter: Starter

    def handed(self, count: int) -> None:
        self.live.in_flight.inc(count)

    def lines(self, raw: bytes, lines: list[Line]) -> None:
        groups = group_lines(lines)
        self.live.in_flight.dec(len(lines))
        self.rundir.append_request_lines(raw)
        self.abort(self.rundir.failure)
        tally = self.tally
        for group in groups:
            observe_lines(self.live, group)
            stage = tally.stages.get(group.stage)
            if stage is None:
                stage = tally.stages[group.stage] = Summarizer(tally.slo)
            summarize_lines(stage, group)
            if group.model is not None:
                summarize_lines(tally._group(tally.models, group.model), group)
            for turn, of_turn in _by_turn(group):
                summarize_lines(tally._group(tally.turns, turn), of_turn)
            ok = group.ok
            self.progress.requests_done(
                group.stage,
                [line["sent_s"] for line in group.lines],
                len(ok),
                sum(line["outcome"] in FAILED for line in group.lines),
                [v for line in ok if (v := line.get("ttft_s")) is not None],
            )
            self.watch.observe_lags([line["dispatch_lag_s"] for line in group.lines])
        for line in lines:
            why = self.guard.observe_end(line["outcome"], line["sent_s"], line["end_s"])
            if why is not None:
                self.abort(why)
                break


def _by_turn(group: Group) -> list[tuple[int, Group]]:
    """``group``'s lines by a conversation's turn (none: not a sessions run)."""
    turns: dict[int, Group] = {}
    for line in group.lines:
        turn = line.get("turn")
        if turn is None:
            continue
        of_turn = turns.get(turn)
        if of_turn is None:
            of_turn = turns[turn] = Group(group.stage, group.model)
        of_turn.lines.append(line)
        if line["outcome"] == "ok":
            of_turn.ok.append(line)
    return sorted(turns.items())
