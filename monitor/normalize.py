"""One engine exposition in, servemon's schema out.

:func:`normalize` parses a target's ``/metrics`` text with prometheus_client's parser,
works out the engine (``vllm``, ``sglang``, ``tgi``, ``llamacpp``) and the dialect
(which of vLLM's spellings it uses), and maps every family it recognises to its
servemon series through the table in :mod:`monitor.names`: the first source of a
series that is present wins, so a version that exposes a deprecated name beside the
new one is read once. Gauges stay gauges, counters counters, histograms keep their
buckets. What it does not recognise is dropped, or passed through unchanged (with a
``target`` label) when asked, except ``process_*`` and ``servemon_*`` families, which
the exporter publishes itself.

Labels: ``target`` (the configured name), ``model`` (the engine's ``model_name``, else
the model the target lists), ``engine``, and ``rank`` (vLLM's ``engine`` index for
data-parallel ranks, SGLang's ``dp_rank``; ``"0"`` without one). Other labels are
dropped, ``finished_reason`` becomes ``reason``. Where dropping labels folds several
samples into one (SGLang's per-TP-rank copies), gauges are averaged, counters take the
largest, histograms keep the first.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from monitor import names
from monitor.exposition import ExpositionParser
from monitor.names import Series, Source

__all__ = ["ENGINE_PREFIXES", "Normalized", "detect_engine", "normalize"]

#: Families the exporter publishes itself, never passed through (they would clash).
OWN_PREFIXES = ("process_", "servemon_")

ENGINE_PREFIXES = {
    "vllm": "vllm:",
    "sglang": "sglang:",
    "tgi": "tgi_",
    "llamacpp": "llamacpp:",
}


@dataclass(slots=True)
class Normalized:
    """A target's exposition in servemon's schema."""

    engine: str
    dialect: str
    families: list[Metric]
    models: set[str]
    info: dict[str, str] = field(default_factory=dict)


def detect_engine(text: str) -> str:
    """The engine whose prefix starts the most lines of ``text``; else ``unknown``."""
    text = "\n" + text
    counts = {
        engine: text.count("\n" + prefix) for engine, prefix in ENGINE_PREFIXES.items()
    }
    best = max(counts, key=lambda k: counts[k])
    return best if counts[best] else "unknown"


#: Family names that some series reads (counters both with and without ``_total``,
#: as prometheus_client names a counter family without it).
KNOWN_FAMILIES = frozenset(
    {src.name for s in names.ENGINE_SERIES for src in s.sources}
    | {
        src.name.removesuffix("_total")
        for s in names.ENGINE_SERIES
        for src in s.sources
    }
    | {"vllm:cache_config_info", "vllm:num_requests_swapped"}
)


def _known(name: str) -> bool:
    return name in KNOWN_FAMILIES


def normalize(
    text: str,
    *,
    target: str,
    model: str | None = None,
    engine: str | None = None,
    passthrough: bool = False,
    parser: ExpositionParser | None = None,
) -> Normalized:
    """Map an exposition to servemon's series; raises ValueError if it won't parse.

    Pass the same ``parser`` on every scrape of a target: it remembers label sets.
    """
    parser = parser or ExpositionParser()
    families = parser.parse(text, None if passthrough else _known)
    engine = engine or detect_engine(text)
    mapper = _Mapper(target, model, engine)
    used: set[str] = set()
    out: list[Metric] = []
    for series in names.ENGINE_SERIES:
        for source in series.sources:
            if source.engine != engine:
                continue
            family = _find(families, source)
            if family is None or not family.samples:
                continue
            mapped = mapper.map(series, family)
            if mapped is None:
                continue
            out.append(mapped)
            used.add(family.name)
            mapper.chosen[series.name] = source
            break
    dialect = _dialect(engine, families)
    info = _info(engine, families, mapper)
    if passthrough:
        out += _passthrough(families.values(), used, target)
    return Normalized(engine, dialect, out, mapper.models, info)


def _find(families: dict[str, Metric], source: Source) -> Metric | None:
    name = source.name
    for candidate in (name, name.removesuffix("_total")):
        family = families.get(candidate)
        if family is not None:
            return family
    return None


class _Mapper:
    def __init__(self, target: str, model: str | None, engine: str) -> None:
        self.target = target
        self.model = model
        self.engine = engine
        self.models: set[str] = set()
        self.chosen: dict[str, Source] = {}

    def labels(self, series: Series, sample_labels: dict[str, str]) -> tuple[str, ...]:
        model = sample_labels.get("model_name") or self.model or "unknown"
        self.models.add(model)
        rank = sample_labels.get("engine") or sample_labels.get("dp_rank") or "0"
        values = [self.target, model, self.engine, rank]
        if "reason" in series.labels:
            values.append(sample_labels.get("finished_reason", "stop"))
        return tuple(values)

    def map(self, series: Series, family: Metric) -> Metric | None:
        if series.kind == "histogram":
            return (
                self._histogram(series, family) if family.type == "histogram" else None
            )
        if family.type not in (series.kind, "unknown", "untyped"):
            return None
        groups: dict[tuple[str, ...], list[float]] = defaultdict(list)
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            groups[self.labels(series, sample.labels)].append(sample.value)
        cls = CounterMetricFamily if series.kind == "counter" else GaugeMetricFamily
        out = cls(series.base, series.doc, labels=series.labels)
        for key, values in groups.items():
            value = (
                max(values) if series.kind == "counter" else sum(values) / len(values)
            )
            out.add_metric(list(key), value)
        return out

    def _histogram(self, series: Series, family: Metric) -> Metric:
        buckets: dict[tuple[str, ...], list[tuple[str, float]]] = defaultdict(list)
        sums: dict[tuple[str, ...], float] = {}
        origin: dict[tuple[str, ...], frozenset[tuple[str, str]]] = {}
        for sample in family.samples:
            plain = {k: v for k, v in sample.labels.items() if k != "le"}
            key = self.labels(series, plain)
            ident = frozenset(plain.items())
            if origin.setdefault(key, ident) != ident:
                continue  # a second copy folded onto the same labels: keep the first
            if sample.name.endswith("_bucket"):
                buckets[key].append((sample.labels["le"], sample.value))
            elif sample.name.endswith("_sum"):
                sums[key] = sample.value
        out = HistogramMetricFamily(series.base, series.doc, labels=series.labels)
        for key, pairs in buckets.items():
            out.add_metric(list(key), pairs, sum_value=sums.get(key, 0.0))
        return out


def _dialect(engine: str, families: dict[str, Metric]) -> str:
    if engine != "vllm":
        return engine
    has = families.__contains__
    if has("vllm:gpu_prefix_cache_hit_rate") or has("vllm:num_requests_swapped"):
        return "vllm-v0"
    if has("vllm:kv_cache_usage_perc"):
        return "vllm-0.10" if has("vllm:gpu_cache_usage_perc") else "vllm"
    return "vllm-0.8" if has("vllm:gpu_cache_usage_perc") else "vllm"


def _info(engine: str, families: dict[str, Metric], mapper: _Mapper) -> dict[str, str]:
    info: dict[str, str] = {"dialect": _dialect(engine, families)}
    cache = families.get("vllm:cache_config_info")
    if cache is not None and cache.samples:
        labels = cache.samples[0].labels
        for key, name in (
            ("block_size", "block_size"),
            ("num_gpu_blocks", "num_gpu_blocks"),
            ("enable_prefix_caching", "prefix_caching"),
        ):
            if key in labels:
                info[name] = labels[key]
    chosen = mapper.chosen.get(names.ENGINE_PREFIX_QUERIES.name)
    if chosen is not None:
        family = _find(families, chosen)
        help_text = family.documentation if family is not None else ""
        info["prefix_cache_unit"] = "blocks" if "block" in help_text else "tokens"
    elif engine == "sglang":
        info["prefix_cache_unit"] = "tokens"
    return info


def _passthrough(
    families: Iterable[Metric], used: set[str], target: str
) -> list[Metric]:
    out: list[Metric] = []
    for family in families:
        if family.name in used or family.name.startswith(OWN_PREFIXES):
            continue
        copy = Metric(family.name, family.documentation, family.type, family.unit)
        for sample in family.samples:
            copy.add_sample(
                sample.name, {**sample.labels, "target": target}, sample.value
            )
        out.append(copy)
    return out
