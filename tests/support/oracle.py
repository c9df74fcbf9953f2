"""The normalizer's oracle: prometheus_client's parser, and the rules applied to
what it reads.

:func:`oracle` is what servemon's normalizer must give for an exposition:
prometheus_client's parser (:func:`text_string_to_metric_families`) reads it, and
the rules (:mod:`servemon.monitor.normalize_rules`) are applied to the families it
gives. :func:`parsed` and :func:`family_rows` put families in a comparable form.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from servemon.monitor.exposition import Family, Lines, SampleKey
from servemon.monitor.normalize_rules import ZERO, decide, detect_engine
from servemon.monitor.render import chunk_family

__all__ = [
    "Expected",
    "comparable",
    "family_rows",
    "library_lines",
    "oracle",
    "parsed",
]


def comparable(value: float) -> Any:
    """Comparable: NaN equals NaN, and -0.0 is told from 0.0."""
    if math.isnan(value):
        return "NaN"
    return (value, math.copysign(1.0, value))


def parsed(text: str, content_type: str) -> Any:
    """Families as prometheus_client's parser for the format reads them, or the
    error it raises."""
    parse = (
        openmetrics_families
        if content_type.startswith("application/openmetrics-text")
        else text_string_to_metric_families
    )
    try:
        return [
            (
                f.name,
                f.type,
                f.documentation,
                f.unit,
                [
                    (s.name, tuple(sorted(s.labels.items())), comparable(s.value))
                    for s in f.samples
                ],
            )
            for f in parse(text)
        ]
    except ValueError as exc:
        return ("refused", str(exc))


def family_rows(families: Iterable[Metric]) -> list[Any]:
    return [
        (
            f.name,
            f.type,
            f.documentation,
            f.unit,
            [(s.name, s.labels, comparable(s.value), s.timestamp) for s in f.samples],
        )
        for f in families
    ]


@dataclass(frozen=True, slots=True)
class Expected:
    """What the rules make of prometheus_client's parse."""

    engine: str
    dialect: str
    models: frozenset[str]
    info: dict[str, str]
    families: list[Metric]


def library_lines(text: str) -> tuple[Lines, dict[str, Family], list[float]]:
    """prometheus_client's families of ``text`` in the rules' input form (one
    entry per sample, in the library's order), and each sample's value. A later
    family of a name replaces an earlier one; untyped ones are joined."""
    entries: list[SampleKey | None] = []
    numbers: list[float] = []
    families: dict[str, Family] = {}
    for metric in text_string_to_metric_families(text):
        members = []
        for sample in metric.samples:
            members.append(len(entries))
            entries.append(SampleKey(sample.name, sample.labels))
            numbers.append(sample.value)
        earlier = families.get(metric.name)
        if earlier is not None and metric.type == "unknown" == earlier.type:
            earlier.members += members
        else:
            families[metric.name] = Family(
                metric.name, metric.documentation, metric.type, members
            )
    n = len(entries)
    lines = Lines(list(entries), [""] * n, [""] * n, list(range(n)))
    return lines, families, numbers


def oracle(
    text: str,
    *,
    target: str = "t",
    model: str | None = None,
    engine: str | None = None,
    passthrough: bool = False,
) -> Expected:
    """The rules applied to prometheus_client's parse; ValueError where either
    refuses."""
    lines, families, numbers = library_lines(text)
    decision = decide(
        lines,
        families,
        target=target,
        model=model,
        engine=engine or detect_engine(text),
        passthrough=passthrough,
    )
    folded = [fold.value([numbers[i] for i in fold.members]) for fold in decision.folds]

    def value(ref: int) -> float:
        if ref == ZERO:
            return 0.0
        return numbers[ref] if ref >= 0 else folded[-2 - ref]

    out = []
    for chunk in decision.chunks:
        family = chunk_family(chunk)
        family.samples = [
            Sample(slot.name, slot.labels, value(slot.ref))
            for slot in decision.slots[chunk.start : chunk.end]
        ]
        out.append(family)
    return Expected(
        decision.engine, decision.dialect, decision.models, decision.info, out
    )
