"""The normalization rules: which of an engine's families become which servemon lines.

:func:`decide` takes one exposition's families (as :mod:`servemon.monitor.exposition`
groups them) and works out what servemon publishes from them, as output slots: each slot
is one output sample (its name and labels) and where its value comes from (a line of
the exposition, a fold of several lines, or the ``0.0`` of a histogram without
``_sum``). It never looks at values, so its answer holds for every exposition of
the same shape (:mod:`servemon.monitor.normalize` keeps it while only values move).

- The engine is the one configured, else the one whose prefix starts the most lines
  (:func:`detect_engine`); the dialect says which of vLLM's spellings it uses.
- Every series of :data:`servemon.core.names.ENGINE_SERIES` takes the first of its
  sources for that engine that is present with samples and of a type it can read (gauges
  from gauges or untyped, counters from counters or untyped, histograms from
  histograms), so a version that exposes a deprecated name beside the new one is read
  once.
- Labels: ``target``, ``model`` (the sample's ``model_name``, else the configured or
  listed model, else ``unknown``), ``engine``, ``rank`` (vLLM's ``engine``, SGLang's
  ``dp_rank``, else ``0``; not on a series counted per model, such as admission
  rejections) and the few bounded labels a source keeps (``Source.keep``: finished
  requests' ``reason`` from ``finished_reason``, else ``stop``; why requests wait;
  prompt tokens by source; ...); histograms keep ``le``. Nothing else.
- A source with ``where`` reads only the samples whose labels hold those values (a
  deprecated family split by a label, read where the newer families are absent;
  never added to them).
- A source read from its newest sample (``Source.read``: vLLM's
  ``lora_requests_info``, a gauge stamped with the wall-clock time that keeps every
  label set it ever had) becomes ``pick`` folds: per output sample, what each line's
  labels say (a count of names, a number, 1 or 0 for one adapter), and at scrape
  time the answer of the line with the largest value.
- Where that folds several lines onto one label set (SGLang's per-TP-rank copies),
  gauges take the mean, counters the largest, histograms the first copy. A gauge is
  always a mean (of one, usually: ``-0.0`` becomes ``0.0``). ``_created`` lines are
  not read. A histogram whose first bucket is negative or NaN has no ``_count`` and
  ``_sum`` (as prometheus_client's ``HistogramMetricFamily`` does).
- With passthrough, every other family except ``process_*`` and ``servemon_*`` (the
  exporter's own) is copied with a ``target`` label.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

from servemon.core import names
from servemon.core.names import Series, Source
from servemon.monitor.exposition import Family, Lines, SampleKey, sample_name

__all__ = [
    "ENGINE_PREFIXES",
    "KNOWN_FAMILIES",
    "OWN_PREFIXES",
    "ZERO",
    "Chunk",
    "Decision",
    "Fold",
    "Slot",
    "decide",
    "detect_engine",
]

#: Families the exporter publishes itself, never passed through (they would clash).
OWN_PREFIXES: Final = ("process_", "servemon_")

ENGINE_PREFIXES: Final = {
    "vllm": "vllm:",
    "sglang": "sglang:",
    "tgi": "tgi_",
    "llamacpp": "llamacpp:",
}

#: Family names that some series reads (counters both with and without ``_total``,
#: as prometheus_client names a counter family without it).
KNOWN_FAMILIES: Final = frozenset(
    {src.name for s in names.ENGINE_SERIES for src in s.sources}
    | {
        src.name.removesuffix("_total")
        for s in names.ENGINE_SERIES
        for src in s.sources
    }
    | {"vllm:cache_config_info", "vllm:num_requests_swapped"}
)

#: The labels every engine series may have, before those a source keeps.
_COMMON: Final = frozenset({"target", "model", "engine", "rank"})

#: A slot's value reference for a histogram without ``_sum`` (the value ``0.0``).
ZERO: Final = -1


def detect_engine(text: str) -> str:
    """The engine whose prefix starts the most lines of ``text``; else ``unknown``."""
    text = "\n" + text
    counts = {
        engine: text.count("\n" + prefix) for engine, prefix in ENGINE_PREFIXES.items()
    }
    best = max(counts, key=lambda k: counts[k])
    return best if counts[best] else "unknown"


@dataclass(frozen=True, slots=True)
class Slot:
    """One output sample: its name, labels and value reference (a line index, a
    fold as ``-2 - fold index``, or :data:`ZERO`)."""

    name: str
    labels: dict[str, str]
    ref: int


@dataclass(frozen=True, slots=True)
class Fold:
    """A value made of several lines' values: their ``max`` or ``mean``, or
    ``pick``: the outcome of the line with the largest value (the first of equals;
    NaN is never the largest), from ``outcomes`` (one per member)."""

    op: Literal["max", "mean", "pick"]
    members: tuple[int, ...]
    outcomes: tuple[float, ...] = ()

    def value(self, numbers: Sequence[float]) -> float:
        """The fold of its members' values ``numbers`` (in member order)."""
        if self.op == "max":
            return max(numbers)
        if self.op == "mean":
            return sum(numbers) / len(numbers)
        best = max(
            range(len(numbers)),
            key=lambda i: -math.inf if math.isnan(numbers[i]) else numbers[i],
        )
        return self.outcomes[best]


