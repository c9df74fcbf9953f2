"""Parsing Prometheus text expositions fast enough to scrape many targets per scrape.

prometheus_client's parser spends most of its time splitting label sets character by
character. An engine's label sets barely change from one scrape to the next, so
:class:`ExpositionParser` keeps the parsed form of every label string it has seen
(through prometheus_client's own :func:`~prometheus_client.parser.parse_labels`) and
otherwise follows the same rules as :func:`text_string_to_metric_families` for
grouping samples into families. Anything it does not expect — a line it cannot split,
a value that is not a number — makes it hand the whole text to prometheus_client's
parser instead, so it never accepts what the library would refuse. A test checks
the two agree.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import parse_labels, text_string_to_metric_families
from prometheus_client.samples import Sample

__all__ = ["ExpositionParser"]

_UNTYPED = ("untyped", "unknown")  # prometheus_client calls "untyped" "unknown"
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_ALLOWED = {
    "counter": ("",),
    "gauge": ("",),
    "summary": ("_count", "_sum", ""),
    "histogram": ("_count", "_sum", "_bucket"),
}


class _Fallback(Exception):
    """The fast path met something unusual: use the library's parser."""


class ExpositionParser:
    """Parses expositions into prometheus_client :class:`Metric` families by name."""

    def __init__(self, max_cached_label_sets: int = 50_000) -> None:
        self._labels: dict[str, dict[str, str]] = {}
        self._names: set[str] = set()
        self._limit = max_cached_label_sets
        self.fallbacks = 0

    def parse(
        self, text: str, keep: Callable[[str], bool] | None = None
    ) -> dict[str, Metric]:
        """Families by name; ``keep(name)`` drops families and samples early.

        Raises ValueError where prometheus_client's parser would.
        """
        try:
            return self._fast(text, keep)
        except _Fallback:
            self.fallbacks += 1
        families: dict[str, Metric] = {}
        for family in text_string_to_metric_families(text):
            if keep is None or keep(family.name):
                earlier = families.get(family.name)
                if earlier is not None and {earlier.type, family.type} <= {*_UNTYPED}:
                    earlier.samples = [*earlier.samples, *family.samples]
                else:
                    families[family.name] = family
        return families

    def _fast(self, text: str, keep: Callable[[str], bool] | None) -> dict[str, Metric]:
        families: dict[str, Metric] = {}
        name = ""
        doc = ""
        typ = "untyped"
        samples: list[Sample] = []
        allowed: tuple[str, ...] = ()

        def flush() -> None:
            if name and (keep is None or keep(name)):
                _build(families, name, doc, typ, samples)

        for raw in text.split("\n"):
            line = raw.strip()
            if not line:
                continue
            if line[0] == "#":
                parts = line.split(None, 3)
                if len(parts) < 2 or parts[1] not in ("HELP", "TYPE"):
                    continue
                if len(parts) < 3:
                    raise _Fallback  # "# TYPE" alone: the library refuses it
                candidate = parts[2]
                if '"' in candidate:
                    raise _Fallback
                if candidate != name:
                    flush()
                    name, doc, typ, samples = candidate, "", "untyped", []
                    allowed = (candidate,)
                if parts[1] == "HELP":
                    doc = parts[3] if len(parts) == 4 else ""
                    if "\\" in doc:
                        raise _Fallback
                else:
                    if len(parts) < 4:
                        raise _Fallback
                    typ = parts[3]
                    allowed = tuple(name + s for s in _ALLOWED.get(typ, ("",)))
                continue
            sample = self._sample(line)
            if sample.name not in allowed:
                flush()
                name, doc, typ, samples, allowed = "", "", "untyped", [], ()
                if keep is None or keep(sample.name):
                    _build(families, sample.name, "", "untyped", [sample])
                continue
            samples.append(sample)
        flush()
        return families

    def _sample(self, line: str) -> Sample:
        brace = line.find("{")
        if brace < 0:
            fields = line.split()
            if len(fields) != 2:
                raise _Fallback  # a timestamp, or something odd
            return Sample(self._name(fields[0]), {}, _number(fields[1]), None)
        end = line.find("}", brace)
        if end < 0 or line.find("}", end + 1) >= 0:
            # No end, or a brace after the label set (an exemplar, a stray one, or
            # one inside a quoted value): prometheus_client's parser decides.
            raise _Fallback
        key = line[brace : end + 1]
        labels = self._labels.get(key)
        if labels is None:
            try:
                labels = parse_labels(line[brace + 1 : end], False)
            except ValueError as exc:
                raise _Fallback from exc
            if len(self._labels) >= self._limit:
                self._labels.clear()
            self._labels[key] = labels
        fields = line[end + 1 :].split()
        if len(fields) != 1 or "__name__" in labels:
            raise _Fallback
        return Sample(
            self._name(line[:brace].strip()), labels, _number(fields[0]), None
        )

    def _name(self, name: str) -> str:
        """``name`` if it is a valid metric name (remembered), else fall back."""
        if name not in self._names:
            if not _METRIC_NAME.fullmatch(name):
                raise _Fallback
            if len(self._names) >= self._limit:
                self._names.clear()
            self._names.add(name)
        return name


def _number(text: str) -> float:
    if "_" in text:
        raise _Fallback  # float() takes "1_000"; the exposition format does not
    try:
        return float(text)
    except ValueError as exc:
        raise _Fallback from exc


def _build(
    families: dict[str, Metric], name: str, doc: str, typ: str, samples: list[Sample]
) -> None:
    if typ == "counter":
        if name.endswith("_total"):
            name = name[:-6]
        else:
            samples = [Sample(s.name + "_total", *s[1:]) for s in samples]
    earlier = families.get(name)
    if earlier is not None and typ == "untyped" and earlier.type in _UNTYPED:
        earlier.samples = [*earlier.samples, *samples]  # untyped singletons, joined
        return
    metric = Metric(name, doc, typ)
    metric.samples = samples
    families[name] = metric
