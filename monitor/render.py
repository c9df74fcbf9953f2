"""Writing the exporter's answer in the scraper's format, from remembered line starts.

prometheus_client's encoders (``generate_latest``, OpenMetrics', as
``choose_encoder`` picks them) write Prometheus text 0.0.4 or OpenMetrics. A
sample's line is its start (name and labels, as the format writes them) and its
value, and the start depends on the format, the sample's name and labels alone for
plain families. So the encoder writes each start once, and what is remembered is
reused: :func:`line_starts` for the normalizer's output slots (per target and
format), :class:`Renderer` for the headers, the trailer and every other family
(targets, info, GPU, probe, process), falling back to the encoder for a family
whose lines depend on more (a unit, timestamps, exemplars, ``_created`` samples).

The engine families of several targets are merged by name, in order of first
appearance, and written as one family each.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from itertools import chain
from typing import Final, Protocol

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from servemon.monitor.normalize_rules import Chunk, Slot


class Normalized(Protocol):
    """What the renderer needs of one target's normalized exposition
    (:class:`servemon.monitor.normalize.Normalized` is one): the renderer does not
    import the normalizer, which uses it."""

    @property
    def passthrough(self) -> bool: ...

    @property
    def families(self) -> list[Metric]: ...

    def chunks(
        self, encoder: Encoder, content_type: str
    ) -> list[tuple[Chunk, list[str]]]: ...


__all__ = [
    "Encoder",
    "LineStarts",
    "Normalized",
    "Renderer",
    "chunk_family",
    "line_starts",
]

#: How prometheus_client's encoders write a value (the library leaves it untyped).
_go: Callable[[float], str] = floatToGoString

#: prometheus_client's encoders: anything with ``collect()`` in, bytes out.
Encoder = Callable[[Collector], bytes]
_SlotKey = tuple[str, tuple[tuple[str, str], ...]]
#: Line starts by sample name and labels, for one format.
LineStarts = dict[_SlotKey, str]

_CACHE_LIMIT = 50_000  # line starts per format: cleared when full
_FORMATS_LIMIT: Final = 8  # formats written from memory before forgetting


class _Collect(Collector):
    """A collector over fixed families, for prometheus_client's encoders."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> list[Metric]:
        return self._families


def chunk_family(chunk: Chunk) -> Metric:
    """An empty family for ``chunk``: its series', or the copied family's."""
    if chunk.series is not None:
        return chunk.series.family()
    assert chunk.family is not None
    return Metric(chunk.family.name, chunk.family.doc, chunk.family.type)


def line_starts(
    slots: Sequence[Slot], chunks: Sequence[Chunk], encoder: Encoder, known: LineStarts
) -> list[str]:
    """Each slot's line up to its value, as ``encoder`` writes it; ``known`` keeps
    them (for this format) from one shape to the next: a new shape's lines that the
    last shape had are not written again, and the lines only older shapes had are
    forgotten (a label value that changes, a new model name, must not leave its
    lines behind: 1.6 MiB per shape of an 8k-line exposition)."""
    keys = [(slot.name, tuple(slot.labels.items())) for slot in slots]
    missing = [i for i, key in enumerate(keys) if key not in known]
    if missing:
        if len(known) + len(missing) > _CACHE_LIMIT:
            known.clear()
            missing = list(range(len(keys)))
        elif len(known) > len(keys) - len(missing):  # lines of a shape gone by
            kept = {key: known[key] for key in keys if key in known}
            known.clear()
            known.update(kept)
        families: list[Metric] = []
        wanted = set(missing)
        for chunk in chunks:  # each sample in its own family, as published
            family = chunk_family(chunk)
            for i in range(chunk.start, chunk.end):
                if i in wanted:
                    family.samples.append(Sample(slots[i].name, slots[i].labels, 0.0))
            families.append(family)
        text = encoder(_Collect(families)).decode("utf-8")
        lines = [line for line in text.split("\n") if line and line[0] != "#"]
        if len(lines) != len(missing) or not all(x.endswith(" 0.0") for x in lines):
            raise RuntimeError("prometheus_client wrote the sample lines unexpectedly")
        for i, line in zip(missing, lines, strict=True):
            known[keys[i]] = line[:-3]
    return [known[key] for key in keys]


