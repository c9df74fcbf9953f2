"""One engine exposition in, servemon's schema out: the memoized normalizer.

:class:`Normalizer` (one per target, kept as long as the exporter runs) turns a
target's ``/metrics`` text into a :class:`Normalized`. An engine's exposition keeps
its shape from one scrape to the next (the same lines in the same order; only the
values move), so the work is done once per shape, as a plan:

- parse (:mod:`servemon.monitor.exposition`: lines classified, remembered per line key,
  and grouped into families), then decide (:mod:`servemon.monitor.normalize_rules`:
  which servemon series each family becomes, which labels, what folds);
- the plan keeps, per line, what it starts with (a sample's ``name{labels}`` and a
  space, or the whole of any other line) and, per output sample, where its value
  comes from.

A scrape whose every line starts as the plan expects only reads the values after
those starts; anything else (a new label set, a new line, a value that is no plain
number, another target context) makes a new plan, from the remembered lines. Every
value must read as a number, dropped families' too, so nothing is published from
an exposition prometheus_client's parser would refuse: such text raises ValueError.

:class:`Normalized` holds a scrape's result as text: its output lines' values
(``floatToGoString``, remembered by value text) beside the line starts that
:mod:`servemon.monitor.render` has prometheus_client's encoder write once per plan and
format. It gives the same as prometheus_client families too
(:attr:`Normalized.families`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Final

from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from servemon.monitor.exposition import ExpositionParser, group, number
from servemon.monitor.normalize_rules import (
    KNOWN_FAMILIES,
    ZERO,
    Chunk,
    Decision,
    decide,
    detect_engine,
)
from servemon.monitor.render import Encoder, LineStarts, chunk_family, line_starts

__all__ = ["Normalized", "Normalizer", "detect_engine", "normalize"]

#: How prometheus_client's encoders write a value (the library leaves it untyped).
_go: Callable[[float], str] = floatToGoString

_ZERO_TEXT: Final = "0.0"  # the value of a histogram's missing _sum
_TEXTS_LIMIT = 20_000  # value texts: a generation (kept small: looked up per line)
_FORMATS_LIMIT = 8  # formats (content types) whose line starts are kept
_Context = tuple[str, str | None, str | None, bool]


class _NotPlain(ValueError):
    """A value text that is not a plain number: the shape must be parsed again."""


def _picker(indices: Sequence[int]) -> Callable[[list[str]], Sequence[str]]:
    """``itemgetter`` that always answers a sequence."""
    if not indices:
        return lambda values: ()
    if len(indices) == 1:
        one = indices[0]
        return lambda values: (values[one],)
    return itemgetter(*indices)


@dataclass(slots=True)
class _Plan:
    """What one shape of exposition becomes."""

    context: _Context
    decision: Decision
    expect: list[str]  # per line: what it starts with ...
    rests: list[slice]  # ... and where its value starts
    tails: tuple[str, ...]  # "" per line that nothing may follow
    pick_tails: Callable[[list[str]], Sequence[str]]
    fixed: list[tuple[int, str]]  # irregular sample lines: their value text
    pick_samples: Callable[[list[str]], Sequence[str]]
    #: Each slot's text from [sample value texts..., fold texts..., zero].
    pick_out: Callable[[list[str]], Sequence[str]]
    #: Each slot's value text from [line values..., fold values..., zero].
    pick_raw: Callable[[list[str]], Sequence[str]]
    #: Per format: each output line's start, with a place for its value after it.
    templates: dict[str, list[str]] = field(default_factory=dict)


def _compile(
    parser: ExpositionParser, text: str, lines: list[str], context: _Context
) -> _Plan:
    target, model, engine, passthrough = context
    parsed = parser.classify(lines)
    families = group(parsed, None if passthrough else KNOWN_FAMILIES.__contains__)
    decision = decide(
        parsed,
        families,
        target=target,
        model=model,
        engine=engine or detect_engine(text),
        passthrough=passthrough,
    )
    n_lines, n_samples = len(lines), len(parsed.samples)
    n_folds = len(decision.folds)
    ordinal = {line: n for n, line in enumerate(parsed.samples)}

    def raw_index(ref: int) -> int:  # into [line values..., folds..., zero]
        if ref == ZERO:
            return n_lines + n_folds
        return ref if ref >= 0 else n_lines + (-2 - ref)

    def out_index(ref: int) -> int:  # into [sample texts..., folds..., zero]
        if ref == ZERO:
            return n_samples + n_folds
        return ordinal[ref] if ref >= 0 else n_samples + (-2 - ref)

    refs = [slot.ref for slot in decision.slots]
    others = [i for i in range(n_lines) if i not in ordinal or i in parsed.irregular]
    return _Plan(
        context=context,
        decision=decision,
        expect=parsed.starts,
        rests=[slice(len(start), None) for start in parsed.starts],
        tails=("",) * len(others),
        pick_tails=_picker(others),
        fixed=[(i, parsed.values[i]) for i in parsed.irregular],
        pick_samples=_picker(parsed.samples),
        pick_out=_picker([out_index(r) for r in refs]),
        pick_raw=_picker([raw_index(r) for r in refs]),
    )


@dataclass(frozen=True, slots=True)
class Normalized:
    """A target's exposition in servemon's schema (one scrape)."""

    engine: str
    dialect: str
    models: frozenset[str]
    info: dict[str, str]
    _plan: _Plan
    _values: list[str]  # value text per line, then per fold, then the zero
    _texts: Sequence[str]  # floatToGoString(value) + newline per slot
    _known: dict[str, LineStarts]  # the target's line starts, per format

    @property
    def passthrough(self) -> bool:
        """Whether other families were passed through (see :attr:`families`)."""
        return self._plan.context[3]

    @property
    def families(self) -> list[Metric]:
        """The same as prometheus_client families: engine series, then any
        passed-through families."""
        decision = self._plan.decision
        raws = self._plan.pick_raw(self._values)
        out: list[Metric] = []
        for chunk in decision.chunks:
            out.append(chunk_family(chunk))
            out[-1].samples = [
                Sample(slot.name, dict(slot.labels), number(raws[i]))
                for i, slot in enumerate(
                    decision.slots[chunk.start : chunk.end], chunk.start
                )
            ]
        return out

    def chunks(
        self, encoder: Encoder, content_type: str
    ) -> list[tuple[Chunk, list[str]]]:
        """Each published family and its sample lines in ``encoder``'s format, as
        pieces of text (each line's start, then its value)."""
        plan = self._plan
        template = plan.templates.get(content_type)
        if template is None:
            if len(plan.templates) >= _FORMATS_LIMIT:
                plan.templates.clear()
            if len(self._known) >= _FORMATS_LIMIT and content_type not in self._known:
                self._known.clear()
            known = self._known.setdefault(content_type, {})
            decision = plan.decision
            template = [""] * (2 * len(decision.slots))
            template[::2] = line_starts(decision.slots, decision.chunks, encoder, known)
            plan.templates[content_type] = template
        pieces = template.copy()
        pieces[1::2] = self._texts
        return [(c, pieces[2 * c.start : 2 * c.end]) for c in plan.decision.chunks]


class Normalizer:
    """Normalizes one target's expositions; keep one per target (it remembers)."""

    def __init__(self) -> None:
        self._parser = ExpositionParser()
        self._plan: _Plan | None = None
        self._texts: dict[str, str] = {}
        self._retired: dict[str, str] = {}
        self._known: dict[str, LineStarts] = {}
        #: Plans made (1 for an exposition whose shape never changes).
        self.compiles = 0

    def normalize(
        self,
        text: str,
        *,
        target: str,
        model: str | None = None,
        engine: str | None = None,
        passthrough: bool = False,
    ) -> Normalized:
        """``text`` in servemon's schema; raises ValueError if it won't parse."""
        context = (target, model, engine, passthrough)
        lines = text.split("\n")
        plan = self._plan
        if (
            plan is None
            or plan.context != context
            or len(lines) != len(plan.expect)
            or not all(map(str.startswith, lines, plan.expect))
        ):
            plan = self._make(text, lines, context)
        values = list(map(str.__getitem__, lines, plan.rests))
        if plan.pick_tails(values) != plan.tails:
            plan = self._make(text, lines, context)
            values = list(map(str.__getitem__, lines, plan.rests))
        try:
            return self._result(plan, values)
        except _NotPlain:
            plan = self._make(text, lines, context)
            values = list(map(str.__getitem__, lines, plan.rests))
            return self._result(plan, values)

    def _make(self, text: str, lines: list[str], context: _Context) -> _Plan:
        self._plan = plan = _compile(self._parser, text, lines, context)
        self.compiles += 1
        return plan

    def _result(self, plan: _Plan, values: list[str]) -> Normalized:
        for i, text in plan.fixed:
            values[i] = text
        texts = self._format(plan.pick_samples(values))
        folded: list[str] = []
        for fold in plan.decision.folds:
            # The values were checked by _format; one with a point is no integer.
            numbers = [
                float(v) if "." in v else number(v)
                for v in map(values.__getitem__, fold.members)
            ]
            try:
                value = fold.value(numbers)
            except OverflowError as exc:  # integers too large for a float
                raise ValueError(f"values too large: {exc}") from exc
            folded.append(repr(value))
        values += folded
        values.append(_ZERO_TEXT)
        texts += self._format(folded)
        texts.append(_ZERO_TEXT + "\n")
        decision = plan.decision
        return Normalized(
            engine=decision.engine,
            dialect=decision.dialect,
            models=decision.models,
            info=dict(decision.info),
            _plan=plan,
            _values=values,
            _texts=plan.pick_out(texts),
            _known=self._known,
        )

    def _format(self, raws: Sequence[str]) -> list[str]:
        """``_go(number(raw))`` and a newline, per value text.

        Kept in two generations: the current one is retired once it holds more than
        ``_TEXTS_LIMIT`` texts (new values, say), and what a scrape still uses comes
        back from the retired one without being formatted again.
        """
        texts = self._texts
        try:
            return list(map(texts.__getitem__, raws))
        except KeyError:
            pass
        if len(texts) > _TEXTS_LIMIT:
            self._retired, texts = texts, {}
            self._texts = texts
        retired = self._retired
        for raw in set(raws).difference(texts):
            found = retired.get(raw)
            if found is None:
                try:
                    found = _go(number(raw)) + "\n"
                except (ValueError, OverflowError) as exc:
                    raise _NotPlain(raw) from exc
            texts[raw] = found
        return list(map(texts.__getitem__, raws))


def normalize(
    text: str,
    *,
    target: str,
    model: str | None = None,
    engine: str | None = None,
    passthrough: bool = False,
) -> Normalized:
    """Map an exposition to servemon's series once; raises ValueError if it won't
    parse. (Scraping a target again and again: keep a :class:`Normalizer`.)"""
    return Normalizer().normalize(
        text, target=target, model=model, engine=engine, passthrough=passthrough
    )