def _names(text: str) -> list[str]:
    """The names of a comma-joined list (``""``: none)."""
    return [name for name in text.split(",") if name]


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


@dataclass(frozen=True, slots=True)
class Chunk:
    """Slots ``start:end`` make one published family: ``series``, or with
    passthrough a copied ``family``."""

    start: int
    end: int
    series: Series | None = None
    family: Family | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    """What servemon publishes for one shape of exposition."""

    engine: str
    dialect: str
    models: frozenset[str]
    info: dict[str, str]
    slots: tuple[Slot, ...]
    folds: tuple[Fold, ...]
    #: The engine series, in table order, then any passed-through families.
    chunks: tuple[Chunk, ...]


def _fold_ref(index: int) -> int:
    """The value reference of fold ``index``."""
    return -2 - index


class _Decider:
    def __init__(
        self,
        lines: Lines,
        target: str,
        model: str | None,
        engine: str,
    ) -> None:
        self.lines = lines
        self.target = target
        self.model = model
        self.engine = engine
        self.models: set[str] = set()
        self.slots: list[Slot] = []
        self.folds: list[Fold] = []

    def key(self, i: int) -> SampleKey:
        entry = self.lines.entries[i]
        assert isinstance(entry, SampleKey)
        return entry

    def labels(
        self, series: Series, source: Source, labels: dict[str, str]
    ) -> tuple[str, ...]:
        """The values of the series' labels (as ``series.labels`` orders them) for
        a sample of ``source`` with ``labels``; the series' extra labels (a
        :class:`Source`'s ``keep``) come after the common ones."""
        model = labels.get("model_name") or self.model or "unknown"
        self.models.add(model)
        common = {"target": self.target, "model": model, "engine": self.engine}
        if "rank" in series.labels:
            common["rank"] = labels.get("engine") or labels.get("dp_rank") or "0"
        values = [common[label] for label in series.labels if label in common]
        values += [labels.get(theirs) or default for _, theirs, default in source.keep]
        return tuple(values)

    def members(self, family: Family, source: Source) -> list[int]:
        """The family's sample lines the source reads: no ``_created`` line, and
        only those whose labels hold the source's ``where``."""
        out = []
        for i in family.members:
            if sample_name(self.lines, family, i).endswith("_created"):
                continue
            labels = self.key(i).labels
            if all(labels.get(k) == v for k, v in source.where):
                out.append(i)
        return out

    def map(self, series: Series, family: Family, source: Source) -> bool:
        """Adds the slots of ``series`` from ``family``; False where the family's
        type is not one the series reads."""
        if source.read != "value":
            if family.type not in (series.kind, "unknown"):
                return False
            self._newest(series, family, source)
            return True
        if series.kind == "histogram":
            if family.type != "histogram":
                return False
            self._histogram(series, family, source)
            return True
        if family.type not in (series.kind, "unknown"):
            return False
        groups: dict[tuple[str, ...], list[int]] = defaultdict(list)
        for i in self.members(family, source):
            groups[self.labels(series, source, self.key(i).labels)].append(i)
        if not groups:
            return False
        name = series.name if series.kind == "counter" else series.base
        for key, members in groups.items():
            if series.kind == "counter" and len(members) == 1:
                ref = members[0]
            else:
                op: Literal["max", "mean"] = (
                    "max" if series.kind == "counter" else "mean"
                )
                self.folds.append(Fold(op, tuple(members)))
                ref = _fold_ref(len(self.folds) - 1)
            self.slots.append(
                Slot(name, dict(zip(series.labels, key, strict=True)), ref)
            )
        return True

    def _newest(self, series: Series, family: Family, source: Source) -> None:
        """``pick`` folds over the family's lines, per label set: what the newest
        line's labels say, as ``source.read`` reads them."""
        groups: dict[tuple[str, ...], list[int]] = defaultdict(list)
        for i in self.members(family, source):
            groups[self.labels(series, source, self.key(i).labels)].append(i)
        common = [label for label in series.labels if label in _COMMON]
        for key, members in groups.items():
            said = [self.key(i).labels for i in members]
            base = dict(zip(common, key, strict=False))
            if source.read == "members":
                for label in source.label.split(","):
                    lists = [_names(labels.get(label, "")) for labels in said]
                    seen = dict.fromkeys(name for names in lists for name in names)
                    state = label.split("_", 1)[0]
                    for name in seen:
                        outcomes = tuple(float(name in names) for names in lists)
                        extra = {"adapter": name, "state": state}
                        self._pick(series, {**base, **extra}, members, outcomes)
                continue
            if source.read == "count":
                outcomes = tuple(
                    float(len(_names(labels.get(source.label, "")))) for labels in said
                )
            else:
                outcomes = tuple(
                    _number(labels.get(source.label, "")) for labels in said
                )
            self._pick(series, base, members, outcomes)

    def _pick(
        self,
        series: Series,
        labels: dict[str, str],
        members: list[int],
        outcomes: tuple[float, ...],
    ) -> None:
        self.folds.append(Fold("pick", tuple(members), outcomes))
        self.slots.append(Slot(series.name, labels, _fold_ref(len(self.folds) - 1)))

    def _histogram(self, series: Series, family: Family, source: Source) -> None:
        buckets: dict[tuple[str, ...], list[tuple[str, int]]] = defaultdict(list)
        sums: dict[tuple[str, ...], int] = {}
        origin: dict[tuple[str, ...], frozenset[tuple[str, str]]] = {}
        for i in self.members(family, source):
            labels = self.key(i).labels
            plain = {k: v for k, v in labels.items() if k != "le"}
            key = self.labels(series, source, plain)
            ident = frozenset(plain.items())
            if origin.setdefault(key, ident) != ident:
                continue  # a second copy folded onto the same labels: keep the first
            name = sample_name(self.lines, family, i)
            if name.endswith("_bucket"):
                if "le" not in labels:
                    raise ValueError(f"a bucket of {family.name} without le")
                buckets[key].append((labels["le"], i))
            elif name.endswith("_sum"):
                sums[key] = i
        for key, pairs in buckets.items():
            labels = dict(zip(series.labels, key, strict=True))
            for le, ref in pairs:
                self.slots.append(
                    Slot(series.name + "_bucket", {**labels, "le": le}, ref)
                )
            if float(pairs[0][0]) >= 0:  # raises where le is no number
                self.slots.append(Slot(series.name + "_count", labels, pairs[-1][1]))
                ref = sums.get(key, ZERO)
                self.slots.append(Slot(series.name + "_sum", dict(labels), ref))