class Renderer:
    """Writes families in a scraper's format; remembers what prometheus_client wrote
    for each header and each sample's line start, per format."""

    def __init__(self) -> None:
        self._headers: dict[tuple[str, str, str, str], str] = {}
        self._trailers: dict[str, str] = {}
        self._starts: dict[str, LineStarts] = {}

    def trailer(self, encoder: Encoder, content_type: str) -> str:
        """What ``encoder`` writes after the last family (OpenMetrics' ``# EOF``)."""
        found = self._trailers.get(content_type)
        if found is None:
            if len(self._trailers) >= _FORMATS_LIMIT:  # scrapers ask in few ways
                self._trailers.clear()
                self._headers.clear()
                self._starts.clear()
            found = self._trailers[content_type] = encoder(_Collect([])).decode()
        return found

    def encode(
        self, encoder: Encoder, content_type: str, families: Iterable[Metric]
    ) -> str:
        """``families`` as ``encoder`` writes them, without the trailer."""
        self.trailer(encoder, content_type)  # first: it may forget other formats
        out: list[str] = []
        for family in families:
            lines = self._samples(encoder, content_type, family)
            if lines is None:
                out.append(self._library(encoder, content_type, [family]))
            else:
                out.append(self._header_of(encoder, content_type, family))
                out.append(lines)
        return "".join(out)

    def header(
        self, encoder: Encoder, content_type: str, name: str, doc: str, typ: str
    ) -> str:
        """The ``# HELP`` and ``# TYPE`` lines of a family."""
        key = (content_type, name, doc, typ)
        found = self._headers.get(key)
        if found is None:
            found = self._library(encoder, content_type, [Metric(name, doc, typ)])
            self._headers[key] = found
        return found

    def _header_of(self, encoder: Encoder, content_type: str, family: Metric) -> str:
        return self.header(
            encoder, content_type, family.name, family.documentation, family.type
        )

    def _library(
        self, encoder: Encoder, content_type: str, families: Iterable[Metric]
    ) -> str:
        text = encoder(_Collect(families)).decode("utf-8")
        return text.removesuffix(self.trailer(encoder, content_type))

    def _samples(
        self, encoder: Encoder, content_type: str, family: Metric
    ) -> str | None:
        """The sample lines of ``family`` from remembered line starts; None where the
        encoder's lines depend on more than a sample's name and labels."""
        if family.unit:
            return None
        moved = {family.name + s for s in ("_created", "_gsum", "_gcount")}
        starts = self._starts.setdefault(content_type, {})
        out: list[str] = []
        for sample in family.samples:
            if (
                sample.timestamp is not None
                or sample.exemplar is not None
                or getattr(sample, "native_histogram", None) is not None
                or sample.name in moved  # written after the family in text 0.0.4
                or not isinstance(sample.value, int | float)
            ):
                return None
            key = (sample.name, tuple(sample.labels.items()))
            start = starts.get(key)
            if start is None:
                start = self._start(encoder, content_type, family, sample)
                if len(starts) >= _CACHE_LIMIT:
                    starts.clear()
                starts[key] = start
            out.append(start + _go(sample.value) + "\n")
        return "".join(out)

    def _start(
        self, encoder: Encoder, content_type: str, family: Metric, sample: Sample
    ) -> str:
        """A sample's line up to its value, as ``encoder`` writes it."""
        alone = Metric(family.name, family.documentation, family.type)
        alone.samples.append(Sample(sample.name, sample.labels, 0.0))
        text = self._library(encoder, content_type, [alone])
        header = self._header_of(encoder, content_type, family)
        if not text.startswith(header) or not text.endswith(" 0.0\n"):
            raise RuntimeError("prometheus_client wrote a sample line unexpectedly")
        return text[len(header) : -4]

    def render(
        self, results: Iterable[Normalized], encoder: Encoder, content_type: str
    ) -> str:
        """The engine families of ``results`` (targets in order) as one text:
        same-named families merged in order of first appearance, as one family."""
        return "".join(self.pieces(results, encoder, content_type))

    def pieces(
        self, results: Iterable[Normalized], encoder: Encoder, content_type: str
    ) -> list[str]:
        """:meth:`render`'s text in pieces."""
        self.trailer(encoder, content_type)  # first: it may forget other formats
        blocks: dict[str, list[str]] = {}
        for result in results:
            if not result.passthrough:
                for chunk, pieces in result.chunks(encoder, content_type):
                    series = chunk.series
                    assert series is not None
                    block = blocks.get(series.base)
                    if block is None:
                        header = self.header(
                            encoder, content_type, series.base, series.doc, series.kind
                        )
                        block = blocks[series.base] = [header]
                    block += pieces
                continue
            for family in result.families:  # passed-through families: any kind
                header = self._header_of(encoder, content_type, family)
                lines = self._samples(encoder, content_type, family)
                if lines is None:
                    text = self._library(encoder, content_type, [family])
                    if not text.startswith(header):
                        raise RuntimeError("prometheus_client wrote a family oddly")
                    lines = text[len(header) :]
                blocks.setdefault(family.name, [header]).append(lines)
        return list(chain.from_iterable(blocks.values()))