def _find(families: dict[str, Family], source: Source) -> Family | None:
    for candidate in (source.name, source.name.removesuffix("_total")):
        family = families.get(candidate)
        if family is not None:
            return family
    return None


def _dialect(engine: str, families: dict[str, Family]) -> str:
    if engine != "vllm":
        return engine
    has = families.__contains__
    if has("vllm:gpu_prefix_cache_hit_rate") or has("vllm:num_requests_swapped"):
        return "vllm-v0"
    if has("vllm:kv_cache_usage_perc"):
        return "vllm-0.10" if has("vllm:gpu_cache_usage_perc") else "vllm"
    return "vllm-0.8" if has("vllm:gpu_cache_usage_perc") else "vllm"


def _info(
    engine: str,
    lines: Lines,
    families: dict[str, Family],
    chosen: dict[str, Source],
    dialect: str,
) -> dict[str, str]:
    info: dict[str, str] = {"dialect": dialect}
    cache = families.get("vllm:cache_config_info")
    if cache is not None and cache.members:
        first = lines.entries[cache.members[0]]
        assert isinstance(first, SampleKey)
        for label, key in (
            ("block_size", "block_size"),
            ("num_gpu_blocks", "num_gpu_blocks"),
            ("enable_prefix_caching", "prefix_caching"),
        ):
            if label in first.labels:
                info[key] = first.labels[label]
    queries = chosen.get(names.ENGINE_PREFIX_QUERIES.name)
    if queries is not None:
        family = _find(families, queries)
        help_text = family.doc if family is not None else ""
        info["prefix_cache_unit"] = "blocks" if "block" in help_text else "tokens"
    elif engine == "sglang":
        info["prefix_cache_unit"] = "tokens"
    return info


def decide(
    lines: Lines,
    families: dict[str, Family],
    *,
    target: str,
    model: str | None,
    engine: str,
    passthrough: bool = False,
) -> Decision:
    """The rules applied to one exposition's families (``engine`` resolved)."""
    decider = _Decider(lines, target, model, engine)
    chunks: list[Chunk] = []
    chosen: dict[str, Source] = {}
    used: set[str] = set()
    for series in names.ENGINE_SERIES:
        for source in series.sources:
            if source.engine != engine:
                continue
            family = _find(families, source)
            if family is None or not family.members:
                continue
            start = len(decider.slots)
            if not decider.map(series, family, source):
                continue
            chunks.append(Chunk(start, len(decider.slots), series=series))
            chosen[series.name] = source
            used.add(family.name)
            break
    if passthrough:
        for family in families.values():
            if family.name in used or family.name.startswith(OWN_PREFIXES):
                continue
            start = len(decider.slots)
            for i in family.members:
                labels = {**decider.key(i).labels, "target": target}
                name = sample_name(lines, family, i)
                decider.slots.append(Slot(name, labels, i))
            chunks.append(Chunk(start, len(decider.slots), family=family))
    dialect = _dialect(engine, families)
    return Decision(
        engine=engine,
        dialect=dialect,
        models=frozenset(decider.models),
        info=_info(engine, lines, families, chosen, dialect),
        slots=tuple(decider.slots),
        folds=tuple(decider.folds),
        chunks=tuple(chunks),
    )
